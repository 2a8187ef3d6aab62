"""Tests for lingvo_pipe.core.params_text."""

import collections.abc
import enum
import math
import struct

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import params_text

ParamsTextError = params_text.ParamsTextError
DottedName = params_text.DottedName


class Mode(enum.Enum):
  TRAIN = 'train'
  EVAL = 'eval'


class Model:
  pass


class PathTest(parameterized.TestCase):

  @parameterized.parameters(
      ('dim', ['dim']),
      ('ffn.dim', ['ffn', 'dim']),
      ('layers[0].dim', ['layers', 0, 'dim']),
      ('grid[1][12]', ['grid', 1, 12]),
      ('_x.y_2', ['_x', 'y_2']),
  )
  def testParseAndFormat(self, path, parts):
    self.assertEqual(params_text.ParsePath(path), parts)
    self.assertEqual(params_text.FormatPath(parts), path)

  @parameterized.parameters('', '.a', 'a.', 'a..b', '0a', 'a[x]', 'a[-1]',
                            'a [0]', 'a.0', '[0]', 'a]', None)
  def testBadPath(self, path):
    with self.assertRaisesRegex(ParamsTextError, 'Bad param path'):
      params_text.ParsePath(path)


class FormatTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('None', None, 'None'),
      ('Bool', False, 'False'),
      ('Int', -12, '-12'),
      ('Float', 0.1, '0.1'),
      ('FloatExp', 1e-05, '1e-05'),
      ('NegZero', -0.0, '-0.0'),
      ('Inf', float('-inf'), '-inf'),
      ('Nan', float('nan'), 'nan'),
      ('NumpyInt', np.int64(3), '3'),
      ('NumpyFloat', np.float64(0.25), '0.25'),
      ('Str', 'abc', "'abc'"),
      ('StrSingleQuote', "it's", '"it\'s"'),
      ('StrBothQuotes', '\'"', "'\\'\"'"),
      ('StrControl', 'a\nb\t\x00\x7f\u2028', "'a\\nb\\t\\x00\\x7f\\u2028'"),
      ('StrUnicode', '\u00e9\u4e2d', "'\u00e9\u4e2d'"),
      ('List', [1, 'a', None], "[1, 'a', None]"),
      ('TupleOne', (1,), '(1,)'),
      ('TupleEmpty', (), '()'),
      ('Tuple', (1, 2), '(1, 2)'),
      ('Dict', {'a': [1], 2: (3,)}, "{'a': [1], 2: (3,)}"),
      ('Class', Model, f'{__name__}.Model'),
      ('Enum', Mode.EVAL, f'{__name__}.Mode.EVAL'),
      ('Dtype', tf.bfloat16, 'tf.bfloat16'),
      ('Unsupported', b'x', "<b'x'>"),
      ('UnsupportedAngled', len, '<built-in function len>'),
  )
  def testFormatValue(self, value, text):
    self.assertEqual(params_text.FormatValue(value), text)

  def testMultiLineReprStaysOnOneLine(self):

    class TwoLines:

      def __repr__(self):
        return 'a\nb'

    self.assertEqual(params_text.FormatValue(TwoLines()), '<a\\nb>')


class ParseTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('None', 'None', None),
      ('True', ' True ', True),
      ('Int', '-12', -12),
      ('LeadingZeros', '007', 7),
      ('BigInt', '123456789012345678901234567890',
       123456789012345678901234567890),
      ('Float', '1.5', 1.5),
      ('FloatExp', '1E3', 1000.0),
      ('FloatDot', '.5', 0.5),
      ('PlusInf', '+inf', float('inf')),
      ('DoubleQuoted', '"a\'b"', "a'b"),
      ('Escapes', r"'\\\'\"\n\r\t\x41\u00e9\U0001F600'",
       '\\\'"\n\r\tA\u00e9\U0001f600'),
      ('List', '[1, [2], ]', [1, [2]]),
      ('Grouping', '(1)', 1),
      ('TupleOne', '(1,)', (1,)),
      ('TupleEmpty', '( )', ()),
      ('Dict', "{'a': {'b': (1, 2)}, 3: None, (1,): 2,}",
       {'a': {'b': (1, 2)}, 3: None, (1,): 2}),
      ('Comment', "[1, 2]  # [3]", [1, 2]),
      ('Name', 'a.b.C', DottedName('a.b.C')),
      ('NameInList', '[tf.int32, m.E.X]',
       [DottedName('tf.int32'), DottedName('m.E.X')]),
  )
  def testParseValue(self, text, value):
    self.assertEqual(params_text.ParseValue(text), value)

  @parameterized.named_parameters(
      ('Empty', '', 'missing value'),
      ('BareWord', 'relu', "bare word 'relu' is not a value"),
      ('Call', "__import__('os')", 'bare word'),
      ('CallDotted', "os.system('ls')", 'unexpected text after the value'),
      ('Lambda', 'lambda: 1', 'bare word'),
      ('Expression', '1 + 2', 'unexpected text after the value'),
      ('TwoValues', '1 2', 'unexpected text after the value'),
      ('DoubleComma', '[1,,2]', "unexpected ','"),
      ('Unclosed', '[1, 2', 'missing "]"'),
      ('Mismatched', '[1, 2)', 'expected "," or "]"'),
      ('ListKey', '{[1]: 2}', 'a dict key must be'),
      ('DuplicateKey', "{'a': 1, 'a': 2}", "duplicate dict key 'a'"),
      ('MissingColon', "{'a' 1}", 'expected ":"'),
      ('ReadOnly', '<function f>', 'for reading only'),
      ('Unterminated', "'abc", 'unterminated string'),
      ('BadEscape', r"'\q'", 'bad escape'),
      ('ShortHex', r"'\x4'", 'bad escape'),
      ('PastUnicode', r"'\U00110000'", 'past U+10FFFF'),
      ('TwoDots', '1.2.3', "unexpected '1'"),
      ('Underscores', '1_000', "unexpected '1'"),
      ('TooDeep', '[' * 101, 'deeper than 100'),
  )
  def testParseErrors(self, text, message):
    with self.assertRaises(ParamsTextError) as cm:
      params_text.ParseValue(text)
    self.assertIn(message, str(cm.exception))

  @parameterized.parameters(
      0.1, 1 / 3, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
      -0.0, 0.0, 1e16, 123456789.123, float('inf'), float('-inf'))
  def testFloatsAreExact(self, value):
    parsed = params_text.ParseValue(params_text.FormatValue(value))
    self.assertIsInstance(parsed, float)
    self.assertEqual(struct.pack('<d', parsed), struct.pack('<d', value))

  def testNanRoundTrips(self):
    self.assertTrue(math.isnan(params_text.ParseValue(
        params_text.FormatValue(float('nan')))))

  @parameterized.parameters(
      '', 'None', '1.5', '"', "'", '\\', '\\n', '\n\r\t', "'; x : 1",
      '\x00\x1f\x7f\x85\x9f', '\u2028\u2029', '\ud800\udfff',
      '\u00e9\u4e2d\U0001f600', '# comment', 'tf.float32', ' spaced ')
  def testStringsRoundTrip(self, value):
    text = params_text.FormatValue(value)
    self.assertLen(text.splitlines(), 1)
    self.assertEqual(params_text.ParseValue(text), value)


class ResolveTest(parameterized.TestCase):

  def testDtypesNeedNoImport(self):
    value = params_text.ResolveNames(
        [DottedName('tf.float32'), {'d': DottedName('tf.string')}],
        allow_import=False)
    self.assertEqual(value, [tf.float32, {'d': tf.string}])

  def testClassesAndMembers(self):
    value = params_text.ResolveNames(
        (DottedName(f'{__name__}.Model'), DottedName(f'{__name__}.Mode.EVAL'),
         DottedName('builtins.int'), DottedName('collections.abc.Mapping')),
        allow_import=True)
    self.assertEqual(value, (Model, Mode.EVAL, int, collections.abc.Mapping))

  @parameterized.named_parameters(
      ('NotAllowed', f'{__name__}.Model', False, 'only resolved for'),
      ('Function', 'os.path.join', True, 'is a function, not a class'),
      ('Module', 'os.path', True, 'is a module'),
      ('Dunder', 'builtins.int.__class__', True, 'dunder names'),
      ('Missing', f'{__name__}.Nope', True, "has no 'Nope'"),
      ('NoModule', 'no_such_module_xyz.Foo', True, 'no module found'),
      ('BadDtype', 'tf.nope', True, 'not a TensorFlow dtype'),
  )
  def testResolveErrors(self, path, allow_import, message):
    with self.assertRaises(ParamsTextError) as cm:
      params_text.ResolveNames(DottedName(path), allow_import)
    self.assertIn(message, str(cm.exception))

  @parameterized.named_parameters(
      ('None', None, True),
      ('Class', Model, True),
      ('Enum', Mode.TRAIN, True),
      ('EmptyList', [], True),
      ('EmptyDict', {}, True),
      ('ListOfClasses', [1, [Model]], True),
      ('DictOfMembers', {'a': Mode.EVAL}, True),
      ('Int', 3, False),
      ('Str', 'x', False),
      ('Dtype', tf.float32, False),
      ('ListOfInts', [1], False),
      ('ListOfNone', [None], False),
  )
  def testAllowsImport(self, current, expected):
    self.assertEqual(params_text.AllowsImport(current), expected)


class ValueFromTextTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('NoneTakesAny', None, '[1]', [1]),
      ('NoneEverywhere', 3, 'None', None),
      ('IntTakesFloat', 3, '0.5', 0.5),
      ('FloatTakesInt', 0.5, '3', 3),
      ('NumpyFloat', np.float32(1), '2.0', 2.0),
      ('ListTakesTuple', [1], '(2,)', (2,)),
      ('DictOfClasses', {'a': Model}, f"{{'b': {__name__}.Mode}}",
       {'b': Mode}),
      ('Dtype', tf.float32, 'tf.int8', tf.int8),
  )
  def testFits(self, current, text, expected):
    value = params_text.ValueFromText('k', current, text)
    self.assertEqual(value, expected)
    self.assertIs(type(value), type(expected))

  @parameterized.named_parameters(
      ('BoolForInt', 3, 'True', "'k' expects int (write a number"),
      ('IntForBool', True, '1', "'k' expects bool (write True or False)"),
      ('EnumForInt', 3, f'{__name__}.Mode.EVAL', 'only resolved for'),
      ('ClassForEnum', Mode.TRAIN, f'{__name__}.Model',
       f'expects Mode (write a member, e.g. {__name__}.Mode.TRAIN); '
       f"got class '{__name__}.Model'"),
      ('StrForDtype', tf.float32, "'float32'", 'expects a tf.DType'),
      ('FunctionValue', len, '3', 'which text cannot express'),
      ('Parse', 3, '[1', "bad value for 'k', which expects int"),
  )
  def testDoesNotFit(self, current, text, message):
    with self.assertRaises(ParamsTextError) as cm:
      params_text.ValueFromText('k', current, text)
    self.assertIn(message, str(cm.exception))

  @parameterized.named_parameters(
      ('Schedule', '1f1b', '1f1b'),
      ('Underscore', 'zb_v', 'zb_v'),
      ('Interleaved', 'interleaved_1f1b', 'interleaved_1f1b'),
      ('Identifier', 'gpipe', 'gpipe'),
      ('Path', '/tmp/my_table.csv', '/tmp/my_table.csv'),
      ('Dashes', 'train-00001-of-00010', 'train-00001-of-00010'),
      ('DottedName', 'my_table.csv', 'my_table.csv'),
      ('NotADtype', 'tf.records', 'tf.records'),
      ('Url', 'gs://bucket/train-*', 'gs://bucket/train-*'),
      ('Version', '1.2.3', '1.2.3'),
      ('Comma', 'dev,test', 'dev,test'),
      ('Token', '</s>', '</s>'),
      ('Unicode', '\u00e9t\u00e9', '\u00e9t\u00e9'),
      ('Spaces', ' \t gpipe  ', 'gpipe'),
      ('Comment', 'zb_v  # zero bubble', 'zb_v'),
  )
  def testBareWordForStr(self, text, expected):
    value = params_text.ValueFromText('k', 'gpipe', text)
    self.assertEqual(value, expected)
    self.assertIs(type(value), str)

  @parameterized.named_parameters(
      ('Quoted', "'1f1b'", '1f1b'),
      ('DoubleQuoted', '"zb_v"', 'zb_v'),
      ('WithSpace', "'a b'", 'a b'),
      ('LikeBool', "'True'", 'True'),
      ('LikeInt', "'12'", '12'),
      ('Empty', "''", ''),
      ('Hash', "'a # b'", 'a # b'),
      ('None', 'None', None),
  )
  def testQuotedForStr(self, text, expected):
    self.assertEqual(params_text.ValueFromText('k', 'gpipe', text), expected)

  @parameterized.named_parameters(
      ('Bool', 'True', "'k' expects str (write a quoted string, e.g. 'abc'); "
       "got bool 'True'"),
      ('Int', '12', "got int '12'"),
      ('Inf', 'inf', "got float 'inf'"),
      ('Dtype', 'tf.float32', "got DType 'tf.float32'"),
      ('TwoWords', 'a b', "bad value for 'k', which expects str"),
      ('List', '[a]', "bare word 'a' is not a value"),
      ('Call', "f('x')", "bad value for 'k'"),
  )
  def testStrStaysStrictForOtherText(self, text, message):
    with self.assertRaises(ParamsTextError) as cm:
      params_text.ValueFromText('k', 'gpipe', text)
    self.assertIn(message, str(cm.exception))
    self.assertNotIn('\n', str(cm.exception))

  @parameterized.named_parameters(
      ('Int', 3, '1f1b', 'int (write a number'),
      ('Float', 0.5, 'zb_v', 'float (write a number'),
      ('Bool', True, 'interleaved_1f1b', 'bool (write True or False)'),
      ('List', ['a'], '/tmp/my_table.csv', 'list (write e.g. [1, 2]'),
      ('None', None, 'gpipe', 'any value'),
      ('Dtype', tf.float32, 'float32', 'a tf.DType'),
      ('Enum', Mode.TRAIN, 'TRAIN', 'Mode (write a member'),
  )
  def testBareWordRefusedForOtherTypes(self, current, text, expects):
    with self.assertRaises(ParamsTextError) as cm:
      params_text.ValueFromText('k', current, f' {text} ')
    message = str(cm.exception)
    self.assertStartsWith(message, f"bad value for 'k', which expects "
                          f'{expects}')
    self.assertEndsWith(message, f': bare word {text!r} is not a value '
                        f'(quote a string: {text!r})')
    self.assertNotIn('\n', message)

  @parameterized.parameters(
      '1f1b', 'zb_v', '/tmp/my_table.csv', 'True', '12', 'None', 'tf.float32',
      ' spaced ', '', "it's", 'a # b', 'a\nb')
  def testStrRoundTrip(self, value):
    text = params_text.FormatValue(value)
    self.assertEqual(params_text.ValueFromText('k', 'gpipe', text), value)


if __name__ == '__main__':
  absltest.main()
