"""Tests for lingvo_pipe.core.hyperparams."""

import collections
import copy
import enum
import importlib
import math
import os
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import params_text

Params = hyperparams.Params
FrozenParamsError = hyperparams.FrozenParamsError
ParamsTextError = params_text.ParamsTextError


class Color(enum.Enum):
  RED = 1
  BLUE = 2


class Size(enum.IntEnum):
  SMALL = 1
  LARGE = 2


class Outer:

  class Inner:
    pass


class Layer:
  """Stands in for a layer: keeps the params it was built with."""

  def __init__(self, params, scale=1):
    self.params = params
    self.scale = scale


Pair = collections.namedtuple('Pair', ['a', 'b'])


def _Sub(dim=1):
  p = Params()
  p.Define('dim', dim, 'Dimension.')
  p.Define('name', '', 'Name.')
  return p


def _Model():
  """Params with one param of each supported kind, nested and in a list."""
  p = Params()
  p.Define('dim', 8, 'Model dimension.')
  p.Define('rate', 0.5, 'A float.')
  p.Define('label', 'x', 'A string.')
  p.Define('flag', False, 'A bool.')
  p.Define('empty', None, 'Holds None by default.')
  p.Define('nums', [1, 2], 'A list.')
  p.Define('shape', (2, 3), 'A tuple.')
  p.Define('table', {'a': 1}, 'A dict.')
  p.Define('layer_cls', Layer, 'A class.')
  p.Define('color', Color.RED, 'An enum member.')
  p.Define('dtype', tf.float32, 'A dtype.')
  p.Define('sub', _Sub(), 'Nested params.')
  p.Define('layers', [_Sub(1), _Sub(2)], 'A list of params.')
  return p


def _Modified():
  """_Model() with every value changed, including tricky ones."""
  p = _Model()
  p.Set(dim=-3, rate=float('-inf'), label='a\'b"c\\d\ne\t\u2028\u00e9',
        flag=True, empty=Color.BLUE, nums=[1, [2.5, -0.0], {'k': (None,)}],
        shape=(7,), table={'x': {'y': [1, 'z']}, 2: None},
        layer_cls=Outer.Inner, color=Color.BLUE, dtype=tf.bfloat16)
  p.Set(**{'sub.dim': 5, 'sub.name': 'None', 'layers[1].dim': 9,
           'layers[0].name': '3'})
  return p


class DefineTest(parameterized.TestCase):

  def testDefineGetAndSet(self):
    p = Params()
    p.Define('dim', 8, 'Model dimension.')
    self.assertEqual(p.dim, 8)
    p.dim = 16
    self.assertEqual(p.dim, 16)
    self.assertEqual(p.Get('dim'), 16)
    self.assertLen(p, 1)

  @parameterized.named_parameters(
      ('Digit', '1abc', 'identifier'),
      ('Dotted', 'a.b', 'identifier'),
      ('Empty', '', 'identifier'),
      ('NotStr', 3, 'identifier'),
      ('Keyword', 'class', 'keyword'),
      ('Underscore', '_dim', 'reserved'),
      ('Method', 'Copy', 'clashes with Params.Copy'),
  )
  def testBadName(self, name, message):
    p = Params()
    with self.assertRaisesRegex(ValueError, message):
      p.Define(name, 1, 'A param.')
    self.assertEmpty(p)

  def testNameClashesWithSubclassMethod(self):
    p = hyperparams.InstantiableParams(Layer)
    with self.assertRaisesRegex(ValueError, 'InstantiableParams.Instantiate'):
      p.Define('Instantiate', 1, 'A param.')

  def testRedefinitionFails(self):
    p = _Sub()
    with self.assertRaisesRegex(AttributeError, "'dim' is already defined"):
      p.Define('dim', 2, 'Again.')
    self.assertEqual(p.dim, 1)

  @parameterized.parameters('', '   ', None, 3)
  def testDescriptionRequired(self, description):
    p = Params()
    with self.assertRaisesRegex(ValueError, 'needs a description'):
      p.Define('dim', 1, description)
    self.assertNotIn('dim', p)


