"""Tests of BaseLayer: eager construction, theta, paths, seeds, modes."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import devices  # noqa: E402
from lingvo_pipe.core import hyperparams  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

devices.SplitCpu(4)  # before any TensorFlow op

BaseLayer = base_layer.BaseLayer
WeightInit = base_layer.WeightInit
WeightParams = base_layer.WeightParams


class _Leaf(BaseLayer):
  """y = x * w, with w of shape [dim]."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 3, 'Size of the last axis.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', WeightParams([self.params.dim]))

  def FProp(self, theta, x):
    return x * theta.w


class _Tree(BaseLayer):
  """y = kids_1(kids_0(child(x))) * w; every part is [batch, dim].

  Children are `child` and the list `kids`; `reverse` creates them (and w)
  in the opposite order, with the same paths.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 3, 'Size of the last axis.')
    p.Define('child_tpl', _Leaf.Params(), 'Params of `child`.')
    p.Define('num_kids', 2, 'Number of layers in `kids`.')
    p.Define('reverse', False, 'Create w, child and kids in reverse order.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    steps = [
        ('w', lambda: self.CreateVariable('w', WeightParams([p.dim]))),
        ('child', lambda: self.CreateChild('child', p.child_tpl)),
        ('kids', lambda: self.CreateChildren(
            'kids', [_Leaf.Params().Set(dim=p.dim)] * p.num_kids)),
    ]
    self.creation_order = []
    for name, step in (reversed(steps) if p.reverse else steps):
      step()
      self.creation_order.append(name)

  def FProp(self, theta, x):
    h = self.child.FProp(theta.child, x)
    for kid, kid_theta in zip(self.kids, theta.kids):
      h = kid.FProp(kid_theta, h)
    return h * theta.w


class _Naming(BaseLayer):
  """Creates variables/children with the names listed in `p.ops`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('ops', [], 'List of (kind, name) to create in __init__.')
    return p

  def __init__(self, params):
    super().__init__(params)
    for kind, name in self.params.ops:
      if kind == 'var':
        self.CreateVariable(name, WeightParams([1]))
      elif kind == 'acc':
        self.CreateAccumulator(name, [1])
      elif kind == 'child':
        self.CreateChild(name, _Leaf.Params())
      elif kind == 'children':
        self.CreateChildren(name, [_Leaf.Params()] * 2)
      else:
        raise AssertionError(kind)


class _Wrap(BaseLayer):
  """y = inner(x): wraps a _Leaf created with `seed_name`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('seed_name', None, "CreateChild's seed_name for `inner`.")
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('inner', _Leaf.Params(), seed_name=self.params.seed_name)

  def FProp(self, theta, x):
    return self.inner.FProp(theta.inner, x)


_UPDATE_CALLS = []


class _Stats(BaseLayer):
  """y = x; counts its inputs in an accumulator, with `depth` sub-layers."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('depth', 0, 'Levels of _Stats children below this one.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', WeightParams([2]))
    self.CreateVariable('seen', WeightParams(
        [], WeightInit.Constant(0.0), trainable=False))
    self.CreateAccumulator('count', [])
    if p.depth:
      self.CreateChildren('sub', [p.Copy().Set(depth=p.depth - 1)] * 2)

  def FProp(self, theta, x):
    if self.update_stats:
      self.accumulators.count.assign_add(1.0)
    for sub, sub_theta in zip(getattr(self, 'sub', []), theta.get('sub', [])):
      x = sub.FProp(sub_theta, x)
    return x

  def _UpdateOwnStats(self):
    _UPDATE_CALLS.append(self.path)
    self.vars.seen.assign_add(self.accumulators.count)
    self.accumulators.count.assign(0.0)
    return [self.path]


def _TreeParams(**kwargs):
  return _Tree.Params().Set(name='root', **kwargs)


def _Values(layer):
  return {k: v.numpy() for k, v in layer.VariablesByPath().items()}


_TREE_PATHS = ['root/child/w', 'root/kids_0/w', 'root/kids_1/w', 'root/w']


