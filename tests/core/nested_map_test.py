"""Tests of NestedMap: a dict with attribute access for tensor structures."""

import collections
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

Point = collections.namedtuple('Point', ['y', 'x'])  # fields not sorted

_DICT_METHODS = sorted(
    n for n in dir(dict) if not n.startswith('__'))
_OWN_METHODS = ['Copy', 'DeepCopy', 'Flatten', 'FlattenItems', 'Pack',
                'Transform', 'Filter', 'DebugString', 'IsCompatible',
                'CheckKey']
_BAD_KEYS = ['a b', '1x', 'a-b', 'a.b', '', 3, None, ('a',)]


def _Sample() -> NestedMap:
  """A structure with every container kind, keys out of sorted order."""
  return NestedMap(
      z=1,
      a=NestedMap(q=[2, 3], b={'y': 4, 'x': 5}),
      m=(6, Point(y=7, x=8)),
      e=[NestedMap(k=9), 10])


class NestedMapAccessTest(tf.test.TestCase, parameterized.TestCase):

  def testAttributeAndItemAreTheSame(self):
    m = NestedMap(x=1)
    m.y = 2
    m['z'] = 3
    self.assertEqual(m['y'], 2)
    self.assertEqual(m.z, 3)
    self.assertEqual(m.x, m['x'])
    self.assertEqual(dict(m), {'x': 1, 'y': 2, 'z': 3})
    m.x = 10
    self.assertEqual(m['x'], 10)
    del m.y
    self.assertNotIn('y', m)
    del m['z']
    self.assertEqual(dict(m), {'x': 10})
    # Attributes live in the dict, not in the instance __dict__.
    self.assertEqual(vars(m), {})

  def testIsADict(self):
    m = NestedMap({'a': 1}, b=2)
    self.assertIsInstance(m, dict)
    self.assertLen(m, 2)
    self.assertEqual(sorted(m.keys()), ['a', 'b'])
    self.assertEqual(sorted(m.items()), [('a', 1), ('b', 2)])
    self.assertEqual(m.get('c', 7), 7)
    self.assertEqual(m.pop('a'), 1)
    self.assertEqual(m, {'b': 2})
    m.update(c=3)
    m.update({'d': 4})
    m.update([('e', 5)])
    self.assertEqual(m.setdefault('b', 99), 2)
    self.assertEqual(m.setdefault('f', 6), 6)
    self.assertEqual(dict(m), {'b': 2, 'c': 3, 'd': 4, 'e': 5, 'f': 6})
    self.assertIn('c', m)

  def testMissingAttributeSuggestsCloseKey(self):
    m = NestedMap(paddings=1, vec=2)
    with self.assertRaisesRegex(AttributeError,
                                "no key 'padings'.*did you mean 'paddings'"):
      _ = m.padings
    # hasattr / getattr default rely on AttributeError, not KeyError.
    self.assertFalse(hasattr(m, 'zzz'))
    self.assertIsNone(getattr(m, 'zzz', None))
    with self.assertRaises(AttributeError):
      del m.zzz

  def testMissingAttributeWithoutCloseKeyHasNoSuggestion(self):
    with self.assertRaises(AttributeError) as ctx:
      _ = NestedMap(vec=1).completely_different
    self.assertNotIn('did you mean', str(ctx.exception))

  @parameterized.parameters(*(_DICT_METHODS + _OWN_METHODS))
  def testReservedKeyRejectedEverywhere(self, key):
    ways = {
        'constructor': lambda: NestedMap({key: 1}),
        'kwargs': lambda: NestedMap(**{key: 1}),
        'setitem': lambda: NestedMap().__setitem__(key, 1),
        'setattr': lambda: setattr(NestedMap(), key, 1),
        'update': lambda: NestedMap().update({key: 1}),
        'update_kwargs': lambda: NestedMap().update(**{key: 1}),
        'setdefault': lambda: NestedMap().setdefault(key, 1),
    }
    for way, fn in ways.items():
      with self.subTest(way=way):
        with self.assertRaisesRegex(ValueError, f"'{key}'.*reserved"):
          fn()

  def testReservedKeyRejectedByInPlaceOr(self):
    m = NestedMap(a=1)
    with self.assertRaisesRegex(ValueError, 'reserved'):
      m |= {'keys': 2}
    self.assertEqual(dict(m), {'a': 1})

  def testEveryClassAttributeIsReserved(self):
    # A key named like a class attribute would be stored in the dict but
    # `m.<key>` would still return the class attribute.
    for name in dir(NestedMap):
      if not name.isidentifier():
        continue
      with self.subTest(name=name):
        with self.assertRaises(ValueError):
          NestedMap()[name] = 1

  @parameterized.parameters(*[(k,) for k in _BAD_KEYS])
  def testNonIdentifierKeyRejectedEverywhere(self, key):
    ways = {
        'constructor': lambda: NestedMap({key: 1}),
        'constructor_pairs': lambda: NestedMap([(key, 1)]),
        'setitem': lambda: NestedMap().__setitem__(key, 1),
        'update': lambda: NestedMap().update({key: 1}),
        'setdefault': lambda: NestedMap().setdefault(key, 1),
    }
    if isinstance(key, str):
      ways['setattr'] = lambda: setattr(NestedMap(), key, 1)
    for way, fn in ways.items():
      with self.subTest(way=way):
        with self.assertRaisesRegex(ValueError, 'not a Python identifier'):
          fn()

  def testRejectedUpdateLeavesMapUsable(self):
    m = NestedMap(a=1)
    with self.assertRaises(ValueError):
      m.update({'b c': 2})
    self.assertNotIn('b c', m)
    m.b = 2
    self.assertEqual(dict(m), {'a': 1, 'b': 2})


