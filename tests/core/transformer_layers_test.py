"""Tests of the pre-LN Transformer encoder and decoder layers."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import dropout
from lingvo_pipe.core import layers
from lingvo_pipe.core import transformer_layers
from lingvo_pipe.core.nested_map import NestedMap

_B, _T, _S, _D, _FF, _H = 4, 4, 3, 8, 12, 2
_EPS = 1e-6


def _Params(cls, **kwargs):
  p = cls.Params().Set(name='layer', model_dim=_D, hidden_dim=_FF,
                       num_heads=_H, dtype=tf.float64)
  return p.Set(**kwargs)


def _Build(cls, **kwargs):
  layer = _Params(cls, **kwargs).Instantiate()
  # Every variable random, so biases and layer-norm scales are tested too.
  rng = np.random.RandomState(11)
  for var in layer.vars.Flatten():
    var.assign(0.5 * rng.normal(size=var.shape.as_list()))
  return layer


def _Inputs(decoder, seed=0, t=_T, dtype=tf.float64):
  rng = np.random.RandomState(seed)
  paddings = np.zeros((_B, t))
  paddings[1, -2:] = 1.0
  paddings[3, -1:] = 1.0
  inputs = NestedMap(vec=rng.normal(size=(_B, t, _D)), paddings=paddings)
  if decoder:
    enc_paddings = np.zeros((_B, _S))
    enc_paddings[2, -1:] = 1.0
    inputs.encoder_vec = rng.normal(size=(_B, _S, _D))
    inputs.encoder_paddings = enc_paddings
  return inputs.Transform(lambda x: tf.constant(x, dtype))


# ---- plain-TF reference, written from the formulas -----------------------


def RefLayerNorm(th, x):
  mean = tf.reduce_sum(x, -1, keepdims=True) / x.shape[-1]
  var = tf.reduce_sum((x - mean)**2, -1, keepdims=True) / x.shape[-1]
  return (x - mean) / tf.sqrt(var + _EPS) * th.scale + th.bias


def RefAttention(th, query, source, paddings, causal):
  tq, tk = query.shape[1], source.shape[1]
  q = tf.tensordot(query, th.w_query, 1) + th.b_query
  k = tf.tensordot(source, th.w_key, 1) + th.b_key
  v = tf.tensordot(source, th.w_value, 1) + th.b_value
  dh = q.shape[-1] // _H
  allowed = np.broadcast_to(paddings.numpy()[:, None, :] == 0,
                            (query.shape[0], tq, tk))
  if causal:
    allowed = allowed & np.tril(np.ones((tq, tk), bool))
  heads = []
  for n in range(_H):
    cols = slice(n * dh, (n + 1) * dh)
    logits = tf.matmul(q[..., cols], k[..., cols], transpose_b=True)
    logits = tf.where(allowed, logits / math.sqrt(dh),
                      tf.constant(-1e30, tf.float64))
    probs = tf.nn.softmax(logits) * allowed.any(-1, keepdims=True)
    heads.append(tf.matmul(probs, v[..., cols]))
  return tf.tensordot(tf.concat(heads, -1), th.w_post, 1) + th.b_post


def RefAttentionSub(th, x, paddings, source=None, causal=False):
  y = RefLayerNorm(th.ln, x)
  return x + RefAttention(th.atten, y, y if source is None else source,
                          paddings, causal)


def RefFfn(th, x):
  h = tf.nn.relu(tf.tensordot(RefLayerNorm(th.ln, x), th.w1, 1) + th.b1)
  return x + tf.tensordot(h, th.w2, 1) + th.b2


def RefEncoder(th, inputs):
  x = RefAttentionSub(th.self_atten, inputs.vec, inputs.paddings)
  return RefFfn(th.ffn, x)


def RefDecoder(th, inputs):
  x = RefAttentionSub(th.self_atten, inputs.vec, inputs.paddings,
                      causal=True)
  x = RefAttentionSub(th.cross_atten, x, inputs.encoder_paddings,
                      source=inputs.encoder_vec)
  return RefFfn(th.ffn, x)


_ENC = transformer_layers.TransformerEncoderLayer
_DEC = transformer_layers.TransformerDecoderLayer
_CASES = (('encoder', _ENC, RefEncoder, False),
          ('decoder', _DEC, RefDecoder, True))


class TransformerLayersTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def testValuesAndGradientsMatchReference(self, cls, ref_fn, decoder):
    layer = _Build(cls)
    inputs = _Inputs(decoder)
    out_w = tf.constant(np.random.RandomState(5).normal(size=(_B, _T, _D)))
    watched = [inputs.vec] + ([inputs.encoder_vec] if decoder else [])
    results = []
    for fn in (lambda th: layer.FProp(th, inputs).vec,
               lambda th: ref_fn(th, inputs)):
      with tf.GradientTape() as tape:
        tape.watch(watched)
        out = fn(layer.vars)
        loss = tf.reduce_sum(out * out_w)
      results.append((out, tape.gradient(loss, [layer.vars, watched])))
    (got, (got_vars, got_in)), (want, (want_vars, want_in)) = results
    self.assertAllClose(want, got, atol=1e-12, rtol=1e-12)
    got_items = dict(got_vars.FlattenItems())
    want_items = dict(want_vars.FlattenItems())
    self.assertCountEqual(want_items, got_items)
    expected = 16 + (10 if decoder else 0)  # ffn: ln 2 + 4; atten: 2 + 8
    self.assertLen(got_items, expected)
    for name, want_g in want_items.items():
      self.assertIsNotNone(got_items[name], name)
      self.assertGreater(np.abs(want_g).max(), 0.0, name)
      self.assertAllClose(want_g, got_items[name], atol=1e-12, rtol=1e-12,
                          msg=name)
    for want_g, got_g in zip(want_in, got_in):
      self.assertAllClose(want_g, got_g, atol=1e-12, rtol=1e-12)

  @parameterized.named_parameters(*_CASES)
  def testOutputMapPassesFieldsThrough(self, cls, unused_ref, decoder):
    layer = _Build(cls)
    inputs = _Inputs(decoder)
    inputs.example_keys = dropout.ExampleKeys(0, _B)
    vec = inputs.vec
    out = layer.FPropDefaultTheta(inputs)
    self.assertIsInstance(out, NestedMap)
    self.assertCountEqual(list(inputs), list(out))
    for key in inputs:
      if key != 'vec':
        self.assertIs(inputs[key], out[key], key)
    self.assertIs(vec, inputs.vec)  # the input map is not modified
    self.assertEqual(vec.shape, out.vec.shape)
    meta = cls.FPropMeta(
        layer.params, inputs.Transform(lambda x: x.shape))
    self.assertLen(meta.out_shapes, 1)
    self.assertEqual(out.Transform(lambda x: x.shape), meta.out_shapes[0])

  def testDecoderIsCausal(self):
    layer = _Build(_DEC)
    inputs = _Inputs(True)
    out = layer.FPropDefaultTheta(inputs).vec
    t = 2
    changed = inputs.Copy()
    changed.vec = tf.concat([inputs.vec[:, :t], inputs.vec[:, t:] * 3.0], 1)
    out2 = layer.FPropDefaultTheta(changed).vec
    self.assertAllEqual(out[:, :t], out2[:, :t])
    self.assertNotAllClose(out[:, t:], out2[:, t:])

  @parameterized.parameters((tf.float64, 1e-12), (tf.float32, 1e-5))
  def testExtendStepEqualsTheFullForward(self, dtype, tol):
    # Decoding one position at a time with cached keys and values gives
    # row t of FProp over the whole target (no target paddings: decoding).
    layer = _Build(_DEC, dtype=dtype)
    layer.SetTraining(False)
    inputs = _Inputs(True, dtype=dtype)
    inputs.paddings = tf.zeros_like(inputs.paddings)
    full = layer.FPropDefaultTheta(inputs).vec
    max_length = _T + 2  # the cache may be longer than what is decoded
    cache = layer.InitDecodeCache(layer.theta, inputs.encoder_vec,
                                  max_length)
    self.assertEqual([_B, max_length, _H, _D // _H],
                     cache.self_kv.key.shape.as_list())
    steps = []
    for t in range(_T):
      step = NestedMap(vec=inputs.vec[:, t:t + 1],
                       encoder_paddings=inputs.encoder_paddings)
      out, cache = layer.ExtendStep(layer.theta, step, cache, tf.constant(t))
      self.assertIs(out.encoder_paddings, step.encoder_paddings)
      steps.append(out.vec)
    self.assertAllClose(full, tf.concat(steps, 1), atol=tol, rtol=0)
    # The cache holds each position's self-attention key, zeros after.
    self.assertAllEqual(tf.zeros([_B, 2, _H, _D // _H], dtype),
                        cache.self_kv.key[:, _T:])

  @parameterized.named_parameters(*_CASES)
  def testPaddedPositionsDoNotLeak(self, cls, unused_ref, decoder):
    layer = _Build(cls)
    inputs = _Inputs(decoder)
    out = layer.FPropDefaultTheta(inputs).vec
    changed = inputs.Copy()
    # The decoder's keys to pad are the encoder's; the encoder's its own.
    vec_key = 'encoder_vec' if decoder else 'vec'
    pad_key = 'encoder_paddings' if decoder else 'paddings'
    pad = changed[pad_key][..., tf.newaxis]
    changed[vec_key] = changed[vec_key] * (1.0 - pad) + 7.0 * pad
    out2 = layer.FPropDefaultTheta(changed).vec
    real = inputs.paddings.numpy() == 0
    if decoder:  # every target position is unaffected
      self.assertAllEqual(out, out2)
    else:  # padded positions change themselves only
      self.assertAllEqual(out.numpy()[real], out2.numpy()[real])
    # Changing a real source position does change the output.
    changed[vec_key] = inputs[vec_key] + 1.0
    out3 = layer.FPropDefaultTheta(changed).vec
    self.assertNotAllClose(out.numpy()[real], out3.numpy()[real])

  def testFullyPaddedExampleIsFinite(self):
    layer = _Build(_DEC)
    inputs = _Inputs(True)
    inputs.paddings = tf.tensor_scatter_nd_update(
        inputs.paddings, [[0]], tf.ones([1, _T], tf.float64))
    inputs.encoder_paddings = tf.ones([_B, _S], tf.float64)
    with tf.GradientTape() as tape:
      out = layer.FPropDefaultTheta(inputs).vec
      loss = tf.reduce_sum(out**2)
    self.assertTrue(np.all(np.isfinite(out.numpy())))
    for g in tape.gradient(loss, layer.vars.Flatten()):
      self.assertTrue(np.all(np.isfinite(tf.convert_to_tensor(g).numpy())))

  @parameterized.named_parameters(
      ('encoder_residual', _ENC, 'residual_dropout_prob'),
      ('encoder_atten', _ENC, 'atten_dropout_prob'),
      ('encoder_relu', _ENC, 'relu_dropout_prob'),
      ('decoder_residual', _DEC, 'residual_dropout_prob'),
      ('decoder_atten', _DEC, 'atten_dropout_prob'),
      ('decoder_relu', _DEC, 'relu_dropout_prob'))
  def testDropoutDeterministicAndSplitInvariant(self, cls, prob_name):
    decoder = cls is _DEC
    layer = _Build(cls, **{prob_name: 0.4})
    inputs = _Inputs(decoder)
    inputs.example_keys = dropout.ExampleKeys(9, _B)
    layer.SetTraining(False)
    eval_out = layer.FPropDefaultTheta(inputs).vec
    ref = (RefDecoder if decoder else RefEncoder)(layer.vars, inputs)
    self.assertAllClose(ref, eval_out, atol=1e-12)
    self.assertAllEqual(eval_out, layer.FPropDefaultTheta(inputs).vec)

    layer.SetTraining(True)
    train = layer.FPropDefaultTheta(inputs).vec
    self.assertAllEqual(train, layer.FPropDefaultTheta(inputs).vec)
    self.assertNotAllClose(eval_out, train)
    # Micro-batches with their keys give exactly the full batch's rows
    # (see the next test for why these shapes are exact).
    for lo, hi in ((0, 2), (2, _B), (0, 1), (1, _B)):
      part = inputs.Transform(lambda x, lo=lo, hi=hi: x[lo:hi])
      self.assertAllEqual(train[lo:hi], layer.FPropDefaultTheta(part).vec)
    no_keys = inputs.Copy()
    del no_keys.example_keys
    with self.assertRaisesRegex(ValueError, 'example_keys'):
      layer.FPropDefaultTheta(no_keys)

  @parameterized.named_parameters(('encoder', _ENC), ('decoder', _DEC))
  def testDropoutSplitAtAnyShapeWithinRounding(self, cls):
    # The test above is exact because its per-example sizes (2*4*4 and
    # 2*4*3 attention probs) divide the CPU's vector width: TF's CPU
    # kernels (exp, rsqrt) round the last, partial vector of a buffer
    # differently, so at other sizes a split can move the last bit. A
    # different dropout mask would move outputs by O(1), not 1e-12.
    probs = dict(residual_dropout_prob=0.2, atten_dropout_prob=0.3,
                 relu_dropout_prob=0.4)
    layer = _Build(cls, **probs)
    inputs = _Inputs(cls is _DEC, t=5)
    inputs.example_keys = dropout.ExampleKeys(2, _B)
    train = layer.FPropDefaultTheta(inputs).vec
    layer.SetTraining(False)
    self.assertNotAllClose(layer.FPropDefaultTheta(inputs).vec, train)
    layer.SetTraining(True)
    for lo, hi in ((0, 1), (1, 3), (3, _B)):
      part = inputs.Transform(lambda x, lo=lo, hi=hi: x[lo:hi])
      self.assertAllClose(train[lo:hi], layer.FPropDefaultTheta(part).vec,
                          atol=1e-12, rtol=1e-12)

  def testStackInSequentialLayerAndMeta(self):
    enc_p = _Params(_ENC, residual_dropout_prob=0.1)
    seq_p = layers.SequentialLayer.Params().Set(
        name='stack', sub=[enc_p.Copy().Set(name='enc0'),
                           enc_p.Copy().Set(name='enc1')], dtype=tf.float64)
    stack = seq_p.Instantiate()
    stack.SetTraining(False)
    inputs = _Inputs(False)
    out = stack.FPropDefaultTheta(inputs)
    th = stack.theta
    want = RefEncoder(th.enc1, NestedMap(vec=RefEncoder(th.enc0, inputs),
                                         paddings=inputs.paddings))
    self.assertAllClose(want, out.vec, atol=1e-12)

    shapes = inputs.Transform(lambda x: x.shape)
    one = _ENC.FPropMeta(enc_p, shapes)
    two = layers.SequentialLayer.FPropMeta(seq_p, shapes)
    self.assertEqual(2 * one.flops, two.flops)
    self.assertEqual((shapes,), two.out_shapes)
    # At a realistic size matmuls dominate: 2 flops per multiply-add.
    b, t, d, ff = 2, 16, 64, 256
    big = _ENC.FPropMeta(
        _Params(_ENC, model_dim=d, hidden_dim=ff, num_heads=4,
                residual_dropout_prob=0.1),
        NestedMap(vec=tf.TensorShape([b, t, d]),
                  paddings=tf.TensorShape([b, t])))
    macs = b * t * (4 * d * d + 2 * t * d + 2 * d * ff)
    self.assertBetween(big.flops, 2 * macs, 2.1 * macs)
    doubled = shapes.Transform(
        lambda s: tf.TensorShape([2 * s[0]]).concatenate(s[1:]))
    self.assertEqual(2 * one.flops, _ENC.FPropMeta(enc_p, doubled).flops)
    dec_shapes = _Inputs(True).Transform(lambda x: x.shape)
    dec = _DEC.FPropMeta(_Params(_DEC, residual_dropout_prob=0.1),
                         dec_shapes)
    cross = transformer_layers.TransformerAttentionLayer.FPropMeta(
        transformer_layers.TransformerAttentionLayer.Params().Set(
            input_dim=_D, num_heads=_H, residual_dropout_prob=0.1),
        dec_shapes.vec, dec_shapes.encoder_vec)
    self.assertEqual(one.flops + cross.flops, dec.flops)


class OpCountTest(tf.test.TestCase):
  """What one encoder layer costs per call, in graph ops: every micro-batch
  of every stage runs them, so a change that adds ops adds to each."""

  # One TransformerEncoderLayer traced with TensorFlow 2.21
  # (requirements.txt): forward; forward and every gradient. A change
  # that moves either moves the pin, on purpose.
  FORWARD_OPS, FORWARD_BACKWARD_OPS = 134, 298

  def _Count(self, fn, vec):
    graph_def = tf.function(fn, autograph=False).get_concrete_function(
        vec).graph.as_graph_def()
    return len(graph_def.node) + sum(
        len(f.node_def) for f in graph_def.library.function)

  def testOneEncoderLayer(self):
    layer = transformer_layers.TransformerEncoderLayer.Params().Set(
        name='layer', model_dim=16, hidden_dim=32, num_heads=2).Instantiate()
    paddings = tf.zeros([2, 4])

    def Forward(vec):
      return layer.FProp(layer.theta,
                         NestedMap(vec=vec, paddings=paddings)).vec

    def ForwardBackward(vec):
      with tf.GradientTape() as tape:
        tape.watch(vec)
        loss = tf.reduce_sum(Forward(vec))
      return tape.gradient(loss, layer.vars.Flatten() + [vec])

    vec = tf.zeros([2, 4, 16])
    self.assertEqual(self.FORWARD_OPS, self._Count(Forward, vec))
    self.assertEqual(self.FORWARD_BACKWARD_OPS,
                     self._Count(ForwardBackward, vec))


if __name__ == '__main__':
  absltest.main()