class ParamsAndConstructionTest(tf.test.TestCase, parameterized.TestCase):

  def testParamsHasBaseFields(self):
    p = BaseLayer.Params()
    self.assertIsInstance(p, hyperparams.InstantiableParams)
    self.assertIs(p.cls, BaseLayer)
    self.assertEqual(p.name, '')
    for key in ('dtype', 'fprop_dtype', 'random_seed', 'params_init'):
      self.assertIsNone(p.Get(key), key)
    self.assertIs(_Leaf.Params().cls, _Leaf)
    self.assertEqual(_Leaf.Params().dim, 3)

  def testInstantiateBuilds(self):
    layer = _TreeParams().Instantiate()
    self.assertIsInstance(layer, _Tree)
    self.assertEqual(layer.path, 'root')
    self.assertIsInstance(layer.child, _Leaf)
    self.assertEqual(layer.child.path, 'root/child')
    self.assertLen(layer.kids, 2)
    self.assertEqual([k.path for k in layer.kids],
                     ['root/kids_0', 'root/kids_1'])
    self.assertEqual(layer.params.dtype, tf.float32)
    self.assertEqual(layer.fprop_dtype, tf.float32)
    self.assertEqual(layer.params.random_seed, 0)
    self.assertEqual(layer.params.params_init, WeightInit.Xavier(1.0))
    self.assertEqual([x.path for x in layer.Layers()],
                     ['root', 'root/child', 'root/kids_0', 'root/kids_1'])

  def testMissingNameRaises(self):
    with self.assertRaisesRegex(ValueError, '_Tree params have no name'):
      _Tree.Params().Instantiate()

  def testNameWithSlashRaises(self):
    with self.assertRaisesRegex(ValueError, "'a/b' must not contain '/'"):
      _Tree.Params().Set(name='a/b').Instantiate()

  def testCallingClassWithoutParamsRaises(self):
    with self.assertRaisesRegex(TypeError, r'Params\(\).Instantiate'):
      _Leaf('root')

  def testVariablesCreatedEagerlyInInit(self):
    layer = _TreeParams().Instantiate()
    leaves = layer.vars.Flatten()
    self.assertLen(leaves, 4)
    for v in leaves:
      self.assertIsInstance(v, tf.Variable)
      self.assertTrue(np.all(np.isfinite(v.numpy())))
      self.assertTrue(np.any(v.numpy() != 0))

  def testThetaMirrorsTheTree(self):
    layer = _TreeParams().Instantiate()
    theta = layer.theta
    self.assertIsInstance(theta, NestedMap)
    self.assertEqual(sorted(theta), ['child', 'kids', 'w'])
    self.assertEqual([k for k, _ in theta.FlattenItems()],
                     ['child.w', 'kids[0].w', 'kids[1].w', 'w'])
    self.assertIs(theta.child.w, layer.child.theta.w)
    self.assertIs(theta.kids[1].w, layer.kids[1].theta.w)
    self.assertIsNot(theta.kids[0].w, theta.kids[1].w)
    self.assertEqual(theta.child.w.name, 'root/child/w:0')
    self.assertEqual(theta.kids[1].w.name, 'root/kids_1/w:0')
    self.assertEqual(theta.w.name, 'root/w:0')
    # vars is the same tree of the same variables.
    self.assertEqual([id(v) for v in layer.vars.Flatten()],
                     [id(v) for v in theta.Flatten()])
    # Changing the returned map does not change the layer.
    theta.w = None
    self.assertIsInstance(layer.theta.w, tf.Variable)

  def testVariablesByPath(self):
    layer = _TreeParams().Instantiate()
    by_path = layer.VariablesByPath()
    self.assertEqual(sorted(by_path), _TREE_PATHS)
    self.assertIs(by_path['root/kids_0/w'], layer.theta.kids[0].w)
    self.assertEqual(sorted(layer.child.VariablesByPath()), ['root/child/w'])

  def testVariablesByPathIgnoresNameScopes(self):
    # Paths are the checkpoint keys: an enclosing tf.name_scope must not
    # change them.
    with tf.name_scope('outer'):
      layer = _TreeParams().Instantiate()
    self.assertEqual(sorted(layer.VariablesByPath()), _TREE_PATHS)

  def testCreateChildCopiesParams(self):
    p = _TreeParams()
    layer = p.Instantiate()
    p.child_tpl.dim = 7
    p.dim = 5
    p.name = 'changed'
    self.assertEqual(layer.child.params.dim, 3)
    self.assertEqual(layer.params.dim, 3)
    self.assertEqual(layer.path, 'root')
    self.assertEqual(layer.theta.child.w.shape, [3])
    # The template keeps its own (empty) name; the child's copy is named.
    self.assertEqual(p.child_tpl.name, '')
    self.assertEqual(layer.child.params.name, 'child')
    self.assertFalse(p.IsFrozen())

  def testParamsFrozenAfterConstruction(self):
    layer = _TreeParams().Instantiate()
    for sub in layer.Layers():
      self.assertTrue(sub.params.IsFrozen(), sub.path)
    with self.assertRaises(hyperparams.FrozenParamsError):
      layer.child.params.dim = 5
    with self.assertRaises(hyperparams.FrozenParamsError):
      layer.params.Set(dim=5)
    with self.assertRaises(hyperparams.FrozenParamsError):
      layer.params.child_tpl.dim = 5
    with self.assertRaises(hyperparams.FrozenParamsError):
      layer.params.params_init.scale = 5.0

  def testInheritsFromParent(self):
    init = WeightInit.Constant(0.5)
    layer = _TreeParams(dtype=tf.float64, random_seed=7,
                        params_init=init).Instantiate()
    for sub in layer.Layers():
      self.assertEqual(sub.params.dtype, tf.float64, sub.path)
      self.assertEqual(sub.params.random_seed, 7, sub.path)
      self.assertEqual(sub.params.params_init, init, sub.path)
      self.assertEqual(sub.fprop_dtype, tf.float64, sub.path)
    for v in layer.vars.Flatten():
      self.assertEqual(v.dtype, tf.float64)
      self.assertAllEqual(v, [0.5] * 3)

  def testChildSettingsOverrideParent(self):
    p = _TreeParams(dtype=tf.float64, random_seed=7,
                    params_init=WeightInit.Constant(0.5),
                    fprop_dtype=tf.float64)
    p.child_tpl.Set(dtype=tf.float32, random_seed=8,
                    params_init=WeightInit.Constant(2.0),
                    fprop_dtype=tf.bfloat16)
    layer = p.Instantiate()
    self.assertEqual(layer.child.params.dtype, tf.float32)
    self.assertEqual(layer.child.params.random_seed, 8)
    self.assertEqual(layer.child.fprop_dtype, tf.bfloat16)
    self.assertEqual(layer.theta.child.w.dtype, tf.float32)
    self.assertAllEqual(layer.theta.child.w, [2.0] * 3)
    self.assertEqual(layer.theta.kids[0].w.dtype, tf.float64)
    self.assertAllEqual(layer.theta.kids[0].w, [0.5] * 3)

  def testWeightParamsOverrideLayerDefaults(self):

    class Mixed(BaseLayer):

      def __init__(self, params):
        super().__init__(params)
        self.CreateVariable('a', WeightParams([2]))
        self.CreateVariable('b', WeightParams(
            [2], WeightInit.Constant(3.0), tf.float64, trainable=False))

    layer = Mixed.Params().Set(
        name='m', params_init=WeightInit.Constant(1.0)).Instantiate()
    self.assertAllEqual(layer.theta.a, [1.0, 1.0])
    self.assertEqual(layer.theta.a.dtype, tf.float32)
    self.assertTrue(layer.theta.a.trainable)
    self.assertAllEqual(layer.theta.b, [3.0, 3.0])
    self.assertEqual(layer.theta.b.dtype, tf.float64)
    self.assertFalse(layer.theta.b.trainable)

  @parameterized.parameters(1, 2)
  def testVariablesOnTheDeviceTheyAreBuiltUnder(self, index):
    device = f'/device:CPU:{index}'
    with tf.device(device):
      layer = _TreeParams().Instantiate()
    for path, v in layer.VariablesByPath().items():
      self.assertTrue(v.device.endswith(device), (path, v.device))

  def testBadShapeRaises(self):

    class BadShape(BaseLayer):

      def __init__(self, params):
        super().__init__(params)
        self.CreateVariable('w', WeightParams([2, -1]))

    with self.assertRaisesRegex(ValueError, r"'b/w' has shape \[2, -1\]"):
      BadShape.Params().Set(name='b').Instantiate()


