"""Tests of the encoder-decoder layer list and its pipelined stack."""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import transformer_layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402

_B, _S, _T, _D = 4, 6, 5, 8


def _State(seed=0):
  """The stack's input state, with some padding on both sides."""
  src_pad = tf.constant([[0.] * 6, [0.] * 4 + [1.] * 2, [0.] * 5 + [1.],
                         [0.] * 3 + [1.] * 3], tf.float64)
  tgt_pad = tf.constant([[0.] * 5, [0.] * 2 + [1.] * 3, [0.] * 4 + [1.],
                         [0.] * 3 + [1.] * 2], tf.float64)
  normal = tf.random.stateless_normal
  return NestedMap(
      vec=normal([_B, _S, _D], [seed, 1], dtype=tf.float64),
      paddings=src_pad,
      tgt_vec=normal([_B, _T, _D], [seed, 2], dtype=tf.float64),
      tgt_paddings=tgt_pad)


def _Layers(num_encoder=2, num_decoder=2):
  return transformer.TransformerLayers(num_encoder, num_decoder, _D, 16, 2)


class LayerListTest(parameterized.TestCase):

  def testNamesAndKinds(self):
    ps = transformer.TransformerLayers(3, 2, _D, 16, 2, dropout_prob=0.1,
                                       atten_dropout_prob=0.2,
                                       relu_dropout_prob=0.3)
    self.assertEqual(['encoder_0', 'encoder_1', 'encoder_2', 'switch',
                      'decoder_0', 'decoder_1', 'decoder_out'],
                     [p.name for p in ps])
    kinds = [p.cls for p in ps]
    self.assertEqual([transformer_layers.TransformerEncoderLayer] * 3 +
                     [transformer.EncoderDecoderSwitch] +
                     [transformer_layers.TransformerDecoderLayer] * 2 +
                     [transformer.DecoderOutputLayer], kinds)
    for p in ps[:3] + ps[4:6]:
      self.assertEqual((_D, 16, 2, 0.1, 0.2, 0.3),
                       (p.model_dim, p.hidden_dim, p.num_heads,
                        p.residual_dropout_prob, p.atten_dropout_prob,
                        p.relu_dropout_prob))

  def testNeedsBothStacks(self):
    with self.assertRaisesRegex(ValueError, 'num_encoder_layers=0'):
      transformer.TransformerLayers(0, 1, _D, 16, 2)

  @parameterized.parameters(1, 2, 3, 4)
  def testPipelinedStackKeepsTheOrder(self, k):
    stack = transformer.PipelinedStack(
        _Layers(), k, 2, transformer.StateShapes(2, _S, _T, _D))
    self.assertLen(stack.cell_tpl, k)
    names = [sub.name for cell in stack.cell_tpl for sub in cell.sub]
    self.assertEqual([p.name for p in _Layers()], names)
    self.assertEqual(2, stack.num_micro_batches)

  def testBalancedByFlopsOfTheGivenShapes(self):
    # Same layers, same parameter counts; a long source makes the encoder
    # the expensive half, a long target the decoder.
    ps = transformer.TransformerLayers(3, 3, 32, 128, 4)
    by_params = transformer.PipelinedStack(ps, 2, 1)
    long_src = transformer.PipelinedStack(
        ps, 2, 1, transformer.StateShapes(4, 64, 4, 32))
    long_tgt = transformer.PipelinedStack(
        ps, 2, 1, transformer.StateShapes(4, 4, 64, 32))
    first = lambda stack: [s.name for s in stack.cell_tpl[0].sub]  # noqa: E731
    self.assertEqual(['encoder_0', 'encoder_1', 'encoder_2', 'switch'],
                     first(by_params))
    self.assertLess(len(first(long_src)), 3)
    self.assertIn('decoder_0', first(long_tgt))


