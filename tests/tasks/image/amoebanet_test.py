"""Tests of AmoebaNet: genotypes, ops, cells, heads and whole networks."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.image import amoebanet  # noqa: E402
from lingvo_pipe.tasks.image import amoebanet_ops as ops  # noqa: E402

# The reference implementation's cells (tensorflow/tpu, amoeba_net/
# model_specs.py) in its own format: operations in pairs, the state each
# reads, and used_hiddenstates (1 = not concatenated).
_REFERENCE = {
    'D_NORMAL': (
        ['1x1', 'max_pool_3x3', 'none', '1x7_7x1', '1x1', '1x7_7x1',
         'max_pool_3x3', 'none', 'avg_pool_3x3', '1x1'],
        [1, 1, 1, 0, 0, 0, 2, 2, 1, 5], [0, 1, 1, 0, 0, 1, 0]),
    'D_REDUCTION': (
        ['max_pool_2x2', 'max_pool_3x3', 'none', '3x3', '1x7_7x1',
         'max_pool_3x3', 'none', 'max_pool_2x2', 'avg_pool_3x3', '1x1'],
        [0, 0, 2, 1, 2, 2, 3, 1, 2, 3], [1, 1, 1, 1, 0, 0, 0]),
    'B_NORMAL': (
        ['1x1', 'max_pool_3x3', 'none', 'separable_3x3_2', '1x1',
         'separable_3x3_2', '1x1', 'none', 'avg_pool_3x3', '1x1'],
        [1, 1, 1, 0, 1, 0, 2, 2, 1, 5], [0, 1, 1, 0, 0, 1, 0]),
    'B_REDUCTION': (
        ['max_pool_2x2', 'max_pool_3x3', 'none', '3x3',
         'dil_2_separable_5x5_2', 'max_pool_3x3', 'none', 'separable_3x3_2',
         'avg_pool_3x3', '1x1'],
        [0, 0, 2, 1, 2, 2, 3, 1, 4, 3], [1, 1, 1, 1, 1, 0, 0]),
}


def _Normal(shape, seed=0):
  return tf.random.stateless_normal(shape, [seed, 7], dtype=tf.float64)


def _Build(p, name='layer'):
  return p.Copy().Set(name=p.name or name, dtype=tf.float64).Instantiate()


def _ShapesOf(nest):
  return tf.nest.map_structure(lambda t: t.shape, nest)


def _NumParams(p):
  with base_layer.VariableShapesOnly():
    return base_layer.NumParameters(p.Copy().Set(name='x').Instantiate())


class GenotypeTest(absltest.TestCase):

  def testCellsAreTheReferencesCells(self):
    for name, (operations, inputs, used) in _REFERENCE.items():
      pairs = list(zip(operations, inputs))
      want = ops.CellSpec(
          tuple((pairs[i], pairs[i + 1]) for i in range(0, 10, 2)),
          tuple(i for i, u in enumerate(used) if not u))
      self.assertEqual(want, getattr(ops, f'AMOEBANET_{name}'), msg=name)
      ops.CheckCellSpec(want, name)

  def testDNormalConcatenatesH0ThoughOpsReadIt(self):
    self.assertEqual((0, 3, 4, 6), ops.AMOEBANET_D_NORMAL.concat)

  def testErrors(self):
    combo = (('none', 0), ('none', 1))
    with self.assertRaisesRegex(ValueError, r'combination 1 \(h3\) reads h3'):
      ops.CheckCellSpec(ops.CellSpec((combo, (('none', 3), ('none', 0))),
                                     (2,)), 'cell')
    with self.assertRaisesRegex(ValueError, "unknown op 'conv_9x9'"):
      ops.CheckCellSpec(ops.CellSpec(((('conv_9x9', 0), ('none', 1)),),
                                     (2,)), 'cell')
    with self.assertRaisesRegex(ValueError, "unknown op 'max_pool_3x2'"):
      ops.OpParams('max_pool_3x2', 2, 2, 1)
    with self.assertRaisesRegex(ValueError, r'concat=\(5,\) must list'):
      ops.CheckCellSpec(ops.CellSpec((combo,), (5,)), 'cell')
    with self.assertRaisesRegex(ValueError, 'must be a CellSpec'):
      ops.CheckCellSpec(('none', 0), 'cell')


class OpsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*[
      (op, s, cin) for op in ('none', '1x1', '3x3', '1x7_7x1',
                              'max_pool_2x2', 'max_pool_3x3', 'avg_pool_3x3',
                              'separable_3x3_2', 'dil_2_separable_5x5_2')
      for s in (1, 2) for cin in (8, 5) if not (op.startswith('dil') and s > 1)
  ])
  def testShapes(self, op, stride, cin):
    p = ops.OpParams(op, cin, 8, stride)
    for size in (5, 6):
      x = _Normal([2, size, size, cin])
      y = _Build(p).FPropDefaultTheta(x)
      out = math.ceil(size / stride)
      self.assertEqual([2, out, out, 8], y.shape.as_list())
      self.assertEqual((y.shape,), tuple(p.cls.FPropMeta(p, x.shape)
                                         .out_shapes))

  def testNoneIsTheIdentityOnlyWhenItCanBe(self):
    x = _Normal([2, 4, 4, 8])
    self.assertAllEqual(x, _Build(ops.OpParams('none', 8, 8, 1))
                        .FPropDefaultTheta(x))
    self.assertTrue(ops.IsIdentity('none', 8, 8, 1))
    for cin, s in ((5, 1), (8, 2)):
      self.assertFalse(ops.IsIdentity('none', cin, 8, s))
      self.assertEqual(cin * 8 + 16, _NumParams(ops.OpParams('none', cin, 8,
                                                             s)))

  def testBottleneckForms(self):
    # 1x7_7x1 at F=64: 1x1 to 16, 1x7, 7x1, 1x1 back to 64, four BNs.
    convs = 64 * 16 + 16 * 16 * 7 * 2 + 16 * 64
    self.assertEqual(convs + 2 * (16 + 16 + 16 + 64),
                     _NumParams(ops.OpParams('1x7_7x1', 64, 64, 1)))
    self.assertEqual(5856, _NumParams(ops.OpParams('1x7_7x1', 64, 64, 1)))
    names = [s.name for s in ops.OpParams('3x3', 32, 64, 2).sub]
    self.assertEqual(['pre_relu', 'pre_1x1', 'pre_bn', 'relu', 'conv3x3',
                      'bn', 'post_relu', 'post_1x1', 'post_bn'], names)
    strides = {s.name: s.filter_stride for s in ops.OpParams(
        '1x7_7x1', 8, 8, 2).sub if s.name.startswith('conv')}
    self.assertEqual({'conv1x7': (1, 2), 'conv7x1': (2, 1)}, strides)
    # F / 4 < 1: no bottleneck.
    self.assertEqual(['relu', 'conv3x3', 'bn'],
                     [s.name for s in ops.OpParams('3x3', 3, 3, 1).sub])

  def testPoolsAreTensorFlowsSamePools(self):
    x = _Normal([2, 5, 6, 4])
    for op, fn, k in (('max_pool_2x2', tf.nn.max_pool2d, 2),
                      ('max_pool_3x3', tf.nn.max_pool2d, 3),
                      ('avg_pool_3x3', tf.nn.avg_pool2d, 3)):
      y = _Build(ops.OpParams(op, 4, 4, 2)).FPropDefaultTheta(x)
      self.assertAllEqual(fn(x, k, 2, 'SAME'), y, msg=op)
    # Another width: the pool, then a 1x1 conv and BN (no ReLU).
    names = [s.name for s in ops.OpParams('avg_pool_3x3', 3, 4, 1).sub]
    self.assertEqual(['pool', 'conv', 'bn'], names)

  def testSeparableStacksAndDilation(self):
    p = ops.OpParams('dil_2_separable_5x5_2', 6, 8, 1)
    seps = [s for s in p.sub if s.name.startswith('sep')]
    self.assertEqual([(5, 5, 6, 1), (5, 5, 8, 1)],
                     [s.filter_shape for s in seps])
    self.assertEqual([(2, 2)] * 2, [s.dilation_rate for s in seps])
    first = ops.OpParams('separable_3x3_2', 8, 8, 2).sub
    self.assertEqual([(2, 2), (1, 1)], [s.filter_stride for s in first
                                        if s.name.startswith('sep')])


class FactorizedReductionTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(4, 5)
  def testTakesEvenAndOddPositions(self, size):
    p = ops.FactorizedReduction.Params().Set(name='fr', input_dim=3,
                                             filters=4)
    layer = _Build(p)
    layer.SetTraining(False)  # BN with its moving statistics: y = x / c
    x = _Normal([2, size, size, 3])
    t = layer.theta
    padded = np.pad(x.numpy(), [[0, 0], [0, 1], [0, 1], [0, 0]])
    even = np.einsum('bhwc,cd->bhwd', x.numpy()[:, ::2, ::2],
                     t.conv_even.w.numpy()[0, 0])
    odd = np.einsum('bhwc,cd->bhwd', padded[:, 1::2, 1::2],
                    t.conv_odd.w.numpy()[0, 0])
    want = layer.bn.FProp(t.bn, tf.constant(np.concatenate([even, odd], -1)))
    y = layer.FPropDefaultTheta(x)
    self.assertAllClose(want, y, atol=1e-12, rtol=0)
    half = -(-size // 2)
    self.assertEqual([2, half, half, 4], y.shape.as_list())
    self.assertEqual((y.shape,), tuple(p.cls.FPropMeta(p, x.shape)
                                       .out_shapes))

  def testOddFiltersAreAnError(self):
    with self.assertRaisesRegex(ValueError, 'filters=3 must be an even'):
      _Build(ops.FactorizedReduction.Params().Set(input_dim=3, filters=3))


def _State(b, hw_prev, c_prev, hw, c, seed=1):
  state = NestedMap(cur=_Normal([b, hw, hw, c], seed + 1),
                    example_keys=dropout.ExampleKeys(3, b),
                    example_steps=tf.fill([b], tf.constant(3, tf.int64)))
  if c_prev:
    state.prev = _Normal([b, hw_prev, hw_prev, c_prev], seed)
  return state


class CellTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # (spec, stride, reduce_prev, prev hw, prev c, cur hw, cur c, out)
      ('NormalNoPrev', 'D_NORMAL', 1, False, 0, 0, 5, 7, [2, 5, 5, 16]),
      ('NormalPrev1x1', 'D_NORMAL', 1, False, 5, 6, 5, 7, [2, 5, 5, 16]),
      ('NormalPrevSame', 'D_NORMAL', 1, False, 5, 4, 5, 7, [2, 5, 5, 16]),
      ('NormalAfterReduction', 'D_NORMAL', 1, True, 6, 5, 3, 7,
       [2, 3, 3, 16]),
      ('ReductionNoPrev', 'D_REDUCTION', 2, False, 0, 0, 6, 7,
       [2, 3, 3, 12]),
      ('ReductionAfterReduction', 'D_REDUCTION', 2, True, 10, 5, 5, 7,
       [2, 3, 3, 12]),
      ('BNormal', 'B_NORMAL', 1, True, 5, 5, 3, 7, [2, 3, 3, 16]),
      ('BReduction', 'B_REDUCTION', 2, False, 6, 5, 6, 7, [2, 3, 3, 8]),
  )
  def testShapesMatchFPropMeta(self, spec, stride, reduce_prev, hw_prev,
                               c_prev, hw, c, want):
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', spec=getattr(ops, f'AMOEBANET_{spec}'), filters=4,
        stride=stride, prev_dim=c_prev, cur_dim=c, reduce_prev=reduce_prev,
        drop_path_keep_prob=0.5, drop_path_burn_in_steps=10)
    state = _State(2, hw_prev, c_prev, hw, c)
    out = _Build(p).FPropDefaultTheta(state)
    self.assertEqual(want, out.cur.shape.as_list())
    self.assertEqual(want[-1], amoebanet.AmoebaCell.OutputDim(p))
    self.assertIs(out.prev, state.cur)
    self.assertIs(out.example_keys, state.example_keys)
    meta = amoebanet.AmoebaCell.FPropMeta(p, _ShapesOf(state))
    self.assertEqual(_ShapesOf(out), meta.out_shapes[0])
    self.assertGreater(meta.flops, 0)

  def testStridesOnlyOnTheCellInputs(self):
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', spec=ops.AMOEBANET_D_REDUCTION, filters=8, stride=2,
        prev_dim=8, cur_dim=8)
    children, _ = amoebanet.AmoebaCell._Plan(p)  # pylint: disable=protected-access

    def Strides(name):
      return [getattr(s, 'filter_stride', None) or s.window_stride
              for s in children[name].sub if s.name[:4] in ('conv', 'pool')]

    self.assertEqual([(2, 2)], Strides('op0_a'))  # max_pool_2x2 (h0)
    self.assertEqual([(2, 2)], Strides('op1_b'))  # 3x3 (h1)
    self.assertEqual([(1, 1), (1, 1)], [
        s.filter_stride for s in children['op2_a'].sub
        if s.name in ('conv1x7', 'conv7x1')])  # 1x7_7x1 (h2): not strided
    self.assertEqual([(1, 1)], Strides('op2_b'))  # max_pool_3x3 (h2)
    self.assertEqual([], children['op1_a'].sub)  # none (h2): identity
    self.assertNotIn('op1_a_drop', children)

  def testCellComputesItsGenotype(self):
    # A two-combination reduction cell computed by hand from its children:
    # h2 = max_pool_2x2(h0) + 3x3(h1), h3 = none(h2) + avg_pool_3x3(h1);
    # concat h0 (factorized to h3's size) and h3.
    spec = ops.CellSpec(((('max_pool_2x2', 0), ('3x3', 1)),
                         (('none', 2), ('avg_pool_3x3', 1))), (0, 3))
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', spec=spec, filters=4, stride=2, prev_dim=0, cur_dim=3)
    cell = _Build(p)
    self.assertEqual(['align0', 'op0_a', 'op0_b', 'op1_a', 'op1_b',
                      'pre_cur'], sorted(cell.children))
    state = _State(2, 0, 0, 6, 3)
    t = cell.theta
    h0 = cell.pre_cur.FProp(t.pre_cur, state.cur)
    h1 = state.cur  # no prev: the raw input
    h2 = tf.nn.max_pool2d(h0, 2, 2, 'SAME') + cell.op0_b.FProp(t.op0_b, h1)
    h3 = h2 + cell.op1_b.FProp(t.op1_b, h1)
    self.assertEqual(('pool', 'conv', 'bn'), cell.op1_b.sub_names)
    want = tf.concat([cell.align0.FProp(t.align0, h0), h3], -1)
    self.assertAllClose(want, cell.FProp(t, state).cur, atol=1e-12, rtol=0)

  def testDropPathDropsWholeExamplesOfEachOp(self):
    p = amoebanet.AmoebaCell.Params().Set(
        name='cell', filters=4, prev_dim=4, cur_dim=4,
        drop_path_keep_prob=0.5)
    cell = _Build(p)
    drops = sorted(n for n in cell.children if n.endswith('_drop'))
    # Every op but the two `none`s of the normal cell.
    self.assertLen(drops, 8)
    self.assertNotIn('op1_a_drop', drops)
    self.assertNotIn('op3_b_drop', drops)
    state = _State(16, 4, 4, 4, 4)
    out = cell.FPropDefaultTheta(state).cur
    self.assertAllEqual(out, cell.FPropDefaultTheta(state).cur)
    # h4 = 1x1(h0) + 1x7_7x1(h0), each op's output of an example either
    # dropped or scaled by 1 / 0.5; h4 is channels 8:12 of the output.
    t = cell.theta
    h0 = cell.pre_cur.FProp(t.pre_cur, state.cur)
    a = cell.op2_a.FProp(t.op2_a, h0).numpy()
    c = cell.op2_b.FProp(t.op2_b, h0).numpy()
    h4 = out[..., 8:12].numpy()
    masks = []
    for b in range(16):
      match = [(ka, kc) for ka in (0, 1) for kc in (0, 1)
               if np.allclose(h4[b], 2 * (ka * a[b] + kc * c[b]),
                              atol=1e-12, rtol=0)]
      self.assertLen(match, 1, msg=b)
      masks += match[0]
    self.assertBetween(sum(masks), 1, 31)  # some kept, some dropped
    self.assertAllEqual(h0, out[..., :4])  # h0 is not an op: never dropped
    del state.example_keys
    with self.assertRaisesRegex(ValueError, 'needs example_keys'):
      cell.FPropDefaultTheta(state)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'stride=3 must be 1 or 2'):
      _Build(amoebanet.AmoebaCell.Params().Set(
          filters=4, prev_dim=3, cur_dim=3, stride=3))
    with self.assertRaisesRegex(ValueError, 'filters=0 must be an int >= 1'):
      _Build(amoebanet.AmoebaCell.Params().Set(prev_dim=3, cur_dim=3))
    with self.assertRaisesRegex(ValueError, 'check reduce_prev'):
      amoebanet.AmoebaCell.FPropMeta(
          amoebanet.AmoebaCell.Params().Set(
              name='cell', filters=4, prev_dim=3, cur_dim=3, stride=2,
              spec=ops.AMOEBANET_D_REDUCTION),
          NestedMap(prev=tf.TensorShape([1, 4, 4, 3]),
                    cur=tf.TensorShape([1, 8, 8, 3])))


class StemAndHeadsTest(tf.test.TestCase):

  def testStem(self):
    p = amoebanet.AmoebaStem.Params().Set(name='stem', filters=5, stride=2)
    stem = _Build(p)
    image = _Normal([2, 9, 9, 3])
    keys = dropout.ExampleKeys(0, 2)
    out = stem.FPropDefaultTheta(NestedMap(image=image, example_keys=keys))
    self.assertEqual(['cur', 'example_keys'], sorted(out))
    self.assertEqual([2, 4, 4, 5], out.cur.shape.as_list())  # 'VALID'
    self.assertIs(keys, out.example_keys)
    meta = amoebanet.AmoebaStem.FPropMeta(
        p, NestedMap(image=image.shape, example_keys=keys.shape))
    self.assertEqual(_ShapesOf(out), meta.out_shapes[0])
    # No ReLU: the output has negative values.
    self.assertLess(np.min(out.cur.numpy()), 0)

  def testAuxHeadInTrainingOnly(self):
    p = amoebanet.AmoebaAuxHead.Params().Set(
        name='aux', input_dim=8, input_size=(14, 14), num_classes=3)
    aux = _Build(p)
    # 14x14 -> 4x4 after the 5x5 / 3 pool: the second conv is 4x4.
    self.assertEqual([4, 4, 51, 307], aux.theta.conv.conv.w.shape.as_list())
    state = NestedMap(cur=_Normal([2, 14, 14, 8]))
    out = aux.FPropDefaultTheta(state)
    self.assertEqual([2, 3], out.aux_logits.shape.as_list())
    meta = amoebanet.AmoebaAuxHead.FPropMeta(p, _ShapesOf(state))
    self.assertEqual(_ShapesOf(out), meta.out_shapes[0])
    aux.SetTraining(False)
    self.assertEqual(['cur'], sorted(aux.FPropDefaultTheta(state)))
    with self.assertRaisesRegex(ValueError, 'smaller than its 5x5'):
      _Build(p.Copy().Set(input_size=(4, 4)))

  def testHead(self):
    p = amoebanet.AmoebaHead.Params().Set(
        name='head', input_dim=4, num_classes=3, keep_prob=0.5)
    head = _Build(p)
    state = _State(2, 0, 0, 3, 4)
    logits = head.FPropDefaultTheta(state)
    self.assertEqual([2, 3], logits.shape.as_list())
    meta = amoebanet.AmoebaHead.FPropMeta(p, _ShapesOf(state))
    self.assertEqual((logits.shape,), tuple(meta.out_shapes))
    head.SetTraining(False)
    pooled = tf.reduce_mean(tf.nn.relu(state.cur), axis=[1, 2])
    want = pooled @ head.theta.logits.w + head.theta.logits.b
    self.assertAllClose(want, head.FPropDefaultTheta(state), atol=1e-12,
                        rtol=0)
    state.aux_logits = _Normal([2, 3])
    out = head.FPropDefaultTheta(state)
    self.assertEqual(['aux_logits', 'logits'], sorted(out))
    self.assertIs(state.aux_logits, out.aux_logits)


def _Table1Count(num_cells, d, image=224, classes=1000):
  """Parameters of AmoebaNet-D (L, D) with the auxiliary head, counted from
  the published description alone (conv weights, BN scale and offset,
  fully connected weights and biases); independent of the layer code."""

  def Bn(c):
    return 2 * c

  def Cell(normal, f, cur, prev, reduce_prev):
    n = cur * f + Bn(f)  # h0
    if prev and reduce_prev:
      n += 2 * prev * (f // 2) + Bn(f)  # factorized reduction
    elif prev and prev != f:
      n += prev * f + Bn(f)
    h1 = f if prev else cur
    r = f // 4
    bottleneck = h1 * r + Bn(r) + 9 * r * r + Bn(r) + r * f + Bn(f)
    bottleneck_f = f * r + Bn(r) + 14 * r * r + 2 * Bn(r) + r * f + Bn(f)
    one = f * f + Bn(f)
    if normal:  # 1x1(h1), 1x7(h0), 1x1(h0), 1x7(h0), 1x1(h5); max_pool,
      # none and avg_pool of h1 project it if it is not F wide.
      n += h1 * f + Bn(f) + 2 * bottleneck_f + 2 * one
      n += 3 * (h1 * f + Bn(f)) if h1 != f else 0
      return n, 4 * f
    # max_pool_2x2(h0), max_pool_3x3(h0), 3x3(h1), 1x7(h2), max_pool_2x2
    # (h1): projected if h1 is not F wide; none(h2), none(h3); 1x1(h3).
    n += bottleneck + bottleneck_f + one
    n += h1 * f + Bn(f) if h1 != f else 0
    return n, 3 * f

  total = 27 * 32 + Bn(32)  # stem conv
  size = (image - 3) // 2 + 1
  outs, reduced = [None, 32], False
  reductions = [num_cells // 3, 2 * num_cells // 3]
  plan = [(None, 0.25), (None, 0.5)]  # (normal cell index, F / D)
  for c in range(num_cells):
    if c in reductions:
      plan.append((None, 2.0 * (reductions.index(c) + 1)))
    plan.append((c, 2.0 ** sum(c >= r for r in reductions)))
  for c, scale in plan:
    normal = c is not None
    n, out = Cell(normal, int(d * scale), outs[-1], outs[-2], reduced)
    total += n
    outs.append(out)
    reduced = not normal
    size = size if normal else -(-size // 2)
    if c == reductions[1] - 1:  # the auxiliary head
      k = (size - 5) // 3 + 1
      total += out * 51 + Bn(51) + k * k * 51 * 307 + Bn(307)
      total += 307 * classes + classes
  return total + outs[-1] * classes + classes


class AmoebaNetTest(tf.test.TestCase, parameterized.TestCase):

  # GPipe's Table 1 (82M, 318M, 542M, 1.05B, 1.8B); ImageNet at 224, 1000
  # classes, with the auxiliary head; shapes only.
  @parameterized.parameters((18, 208, 82e6), (18, 416, 318e6),
                            (18, 544, 542e6), (36, 544, 1.05e9),
                            (72, 512, 1.8e9))
  def testTable1ParameterCounts(self, num_cells, d, paper):
    layer_ps = amoebanet.AmoebaNetD(num_cells, d, 1000, aux_head=True,
                                    image_size=224)
    net = layers.SequentialLayer.Params().Set(name='net', sub=layer_ps)
    count = _NumParams(net)
    self.assertEqual(_Table1Count(num_cells, d), count)
    self.assertLess(abs(count - paper) / paper, 0.03)

  def testAmoebaNetB557M(self):
    # The paper's ImageNet model: AmoebaNet-B (18, 512), 557M parameters.
    layer_ps = amoebanet.AmoebaNetB(18, 512, 1000)
    count = _NumParams(layers.SequentialLayer.Params().Set(sub=layer_ps))
    self.assertLess(abs(count - 557e6) / 557e6, 0.01)

  def testImageNetLayout(self):
    layer_ps = amoebanet.AmoebaNetD(6, 8, 10, aux_head=True, image_size=224)
    self.assertEqual(
        ['stem', 'stem_cell0', 'stem_cell1', 'stack0_cell0', 'stack0_cell1',
         'reduction0', 'stack1_cell0', 'stack1_cell1', 'aux_head',
         'reduction1', 'stack2_cell0', 'stack2_cell1', 'head'],
        [p.name for p in layer_ps])
    cells = [p for p in layer_ps if 'cell' in p.name or 'red' in p.name]
    self.assertEqual([2, 4, 8, 8, 16, 16, 16, 32, 32, 32],
                     [p.filters for p in cells])
    self.assertEqual([0, 32, 6, 12, 32, 32, 48, 64, 64, 96],
                     [p.prev_dim for p in cells])
    self.assertEqual([False, True, True, False, False, True, False, False,
                      True, False], [p.reduce_prev for p in cells])
    self.assertEqual(16 * 8, layer_ps[-1].input_dim)
    shapes = NestedMap(image=tf.TensorShape([2, 224, 224, 3]))
    sizes = {}
    for p in layer_ps:
      shapes = p.cls.FPropMeta(p, shapes).out_shapes[0]
      if p.name != 'head':
        sizes[p.name] = shapes.cur.as_list()[1:]
    self.assertEqual([111, 111, 32], sizes['stem'])
    self.assertEqual([56, 56, 6], sizes['stem_cell0'])
    self.assertEqual([28, 28, 12], sizes['stem_cell1'])
    self.assertEqual([28, 28, 32], sizes['stack0_cell1'])
    self.assertEqual([14, 14, 64], sizes['stack1_cell1'])
    self.assertEqual([7, 7, 128], sizes['stack2_cell1'])
    self.assertEqual((14, 14), layer_ps[8].input_size)
    self.assertEqual(['aux_logits', 'logits'], sorted(shapes))

  def testCifarLayoutAndUnevenStacks(self):
    layer_ps = amoebanet.AmoebaNetD(4, 8, 10, stem='cifar')
    self.assertEqual(
        ['stem', 'stack0_cell0', 'reduction0', 'stack1_cell0',
         'reduction1', 'stack2_cell0', 'stack2_cell1', 'head'],
        [p.name for p in layer_ps])
    self.assertEqual(0, layer_ps[1].prev_dim)
    self.assertFalse(layer_ps[2].reduce_prev)  # stem conv keeps the size

  @parameterized.named_parameters(('D', amoebanet.AmoebaNetD),
                                  ('B', amoebanet.AmoebaNetB))
  def testEveryLayerMatchesItsFPropMeta(self, make):
    layer_ps = make(3, 8, 7, keep_prob=0.8, drop_path_keep_prob=0.7,
                    aux_head=True, image_size=36, stem='cifar')
    state = NestedMap(image=_Normal([2, 36, 36, 3]),
                      example_keys=dropout.ExampleKeys(1, 2),
                      example_steps=tf.constant([4, 4], tf.int64))
    shapes = _ShapesOf(state)
    for p in layer_ps:
      meta = p.cls.FPropMeta(p, shapes)
      state = _Build(p).FPropDefaultTheta(state)
      self.assertEqual(_ShapesOf(state), meta.out_shapes[0], msg=p.name)
      shapes = meta.out_shapes[0]
    self.assertEqual([2, 7], state.logits.shape.as_list())
    self.assertTrue(np.all(np.isfinite(state.logits.numpy())))

  def testBadArguments(self):
    with self.assertRaisesRegex(ValueError, 'num_cells=2'):
      amoebanet.AmoebaNetD(2, 8, 10)
    with self.assertRaisesRegex(ValueError, "stem='big'"):
      amoebanet.AmoebaNetD(3, 8, 10, stem='big')
    with self.assertRaisesRegex(ValueError, 'aux_head=True needs image_size'):
      amoebanet.AmoebaNetD(3, 8, 10, aux_head=True)
    with self.assertRaisesRegex(ValueError, 'filters=3 must be an even'):
      amoebanet.AmoebaNetD(3, 6, 10)  # stem_cell1 has F = 3
    with self.assertRaisesRegex(ValueError, 'smaller than its 5x5'):
      amoebanet.AmoebaNetD(3, 8, 10, aux_head=True, image_size=32)


if __name__ == '__main__':
  absltest.main()
