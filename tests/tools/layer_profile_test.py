"""Tests of layer_profile's kept-activation count and partition profiles.

residual_bytes is what a layer's gradient reads from its forward: a view
of an input (a reshape, or a slice that takes all of it) costs nothing,
a strided slice its own size. ProfilePartitions measures a split's
partitions as SequentialLayers: their parameters and the bytes between
them must be their layers'; ProfilePartitionsTogether measures them at
once, one pinned process each, and must count what it counts.
"""

import dataclasses
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import layers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tools import layer_profile


class _SliceScale(base_layer.BaseLayer):
  """x [b, n] -> x[:, ::step] * w: w's gradient reads the slice."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Size of the sliced axis.')
    p.Define('step', 1, 'Slice step.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', base_layer.WeightParams(
        [-(-p.dim // p.step)], base_layer.WeightInit.Constant(2.0)))

  def FProp(self, theta, inputs):
    return inputs[:, ::self.params.step] * theta.w

  @classmethod
  def FPropMeta(cls, params, shape):
    out = shape[:1].concatenate([-(-params.dim // params.step)])
    return NestedMap(flops=out.num_elements(), out_shapes=(out,))


def _Projections(dims):
  return [layers.ProjectionLayer.Params().Set(
      name=f'proj{i}', input_dim=d_in, output_dim=d_out, activation='RELU')
          for i, (d_in, d_out) in enumerate(zip(dims, dims[1:]))]


class KeptBytesTest(parameterized.TestCase):

  @parameterized.parameters((1, 0), (2, 8 * 32 * 4), (4, 8 * 16 * 4))
  def testSliceOfTheInputIsAViewOnlyWhenWhole(self, step, kept):
    p = _SliceScale.Params().Set(name='s', dim=64, step=step)
    profile, = layer_profile.ProfileLayers([p], tf.TensorShape([8, 64]),
                                           num_runs=1)
    self.assertEqual(profile.residual_bytes, kept)


class ProfilePartitionsTest(absltest.TestCase):

  def testPartitionsAreTheirLayers(self):
    ps = _Projections([8, 16, 32, 4])
    shape = tf.TensorShape([5, 8])
    one = layer_profile.ProfileLayers(ps, shape, num_runs=1)
    parts = layer_profile.ProfilePartitions(ps, [0, 1, 3], shape,
                                            num_runs=1)
    self.assertEqual([p.name for p in parts], ['partition_0', 'partition_1'])
    self.assertEqual(parts[0].num_params, one[0].num_params)
    self.assertEqual(parts[1].num_params,
                     one[1].num_params + one[2].num_params)
    self.assertEqual(parts[1].param_bytes,
                     one[1].param_bytes + one[2].param_bytes)
    self.assertEqual(parts[0].input_bytes, 5 * 8 * 4)
    self.assertEqual(parts[0].output_bytes, one[0].output_bytes)
    self.assertEqual(parts[1].input_bytes, one[1].input_bytes)
    self.assertEqual(parts[1].output_bytes, 5 * 4 * 4)


def _Run(graph):
  """The ops of a traced function that its outputs need: those the
  runtime runs (it prunes the rest)."""
  todo = [t.op for t in graph.outputs]
  seen = {}
  while todo:
    op = todo.pop()
    if op.name not in seen:
      seen[op.name] = op
      todo.extend(t.op for t in op.inputs)
      todo.extend(op.control_inputs)
  return list(seen.values())


class InputGradientTest(absltest.TestCase):

  def testWithoutInputGradientTheBackwardDoesLessAndTheSame(self):
    """As the pipeline's first partition for inputs from no variable: the
    variables' gradients bit for bit, no input gradient, and one MatMul
    fewer among the ops the backward's outputs need (the projection's
    d(input))."""
    layer = _Projections([8, 16])[0].Instantiate()
    args = (tf.random.stateless_normal([5, 8], [1, 2]),)
    out = layer.FProp(layer.theta, *args)
    results, matmuls = {}, {}
    for wanted in (True, False):
      fn, inputs = layer_profile._GradientFn(  # pylint: disable=protected-access
          layer, args, out, input_gradient=wanted)
      results[wanted] = fn(*inputs)
      graph = fn.get_concrete_function(*inputs).graph
      matmuls[wanted] = sum(op.type == 'MatMul' for op in _Run(graph))
    (dx, dtheta), (no_dx, same) = results[True], results[False]
    self.assertLen(dx, 1)
    self.assertEqual(dx[0].shape, [5, 8])
    self.assertEqual(list(no_dx), [])
    self.assertLen(same, len(dtheta))
    for a, b in zip(dtheta, same):
      self.assertAllEqualBits(a, b)
    self.assertEqual(matmuls[False], matmuls[True] - 1)

  def assertAllEqualBits(self, a, b):
    self.assertEqual(a.numpy().tobytes(), b.numpy().tobytes())

  def testOnlyTheFirstLayerLeavesItOut(self):
    """Later layers' input gradients feed the layer before: only the
    first layer (or partition) may leave its own out."""
    real = layer_profile._GradientFn  # pylint: disable=protected-access
    for wanted, flags in ((True, [True, True]), (False, [False, True])):
      seen = []

      def Spy(layer, args, out, input_gradient=True, seen=seen):
        seen.append(input_gradient)
        return real(layer, args, out, input_gradient)

      with mock.patch.object(layer_profile, '_GradientFn', Spy):
        layer_profile.ProfilePartitions(
            _Projections([8, 16, 32]), [0, 1, 2], tf.TensorShape([5, 8]),
            num_runs=1, input_gradient=wanted)
      self.assertEqual(seen, flags)


class ProfilePartitionsTogetherTest(absltest.TestCase):
  """Each partition in its own process pinned to its core, all at once:
  what is counted must be what ProfilePartitions counts."""

  def setUp(self):
    super().setUp()
    self.cores = sorted(os.sched_getaffinity(0))[:2]
    if len(self.cores) < 2:
      self.skipTest('needs two cores to pin two partitions to')

  def testCountsAreThoseOfOneAfterAnother(self):
    ps = _Projections([8, 16, 32, 4])
    shape = tf.TensorShape([5, 8])
    alone = layer_profile.ProfilePartitions(ps, [0, 1, 3], shape,
                                            num_runs=1)
    together = layer_profile.ProfilePartitionsTogether(
        ps, [0, 1, 3], shape, self.cores, num_runs=1)
    self.assertEqual([p.name for p in together],
                     ['partition_0', 'partition_1'])
    timed = ('forward_s', 'backward_s', 'backward_peak_bytes')
    for one, two in zip(alone, together):
      for field in dataclasses.fields(one):
        if field.name not in timed:
          self.assertEqual(getattr(two, field.name),
                           getattr(one, field.name), field.name)
      self.assertGreater(two.forward_s, 0)
      self.assertGreater(two.forward_s + two.backward_s, 0)

  def testStagesOfAWorkerAreMeasuredInItsProcess(self):
    """V = 2: four stages on two workers, stage s on worker s mod 2; each
    stage's counts are those of ProfilePartitions, which measures it on
    the real outputs of the stages before it."""
    ps = _Projections([8, 16, 32, 4, 12, 6])
    shape, bounds = tf.TensorShape([5, 8]), [0, 1, 2, 4, 5]
    alone = layer_profile.ProfilePartitions(ps, bounds, shape, num_runs=1)
    together = layer_profile.ProfilePartitionsTogether(
        ps, bounds, shape, self.cores, num_runs=1, num_virtual_stages=2)
    self.assertEqual([p.name for p in together],
                     [f'partition_{s}' for s in range(4)])
    timed = ('forward_s', 'backward_s', 'backward_peak_bytes')
    for one, two in zip(alone, together):
      for field in dataclasses.fields(one):
        if field.name not in timed:
          self.assertEqual(getattr(two, field.name),
                           getattr(one, field.name),
                           f'{one.name}: {field.name}')
      self.assertGreater(two.forward_s + two.backward_s, 0)

  def testAPartitionThatFailsSaysWhichAndWhere(self):
    ps = _Projections([8, 16, 32, 4])
    ps[2].input_dim = 7  # partition 1 gets 32 features
    with self.assertRaisesRegex(
        RuntimeError, rf'^profiling partition 1 on core {self.cores[1]} '
        'failed: '):
      layer_profile.ProfilePartitionsTogether(
          ps, [0, 2, 3], tf.TensorShape([5, 8]), self.cores, num_runs=1,
          timeout=300)

  def testBadCores(self):
    ps, shape = _Projections([8, 16, 4]), tf.TensorShape([5, 8])
    for cores, error in (
        ([0], r'^2 partitions need 2 cores, got cores=\[0\]: give one '
         r'core per partition\.$'),
        ([0, 0], r'^cores=\[0, 0\] repeats a core: .* give distinct '
         r'cores\.$'),
        ([0, 4096], r'^cores=\[0, 4096\]: \[4096\] not on this machine, '
         'which has cores 0 to ')):
      with self.assertRaisesRegex(ValueError, error):
        layer_profile.ProfilePartitionsTogether(ps, [0, 1, 2], shape, cores)
    ps = _Projections([8, 16, 4, 8, 4])
    for v, cores, error in (
        (3, [0, 1], r'^num_virtual_stages=3 must divide the 4 partitions; '
         r'change V or the split\.$'),
        (2, [0], r'^4 stages, 2 a worker, on 2 workers need 2 cores, got '
         r'cores=\[0\]: give one core per worker\.$')):
      with self.assertRaisesRegex(ValueError, error):
        layer_profile.ProfilePartitionsTogether(
            ps, [0, 1, 2, 3, 4], shape, cores, num_virtual_stages=v)


if __name__ == '__main__':
  absltest.main()