class AccessTest(parameterized.TestCase):

  def testUnknownGetSuggests(self):
    p = _Sub()
    with self.assertRaises(AttributeError) as cm:
      _ = p.dimm
    self.assertEqual(str(cm.exception),
                     "Unknown param 'dimm' in Params; did you mean 'dim'?")

  def testUnknownSetSuggestsAndSetsNothing(self):
    p = _Sub()
    with self.assertRaisesRegex(AttributeError, "did you mean 'dim'"):
      p.dimm = 3
    self.assertNotIn('dimm', p)
    self.assertNotIn('dimm', p.__dict__)

  def testUnknownNamesLayerAndPath(self):
    p = _Model()
    p.layers[1] = hyperparams.InstantiableParams(Layer)
    p.layers[1].Define('name', 'ffn', 'Name.')
    p.layers[1].Define('hidden_dim', 4, 'Hidden.')
    with self.assertRaises(AttributeError) as cm:
      p.Get('layers[1].hiden_dim')
    self.assertEqual(
        str(cm.exception), "Unknown param 'hiden_dim' in Layer params 'ffn' "
        "at 'layers[1]'; did you mean 'hidden_dim'?")

  def testUnknownWithoutCloseMatchListsNames(self):
    with self.assertRaisesRegex(AttributeError, 'defined: dim, name$'):
      _ = _Sub().zzz
    with self.assertRaisesRegex(AttributeError, 'defines no params'):
      _ = Params().zzz

  def testPrivateAttributeIsPlainAttributeError(self):
    self.assertFalse(hasattr(Params(), '_nope'))
    self.assertFalse(hasattr(Params(), '__deepcopy_helper__'))

  def testSetReturnsSelfAndTakesPaths(self):
    p = _Model()
    result = p.Set(dim=3, **{'sub.dim': 4, 'layers[1].dim': 5, 'nums[0]': 6})
    self.assertIs(result, p)
    self.assertEqual((p.dim, p.sub.dim, p.layers[1].dim, p.layers[0].dim),
                     (3, 4, 5, 1))
    self.assertEqual(p.nums, [6, 2])

  def testSetChecksEveryKeyFirst(self):
    p = _Model()
    with self.assertRaisesRegex(AttributeError, "did you mean 'dim'"):
      p.Set(rate=0.1, **{'sub.dimm': 3})
    self.assertEqual(p.rate, 0.5)

  def testSetTupleItemFails(self):
    p = _Model()
    with self.assertRaisesRegex(TypeError, "'shape' is a tuple"):
      p.Set(**{'shape[0]': 1})
    self.assertEqual(p.shape, (2, 3))

  def testGetPaths(self):
    p = _Model()
    self.assertEqual(p.Get('sub.dim'), 1)
    self.assertEqual(p.Get('layers[1].dim'), 2)
    self.assertIs(p.Get('layers[1]'), p.layers[1])
    self.assertEqual(p.Get('nums[1]'), 2)

  @parameterized.named_parameters(
      ('IndexOutOfRange', 'layers[2].dim', IndexError, 'has 2 items'),
      ('FieldOfInt', 'dim.x', TypeError, 'holds int, not Params'),
      ('IndexParams', 'sub[0]', TypeError, 'holds Params, not a list'),
      ('BadPath', 'sub..dim', ValueError, 'Bad param path'),
      ('Negative', 'nums[-1]', ValueError, 'Bad param path'),
      ('UnknownNested', 'sub.dimm', AttributeError, "at 'sub'; did you"),
  )
  def testGetErrors(self, path, error, message):
    with self.assertRaisesRegex(error, message):
      _Model().Get(path)

  def testDelete(self):
    p = _Model()
    self.assertIs(p.Delete('dim', 'sub.name', 'layers[0].dim'), p)
    self.assertNotIn('dim', p)
    self.assertEqual(list(n for n, _ in p.sub.IterParams()), ['dim'])
    self.assertNotIn('layers[0].dim', p)
    self.assertIn('layers[1].dim', p)
    p.Define('dim', 2, 'Defined again after Delete.')
    self.assertEqual(p.dim, 2)

  def testDeleteUnknownDeletesNothing(self):
    p = _Model()
    with self.assertRaisesRegex(AttributeError, "did you mean 'rate'"):
      p.Delete('dim', 'rat')
    self.assertIn('dim', p)

  def testDeleteListItemFails(self):
    with self.assertRaisesRegex(TypeError, 'not list items'):
      _Model().Delete('layers[0]')

  @parameterized.parameters(
      ('dim', True), ('sub.dim', True), ('layers[1].name', True),
      ('nums[1]', True), ('layers[2].dim', False), ('nope', False),
      ('sub.nope', False), ('a..b', False), (3, False), ('dim.x', False))
  def testContains(self, name, expected):
    self.assertEqual(name in _Model(), expected)

  def testIterParamsInDefinitionOrder(self):
    p = _Sub()
    p.Define('rate', 0.1, 'Rate.')
    p.name = 'changed'
    self.assertEqual(list(p.IterParams()),
                     [('dim', 1), ('name', 'changed'), ('rate', 0.1)])
    p.Delete('dim')
    p.Define('dim', 3, 'Again.')
    self.assertEqual([n for n, _ in p.IterParams()], ['name', 'rate', 'dim'])

  def testParamNamedSelf(self):
    p = Params()
    p.Define('self', 1, 'A param named like the method receiver.')
    p.self = 2
    p.Set(self=3)
    self.assertEqual(p.self, 3)

  def testDirListsParams(self):
    self.assertContainsSubset(['dim', 'name', 'Define'], dir(_Sub()))


