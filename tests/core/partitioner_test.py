"""Tests of partitioner: optimal contiguous splits, costs, the report.

The split is checked against a brute-force enumeration of every contiguous
split; a PipeliningLayer built from it starts from the same weights as a
plain SequentialLayer of the same named layers, and computes the same.
"""

import itertools
import random

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import partitioner  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.core import transformer_layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

# ProjectionLayers without bias, widths 4 -> 8 -> 16 -> 8 -> 4 -> 4, on a
# [2, 4] input (rows = 2). flops = 2 * rows * in * out per layer:
#   layer_0  2*2*4*8   = 128
#   layer_1  2*2*8*16  = 512
#   layer_2  2*2*16*8  = 512
#   layer_3  2*2*8*4   = 128
#   layer_4  2*2*4*4   =  64          total 1344
# K=2: 128 512 | 512 128 64  -> 640, 704 (any other cut is worse).
# K=3: 128 512 | 512 | 128 64 -> 640, 512, 192; "128 512 | 512 128 | 64"
#      also peaks at 640: the earlier boundary wins the tie.
DIMS = [4, 8, 16, 8, 4, 4]
FLOPS = [128, 512, 512, 128, 64]


def _Projections(dims, has_bias=False, activation='NONE'):
  return [layers.ProjectionLayer.Params().Set(
      input_dim=a, output_dim=b, has_bias=has_bias, activation=activation)
          for a, b in zip(dims, dims[1:])]


def _SumLeftToRight(values):
  total = 0
  for v in values:
    total += v
  return total


