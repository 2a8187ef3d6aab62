"""Tests of AmoebaNet-D: ops, cells, stem, head and the layer list."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.image import amoebanet  # noqa: E402


def _Normal(shape, seed=0):
  return tf.random.stateless_normal(shape, [seed, 7], dtype=tf.float64)


def _Build(p, name='layer'):
  return p.Copy().Set(name=p.name or name, dtype=tf.float64).Instantiate()


def _ShapesOf(nest):
  """A NestedMap or tensor of tensors -> the same of TensorShapes."""
  return tf.nest.map_structure(lambda t: t.shape, nest)


def _State(b, hw_prev, c_prev, hw, c, keys=True):
  state = NestedMap(prev=_Normal([b, hw_prev, hw_prev, c_prev], 1),
                    cur=_Normal([b, hw, hw, c], 2))
  if keys:
    state.example_keys = dropout.ExampleKeys(3, b)
  return state


class OpsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*[(op, s) for op in amoebanet.OPS
                              for s in (1, 2)])
  def testShape(self, op, stride):
    p = amoebanet.OpParams(op, 3, stride)
    x = _Normal([2, 5, 5, 3])
    y = _Build(p).FPropDefaultTheta(x)
    want = [2, 3, 3, 3] if stride == 2 else [2, 5, 5, 3]
    self.assertEqual(want, y.shape.as_list())
    meta = p.cls.FPropMeta(p, x.shape)
    self.assertEqual((y.shape,), tuple(meta.out_shapes))

  def testIdentityIsIdentity(self):
    x = _Normal([2, 4, 4, 3])
    layer = _Build(amoebanet.OpParams('identity', 3, 1))
    self.assertAllEqual(x, layer.FPropDefaultTheta(x))
    self.assertEqual(0, layer.params.cls.FPropMeta(layer.params,
                                                   x.shape).flops)

  def testMaxPool(self):
    x = _Normal([1, 4, 4, 2])
    y = _Build(amoebanet.OpParams('max_pool_3x3', 2, 2)).FPropDefaultTheta(x)
    self.assertAllEqual(tf.nn.max_pool2d(x, 3, 2, 'SAME'), y)

  def testUnknownOp(self):
    with self.assertRaisesRegex(ValueError, "unknown op 'conv_9x9'"):
      amoebanet.OpParams('conv_9x9', 3, 1)


class GenotypeTest(absltest.TestCase):

  def testConcatAreTheUnusedStates(self):
    self.assertEqual([4, 5, 6],
                     amoebanet.CheckGenotype(amoebanet.NORMAL_CELL, 'n'))
    self.assertEqual([5, 6],
                     amoebanet.CheckGenotype(amoebanet.REDUCTION_CELL, 'r'))

  def testTheCellsUseThePapersOps(self):
    used = {op for cell in (amoebanet.NORMAL_CELL, amoebanet.REDUCTION_CELL)
            for combo in cell for op, _ in combo}
    self.assertEqual(set(amoebanet.OPS) - {'conv_3x3'}, used)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'combination 1 \\(h3\\) reads '
                                'h3'):
      amoebanet.CheckGenotype([(('identity', 0), ('identity', 1)),
                               (('identity', 3), ('identity', 0))], 'cell')
    with self.assertRaisesRegex(ValueError, "unknown op 'nope'"):
      amoebanet.CheckGenotype([(('nope', 0), ('identity', 1))], 'cell')
    with self.assertRaisesRegex(ValueError, 'no combinations'):
      amoebanet.CheckGenotype([], 'cell')
    with self.assertRaisesRegex(ValueError, 'must be a list of'):
      amoebanet.CheckGenotype([('identity', 0)], 'cell')


class CellTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # (stride, reduce_prev, prev hw, prev c, cur hw, cur c, want cur)
      ('Normal', 1, False, 6, 5, 6, 7, [2, 6, 6, 12]),
      ('NormalAfterReduction', 1, True, 6, 5, 3, 7, [2, 3, 3, 12]),
      ('Reduction', 2, False, 6, 5, 6, 7, [2, 3, 3, 8]),
      ('ReductionAfterReduction', 2, True, 10, 5, 5, 7, [2, 3, 3, 8]),
  )
  def testShapesMatchFPropMeta(self, stride, reduce_prev, hw_prev, c_prev,
                               hw, c, want):
    genotype = (amoebanet.NORMAL_CELL if stride == 1
                else amoebanet.REDUCTION_CELL)
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', genotype=genotype, filters=4, stride=stride,
        prev_dim=c_prev, cur_dim=c, reduce_prev=reduce_prev)
    state = _State(2, hw_prev, c_prev, hw, c)
    out = _Build(p).FPropDefaultTheta(state)
    self.assertEqual(want, out.cur.shape.as_list())
    self.assertEqual(want[-1], amoebanet.AmoebaCell.OutputDim(p))
    self.assertIs(out.prev, state.cur)
    self.assertIs(out.example_keys, state.example_keys)
    meta = amoebanet.AmoebaCell.FPropMeta(p, _ShapesOf(state))
    self.assertLen(meta.out_shapes, 1)
    self.assertEqual(_ShapesOf(out), meta.out_shapes[0])
    self.assertGreater(meta.flops, 0)

  def testCellComputesTheGenotype(self):
    # A two-combination genotype checked against its children by hand.
    genotype = ((('identity', 0), ('avg_pool_3x3', 1)),
                (('conv_1x1', 2), ('identity', 1)))
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', genotype=genotype, filters=3, prev_dim=2, cur_dim=4)
    cell = _Build(p)
    state = _State(2, 4, 2, 4, 4, keys=False)
    t = cell.theta
    h0 = cell.pre_prev.FProp(t.pre_prev, state.prev)
    h1 = cell.pre_cur.FProp(t.pre_cur, state.cur)
    h2 = h0 + tf.nn.avg_pool2d(h1, 3, 1, 'SAME')
    h3 = cell.op1_a.FProp(t.op1_a, h2) + h1
    self.assertAllClose(h3, cell.FProp(t, state).cur, atol=1e-12, rtol=0)

  def testMismatchedInputsAreAnError(self):
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', filters=4, prev_dim=3, cur_dim=3, reduce_prev=False)
    shapes = NestedMap(prev=tf.TensorShape([1, 8, 8, 3]),
                       cur=tf.TensorShape([1, 4, 4, 3]))
    with self.assertRaisesRegex(ValueError, 'check reduce_prev'):
      amoebanet.AmoebaCell.FPropMeta(p, shapes)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'stride=3 must be 1 or 2'):
      _Build(amoebanet.AmoebaCell.Params().Set(
          filters=4, prev_dim=3, cur_dim=3, stride=3))
    with self.assertRaisesRegex(ValueError, 'filters=0'):
      _Build(amoebanet.AmoebaCell.Params().Set(prev_dim=3, cur_dim=3))


class StemAndHeadTest(tf.test.TestCase):

  def testStemTakesAMapOrAnImage(self):
    p = amoebanet.AmoebaStem.Params().Set(name='stem', filters=5, stride=2)
    stem = _Build(p)
    image = _Normal([2, 8, 8, 3])
    keys = dropout.ExampleKeys(0, 2)
    out = stem.FPropDefaultTheta(NestedMap(image=image, example_keys=keys))
    self.assertEqual(['cur', 'example_keys', 'prev'], sorted(out))
    self.assertIs(out.prev, out.cur)
    self.assertIs(keys, out.example_keys)
    self.assertEqual([2, 4, 4, 5], out.cur.shape.as_list())
    self.assertEqual(['cur', 'prev'],
                     sorted(stem.FPropDefaultTheta(image)))
    meta = amoebanet.AmoebaStem.FPropMeta(
        p, NestedMap(image=image.shape, example_keys=keys.shape))
    self.assertEqual(_ShapesOf(out), meta.out_shapes[0])

  def testHead(self):
    p = amoebanet.AmoebaHead.Params().Set(
        name='head', input_dim=4, num_classes=3, keep_prob=0.5)
    head = _Build(p)
    state = _State(2, 3, 4, 3, 4)
    logits = head.FPropDefaultTheta(state)
    self.assertEqual([2, 3], logits.shape.as_list())
    meta = amoebanet.AmoebaHead.FPropMeta(p, _ShapesOf(state))
    self.assertEqual((logits.shape,), tuple(meta.out_shapes))
    # Eval: no dropout, so it is the plain pooled projection.
    head.SetTraining(False)
    pooled = tf.reduce_mean(tf.nn.relu(state.cur), axis=[1, 2])
    want = pooled @ head.theta.logits.w + head.theta.logits.b
    self.assertAllClose(want, head.FPropDefaultTheta(state), atol=1e-12,
                        rtol=0)
    self.assertNotAllClose(want, logits)  # training: dropout was applied
    head.SetTraining(True)
    del state.example_keys
    with self.assertRaisesRegex(ValueError, 'needs example_keys'):
      head.FPropDefaultTheta(state)


class AmoebaNetDTest(tf.test.TestCase, parameterized.TestCase):

  def testNamesAndFilters(self):
    layer_ps = amoebanet.AmoebaNetD(6, 4, 10)
    self.assertEqual(
        ['stem', 'stack0_cell0', 'stack0_cell1', 'reduction0',
         'stack1_cell0', 'stack1_cell1', 'reduction1', 'stack2_cell0',
         'stack2_cell1', 'head'], [p.name for p in layer_ps])
    cells = layer_ps[1:-1]
    self.assertEqual([4, 4, 8, 8, 8, 16, 16, 16],
                     [p.filters for p in cells])
    self.assertEqual([False, False, False, True, False, False, True, False],
                     [p.reduce_prev for p in cells])
    self.assertEqual([1, 1, 2, 1, 1, 2, 1, 1], [p.stride for p in cells])
    self.assertEqual(3 * 16, layer_ps[-1].input_dim)

  @parameterized.named_parameters(
      ('Cifar', dict(), [2, 16, 16, 3]),
      ('ImageNetStem', dict(num_stem_reduction_cells=2, stem_stride=2),
       [2, 32, 32, 3]),
  )
  def testEveryLayerMatchesItsFPropMeta(self, kwargs, image_shape):
    layer_ps = amoebanet.AmoebaNetD(3, 4, 7, keep_prob=0.8, **kwargs)
    state = NestedMap(image=_Normal(image_shape),
                      example_keys=dropout.ExampleKeys(1, 2))
    shapes = _ShapesOf(state)
    for p in layer_ps:
      meta = p.cls.FPropMeta(p, shapes)
      state = _Build(p).FPropDefaultTheta(state)
      self.assertLen(meta.out_shapes, 1)
      self.assertEqual(_ShapesOf(state), meta.out_shapes[0], msg=p.name)
      shapes = meta.out_shapes[0]
    self.assertEqual([2, 7], state.shape.as_list())
    self.assertTrue(np.all(np.isfinite(state.numpy())))

  def testBadArguments(self):
    with self.assertRaisesRegex(ValueError, 'multiple of 3'):
      amoebanet.AmoebaNetD(4, 8, 10)
    with self.assertRaisesRegex(ValueError, 'divisible by'):
      amoebanet.AmoebaNetD(3, 6, 10, num_stem_reduction_cells=2)
    with self.assertRaisesRegex(ValueError, 'normal_cell: unknown op'):
      amoebanet.AmoebaNetD(3, 8, 10, normal_cell=[(('x', 0), ('x', 1))])

  def testLayersAreSequentialReady(self):
    # One SequentialLayer of the list runs end to end on a plain image too.
    seq = _Build(layers.SequentialLayer.Params().Set(
        name='net', sub=amoebanet.AmoebaNetD(3, 2, 5)))
    self.assertEqual([3, 5], seq.FPropDefaultTheta(
        _Normal([3, 8, 8, 3])).shape.as_list())


if __name__ == '__main__':
  absltest.main()