class InitialValueTest(tf.test.TestCase, parameterized.TestCase):

  def testSameModelTwiceSameValues(self):
    a = _Values(_TreeParams().Instantiate())
    b = _Values(_TreeParams().Instantiate())
    self.assertEqual(sorted(a), _TREE_PATHS)
    for path in _TREE_PATHS:
      np.testing.assert_array_equal(a[path], b[path], err_msg=path)

  def testValuesIndependentOfDevice(self):
    with tf.device('/device:CPU:0'):
      a = _Values(_TreeParams(dtype=tf.float64).Instantiate())
    with tf.device('/device:CPU:3'):
      b = _Values(_TreeParams(dtype=tf.float64).Instantiate())
    for path in _TREE_PATHS:
      np.testing.assert_array_equal(a[path], b[path], err_msg=path)

  def testValuesIndependentOfConstructionOrder(self):
    a = _TreeParams().Instantiate()
    b = _TreeParams(reverse=True).Instantiate()
    self.assertEqual(a.creation_order, ['w', 'child', 'kids'])
    self.assertEqual(b.creation_order, ['kids', 'child', 'w'])
    a, b = _Values(a), _Values(b)
    self.assertEqual(sorted(b), _TREE_PATHS)
    for path in _TREE_PATHS:
      np.testing.assert_array_equal(a[path], b[path], err_msg=path)

  def testDifferentSeedDifferentValues(self):
    a = _Values(_TreeParams(random_seed=1).Instantiate())
    b = _Values(_TreeParams(random_seed=2).Instantiate())
    for path in _TREE_PATHS:
      self.assertFalse(np.any(a[path] == b[path]), path)

  def testDifferentPathsDifferentValues(self):
    values = _Values(_TreeParams().Instantiate())
    for i, p1 in enumerate(_TREE_PATHS):
      for p2 in _TREE_PATHS[i + 1:]:
        self.assertFalse(np.any(values[p1] == values[p2]), (p1, p2))
    renamed = _Values(_Tree.Params().Set(name='other').Instantiate())
    self.assertFalse(
        np.any(renamed['other/child/w'] == values['root/child/w']))

  def testSeedPathFollowsPathByDefault(self):
    layer = _TreeParams().Instantiate()
    self.assertEqual([x.seed_path for x in layer.Layers()],
                     [x.path for x in layer.Layers()])

  def testSeedNameEmptyStartsLikeTheUnwrappedLayer(self):
    leaf = _Leaf.Params().Set(name='root').Instantiate()
    wrap = _Wrap.Params().Set(name='root', seed_name='').Instantiate()
    self.assertEqual(wrap.inner.path, 'root/inner')
    self.assertEqual(wrap.inner.seed_path, 'root')
    self.assertEqual(sorted(wrap.VariablesByPath()), ['root/inner/w'])
    self.assertAllEqual(wrap.theta.inner.w, leaf.theta.w)
    default = _Wrap.Params().Set(name='root').Instantiate()
    self.assertEqual(default.inner.seed_path, 'root/inner')
    self.assertNotAllClose(default.theta.inner.w, leaf.theta.w)

  def testSeedNameReplacesTheChildName(self):
    wrap = _Wrap.Params().Set(name='root', seed_name='kids_1').Instantiate()
    tree = _TreeParams().Instantiate()
    self.assertEqual(wrap.inner.seed_path, 'root/kids_1')
    self.assertAllEqual(wrap.theta.inner.w, tree.theta.kids[1].w)

  def testPathSeedIsAPureFunction(self):
    seed = base_layer.PathSeed(3, 'root/child/w')
    self.assertEqual(seed.dtype, tf.int64)
    self.assertEqual(seed.shape, [2])
    self.assertAllEqual(seed, base_layer.PathSeed(3, 'root/child/w'))
    self.assertNotAllEqual(seed, base_layer.PathSeed(4, 'root/child/w'))
    self.assertNotAllEqual(seed, base_layer.PathSeed(3, 'root/child/v'))

  def _Init(self, init, shape, dtype=tf.float64, path='p/w', seed=0):
    return base_layer.InitialValue(
        init, shape, dtype, base_layer.PathSeed(seed, path)).numpy()

  @parameterized.named_parameters(
      ('Matrix', [300, 200], 1.0, 300, 200),
      ('MatrixScaled', [300, 200], 2.0, 300, 200),
      ('Conv', [3, 3, 16, 32], 1.0, 144, 288),
      ('Vector', [5000], 0.5, 5000, 5000))
  def testXavier(self, shape, scale, fan_in, fan_out):
    x = self._Init(WeightInit.Xavier(scale), shape)
    limit = scale * np.sqrt(6.0 / (fan_in + fan_out))
    self.assertEqual(list(x.shape), shape)
    self.assertLessEqual(np.abs(x).max(), limit)
    self.assertGreater(np.abs(x).max(), 0.98 * limit)
    self.assertLess(abs(x.mean()), 0.05 * limit)
    self.assertAllClose(x.std(), limit / np.sqrt(3.0), rtol=0.05)

  def testUniform(self):
    x = self._Init(WeightInit.Uniform(0.3), [100, 100])
    self.assertLessEqual(np.abs(x).max(), 0.3)
    self.assertGreater(np.abs(x).max(), 0.29)
    self.assertGreater(x.max(), 0.29)
    self.assertLess(x.min(), -0.29)
    self.assertAllClose(x.std(), 0.3 / np.sqrt(3.0), rtol=0.05)

  def testGaussian(self):
    x = self._Init(WeightInit.Gaussian(2.0), [100, 100])
    self.assertLess(abs(x.mean()), 0.1)
    self.assertAllClose(x.std(), 2.0, rtol=0.05)
    self.assertGreater(np.abs(x).max(), 2.0 * 3)  # unbounded, not uniform

  @parameterized.parameters(([400, 50], 400), ([2, 2, 100, 10], 400))
  def testGaussianSqrtFanIn(self, shape, fan_in):
    x = self._Init(WeightInit.GaussianSqrtFanIn(1.5), shape)
    self.assertAllClose(x.std(), 1.5 / np.sqrt(fan_in), rtol=0.05)
    self.assertLess(abs(x.mean()), 0.1 * 1.5 / np.sqrt(fan_in))

  @parameterized.parameters(tf.float32, tf.float64, tf.bfloat16)
  def testConstant(self, dtype):
    x = base_layer.InitialValue(WeightInit.Constant(0.25), [3, 4], dtype,
                                base_layer.PathSeed(0, 'p/w'))
    self.assertEqual(x.dtype, dtype)
    self.assertAllEqual(tf.cast(x, tf.float64), np.full([3, 4], 0.25))

  def testScalarShape(self):
    x = self._Init(WeightInit.Xavier(1.0), [])
    self.assertEqual(x.shape, ())
    self.assertLessEqual(abs(float(x)), np.sqrt(3.0))

  def testUnknownMethodRaises(self):
    init = WeightInit.Gaussian(1.0).Set(method='orthogonal')
    with self.assertRaisesRegex(ValueError,
                                "Unknown WeightInit method 'orthogonal'"):
      self._Init(init, [2, 2])

  def testUnknownMethodRaisesAtConstruction(self):
    p = _TreeParams(params_init=WeightInit.Gaussian().Set(method='bogus'))
    with self.assertRaisesRegex(ValueError, "'bogus'"):
      p.Instantiate()