class SwitchAndOutputTest(tf.test.TestCase):

  def testSwitch(self):
    p = transformer.EncoderDecoderSwitch.Params().Set(
        name='switch', model_dim=_D, dtype=tf.float64)
    layer = p.Instantiate()
    state = _State()
    state.example_keys = tf.constant([1, 2, 3, 4], tf.int64)
    out = layer.FPropDefaultTheta(state)
    self.assertEqual(['encoder_paddings', 'encoder_vec', 'example_keys',
                      'paddings', 'vec'], sorted(out))
    self.assertIs(state.tgt_vec, out.vec)
    self.assertIs(state.tgt_paddings, out.paddings)
    self.assertIs(state.paddings, out.encoder_paddings)
    self.assertIs(state.example_keys, out.example_keys)
    x = state.vec
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    self.assertAllClose((x - mean) / tf.sqrt(var + 1e-6), out.encoder_vec,
                        atol=1e-12)
    meta = transformer.EncoderDecoderSwitch.FPropMeta(
        p, state.Transform(lambda t: t.shape))
    self.assertEqual(out.Transform(lambda t: t.shape), meta.out_shapes[0])
    self.assertGreater(meta.flops, 0)

  def testSwitchNeedsTheTarget(self):
    layer = transformer.EncoderDecoderSwitch.Params().Set(
        name='switch', model_dim=_D, dtype=tf.float64).Instantiate()
    state = _State()
    del state.tgt_vec
    with self.assertRaisesRegex(ValueError, "no 'tgt_vec'"):
      layer.FPropDefaultTheta(state)

  def testOutputLayer(self):
    p = transformer.DecoderOutputLayer.Params().Set(
        name='out', model_dim=_D, dtype=tf.float64)
    state = NestedMap(vec=_State().tgt_vec, paddings=_State().tgt_paddings,
                      encoder_vec=_State().vec)
    out = p.Instantiate().FPropDefaultTheta(state)
    self.assertEqual(['paddings', 'vec'], sorted(out))
    meta = transformer.DecoderOutputLayer.FPropMeta(
        p, state.Transform(lambda t: t.shape))
    self.assertEqual(out.Transform(lambda t: t.shape), meta.out_shapes[0])

  def testBadModelDim(self):
    with self.assertRaisesRegex(ValueError, 'model_dim=0'):
      transformer.DecoderOutputLayer.Params().Set(name='out').Instantiate()


class StackStepsTest(tf.test.TestCase, parameterized.TestCase):

  def _Stacks(self):
    piped = transformer.PipelinedStack(_Layers(), 2, 2).Set(dtype=tf.float64)
    plain = transformer.SequentialStack(_Layers()).Set(dtype=tf.float64)
    return piped.Instantiate(), plain.Instantiate()

  def testStepsFollowTheLayerList(self):
    piped, plain = self._Stacks()
    self.assertIsInstance(piped, gpipe.PipeliningLayer)
    self.assertIsInstance(plain, layers.SequentialLayer)
    names = [p.name for p in _Layers()]
    for stack in (piped, plain):
      steps = transformer.StackSteps(stack, stack.theta)
      self.assertEqual(names, [layer.params.name for _, layer, _ in steps])
      encoder, decoder = transformer.SplitAtSwitch(steps)
      self.assertEqual(['encoder_0', 'encoder_1'],
                       [layer.params.name for _, layer, _ in encoder])
      self.assertIsInstance(decoder[0][1], transformer.EncoderDecoderSwitch)
    devices_used = [d for d, _, _ in transformer.StackSteps(piped,
                                                            piped.theta)]
    self.assertEqual(piped.devices, sorted(set(devices_used)))
    self.assertEqual({None}, {d for d, _, _ in transformer.StackSteps(
        plain, plain.theta)})

  def testRunStepsEqualsTheStack(self):
    piped, plain = self._Stacks()
    piped.SetTraining(False)
    state = _State()
    want = plain.FPropDefaultTheta(state)
    self.assertEqual(['paddings', 'vec'], sorted(want))
    for stack in (piped, plain):
      got = transformer.RunSteps(transformer.StackSteps(stack, stack.theta),
                                 state)
      self.assertAllClose(want.vec, got.vec, atol=1e-12)
    self.assertAllClose(want.vec, piped.FPropDefaultTheta(state).vec,
                        atol=1e-12)

  def testErrors(self):
    proj = layers.ProjectionLayer.Params().Set(
        name='proj', input_dim=2, output_dim=2).Instantiate()
    with self.assertRaisesRegex(ValueError, 'ProjectionLayer'):
      transformer.StackSteps(proj, proj.theta)
    enc = transformer.SequentialStack(
        transformer.EncoderLayers(2, _D, 16, 2)).Instantiate()
    with self.assertRaisesRegex(ValueError, '0 EncoderDecoderSwitch'):
      transformer.SplitAtSwitch(transformer.StackSteps(enc, enc.theta))


if __name__ == '__main__':
  absltest.main()