class NestedMapFlattenPackTest(tf.test.TestCase, parameterized.TestCase):

  def testFlattenMatchesTfNest(self):
    m = _Sample()
    self.assertEqual(m.Flatten(), tf.nest.flatten(m))
    # Sorted keys; namedtuple fields keep their declared order (y, x).
    self.assertEqual(m.Flatten(), [5, 4, 2, 3, 9, 10, 6, 7, 8, 1])

  def testFlattenMatchesTfNestWithTensors(self):
    m = NestedMap(b=tf.constant(1.0), a=[tf.constant(2.0), {'c': None}])
    self.assertEqual([id(x) for x in m.Flatten()],
                     [id(x) for x in tf.nest.flatten(m)])

  def testFlattenItemsPaths(self):
    self.assertEqual(
        [k for k, _ in _Sample().FlattenItems()],
        ['a.b.x', 'a.b.y', 'a.q[0]', 'a.q[1]', 'e[0].k', 'e[1]', 'm[0]',
         'm[1][0]', 'm[1][1]', 'z'])
    self.assertEqual(
        NestedMap(a=NestedMap(b=[7])).FlattenItems(), [('a.b[0]', 7)])

  def testEmptyContainersHaveNoLeaves(self):
    m = NestedMap(a=[], b=NestedMap(), c={}, d=())
    self.assertEqual(m.Flatten(), [])
    self.assertEqual(tf.nest.flatten(m), [])
    self.assertEqual(m.Pack([]), m)

  def testPackRoundTripKeepsTypes(self):
    m = _Sample()
    leaves = [f'leaf{i}' for i in range(len(m.Flatten()))]
    packed = m.Pack(leaves)
    self.assertEqual(packed.Flatten(), leaves)
    self.assertEqual(packed, tf.nest.pack_sequence_as(m, leaves))
    self.assertIsInstance(packed, NestedMap)
    self.assertIsInstance(packed.a, NestedMap)
    self.assertIsInstance(packed.e[0], NestedMap)
    self.assertIs(type(packed.a.b), dict)
    self.assertIsInstance(packed.a.q, list)
    self.assertIsInstance(packed.m, tuple)
    self.assertIsInstance(packed.m[1], Point)
    self.assertEqual(packed.m[1].y, 'leaf7')
    self.assertEqual(packed.a.b['x'], 'leaf0')
    self.assertEqual(packed.z, 'leaf9')
    # Pack builds a new structure; the original is untouched.
    self.assertEqual(m.z, 1)

  @parameterized.named_parameters(
      ('TooFew', 9), ('NoLeaves', 0), ('TooMany', 11), ('FarTooMany', 20))
  def testPackWrongCountIsValueError(self, count):
    with self.assertRaisesRegex(ValueError, f'got {count} leaves.* has 10'):
      _Sample().Pack(range(count))

  def testTransform(self):
    m = NestedMap(a=tf.constant([1.0, 2.0]), b=[tf.constant(3.0)],
                  c=NestedMap(d=tf.constant(4.0)))
    t = m.Transform(lambda x: x * 10)
    self.assertIsInstance(t, NestedMap)
    self.assertIsInstance(t.c, NestedMap)
    self.assertAllEqual(t.a, [10.0, 20.0])
    self.assertAllEqual(t.b[0], 30.0)
    self.assertAllEqual(t.c.d, 40.0)
    self.assertAllEqual(m.c.d, 4.0)  # original unchanged

  def testFilterDropsLeavesAndEmptiedContainers(self):
    m = NestedMap(
        a=1, b='x', c=NestedMap(d='y', e=NestedMap(f='z')),
        g=[2, 'w', 3], h=['v'], i=('u', 4), j={'k': 't'})
    kept = m.Filter(lambda v: isinstance(v, int))
    self.assertEqual(kept, {'a': 1, 'g': [2, 3], 'i': (4,)})
    self.assertIsInstance(kept, NestedMap)
    self.assertNotIn('c', kept)
    self.assertNotIn('h', kept)
    self.assertNotIn('j', kept)
    self.assertEqual(m.Filter(lambda v: False), NestedMap())
    self.assertIsInstance(m.Filter(lambda v: False), NestedMap)

  def testFilterKeepsNestedTypes(self):
    m = NestedMap(a=NestedMap(b=1, c=2), d=[NestedMap(e=3)])
    kept = m.Filter(lambda v: v != 2)
    self.assertIsInstance(kept.a, NestedMap)
    self.assertIsInstance(kept.d[0], NestedMap)
    self.assertEqual(kept, {'a': {'b': 1}, 'd': [{'e': 3}]})

  def testFilterKeepingEverythingIsIdentityOnNamedTuples(self):
    m = NestedMap(p=Point(y=1, x=2), q=3)
    kept = m.Filter(lambda v: True)
    self.assertEqual(kept, m)
    self.assertIsInstance(kept.p, Point)

  def testCopyIsNewStructureWithSameLeaves(self):
    leaf = tf.constant([1.0])
    m = NestedMap(a=NestedMap(b=leaf), c=[leaf, {'d': leaf}])
    c = m.Copy()
    self.assertEqual(c, m)
    self.assertIsInstance(c, NestedMap)
    self.assertIsNot(c, m)
    self.assertIsNot(c.a, m.a)
    self.assertIsNot(c.c, m.c)
    self.assertIsNot(c.c[1], m.c[1])
    self.assertIs(c.a.b, leaf)
    self.assertIs(c.c[1]['d'], leaf)
    c.a.b = 5
    c.c.append(6)
    self.assertIs(m.a.b, leaf)
    self.assertLen(m.c, 2)
    self.assertIs(m.DeepCopy().a.b, leaf)

  def testIsCompatible(self):
    m = NestedMap(a=1, b=[2, 3], c=NestedMap(d=4))
    self.assertTrue(m.IsCompatible(m.Transform(str)))
    self.assertTrue(m.IsCompatible({'c': {'d': 'x'}, 'b': [0, 0], 'a': 0}))
    self.assertFalse(m.IsCompatible(NestedMap(a=1, b=[2], c=NestedMap(d=4))))
    self.assertFalse(m.IsCompatible(NestedMap(a=1, b=[2, 3])))
    self.assertFalse(
        m.IsCompatible(NestedMap(a=1, b=[2, 3], c=NestedMap(e=4))))
    self.assertFalse(
        m.IsCompatible(NestedMap(a=1, b=[2, 3], c=NestedMap(d=[4]))))
    self.assertFalse(m.IsCompatible([1, 2, 3, 4]))

  def testDebugString(self):
    m = NestedMap(zz=1, a=NestedMap(b=[2, 'three']))
    lines = m.DebugString().split('\n')
    self.assertEqual([ln.split() for ln in lines],
                     [['a.b[0]', '2'], ['a.b[1]', 'three'], ['zz', '1']])
    # Values line up in one column.
    self.assertLen({ln.rindex(' ') for ln in lines}, 1)
    self.assertEqual(NestedMap().DebugString(), '')


