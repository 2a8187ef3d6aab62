"""Tests of attention: MultiHeadAttention and positional embeddings."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import attention
from lingvo_pipe.core import dropout

_VAR_NAMES = ('w_query', 'w_key', 'w_value', 'w_post',
              'b_query', 'b_key', 'b_value', 'b_post')


def _Layer(input_dim=6, hidden_dim=8, num_heads=2, use_bias=True,
           atten_dropout_prob=0.0, dtype=tf.float64, name='mha'):
  p = attention.MultiHeadAttention.Params().Set(
      name=name, input_dim=input_dim, hidden_dim=hidden_dim,
      num_heads=num_heads, use_bias=use_bias,
      atten_dropout_prob=atten_dropout_prob, dtype=dtype)
  layer = p.Instantiate()
  if use_bias:  # Non-zero biases, so that they are tested too.
    rng = np.random.RandomState(7)
    for name in _VAR_NAMES[4:]:
      var = layer.theta[name]
      var.assign(rng.normal(size=var.shape.as_list()))
  return layer


def _Weights(layer):
  return {k: v.numpy() for k, v in layer.theta.items()
          if k in _VAR_NAMES}


def NumpyAttention(w, query, key, value, paddings, causal, num_heads):
  """Loops over batch, head and query: (encoded, probs)."""
  b, tq, _ = query.shape
  tk = key.shape[1]
  q = query @ w['w_query'] + w.get('b_query', 0.0)
  k = key @ w['w_key'] + w.get('b_key', 0.0)
  v = value @ w['w_value'] + w.get('b_value', 0.0)
  hidden = q.shape[-1]
  dh = hidden // num_heads
  ctx = np.zeros((b, tq, hidden))
  probs = np.zeros((b, num_heads, tq, tk))
  for bi in range(b):
    for n in range(num_heads):
      cols = slice(n * dh, (n + 1) * dh)
      for i in range(tq):
        valid = [j for j in range(tk)
                 if paddings[bi, j] == 0 and not (causal and j > i)]
        if not valid:
          continue
        scores = np.array(
            [q[bi, i, cols] @ k[bi, j, cols] for j in valid]) / math.sqrt(dh)
        e = np.exp(scores - scores.max())
        probs[bi, n, i, valid] = e / e.sum()
        ctx[bi, i, cols] = sum(probs[bi, n, i, j] * v[bi, j, cols]
                               for j in valid)
  encoded = ctx @ w['w_post'] + w.get('b_post', 0.0)
  return encoded, probs


def TfAttention(theta, query, key, value, paddings, causal, num_heads):
  """Plain-TF reference (matmul per head), for gradients."""
  def Dense(x, name):
    y = tf.tensordot(x, theta['w_' + name], 1)
    return y + theta['b_' + name] if 'b_' + name in theta else y

  q, k, v = Dense(query, 'query'), Dense(key, 'key'), Dense(value, 'value')
  dh = q.shape[-1] // num_heads
  tq, tk = query.shape[1], key.shape[1]
  allowed = tf.cast(1.0 - paddings, tf.bool)[:, tf.newaxis, :]
  allowed = tf.tile(allowed, [1, tq, 1])
  if causal:
    lower = np.tril(np.ones((tq, tk), bool))
    allowed = tf.logical_and(allowed, lower[np.newaxis])
  any_allowed = tf.cast(
      tf.reduce_any(allowed, axis=-1, keepdims=True), q.dtype)
  heads, probs = [], []
  for n in range(num_heads):
    cols = slice(n * dh, (n + 1) * dh)
    logits = tf.matmul(q[..., cols], k[..., cols], transpose_b=True)
    logits = tf.where(allowed, logits / math.sqrt(dh),
                      tf.constant(-1e30, q.dtype))
    prob = tf.nn.softmax(logits) * any_allowed
    probs.append(prob)
    heads.append(tf.matmul(prob, v[..., cols]))
  encoded = Dense(tf.concat(heads, axis=-1), 'post')
  return encoded, tf.stack(probs, axis=1)


def _Inputs(b, tq, tk, d, seed=0):
  rng = np.random.RandomState(seed)
  q = rng.normal(size=(b, tq, d))
  k = rng.normal(size=(b, tk, d))
  v = rng.normal(size=(b, tk, d))
  paddings = np.zeros((b, tk))
  for bi in range(b):  # Example bi has its last bi keys padded.
    if bi:
      paddings[bi, tk - bi:] = 1.0
  return q, k, v, paddings


class PerExampleMatmulTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('static', False), ('unknown_dims', True))
  def testValuesAndGradientsMatchEinsum(self, unknown_dims):
    x = tf.random.stateless_normal([3, 5, 4], [1, 2], dtype=tf.float64)
    w = tf.random.stateless_normal([4, 6], [3, 4], dtype=tf.float64)
    dy = tf.random.stateless_normal([3, 5, 6], [5, 6], dtype=tf.float64)

    def Grads(fn, x, w):
      with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = fn(x, w)
      return (y,) + tuple(tape.gradient(y, [x, w], output_gradients=dy))

    def ours(x, w):
      return Grads(attention.PerExampleMatmul, x, w)

    if unknown_dims:
      spec = [tf.TensorSpec([None, None, 4], tf.float64),
              tf.TensorSpec([None, None], tf.float64)]
      ours = tf.function(ours, input_signature=spec, autograph=False)
    want = Grads(lambda x, w: tf.einsum('bti,io->bto', x, w), x, w)
    for name, a, b in zip(('y', 'dx', 'dw'), want, ours(x, w)):
      self.assertAllClose(a, b, atol=1e-12, rtol=0, msg=name)

  def testRowsDoNotDependOnTheBatch(self):
    # At these float64 shapes a flat [b * t, i] matmul does round the
    # rows of a slice differently from the same rows of the whole batch.
    x = tf.random.stateless_normal([8, 7, 33], [1, 2], dtype=tf.float64)
    w = tf.random.stateless_normal([33, 65], [3, 4], dtype=tf.float64)
    full = attention.PerExampleMatmul(x, w)
    for lo, hi in ((0, 1), (1, 3), (3, 8)):
      self.assertAllEqual(full[lo:hi],
                          attention.PerExampleMatmul(x[lo:hi], w))


class MultiHeadAttentionTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('self', True, False, True, 2),
      ('self_causal', True, True, True, 2),
      ('cross', False, False, True, 2),
      ('cross_no_bias_one_head', False, False, False, 1),
      ('self_causal_four_heads', True, True, False, 4))
  def testValuesMatchNumpy(self, self_atten, causal, use_bias, num_heads):
    layer = _Layer(use_bias=use_bias, num_heads=num_heads)
    q, k, v, paddings = _Inputs(3, 5, 5 if self_atten else 4, 6)
    if self_atten:
      k = v = q
    encoded, probs = layer.FPropDefaultTheta(q, k, v, paddings, causal)
    want_encoded, want_probs = NumpyAttention(
        _Weights(layer), q, k, v, paddings, causal, num_heads)
    self.assertEqual(encoded.dtype, tf.float64)
    self.assertAllClose(want_probs, probs, atol=1e-12, rtol=1e-12)
    self.assertAllClose(want_encoded, encoded, atol=1e-12, rtol=1e-12)

  @parameterized.named_parameters(('self_causal', True), ('cross', False))
  def testGradientsMatchReference(self, causal):
    layer = _Layer()
    q, k, v, paddings = _Inputs(3, 4, 4 if causal else 5, 6, seed=1)
    rng = np.random.RandomState(2)
    enc_w = rng.normal(size=(3, 4, 6))
    probs_w = rng.normal(size=(3, 2, 4, k.shape[1]))
    inputs = [tf.constant(x) for x in (q, k, v)]
    variables = layer.vars

    def Loss(fn, theta):
      encoded, probs = fn(theta, *inputs, tf.constant(paddings), causal, 2)
      return (tf.reduce_sum(encoded * enc_w) +
              tf.reduce_sum(probs * probs_w))

    def LayerFn(theta, *args):
      return layer.FProp(theta, *args[:5])

    grads = {}
    for name, fn in (('layer', LayerFn), ('ref', TfAttention)):
      with tf.GradientTape() as tape:
        tape.watch(inputs)
        loss = Loss(fn, variables)
      grads[name] = (loss, tape.gradient(loss, [variables, inputs]))
    self.assertAllClose(grads['ref'][0], grads['layer'][0], atol=1e-12)
    want_vars, want_inputs = grads['ref'][1]
    got_vars, got_inputs = grads['layer'][1]
    self.assertCountEqual(_VAR_NAMES, [
        k for k in got_vars if k != 'atten_dropout'])
    for name in _VAR_NAMES:
      self.assertIsNotNone(got_vars[name], name)
      self.assertGreater(np.abs(want_vars[name]).max(), 0.0, name)
      self.assertAllClose(want_vars[name], got_vars[name], atol=1e-12,
                          rtol=1e-12, msg=name)
    for want, got in zip(want_inputs, got_inputs):
      self.assertAllClose(want, got, atol=1e-12, rtol=1e-12)

  def testCausalOutputIgnoresFuture(self):
    layer = _Layer()
    q, _, _, paddings = _Inputs(2, 6, 6, 6)
    paddings[:] = 0.0
    x = tf.constant(q)
    t = 3
    perturbed = tf.concat([x[:, :t], x[:, t:] + 10.0], axis=1)
    enc, probs = layer.FPropDefaultTheta(x, x, x, paddings, causal=True)
    enc2, _ = layer.FPropDefaultTheta(
        perturbed, perturbed, perturbed, paddings, causal=True)
    self.assertAllEqual(enc[:, :t], enc2[:, :t])
    self.assertNotAllClose(enc[:, t:], enc2[:, t:])
    upper = np.triu(np.ones((6, 6), bool), k=1)
    self.assertAllEqual(np.zeros_like(probs.numpy()[..., upper]),
                        probs.numpy()[..., upper])
    # Without the mask the perturbation reaches earlier positions.
    enc3, _ = layer.FPropDefaultTheta(
        perturbed, perturbed, perturbed, paddings, causal=False)
    enc4, _ = layer.FPropDefaultTheta(x, x, x, paddings, causal=False)
    self.assertNotAllClose(enc4[:, :t], enc3[:, :t])

  def testPaddedKeysDoNotMatter(self):
    layer = _Layer()
    q, k, v, paddings = _Inputs(3, 4, 5, 6)
    enc, probs = layer.FPropDefaultTheta(q, k, v, paddings)
    k2, v2 = k.copy(), v.copy()
    k2[paddings > 0] += 100.0
    v2[paddings > 0] -= 50.0
    enc2, probs2 = layer.FPropDefaultTheta(q, k2, v2, paddings)
    self.assertAllEqual(enc, enc2)
    self.assertAllEqual(probs, probs2)
    mask = np.broadcast_to(paddings[:, None, None, :] > 0, probs.shape)
    self.assertAllEqual(np.zeros(mask.sum()), probs.numpy()[mask])
    self.assertAllClose(np.ones(probs.shape[:-1]),
                        tf.reduce_sum(probs, -1), atol=1e-12)

  @parameterized.parameters(tf.float64, tf.float32, tf.float16, tf.bfloat16)
  def testFullyPaddedRowsHaveNoNan(self, dtype):
    layer = _Layer(dtype=dtype)
    q, k, v, paddings = _Inputs(2, 3, 4, 6)
    paddings[1] = 1.0
    x = [tf.cast(a, dtype) for a in (q, k, v)]
    with tf.GradientTape() as tape:
      enc, probs = layer.FPropDefaultTheta(*x, paddings, causal=False)
      loss = tf.reduce_sum(tf.cast(enc, tf.float32) ** 2)
    grads = tape.gradient(loss, layer.vars.Flatten())
    self.assertEqual(enc.dtype, dtype)
    self.assertAllEqual(np.zeros((2, 3, 4)), probs[1])
    post = tf.cast(layer.theta.b_post, tf.float32)
    self.assertAllEqual(np.broadcast_to(post.numpy(), (3, 6)),
                        tf.cast(enc[1], tf.float32))
    self.assertTrue(np.all(np.isfinite(tf.cast(enc, tf.float32).numpy())))
    for g in grads:
      self.assertTrue(np.all(np.isfinite(tf.cast(g, tf.float32).numpy())))
    # The valid example still attends normally.
    self.assertAllClose(np.ones((2, 3)),
                        tf.reduce_sum(tf.cast(probs[0], tf.float32), -1),
                        atol=2e-2)

  def testCrossAttentionShapesAndMeta(self):
    layer = _Layer(input_dim=6, hidden_dim=12, num_heads=3)
    q, k, v, paddings = _Inputs(2, 7, 3, 6)
    enc, probs = layer.FPropDefaultTheta(q, k, v, paddings)
    self.assertEqual([2, 7, 6], enc.shape.as_list())
    self.assertEqual([2, 3, 7, 3], probs.shape.as_list())
    meta = attention.MultiHeadAttention.FPropMeta(
        layer.params, tf.TensorShape(q.shape), tf.TensorShape(k.shape),
        tf.TensorShape(v.shape), tf.TensorShape(paddings.shape))
    self.assertEqual((enc.shape, probs.shape), meta.out_shapes)
    # 2 flops per multiply-add: projections of q (7 rows) and k, v (3 rows
    # each), the post projection, logits and context; 5 per softmax entry.
    b, tq, tk, d, hid = 2, 7, 3, 6, 12
    want = (2 * b * (tq * d * hid * 2 + tk * d * hid * 2) +
            4 * b * tq * tk * hid + 5 * b * 3 * tq * tk)
    self.assertEqual(want, meta.flops)

  def testDropoutDeterministicAndSplitInvariant(self):
    layer = _Layer(atten_dropout_prob=0.5)
    q, k, v, paddings = _Inputs(4, 4, 5, 6)
    keys = dropout.ExampleKeys(3, 4)
    layer.SetTraining(False)
    eval1, eval_probs = layer.FPropDefaultTheta(q, k, v, paddings)
    eval2, _ = layer.FPropDefaultTheta(q, k, v, paddings)
    self.assertAllEqual(eval1, eval2)
    want, _ = NumpyAttention(_Weights(layer), q, k, v, paddings, False, 2)
    self.assertAllClose(want, eval1, atol=1e-12)

    layer.SetTraining(True)
    with self.assertRaisesRegex(ValueError, 'example_keys'):
      layer.FPropDefaultTheta(q, k, v, paddings)
    train1, probs = layer.FPropDefaultTheta(
        q, k, v, paddings, example_keys=keys)
    train2, _ = layer.FPropDefaultTheta(
        q, k, v, paddings, example_keys=keys)
    self.assertAllEqual(train1, train2)
    self.assertAllEqual(eval_probs, probs)  # probs come before dropout
    self.assertNotAllClose(eval1, train1)
    for lo, hi in ((0, 2), (2, 4)):
      half, _ = layer.FPropDefaultTheta(
          q[lo:hi], k[lo:hi], v[lo:hi], paddings[lo:hi],
          example_keys=keys[lo:hi])
      self.assertAllEqual(train1[lo:hi], half)
    other, _ = layer.FPropDefaultTheta(
        q, k, v, paddings, example_keys=dropout.ExampleKeys(4, 4))
    self.assertNotAllClose(train1, other)

  def testBadParamsRaise(self):
    with self.assertRaisesRegex(ValueError, 'multiple of num_heads=3'):
      _Layer(hidden_dim=8, num_heads=3)
    with self.assertRaisesRegex(ValueError, 'atten_dropout_prob'):
      _Layer(atten_dropout_prob=1.0)


class PositionalEmbeddingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((8, 1.0), (7, 2.0))
  def testSinusoidMatchesNumpy(self, dim, min_timescale):
    p = attention.PositionalEmbeddingLayer.Params().Set(
        name='pos', embedding_dim=dim, min_timescale=min_timescale,
        dtype=tf.float64)
    layer = p.Instantiate()
    got = layer.FPropDefaultTheta(seq_length=5)
    n = dim // 2
    timescales = min_timescale * (1e4 / min_timescale)**(
        np.arange(n) / (n - 1))
    inv = 1.0 / timescales
    angles = np.arange(5)[:, None] * inv[None, :]
    want = np.zeros((5, dim))
    want[:, :n] = np.sin(angles)
    want[:, n:2 * n] = np.cos(angles)
    self.assertAllClose(want, got, atol=1e-12, rtol=1e-12)
    positions = np.array([[4, 0, 2], [1, 1, 3]])
    by_pos = layer.FPropDefaultTheta(positions=positions)
    self.assertAllClose(want[positions], by_pos, atol=1e-12)
    meta = attention.PositionalEmbeddingLayer.FPropMeta(
        layer.params, tf.TensorShape([2, 3]))
    self.assertEqual((by_pos.shape,), meta.out_shapes)
    meta = attention.PositionalEmbeddingLayer.FPropMeta(layer.params, 5)
    self.assertEqual((got.shape,), meta.out_shapes)
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      layer.FPropDefaultTheta()

  def testLearnedGathersTableRowsAndGradients(self):
    p = attention.LearnedPositionalEmbeddingLayer.Params().Set(
        name='pos', embedding_dim=4, max_seq_length=6, dtype=tf.float64)
    layer = p.Instantiate()
    table = layer.theta.emb.numpy()
    self.assertAllEqual(table[:3], layer.FPropDefaultTheta(seq_length=3))
    positions = np.array([[5, 0], [5, 5]])
    with tf.GradientTape() as tape:
      out = layer.FPropDefaultTheta(positions=positions)
      loss = tf.reduce_sum(out)
    self.assertAllEqual(table[positions], out)
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.theta.emb))
    want = np.zeros((6, 4))
    want[0] = 1.0
    want[5] = 3.0
    self.assertAllEqual(want, grad)
    meta = attention.LearnedPositionalEmbeddingLayer.FPropMeta(
        layer.params, tf.TensorShape([2, 2]))
    self.assertEqual((out.shape,), meta.out_shapes)
    with self.assertRaisesRegex(ValueError, 'max_seq_length'):
      layer.FPropDefaultTheta(seq_length=7)


if __name__ == '__main__':
  absltest.main()