class FPropTest(tf.test.TestCase):

  def _Layer(self):
    return _TreeParams(dtype=tf.float64).Instantiate()

  def testFPropDefaultThetaEqualsFPropOfTheta(self):
    layer = self._Layer()
    x = tf.constant([[1.0, -2.0, 3.0]], tf.float64)
    expected = x.numpy()
    for v in layer.vars.Flatten():
      expected = expected * v.numpy()
    self.assertAllEqual(layer.FPropDefaultTheta(x), expected)
    self.assertAllEqual(layer.FProp(layer.theta, x), expected)

  def testFPropIsAPureFunctionOfTheta(self):
    layer = self._Layer()
    before = _Values(layer)
    x = tf.constant([[1.0, -2.0, 3.0], [0.5, 0.25, 4.0]], tf.float64)
    y = layer.FPropDefaultTheta(x)
    doubled = layer.theta.Transform(lambda v: v * 2.0)
    # Four factors, each doubled: exactly 16 times the output.
    self.assertAllEqual(layer.FProp(doubled, x), 16.0 * y)
    # Replacing one child's theta changes only its factor.
    one_kid = layer.theta
    one_kid.kids[1] = NestedMap(w=tf.ones([3], tf.float64))
    c, k0, _, w = [v.numpy() for v in layer.vars.Flatten()]
    self.assertAllEqual(layer.FProp(one_kid, x), x.numpy() * c * k0 * w)
    self.assertNotAllClose(layer.FProp(one_kid, x), y)
    # The variables are untouched.
    after = _Values(layer)
    for path in _TREE_PATHS:
      np.testing.assert_array_equal(before[path], after[path], err_msg=path)
    self.assertAllEqual(layer.FPropDefaultTheta(x), y)

  def testFPropInTfFunctionWithThetaArgument(self):
    layer = self._Layer()
    fprop = tf.function(layer.FProp, autograph=False)
    x = tf.constant([[1.0, 2.0, 3.0]], tf.float64)
    theta = layer.theta.Transform(tf.convert_to_tensor)
    self.assertAllEqual(fprop(theta, x), layer.FPropDefaultTheta(x))
    zeros = theta.Transform(tf.zeros_like)
    self.assertAllEqual(fprop(zeros, x), tf.zeros([1, 3], tf.float64))

  def testBaseFPropRaises(self):
    layer = BaseLayer.Params().Set(name='b').Instantiate()
    with self.assertRaisesRegex(NotImplementedError, 'BaseLayer must'):
      layer.FProp(layer.theta, tf.zeros([1]))
    with self.assertRaises(NotImplementedError):
      layer.FPropDefaultTheta(tf.zeros([1]))

  def testFPropMetaDefaultRaises(self):
    with self.assertRaisesRegex(NotImplementedError,
                                "_Tree has no FPropMeta.*cost='params'"):
      _Tree.FPropMeta(_TreeParams(), [2, 3])


class SealingAndNamesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('Variable', lambda x: x.CreateVariable('late', WeightParams([1]))),
      ('Accumulator', lambda x: x.CreateAccumulator('late', [1])),
      ('Child', lambda x: x.CreateChild('late', _Leaf.Params())),
      ('Children', lambda x: x.CreateChildren('late', [_Leaf.Params()])),
      ('ChildOfChild',
       lambda x: x.child.CreateVariable('late', WeightParams([1]))))
  def testCreatingAfterInitRaises(self, create):
    layer = _TreeParams().Instantiate()
    before = sorted(layer.VariablesByPath())
    with self.assertRaisesRegex(
        RuntimeError, r"'root(/child)?' created .* 'late' outside __init__"):
      create(layer)
    self.assertEqual(sorted(layer.VariablesByPath()), before)
    self.assertNotIn('late', layer.theta)
    self.assertNotIn('late', layer.children)

  @parameterized.named_parameters(
      ('VarVar', [('var', 'a'), ('var', 'a')]),
      ('VarChild', [('var', 'a'), ('child', 'a')]),
      ('ChildVar', [('child', 'a'), ('var', 'a')]),
      ('ChildChild', [('child', 'a'), ('child', 'a')]),
      ('ChildrenChildren', [('children', 'a'), ('children', 'a')]),
      ('VarAccumulator', [('var', 'a'), ('acc', 'a')]),
      ('AccumulatorChild', [('acc', 'a'), ('child', 'a')]))
  def testDuplicateNamesRaise(self, ops):
    with self.assertRaisesRegex(ValueError, "already has .* named 'a'"):
      _Naming.Params().Set(name='n', ops=ops).Instantiate()

  @parameterized.named_parameters(
      ('ChildrenThenChild', [('children', 'a'), ('child', 'a_1')]),
      ('ChildThenChildren', [('child', 'a_0'), ('children', 'a')]))
  def testChildPathCollisionRaises(self, ops):
    # Both would own variables at path 'n/a_0/w' (or 'n/a_1/w'): same
    # initial values, and one would vanish from VariablesByPath.
    with self.assertRaises(ValueError):
      _Naming.Params().Set(name='n', ops=ops).Instantiate()

  @parameterized.product(
      kind=['var', 'acc', 'child', 'children'],
      name=['keys', 'items', 'get', 'update', 'Flatten', 'Transform',
            'a/b', 'a b', '1x', ''])
  def testReservedOrInvalidNamesRaise(self, kind, name):
    with self.assertRaises(ValueError):
      _Naming.Params().Set(name='n', ops=[(kind, name)]).Instantiate()

  @parameterized.product(
      kind=['child', 'children'],
      name=['params', 'theta', 'training', 'FProp'])
  def testChildNameShadowingLayerAttributeRaises(self, kind, name):
    # `layer.<name>` would return the attribute, never the child.
    with self.assertRaises(ValueError):
      _Naming.Params().Set(name='n', ops=[(kind, name)]).Instantiate()

  def testValidNamesWork(self):
    layer = _Naming.Params().Set(
        name='n', ops=[('var', 'v'), ('acc', 'c'), ('child', 'kid'),
                       ('children', 'many')]).Instantiate()
    self.assertEqual(sorted(layer.VariablesByPath()),
                     ['n/kid/w', 'n/many_0/w', 'n/many_1/w', 'n/v'])
    self.assertIsInstance(layer.kid, _Leaf)
    with self.assertRaisesRegex(AttributeError, "no attribute 'nothing'"):
      _ = layer.nothing


