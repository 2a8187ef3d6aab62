"""Tests of layer_profile's kept-activation count and partition profiles.

residual_bytes is what a layer's gradient reads from its forward: a view
of an input (a reshape, or a slice that takes all of it) costs nothing,
a strided slice its own size. ProfilePartitions measures a split's
partitions as SequentialLayers: their parameters and the bytes between
them must be their layers'.
"""

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


class KeptBytesTest(parameterized.TestCase):

  @parameterized.parameters((1, 0), (2, 8 * 32 * 4), (4, 8 * 16 * 4))
  def testSliceOfTheInputIsAViewOnlyWhenWhole(self, step, kept):
    p = _SliceScale.Params().Set(name='s', dim=64, step=step)
    profile, = layer_profile.ProfileLayers([p], tf.TensorShape([8, 64]),
                                           num_runs=1)
    self.assertEqual(profile.residual_bytes, kept)


class ProfilePartitionsTest(absltest.TestCase):

  def testPartitionsAreTheirLayers(self):
    ps = [layers.ProjectionLayer.Params().Set(
        name=f'proj{i}', input_dim=d_in, output_dim=d_out,
        activation='RELU')
          for i, (d_in, d_out) in enumerate([(8, 16), (16, 32), (32, 4)])]
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


if __name__ == '__main__':
  absltest.main()