class CopyTest(absltest.TestCase):

  def testCopyIsEqualAndIndependent(self):
    p = _Modified()
    q = p.Copy()
    self.assertEqual(p, q)
    q.sub.dim = 100
    q.layers[0].dim = 100
    q.layers.append(_Sub())
    q.nums[1][0] = 100
    q.table['x']['y'].append(100)
    self.assertEqual(p, _Modified())
    self.assertNotEqual(p, q)

  def testCopySharesClassesEnumsAndDtypes(self):
    p = _Modified()
    p.empty = [Layer, Color.BLUE, tf.int32]
    q = p.Copy()
    self.assertIs(q.layer_cls, Outer.Inner)
    self.assertIs(q.color, Color.BLUE)
    self.assertIs(q.dtype, tf.bfloat16)
    for mine, theirs in zip(p.empty, q.empty):
      self.assertIs(mine, theirs)

  def testCopiesParamsInsideContainers(self):
    p = Params()
    p.Define('mixed', [1, _Sub()], 'A list holding Params.')
    p.Define('by_name', {'a': _Sub()}, 'A dict holding Params.')
    p.Define('pair', Pair(_Sub(), 2), 'A namedtuple holding Params.')
    q = p.Copy()
    q.mixed[1].dim = 5
    q.by_name['a'].dim = 6
    q.pair.a.dim = 7
    self.assertEqual((p.mixed[1].dim, p.by_name['a'].dim, p.pair.a.dim),
                     (1, 1, 1))
    self.assertIsInstance(q.pair, Pair)

  def testCopyModuleFunctions(self):
    p = _Model()
    for q in (copy.copy(p), copy.deepcopy(p)):
      q.sub.dim = 50
      self.assertEqual(p.sub.dim, 1)
      self.assertEqual(q.sub.dim, 50)

  def testCopyKeepsSubclassAndDescriptions(self):
    p = hyperparams.InstantiableParams(Layer)
    q = p.Copy()
    self.assertIsInstance(q, hyperparams.InstantiableParams)
    self.assertIs(q.cls, Layer)
    q.Delete('cls')
    self.assertIs(p.cls, Layer)

  def testCopyOfFrozenIsMutable(self):
    p = _Modified().Freeze()
    q = p.Copy()
    self.assertFalse(q.IsFrozen())
    self.assertFalse(q.layers[0].IsFrozen())
    self.assertIsInstance(q.nums, list)
    self.assertIsInstance(q.nums[1], list)
    self.assertIsInstance(q.table, dict)
    q.nums.append(3)
    q.layers[0].dim = 4
    self.assertEqual(p, _Modified())

  def testFreezingCopyLeavesOriginalMutable(self):
    p = _Model()
    q = p.Copy().Freeze()
    self.assertTrue(q.layers[0].IsFrozen())
    p.layers[0].dim = 10
    p.nums.append(3)
    self.assertFalse(p.IsFrozen())
    self.assertEqual(p.nums, [1, 2, 3])


class FreezeTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.p = _Modified()
    self.assertIs(self.p.Freeze(), self.p)

  def testIsFrozenAllTheWayDown(self):
    self.assertTrue(self.p.IsFrozen())
    self.assertTrue(self.p.sub.IsFrozen())
    self.assertTrue(self.p.layers[1].IsFrozen())
    self.assertIsInstance(self.p.nums, hyperparams.FrozenList)
    self.assertIsInstance(self.p.nums[1], hyperparams.FrozenList)
    self.assertIsInstance(self.p.nums[2], hyperparams.FrozenDict)
    self.assertIsInstance(self.p.table['x']['y'], hyperparams.FrozenList)

  def testSetFails(self):
    with self.assertRaises(FrozenParamsError) as cm:
      self.p.dim = 3
    self.assertEqual(
        str(cm.exception),
        "Cannot set 'dim': Params is frozen; use Copy() to get a mutable copy.")
    self.assertEqual(self.p.dim, -3)

  def testNestedAndInListSetFails(self):
    with self.assertRaisesRegex(FrozenParamsError, 'frozen'):
      self.p.sub.dim = 3
    with self.assertRaisesRegex(FrozenParamsError, 'frozen'):
      self.p.layers[0].dim = 3
    with self.assertRaisesRegex(FrozenParamsError, 'frozen'):
      self.p.Set(**{'layers[0].dim': 3})
    self.assertEqual((self.p.sub.dim, self.p.layers[0].dim), (5, 1))

  def testContainersAreReadOnly(self):
    with self.assertRaises(AttributeError):
      self.p.nums.append(1)
    with self.assertRaises(TypeError):
      self.p.nums[0] = 5
    with self.assertRaises(TypeError):
      self.p.table['new'] = 1
    with self.assertRaises(TypeError):
      self.p.layers[0] = _Sub()
    self.assertEqual(self.p.nums[0], 1)
    self.assertNotIn('new', self.p.table)

  def testSetsBecomeFrozensets(self):
    p = Params()
    p.Define('ids', {1, 2}, 'A set.')
    self.assertIsInstance(p.Freeze().ids, frozenset)

  @parameterized.named_parameters(
      ('Define', lambda p: p.Define('x', 1, 'X.')),
      ('Delete', lambda p: p.Delete('dim')),
      ('SetPath', lambda p: p.Set(**{'sub.dim': 1})),
      ('FromText', lambda p: p.FromText('dim : 1')),
      ('FromTextNested', lambda p: p.sub.FromText('dim : 1')),
  )
  def testMutatorsFail(self, mutate):
    with self.assertRaisesRegex(FrozenParamsError, r'frozen; use Copy\(\)'):
      mutate(self.p)
    self.assertEqual(self.p, _Modified())

  def testFrozenEqualsAndPrintsLikeUnfrozen(self):
    self.assertEqual(self.p, _Modified())
    self.assertEqual(_Modified(), self.p)
    self.assertEqual(self.p.ToText(), _Modified().ToText())
    self.assertEqual(self.p.nums[:1], [1])


class EqualityTest(parameterized.TestCase):

  def testEqual(self):
    self.assertEqual(_Model(), _Model())
    self.assertEqual(_Modified(), _Modified())

  def testKeysMatter(self):
    p = _Model()
    p.Define('extra', 1, 'Extra.')
    self.assertNotEqual(p, _Model())
    self.assertNotEqual(_Model(), p)

  def testNestedValuesMatter(self):
    p = _Model()
    p.layers[1].name = 'b'
    self.assertNotEqual(p, _Model())

  def testNanEqualsNan(self):
    p, q = _Model(), _Model()
    p.rate = q.rate = float('nan')
    self.assertEqual(p, q)

  @parameterized.named_parameters(
      ('ListVsTuple', [1, 2], (1, 2)),
      ('IntVsBool', 1, True),
      ('IntVsFloat', 1, 1.0),
      ('DtypeVsStr', tf.float32, 'float32'),
      ('NoneVsZero', None, 0),
      ('NestedListVsTuple', {'a': [1]}, {'a': (1,)}),
  )
  def testTypesMatter(self, a, b):
    p, q = _Sub(), _Sub()
    p.dim, q.dim = a, b
    self.assertNotEqual(p, q)

  def testNotEqualToOtherTypes(self):
    self.assertNotEqual(_Sub(), 3)
    self.assertNotEqual(_Sub(), {'dim': 1, 'name': ''})