class ModesAndStatsTest(tf.test.TestCase):

  def _Layer(self):
    return _Stats.Params().Set(name='s', depth=2).Instantiate()

  def testLayersCoversTheSubtree(self):
    layer = self._Layer()
    self.assertEqual([x.path for x in layer.Layers()], [
        's', 's/sub_0', 's/sub_0/sub_0', 's/sub_0/sub_1', 's/sub_1',
        's/sub_1/sub_0', 's/sub_1/sub_1'])

  def testSetTrainingRecurses(self):
    layer = self._Layer()
    self.assertTrue(all(x.training for x in layer.Layers()))
    layer.SetTraining(False)
    self.assertFalse(any(x.training for x in layer.Layers()))
    layer.sub[1].SetTraining(True)
    self.assertEqual([x.training for x in layer.Layers()],
                     [False, False, False, False, True, True, True])

  def testSetUpdateStatsRecurses(self):
    layer = self._Layer()
    self.assertTrue(all(x.update_stats for x in layer.Layers()))
    layer.SetUpdateStats(False)
    self.assertFalse(any(x.update_stats for x in layer.Layers()))
    layer.sub[0].SetUpdateStats(True)
    self.assertEqual([x.update_stats for x in layer.Layers()],
                     [False, True, True, True, False, False, False])
    # Training is a separate flag.
    self.assertTrue(all(x.training for x in layer.Layers()))

  def testNoStatUpdatesRestoresEachFlag(self):
    layer = self._Layer()
    layer.sub[0].sub[1].SetUpdateStats(False)
    saved = [x.update_stats for x in layer.Layers()]
    self.assertEqual(saved.count(False), 1)
    with layer.NoStatUpdates():
      self.assertFalse(any(x.update_stats for x in layer.Layers()))
    self.assertEqual([x.update_stats for x in layer.Layers()], saved)
    with self.assertRaises(KeyError):
      with layer.NoStatUpdates():
        raise KeyError('boom')
    self.assertEqual([x.update_stats for x in layer.Layers()], saved)

  def testNoStatUpdatesStopsAccumulation(self):
    layer = self._Layer()
    x = tf.zeros([1])
    layer.FPropDefaultTheta(x)
    with layer.NoStatUpdates():
      layer.FPropDefaultTheta(x)
    layer.FPropDefaultTheta(x)
    for acc in layer.accumulators.Flatten():
      self.assertEqual(float(acc.numpy()), 2.0)

  def testAccumulatorsAreNotInTheta(self):
    layer = self._Layer()
    self.assertEqual([k for k, _ in layer.accumulators.FlattenItems()][:3],
                     ['count', 'sub[0].count', 'sub[0].sub[0].count'])
    self.assertLen(layer.accumulators.Flatten(), 7)
    acc_ids = {id(a) for a in layer.accumulators.Flatten()}
    self.assertFalse(acc_ids & {id(v) for v in layer.theta.Flatten()})
    self.assertFalse(acc_ids & {id(v) for v in layer.vars.Flatten()})
    self.assertNotIn('count', layer.theta)
    self.assertNotIn('s/count', layer.VariablesByPath())
    for acc in layer.accumulators.Flatten():
      self.assertFalse(acc.trainable)
      self.assertEqual(float(acc.numpy()), 0.0)

  def testUpdateStatsCallsEveryLayer(self):
    layer = self._Layer()
    for _ in range(3):
      layer.FPropDefaultTheta(tf.zeros([1]))
    del _UPDATE_CALLS[:]
    updates = layer.UpdateStats()
    paths = [x.path for x in layer.Layers()]
    self.assertEqual(_UPDATE_CALLS, paths)
    self.assertEqual(updates, paths)
    for sub in layer.Layers():
      self.assertEqual(float(sub.theta.seen.numpy()), 3.0, sub.path)
      self.assertEqual(float(sub.accumulators.count.numpy()), 0.0)
    # On a subtree, only that subtree.
    del _UPDATE_CALLS[:]
    layer.sub[1].UpdateStats()
    self.assertEqual(_UPDATE_CALLS,
                     ['s/sub_1', 's/sub_1/sub_0', 's/sub_1/sub_1'])

  def testBaseUpdateStatsIsANoOp(self):
    layer = _TreeParams().Instantiate()
    self.assertEqual(layer.UpdateStats(), [])