class NestedMapTfTest(tf.test.TestCase):

  def testMapStructureReturnsNestedMapsAtEveryLevel(self):
    m = NestedMap(a=NestedMap(b=1.0), c=[NestedMap(d=2.0)], e={'f': 3.0})
    r = tf.nest.map_structure(lambda x: x + 1, m)
    self.assertIsInstance(r, NestedMap)
    self.assertIsInstance(r.a, NestedMap)
    self.assertIsInstance(r.c[0], NestedMap)
    self.assertIs(type(r.e), dict)
    self.assertEqual(r.a.b, 2.0)
    self.assertEqual(r.c[0].d, 3.0)
    tf.nest.assert_same_structure(m, r)

  def testPackSequenceAsMatchesPack(self):
    m = _Sample()
    leaves = list(range(100, 110))
    self.assertEqual(tf.nest.pack_sequence_as(m, leaves), m.Pack(leaves))

  def testTfFunctionArgumentAndReturnValue(self):
    traces = []

    @tf.function(autograph=False)
    def Fn(inputs):
      traces.append(1)
      self.assertIsInstance(inputs, NestedMap)
      return NestedMap(
          y=inputs.x * 2.0,
          sub=NestedMap(z=inputs.sub.w + inputs.x))

    m = NestedMap(x=tf.constant(3.0), sub=NestedMap(w=tf.constant(4.0)))
    out = Fn(m)
    self.assertIsInstance(out, NestedMap)
    self.assertIsInstance(out.sub, NestedMap)
    self.assertAllEqual(out.y, 6.0)
    self.assertAllEqual(out.sub.z, 7.0)
    # Same structure, new values: no retrace.
    out = Fn(NestedMap(x=tf.constant(1.0), sub=NestedMap(w=tf.constant(1.0))))
    self.assertAllEqual(out.sub.z, 2.0)
    self.assertLen(traces, 1)

  def testGradientThroughNestedMap(self):
    v = tf.Variable(2.0)
    with tf.GradientTape() as tape:
      m = NestedMap(a=v * v).Transform(lambda t: t * 3.0)
      loss = m.a
    self.assertAllEqual(tape.gradient(loss, v), 12.0)


if __name__ == '__main__':
  absltest.main()