def _BruteForce(costs, k):
  """(least max part cost, lexicographically first optimal boundaries)."""
  n = len(costs)
  best = None
  for cuts in itertools.combinations(range(1, n), k - 1):
    bounds = [0, *cuts, n]
    peak = max(_SumLeftToRight(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
    if best is None or peak < best[0]:  # combinations come in lex order
      best = (peak, bounds)
  return best


def _Bounds(cells):
  sizes = [len(cell.sub) for cell in cells]
  return [sum(sizes[:i]) for i in range(len(sizes) + 1)]


class NoMetaLayer(base_layer.BaseLayer):
  """y = x * w, w of shape [dim]; has no FPropMeta."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 3, 'Width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams([self.params.dim]))

  def FProp(self, theta, inputs):
    return inputs * theta.w


class MinMaxTest(parameterized.TestCase):

  @parameterized.parameters(range(12))
  def testMatchesBruteForceOnIntegers(self, seed):
    rng = random.Random(seed)
    costs = [rng.randint(0, 9) for _ in range(rng.randint(1, 9))]
    for k in range(1, len(costs) + 1):
      peak, bounds = _BruteForce(costs, k)
      got = partitioner.MinMaxPartition(costs, k)
      self.assertEqual(got, bounds, f'costs={costs} k={k}')
      self.assertEqual(max(_SumLeftToRight(costs[a:b])
                           for a, b in zip(got, got[1:])), peak)

  @parameterized.parameters(range(6))
  def testMatchesBruteForceOnFloats(self, seed):
    rng = random.Random(100 + seed)
    costs = [rng.uniform(0.0, 5.0) for _ in range(rng.randint(2, 10))]
    for k in range(1, len(costs) + 1):
      peak, _ = _BruteForce(costs, k)
      got = partitioner.MinMaxPartition(costs, k)
      self.assertLen(got, k + 1)
      self.assertAlmostEqual(max(_SumLeftToRight(costs[a:b])
                                 for a, b in zip(got, got[1:])), peak,
                             places=12, msg=f'costs={costs} k={k}')

  def testDocstringExamples(self):
    self.assertEqual(partitioner.MinMaxPartition([4, 2, 3, 3, 1, 5], 3),
                     [0, 2, 4, 6])
    self.assertEqual(partitioner.MinMaxPartition([1] * 5, 2), [0, 2, 5])
    self.assertEqual(partitioner.MinMaxPartition([5, 0, 0, 5], 2),
                     [0, 1, 4])


class PartitionTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(range(5))
  def testUserCostsGiveTheOptimalContiguousSplit(self, seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    costs = [rng.randint(0, 20) for _ in range(n)]
    originals = _Projections([2] * (n + 1))
    for k in (1, 2, n // 2 + 1, n):
      cells, report = partitioner.PartitionWithReport(originals, k, costs)
      self.assertLen(cells, k)
      # Every layer once, in order, contiguous, none empty.
      names = [sub.name for cell in cells for sub in cell.sub]
      self.assertEqual(names, [f'layer_{i}' for i in range(n)])
      self.assertTrue(all(cell.sub for cell in cells))
      self.assertEqual([cell.name for cell in cells],
                       [f'cell_{i}' for i in range(k)])
      peak, bounds = _BruteForce(costs, k)
      self.assertEqual(_Bounds(cells), bounds)
      self.assertEqual(max(report.costs), peak)
      self.assertEqual(report.cost_name, 'user')
    # Copies: the caller's params keep their empty names.
    self.assertEqual([p.name for p in originals], [''] * n)

  def testNamesAreKeptAndCollisionsRejected(self):
    ps = _Projections([2, 2, 2, 2])
    ps[0].name = 'embed'
    cells = partitioner.PartitionSequentialLayers(
        ps, 2, 'params', verbose=False)
    self.assertEqual([s.name for c in cells for s in c.sub],
                     ['embed', 'layer_1', 'layer_2'])
    ps[2].name = 'layer_1'  # collides with the name given to layer 1
    with self.assertRaisesRegex(
        ValueError, r"layers 1 and 2 are both named 'layer_1'"):
      partitioner.PartitionSequentialLayers(ps, 2, 'params', verbose=False)

  @parameterized.parameters((2, [0, 2, 5], [640, 704]),
                            (3, [0, 2, 3, 5], [640, 512, 192]))
  def testFlopsOfProjections(self, k, bounds, part_flops):
    cells, report = partitioner.PartitionWithReport(
        _Projections(DIMS), k, 'flops', input_shapes=[2, 4],
        dtype=tf.float64)
    self.assertEqual(_Bounds(cells), bounds)
    self.assertEqual(report.costs, part_flops)
    self.assertEqual([list(p.layer_costs) for p in report.partitions],
                     [FLOPS[a:b] for a, b in zip(bounds, bounds[1:])])
    # Outputs of layer_0, layer_1 for one micro-batch: 2 * (8 + 16) float64.
    self.assertEqual(report.partitions[0].activation_bytes, 2 * 24 * 8)

  def testFlopsPropagatesNestedMaps(self):
    p = transformer_layers.TransformerEncoderLayer.Params().Set(
        model_dim=8, hidden_dim=16, num_heads=2)
    shapes = NestedMap(vec=tf.TensorShape([2, 5, 8]),
                       paddings=tf.TensorShape([2, 5]))
    one = transformer_layers.TransformerEncoderLayer.FPropMeta(p, shapes)
    cells, report = partitioner.PartitionWithReport(
        [p] * 4, 2, 'flops', input_shapes=shapes)
    self.assertEqual(_Bounds(cells), [0, 2, 4])
    self.assertEqual(report.costs, [2 * one.flops] * 2)
    # float32 vec [2, 5, 8] and paddings [2, 5], two layers per cell.
    self.assertEqual(report.partitions[0].activation_bytes,
                     2 * (80 + 10) * 4)

  def testParamsMatchBuiltLayers(self):
    ps = _Projections([3, 7, 2], has_bias=True) + [
        NoMetaLayer.Params().Set(dim=5),
        transformer_layers.TransformerEncoderLayer.Params().Set(
            model_dim=4, hidden_dim=8, num_heads=2)]
    cells, report = partitioner.PartitionWithReport(ps, 2, 'params')
    built = []
    for cell in cells:
      for sub in cell.sub:
        built.append(base_layer.NumParameters(sub.Instantiate()))
    self.assertEqual(
        [c for p in report.partitions for c in p.layer_costs], built)
    self.assertEqual([p.num_params for p in report.partitions],
                     [sum(built[a:b]) for a, b in
                      zip(_Bounds(cells), _Bounds(cells)[1:])])
    self.assertEqual(report.total_cost, sum(built))
    # No input shapes: the activation memory is unknown.
    self.assertIsNone(report.partitions[0].activation_bytes)

  def testTimeRunsEveryLayer(self):
    cells, report = partitioner.PartitionWithReport(
        _Projections([8, 16, 16, 8, 8], activation='RELU'), 2, 'time',
        input_shapes=[4, 8], num_timing_runs=2)
    self.assertLen(cells, 2)
    self.assertEqual(report.cost_name, 'time')
    layer_times = [t for p in report.partitions for t in p.layer_costs]
    self.assertLen(layer_times, 4)
    self.assertTrue(all(t > 0 for t in layer_times), layer_times)
    # Measured outputs: [4, 16] float32 for layer_0.
    self.assertEqual(
        sum(p.activation_bytes for p in report.partitions),
        4 * (16 + 16 + 8 + 8) * 4)


class PipelineTest(tf.test.TestCase, parameterized.TestCase):
  """Cells from the partitioner, in a PipeliningLayer, against a plain stack."""

  def _PerLayerVars(self, layer):
    """(layer name, variable name) -> value, with any cell_k left out."""
    found = {}
    for var in layer.vars.Flatten():
      parts = [s for s in var.name.split(':')[0].split('/')
               if not s.startswith('cell_')]
      found[tuple(parts[1:])] = var.numpy()
    return found

  @parameterized.parameters(2, 4)
  def testSameWeightsAndOutputsAsSequential(self, k):
    stack = _Projections([3, 5, 4, 6, 3, 4, 3], has_bias=True,
                         activation='TANH')
    cells = partitioner.PartitionSequentialLayers(
        stack, k, 'flops', input_shapes=[2, 3], num_micro_batches=2,
        dtype=tf.float64, verbose=False)
    pipe = gpipe.PipeliningLayer.Params().Set(
        name='model', dtype=tf.float64, cell_tpl=cells,
        num_micro_batches=2).Instantiate()
    ref = layers.SequentialLayer.Params().Set(
        name='model', dtype=tf.float64,
        sub=[sub for cell in cells for sub in cell.sub]).Instantiate()
    self.assertEqual(pipe.num_partitions, k)
    pipe_vars, ref_vars = self._PerLayerVars(pipe), self._PerLayerVars(ref)
    self.assertLen(ref_vars, 12)
    self.assertCountEqual(pipe_vars, ref_vars)
    for key, value in ref_vars.items():
      self.assertAllEqual(pipe_vars[key], value, msg=str(key))
    x = tf.random.stateless_normal([4, 3], [5, 6], dtype=tf.float64)
    self.assertAllClose(ref.FPropDefaultTheta(x), pipe.FPropDefaultTheta(x),
                        atol=1e-12, rtol=0)


class ReportTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      # Balanced GPipe: (K-1) / (M+K-1) = 1/3.
      ('balanced', [2, 2], 'gpipe', 1, 2, 1 / 3,
       'K=2 partitions, M=2 micro-batches, bubble 33.3% (gpipe'),
      # Stage 1 three times stage 0, M=3, by hand: device 1 works 27 of a
      # step of 30 (it waits 1 for its first input, 2 for stage 0's last
      # backward); device 0 works 9: 1 - 36/60.
      ('imbalanced', [1, 3], 'gpipe', 1, 3, 0.4,
       'K=2 partitions, M=3 micro-batches, bubble 40.0% (gpipe'),
      ('imbalanced_1f1b', [1, 3], '1f1b', 1, 3, 0.4,
       'bubble 40.0% (1f1b, backward = 2 x forward)'),
      # Stages 0, 2 on device 0 and 1, 3 on device 1: a step of 15 units,
      # 12 busy on each device (timeline_test works it out).
      ('interleaved', [1, 1, 1, 1], 'interleaved_1f1b', 2, 2, 0.2,
       'K=2 devices x V=2 stages, M=2 micro-batches, bubble 20.0% '
       '(interleaved_1f1b'))
  def testBubbleIsTheTableSimulatedWithTheCosts(self, costs, name, v, m,
                                                bubble, head):
    _, report = partitioner.PartitionWithReport(
        _Projections([4] * (len(costs) + 1)), len(costs), costs,
        num_micro_batches=m, schedule_name=name, num_virtual_stages=v)
    self.assertEqual(report.costs, costs)  # one layer per partition
    self.assertEqual(report.Table(), registry.Make(name, len(costs) // v, m,
                                                   v))
    self.assertAlmostEqual(report.bubble_fraction, bubble)
    self.assertIn(head, str(report).splitlines()[0])

  def testScheduleErrorsBeforeMeasuring(self):
    ps = _Projections([4] * 4)
    with self.assertRaisesRegex(
        ValueError, r"^PartitionSequentialLayers: Schedule 'gpipe': "
        'num_virtual_stages=2 must be a positive divisor of the 3 cells'):
      partitioner.PartitionWithReport(ps, 3, 'time', num_virtual_stages=2)
    with self.assertRaisesRegex(ValueError, 'needs M a multiple of K'):
      partitioner.PartitionSequentialLayers(
          _Projections([4] * 5), 4, 'params', num_micro_batches=3,
          schedule_name='interleaved_1f1b', num_virtual_stages=2)

  def testBubbleImbalanceAndTable(self):
    ps = _Projections([4, 8, 16, 8, 4, 4, 8, 4])
    cells, report = partitioner.PartitionWithReport(
        ps, 4, 'flops', input_shapes=[2, 4], num_micro_batches=8)
    self.assertLen(cells, 4)
    self.assertEqual(report.num_partitions, 4)
    # The costs' imbalance shows: more idle than a balanced split's 3/11.
    self.assertAlmostEqual(report.bubble_fraction, schedule.Simulate(
        registry.Make('gpipe', 4, 8), report.costs,
        [2 * c for c in report.costs]).bubble)
    self.assertGreater(report.bubble_fraction, 3 / 11)
    layer_flops = [c for p in report.partitions for c in p.layer_costs]
    self.assertEqual(sum(report.costs), sum(layer_flops))
    self.assertEqual(report.total_cost, sum(layer_flops))
    self.assertAlmostEqual(report.imbalance,
                           max(report.costs) / (sum(layer_flops) / 4))
    lines = str(report).splitlines()
    self.assertIn('K=4 partitions, M=8 micro-batches, bubble '
                  f'{report.bubble_fraction:.1%} (gpipe, backward = 2 x '
                  'forward)', lines[0])
    self.assertIn('cost (flops)', lines[1])
    rows = lines[2:6]
    for k, (row, part) in enumerate(zip(rows, report.partitions)):
      self.assertTrue(row.split()[0] == str(k), row)
      self.assertIn(part.layer_names[0], row)

  def testVerboseLogsTheReport(self):
    with self.assertLogs('absl', 'INFO') as logs:
      partitioner.PartitionSequentialLayers(
          _Projections(DIMS), 2, 'flops', input_shapes=[2, 4])
    self.assertIn('Pipeline balance by flops', '\n'.join(logs.output))


class ErrorTest(tf.test.TestCase):

  def _Partition(self, num_partitions=2, cost='flops', **kwargs):
    kwargs.setdefault('input_shapes', [2, 4])
    return partitioner.PartitionSequentialLayers(
        _Projections(DIMS), num_partitions, cost, verbose=False, **kwargs)

  def testMorePartitionsThanLayers(self):
    with self.assertRaisesRegex(
        ValueError, r'num_partitions=6 but there are 5 layers; use between 1 '
        r'and 5 partitions'):
      self._Partition(6)

  def testNoPartitions(self):
    with self.assertRaisesRegex(ValueError, 'num_partitions=0'):
      self._Partition(0)

  def testUnknownCost(self):
    with self.assertRaisesRegex(
        ValueError, r"unknown cost='flop'; use one of 'flops', 'params', "
        r"'time'"):
      self._Partition(cost='flop')

  def testMissingInputShapes(self):
    for cost in ('flops', 'time'):
      with self.assertRaisesRegex(
          ValueError, f"cost='{cost}' needs input_shapes"):
        self._Partition(cost=cost, input_shapes=None)

  def testBadUserCosts(self):
    with self.assertRaisesRegex(ValueError, 'got 2 costs for 5 layers'):
      self._Partition(cost=[1, 2])
    with self.assertRaisesRegex(ValueError, 'cost 1 is -1'):
      self._Partition(cost=[1, -1, 1, 1, 1])

  def testLayerWithoutFPropMeta(self):
    ps = _Projections([3, 3]) + [NoMetaLayer.Params()]
    with self.assertRaisesRegex(
        NotImplementedError, r"layer 1 'layer_1': NoMetaLayer has no "
        r"FPropMeta; .* cost='params' or cost='time'"):
      partitioner.PartitionSequentialLayers(
          ps, 2, 'flops', input_shapes=[2, 3], verbose=False)
    # Other costs work, and give the memory of the layers before it.
    _, report = partitioner.PartitionWithReport(
        ps, 2, 'params', input_shapes=[2, 3])
    self.assertEqual(report.partitions[0].activation_bytes, 2 * 3 * 4)
    self.assertIsNone(report.partitions[1].activation_bytes)

  def testFPropMetaFailureNamesTheLayer(self):
    with self.assertRaisesRegex(
        ValueError, r"layer 0 'layer_0' \(ProjectionLayer\): FPropMeta "
        'failed'):
      self._Partition(input_shapes=[2, None])


if __name__ == '__main__':
  absltest.main()