class NumParametersTest(tf.test.TestCase):

  def testCountsTrainableOnly(self):
    # w, kids_0/w, kids_1/w: [5]; child/w keeps its template's [3].
    self.assertEqual(
        base_layer.NumParameters(_TreeParams(dim=5).Instantiate()), 18)
    # _Stats: w [2] trainable; seen [] not trainable; accumulators excluded.
    layer = _Stats.Params().Set(name='s', depth=1).Instantiate()
    self.assertEqual(base_layer.NumParameters(layer), 3 * 2)
    self.assertEqual(base_layer.NumParameters(layer.sub[0]), 2)

  def testCountsMatrices(self):

    class Dense(BaseLayer):

      def __init__(self, params):
        super().__init__(params)
        self.CreateVariable('w', WeightParams([4, 6]))
        self.CreateVariable('b', WeightParams([6]))
        self.CreateVariable('frozen', WeightParams([100], trainable=False))

    layer = Dense.Params().Set(name='d').Instantiate()
    self.assertEqual(base_layer.NumParameters(layer), 4 * 6 + 6)

  def testShapesOnlyMirrorsTheVariables(self):
    for p in (_TreeParams(dim=5), _Stats.Params().Set(name='s', depth=2)):
      real = p.Instantiate()
      with base_layer.VariableShapesOnly():
        shapes = p.Instantiate()
      self.assertEqual(base_layer.NumParameters(shapes),
                       base_layer.NumParameters(real))
      real_vars = real.vars.Flatten() + real.accumulators.Flatten()
      shape_vars = shapes.vars.Flatten() + shapes.accumulators.Flatten()
      self.assertLen(shape_vars, len(real_vars))
      for want, got in zip(real_vars, shape_vars):
        self.assertIsInstance(got, base_layer.VariableShape)
        self.assertEqual(want.name.split(':')[0], got.name)
        self.assertEqual(want.shape, got.shape)
        self.assertEqual(want.dtype, got.dtype)
        self.assertEqual(want.trainable, got.trainable)
    # The mode ends with the block, also when the block raises.
    with self.assertRaises(KeyError):
      with base_layer.VariableShapesOnly():
        raise KeyError('stop')
    self.assertIsInstance(_TreeParams(dim=2).Instantiate().vars.w,
                          tf.Variable)


class MetaNumElementsTest(tf.test.TestCase):

  def testCountsStaticShapesAndNamesTheLayerOtherwise(self):
    self.assertEqual(base_layer.MetaNumElements([2, 3, 4], 'L'), 24)
    self.assertEqual(base_layer.MetaNumElements(tf.TensorShape([]), 'L'), 1)
    for shape in ([None, 3], None):
      with self.assertRaisesRegex(
          ValueError, r'^Proj.FPropMeta needs a fully defined input shape'):
        base_layer.MetaNumElements(shape, 'Proj')


if __name__ == '__main__':
  absltest.main()