class TextTest(parameterized.TestCase):

  def testToText(self):
    p = Params()
    p.Define('dim', 8, 'Dim.')
    p.Define('name', "it's", 'Name.')
    p.Define('shape', (2,), 'Shape.')
    p.Define('cls', Layer, 'Class.')
    p.Define('sub', _Sub(), 'Sub.')
    p.Define('layers', [_Sub(3)], 'Layers.')
    p.Define('none', [], 'No layers.')
    self.assertEqual(
        p.ToText(), 'dim : 8\n'
        'name : "it\'s"\n'
        'shape : (2,)\n'
        f'cls : {__name__}.Layer\n'
        'sub.dim : 1\n'
        "sub.name : ''\n"
        'layers[0].dim : 3\n'
        "layers[0].name : ''\n"
        'none : []\n')
    self.assertEqual(str(p), p.ToText())
    self.assertEqual(repr(p), p.ToText())

  def testModelRoundTrip(self):
    p = _Modified()
    q = _Model()
    self.assertIs(q.FromText(p.ToText()), q)
    self.assertEqual(q, p)
    self.assertEqual(q.ToText(), p.ToText())
    self.assertEqual(math.copysign(1.0, q.nums[1][1]), -1.0)
    self.assertIsInstance(q.shape, tuple)
    self.assertEqual(q.label, 'a\'b"c\\d\ne\t\u2028\u00e9')
    self.assertEqual(q.sub.name, 'None')
    self.assertEqual(q.layers[0].name, '3')

  @parameterized.named_parameters(
      ('Int', 8, -(2**70)),
      ('Float', 0.5, 0.1),
      ('FloatTiny', 0.5, 5e-324),
      ('FloatHuge', 0.5, 1.7976931348623157e308),
      ('FloatInf', 0.5, float('inf')),
      ('FloatNegInf', 0.5, float('-inf')),
      ('FloatNan', 0.5, float('nan')),
      ('IntInFloatParam', 0.5, 3),
      ('FloatInIntParam', 1, 2.5),
      ('Bool', False, True),
      ('NoneOverInt', 1, None),
      ('StrQuotes', 'x', '\'"\'"'),
      ('StrBackslashes', 'x', '\\\\n\\'),
      ('StrNewlines', 'x', 'a\nb\r\nc\x0bd\x85e'),
      ('StrUnicode', 'x', '\u00e9\u4e2d\U0001f600\u2029\ud800'),
      ('StrLikeNumber', 'x', '1.5'),
      ('StrLikeNone', 'x', 'None'),
      ('StrLikeClass', 'x', 'os.system'),
      ('StrLikeComment', 'x', '# not a comment'),
      ('StrLikeList', 'x', "[1, 'a']"),
      ('StrEmpty', 'x', ''),
      ('ListNested', [], [1, [2, (3,)], {'a': [None]}, 'b']),
      ('ListEmpty', [1], []),
      ('TupleEmpty', (1,), ()),
      ('TupleOne', (1, 2), ('a',)),
      ('ListForTuple', (1, 2), [1, 2]),
      ('DictNested', {}, {'a': {'b': [1, 2.5]}, 3: None, (1, 'x'): True}),
      ('DictEmpty', {'a': 1}, {}),
      ('Class', Layer, Outer.Inner),
      ('Builtin', Layer, int),
      ('Enum', Color.RED, Color.BLUE),
      ('IntEnum', Size.SMALL, Size.LARGE),
      ('Dtype', tf.float32, tf.int64),
      ('DtypeString', tf.float32, tf.string),
      ('DtypesInList', [], [tf.float16, tf.bool]),
      ('ClassesInList', [Layer], [Outer.Inner, Color.RED]),
  )
  def testValueRoundTrip(self, default, value):
    for start in (default, None):
      p, q = Params(), Params()
      p.Define('v', start, 'Value.')
      q.Define('v', start, 'Value.')
      p.v = value
      q.FromText(p.ToText())
      self.assertEqual(q, p, msg=f'start={start!r}')
      self.assertIs(type(q.v), type(value))

  def testNegativeZeroRoundTrip(self):
    p = _Sub()
    p.dim = -0.0
    q = _Sub().FromText(p.ToText())
    self.assertEqual(math.copysign(1.0, q.dim), -1.0)

  def testCommentsBlankLinesAndCrlf(self):
    p = _Model().FromText(
        '# A comment.\r\n\r\n  dim : 3  # trailing comment\r\n'
        "label : 'a # b'\n   \nsub.dim:4\n")
    self.assertEqual((p.dim, p.label, p.sub.dim), (3, 'a # b', 4))

  def testSetParamsToNone(self):
    p = _Model().FromText('sub : None\nlayers[0] : None\ndim : None')
    self.assertIsNone(p.sub)
    self.assertIsNone(p.layers[0])
    self.assertIsNone(p.dim)

  def testFromTextChecksEveryLineFirst(self):
    p = _Model()
    with self.assertRaises(ParamsTextError):
      p.FromText('dim : 3\nsub.dim : 4\nrate : oops')
    self.assertEqual(p, _Model())

  @parameterized.named_parameters(
      ('UnknownKey', 'dim : 1\nsub.dimm : 2',
       "FromText line 2: Unknown param 'dimm' in Params at 'sub'; "
       "did you mean 'dim'?"),
      ('UnknownTopKey', 'rat : 1', "did you mean 'rate'?"),
      ('StrForInt', "dim : 'abc'",
       "FromText line 1: 'dim' expects int (write a number, e.g. 3 or 0.5); "
       "got str \"'abc'\""),
      ('BareWordForInt', 'dim : abc',
       "bad value for 'dim', which expects int (write a number, e.g. 3 or "
       "0.5): bare word 'abc' is not a value"),
      ('IntForStr', 'label : 5',
       "'label' expects str (write a quoted string, e.g. 'abc')"),
      ('BoolForStr', 'label : True', "'label' expects str (write a quoted "
       "string, e.g. 'abc'); got bool 'True'"),
      ('IntForBool', 'flag : 1', 'expects bool (write True or False)'),
      ('IntForList', 'nums : 1', 'expects list (write e.g. [1, 2]'),
      ('ListForDict', 'table : [1]', 'expects dict'),
      ('IntForClass', 'layer_cls : 3', 'expects a class'),
      ('ClassForEnum', f'color : {__name__}.Layer',
       f'write a member, e.g. {__name__}.Color.RED'),
      ('OtherEnum', f'color : {__name__}.Size.SMALL', 'expects Color'),
      ('UnknownMember', f'color : {__name__}.Color.GREEN',
       "has no 'Color.GREEN'"),
      ('StrForDtype', "dtype : 'float32'", 'write e.g. tf.float32'),
      ('BadDtype', 'dtype : tf.float33', "'tf.float33' is not a TensorFlow"),
      ('ValueForParams', 'sub : 3', "set its fields as 'sub.<name> : value'"),
      ('ValueForParamsInList', 'layers[1] : 3', 'holds Params'),
      ('IndexOutOfRange', 'layers[2].dim : 1',
       "Index [2] is out of range for 'layers', which has 2 items"),
      ('NoColon', 'dim 3', "expected 'key : value'"),
      ('BadKey', 'layers.0.dim : 3', 'Bad param path'),
      ('Duplicate', 'dim : 1\ndim : 2', "line 2: key 'dim' is set twice"),
      ('ReadOnlyValue', 'empty : <function f>', 'for reading only'),
      ('FunctionPath', 'empty : os.path.join', 'is a function, not a class'),
      ('NoModule', 'empty : no_such_module_xyz.Foo', 'no module found'),
      ('Unterminated', "label : 'abc", 'unterminated string'),
      ('MissingValue', 'dim :', 'missing value'),
  )
  def testFromTextErrors(self, text, message):
    p = _Model()
    with self.assertRaises(ParamsTextError) as cm:
      p.FromText(text)
    self.assertIn(message, str(cm.exception))
    self.assertNotIn('\n', str(cm.exception))
    self.assertEqual(p, _Model())

  def testUnserializableValueIsWrittenForReading(self):
    p = _Sub()
    p.dim = len
    self.assertIn('dim : <built-in function len>\n', p.ToText())
    p.name = {'a': _Sub()}
    self.assertIn("name : {'a': <dim : 1\\nname : ''\\n>}\n", p.ToText())
    with self.assertRaisesRegex(ParamsTextError, 'for reading only'):
      _Sub().FromText(p.ToText())

  def testNamesImportOnlyForKeysThatHoldClasses(self):
    module_name = 'lingvo_pipe_hyperparams_test_probe'
    directory = self.enter_context(tempfile.TemporaryDirectory())
    with open(os.path.join(directory, module_name + '.py'), 'w') as f:
      f.write('class Probe:\n  pass\n')
    sys.path.insert(0, directory)
    self.addCleanup(sys.path.remove, directory)
    self.addCleanup(sys.modules.pop, module_name, None)
    importlib.invalidate_caches()
    p = _Model()
    for key in ('dim', 'nums'):
      with self.assertRaisesRegex(ParamsTextError, 'only resolved for'):
        p.FromText(f'{key} : {module_name}.Probe')
      self.assertNotIn(module_name, sys.modules)
    p.FromText(f'label : {module_name}.Probe')  # A str key takes a bare word.
    self.assertEqual(p.label, f'{module_name}.Probe')
    self.assertNotIn(module_name, sys.modules)
    p.FromText(f'empty : {module_name}.Probe')
    self.assertIn(module_name, sys.modules)
    self.assertIs(p.empty, sys.modules[module_name].Probe)

  def testTextDiff(self):
    p, q = _Model(), _Model()
    self.assertEqual(p.TextDiff(q), '')
    q.Set(dim=9, **{'sub.name': 'b'})
    q.layers.append(_Sub(7))
    q.Delete('flag')
    self.assertEqual(
        p.TextDiff(q), '< dim: 8\n'
        '> dim: 9\n'
        '< flag: False\n'
        "< sub.name: ''\n"
        "> sub.name: 'b'\n"
        '> layers[2].dim: 7\n'
        "> layers[2].name: ''\n")
    self.assertEqual(q.TextDiff(p).count('\n'), 7)

  def testTextDiffNan(self):
    p, q = _Model(), _Model()
    p.rate = q.rate = float('nan')
    self.assertEqual(p.TextDiff(q), '')


class InstantiateTest(absltest.TestCase):

  def testInstantiatePassesParamsAndKwargs(self):
    p = hyperparams.InstantiableParams(Layer)
    p.Define('dim', 4, 'Dim.')
    layer = p.Instantiate(scale=3)
    self.assertIsInstance(layer, Layer)
    self.assertIs(layer.params, p)
    self.assertEqual((layer.params.dim, layer.scale), (4, 3))

  def testCopyInstantiates(self):
    p = hyperparams.InstantiableParams(Layer)
    layer = p.Copy().Instantiate()
    self.assertIsInstance(layer, Layer)
    self.assertIsNot(layer.params, p)
    self.assertEqual(layer.params, p)

  def testWithoutClassFails(self):
    with self.assertRaisesRegex(ValueError, 'cls is None; set p.cls'):
      hyperparams.InstantiableParams().Instantiate()

  def testClassRoundTripsThroughText(self):
    p = hyperparams.InstantiableParams(Layer)
    self.assertEqual(p.ToText(), f'cls : {__name__}.Layer\n')
    q = hyperparams.InstantiableParams(Outer.Inner).FromText(p.ToText())
    self.assertIs(q.cls, Layer)


if __name__ == '__main__':
  absltest.main()
