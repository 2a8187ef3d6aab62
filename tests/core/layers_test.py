"""Tests of lingvo_pipe.core.layers against plain TF / numpy references.

Each layer is compared with a hand-written reference that uses the same
weight values (read once from the layer's variables) and no layer code:
outputs, and the gradients of sum(y * r) with respect to the inputs and to
EVERY variable, in float64.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import layers
from lingvo_pipe.core.nested_map import NestedMap

_TOL = dict(atol=1e-10, rtol=1e-10)


def _Params(cls, **kwargs):
  p = cls.Params()
  p.name = kwargs.pop('name', 'layer')
  p.dtype = tf.float64
  for key, value in kwargs.items():
    setattr(p, key, value)
  return p


def _Rand(*shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape)


def _Const(theta):
  """theta's current values as float64 constants (for references)."""
  return theta.Transform(lambda v: tf.constant(v.numpy()))


def _ValueAndGrads(fn, theta, inputs):
  """y = fn(theta, *inputs); grads of sum(y * r) w.r.t. inputs and theta."""
  leaves = theta.Flatten()
  float_inputs = [x for x in inputs if x.dtype.is_floating]
  with tf.GradientTape(persistent=True) as tape:
    for t in leaves + float_inputs:
      tape.watch(t)
    y = fn(theta, *inputs)
    r = tf.constant(_Rand(*y.shape, seed=7), y.dtype)
    loss = tf.reduce_sum(y * r)
  grads = tape.gradient(loss, float_inputs + leaves)
  grads = [None if g is None else tf.convert_to_tensor(g).numpy()
           for g in grads]
  return y.numpy(), grads


class _Case(tf.test.TestCase, parameterized.TestCase):

  def CheckAgainst(self, layer, ref_fn, *inputs, method=None):
    """layer.FProp (or `method`) vs ref_fn(theta_constants, *inputs).

    Compares the outputs and the gradients w.r.t. every float input and
    every variable of the layer.
    """
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    y, grads = _ValueAndGrads(method or layer.FProp, layer.theta, inputs)
    y_ref, grads_ref = _ValueAndGrads(ref_fn, _Const(layer.theta), inputs)
    self.assertAllClose(y_ref, y, **_TOL)
    self.assertLen(grads, len(grads_ref))
    names = [f'input_{i}' for i, x in enumerate(inputs)
             if x.dtype.is_floating]
    names += [k for k, _ in layer.theta.FlattenItems()]
    for name, g, g_ref in zip(names, grads, grads_ref):
      self.assertIsNotNone(g, name)
      self.assertAllClose(g_ref, g, msg=name, **_TOL)
    return y

  def CheckMeta(self, p, input_shapes, outputs):
    meta = p.cls.FPropMeta(p, *input_shapes)
    self.assertIsInstance(meta.flops, int)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    self.assertEqual([tf.TensorShape(s) for s in meta.out_shapes],
                     [o.shape for o in outputs])
    return meta


# ---- references ----------------------------------------------------------

_ERF = np.vectorize(math.erf)

# name -> (f(x), f'(x)) in numpy.
_NP_ACTIVATIONS = {
    'NONE': (lambda x: x, np.ones_like),
    'RELU': (lambda x: np.maximum(x, 0), lambda x: (x > 0) * 1.0),
    'RELU6': (lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)) * 1.),
    'SIGMOID': (lambda x: 1 / (1 + np.exp(-x)),
                lambda x: np.exp(-x) / (1 + np.exp(-x))**2),
    'TANH': (np.tanh, lambda x: 1 - np.tanh(x)**2),
    'GELU': (lambda x: 0.5 * x * (1 + _ERF(x / math.sqrt(2))),
             lambda x: 0.5 * (1 + _ERF(x / math.sqrt(2))) +
             x * np.exp(-x**2 / 2) / math.sqrt(2 * math.pi)),
    'SWISH': (lambda x: x / (1 + np.exp(-x)),
              lambda x: (1 / (1 + np.exp(-x))) *
              (1 + x * (1 - 1 / (1 + np.exp(-x))))),
}


def _PadFor(n, k, s, padding):
  if padding == 'VALID':
    return (n - k) // s + 1, 0, 0
  out = -(-n // s)
  total = max((out - 1) * s + k - n, 0)
  return out, total // 2, total - total // 2


def _Windows(x, window, stride, padding, pad_value=0.0):
  """{(i, j): x_padded[:, i + s*oh, j + s*ow, :]} for the window offsets."""
  _, h, w, _ = x.shape
  oh, pt, pb = _PadFor(h, window[0], stride[0], padding)
  ow, pl, pr = _PadFor(w, window[1], stride[1], padding)
  xp = tf.pad(x, [[0, 0], [pt, pb], [pl, pr], [0, 0]],
              constant_values=pad_value)
  return {(i, j): xp[:, i:i + (oh - 1) * stride[0] + 1:stride[0],
                     j:j + (ow - 1) * stride[1] + 1:stride[1], :]
          for i in range(window[0]) for j in range(window[1])}


def _RefConv(x, w, stride, padding):
  wins = _Windows(x, w.shape[:2], stride, padding)
  return tf.add_n([tf.einsum('bhwc,co->bhwo', win, w[i, j])
                   for (i, j), win in wins.items()])


def _RefAct(name, y):
  if name == 'RELU':
    return tf.maximum(y, tf.zeros_like(y))
  assert name == 'NONE'
  return y


# ---- tests ---------------------------------------------------------------


class ActivationTest(_Case):

  @parameterized.parameters(*_NP_ACTIVATIONS)
  def testValueAndGradient(self, name):
    x = np.linspace(-7.3, 7.1, 23)  # avoids the kinks at 0 and 6
    layer = _Params(layers.ActivationLayer, activation=name).Instantiate()
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
      tape.watch(xt)
      y = layer.FProp(layer.theta, xt)
    f, df = _NP_ACTIVATIONS[name]
    self.assertAllClose(f(x), y, **_TOL)
    self.assertAllClose(df(x), tape.gradient(y, xt), **_TOL)
    self.assertAllClose(f(x), layers.Activation(name, xt), **_TOL)
    self.CheckMeta(layer.params, [xt.shape], y)

  def testUnknownActivation(self):
    with self.assertRaisesRegex(ValueError, 'LEAKY') as ctx:
      _Params(layers.ActivationLayer, activation='LEAKY').Instantiate()
    message = str(ctx.exception)
    self.assertNotIn('\n', message)
    for name in _NP_ACTIVATIONS:
      self.assertIn(name, message)
    self.assertIn("'layer'", message)
    with self.assertRaisesRegex(ValueError, "unknown activation 'relu'.*"
                                'RELU, RELU6'):
      layers.Activation('relu', tf.zeros([2]))


class ProjectionTest(_Case):

  @parameterized.parameters(('NONE', True, [4, 3]), ('RELU', True, [2, 5, 3]),
                            ('NONE', False, [2, 3]))
  def testAgainstReference(self, act, has_bias, shape):
    p = _Params(layers.ProjectionLayer, input_dim=3, output_dim=4,
                has_bias=has_bias, activation=act)
    layer = p.Instantiate()
    self.assertEqual(sorted(layer.theta), ['b', 'w'] if has_bias else ['w'])
    if has_bias:
      self.assertAllEqual(np.zeros([4]), layer.theta.b)
      layer.theta.b.assign(_Rand(4, seed=3))

    def Ref(theta, x):
      y = tf.reshape(tf.reshape(x, [-1, 3]) @ theta.w, shape[:-1] + [4])
      return _RefAct(act, y + theta.b if has_bias else y)

    y = self.CheckAgainst(layer, Ref, _Rand(*shape))
    meta = self.CheckMeta(p, [shape], tf.constant(y))
    rows = math.prod(shape[:-1])
    self.assertEqual(2 * rows * 12 + (rows * 4 if has_bias else 0)
                     + (rows * 4 if act == 'RELU' else 0), meta.flops)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'output_dim=0 must be > 0'):
      _Params(layers.ProjectionLayer, input_dim=3).Instantiate()
    with self.assertRaisesRegex(ValueError, "unknown activation 'SOFTPLUS'"):
      _Params(layers.ProjectionLayer, input_dim=3, output_dim=2,
              activation='SOFTPLUS').Instantiate()
    layer = _Params(layers.ProjectionLayer, input_dim=3,
                    output_dim=2).Instantiate()
    with self.assertRaisesRegex(ValueError,
                                "'layer'.*last dimension 5; expected 3"):
      layer.FProp(layer.theta, tf.zeros([2, 5], tf.float64))


class ConvTest(_Case):

  @parameterized.parameters(
      ('SAME', (1, 1), 'NONE'), ('SAME', (2, 2), 'RELU'),
      ('VALID', (1, 2), 'NONE'), ('VALID', (2, 1), 'RELU'),
      ('SAME', (2, 3), 'NONE'))
  def testConv2D(self, padding, stride, act):
    p = _Params(layers.Conv2DLayer, filter_shape=[3, 2, 2, 3],
                filter_stride=stride, padding=padding, activation=act)
    layer = p.Instantiate()
    layer.theta.b.assign(_Rand(3, seed=4))

    def Ref(theta, x):
      return _RefAct(act, _RefConv(x, theta.w, stride, padding) + theta.b)

    x = _Rand(2, 5, 6, 2)
    y = self.CheckAgainst(layer, Ref, x)
    self.CheckMeta(p, [x.shape], tf.constant(y))

  @parameterized.parameters(
      ('SAME', (1, 1)), ('VALID', (1, 1)), ('SAME', (2, 2)),
      ('VALID', (2, 3)), ('SAME', (3, 2)))
  def testConv2D1x1(self, padding, stride):
    # 1x1 filters go through PointwiseConv, not tf.nn.conv2d.
    p = _Params(layers.Conv2DLayer, filter_shape=[1, 1, 2, 3],
                filter_stride=stride, padding=padding)
    layer = p.Instantiate()
    layer.theta.b.assign(_Rand(3, seed=4))

    def Ref(theta, x):
      return _RefConv(x, theta.w, stride, padding) + theta.b

    x = _Rand(2, 5, 6, 2)
    y = self.CheckAgainst(layer, Ref, x)
    self.CheckMeta(p, [x.shape], tf.constant(y))

  def testNoConvBackpropKernelOnCpu(self):
    # TF's CPU Conv2DBackpropInput and Conv2DBackpropFilter hold a scratch
    # buffer of up to 32 MiB whatever the batch (docs/DESIGN.md section
    # 27): on a CPU the input's gradient is a forward convolution, and the
    # filter's a matmul (1x1) or im2col, unless im2col's patches would
    # take more than 8 MiB. Under an accelerator's scope (traced only; no
    # GPU here) a k x k filter keeps TF's kernels.
    def GradientOps(p, device, shape=(2, 6, 6, 4)):
      layer = p.Instantiate()

      def Grads(x):
        with tf.device(device):
          with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(layer.FProp(layer.theta, x)))
          return tape.gradient(loss, [x] + layer.vars.Flatten())

      graph = tf.function(Grads, autograph=False).get_concrete_function(
          tf.TensorSpec(shape, p.dtype)).graph
      return {op.type for op in graph.get_operations()}

    pointwise = _Params(layers.Conv2DLayer, filter_shape=[1, 1, 4, 8],
                        filter_stride=[2, 2])
    conv = pointwise.Copy().Set(filter_shape=[3, 3, 4, 8])
    separable = _Params(layers.DepthwiseSeparableConv2DLayer,
                        filter_shape=[3, 3, 4, 1], output_dim=8)
    for p in (pointwise, conv, separable):
      ops = GradientOps(p, '/device:CPU:0')
      self.assertNotIn('Conv2DBackpropFilter', ops, p.cls)
      self.assertNotIn('Conv2DBackpropInput', ops, p.cls)
    self.assertContainsSubset({'Conv2DBackpropFilter', 'Conv2DBackpropInput'},
                              GradientOps(conv, '/device:GPU:0'))
    # Stride 2: 128 x 16 x 16 outputs x 3 x 3 x 4 float64 = 9 MiB of
    # patches; half the batch, 4.5 MiB.
    large = GradientOps(conv, '/device:CPU:0', (128, 32, 32, 4))
    self.assertIn('Conv2DBackpropFilter', large)
    self.assertNotIn('Conv2DBackpropInput', large)
    self.assertNotIn('Conv2DBackpropFilter',
                     GradientOps(conv, '/device:CPU:0', (64, 32, 32, 4)))
    self.assertNotIn('Conv2DBackpropFilter',
                     GradientOps(pointwise, '/device:GPU:0'))

  @parameterized.parameters(('SAME', 1, 'RELU'), ('VALID', 2, 'NONE'),
                            ('SAME', 2, 'NONE'))
  def testDepthwiseSeparable(self, padding, stride, act):
    p = _Params(layers.DepthwiseSeparableConv2DLayer,
                filter_shape=[3, 3, 2, 2], output_dim=3,
                filter_stride=[stride, stride], padding=padding,
                activation=act)
    layer = p.Instantiate()
    self.assertEqual([3, 3, 2, 2], layer.theta.depthwise_w.shape)
    self.assertEqual([1, 1, 4, 3], layer.theta.pointwise_w.shape)
    layer.theta.b.assign(_Rand(3, seed=4))

    def Ref(theta, x):
      wins = _Windows(x, [3, 3], [stride, stride], padding)
      d = tf.add_n([win[..., :, None] * theta.depthwise_w[i, j]
                    for (i, j), win in wins.items()])
      d = tf.reshape(d, d.shape[:3].as_list() + [4])  # channel c * 2 + m
      y = tf.einsum('bhwc,co->bhwo', d, theta.pointwise_w[0, 0])
      return _RefAct(act, y + theta.b)

    x = _Rand(2, 5, 6, 2)
    y = self.CheckAgainst(layer, Ref, x)
    meta = self.CheckMeta(p, [x.shape], tf.constant(y))
    positions = math.prod(y.shape[:3])
    self.assertGreaterEqual(meta.flops, 2 * positions * (18 * 2 + 4 * 3))

  @parameterized.parameters('SAME', 'VALID')
  def testDepthwiseSeparableDilated(self, padding):
    p = _Params(layers.DepthwiseSeparableConv2DLayer,
                filter_shape=[3, 3, 2, 1], output_dim=3,
                dilation_rate=[2, 2], padding=padding, has_bias=False)
    layer = p.Instantiate()

    def Ref(theta, x):
      # A dilated 3x3 filter is a 5x5 window reading every other position.
      wins = _Windows(x, [5, 5], [1, 1], padding)
      d = tf.add_n([win * theta.depthwise_w[i // 2, j // 2, :, 0]
                    for (i, j), win in wins.items()
                    if i % 2 == 0 and j % 2 == 0])
      return tf.einsum('bhwc,co->bhwo', d, theta.pointwise_w[0, 0])

    x = _Rand(2, 7, 6, 2)
    y = self.CheckAgainst(layer, Ref, x)
    self.CheckMeta(p, [x.shape], tf.constant(y))

  def testConvErrors(self):
    with self.assertRaisesRegex(ValueError, "padding='same'"):
      _Params(layers.Conv2DLayer, filter_shape=[3, 3, 1, 1],
              padding='same').Instantiate()
    with self.assertRaisesRegex(ValueError, 'filter_shape=.*4 positive'):
      _Params(layers.Conv2DLayer, filter_shape=[3, 3, 1]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'must be equal along'):
      _Params(layers.DepthwiseSeparableConv2DLayer,
              filter_shape=[3, 3, 1, 1], output_dim=2,
              filter_stride=[1, 2]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'dilation_rate=.*1 when '
                                'filter_stride'):
      _Params(layers.DepthwiseSeparableConv2DLayer,
              filter_shape=[3, 3, 1, 1], output_dim=2, filter_stride=[2, 2],
              dilation_rate=[2, 2]).Instantiate()
    layer = _Params(layers.Conv2DLayer,
                    filter_shape=[3, 3, 2, 1]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'last dimension 3; expected 2'):
      layer.FProp(layer.theta, tf.zeros([1, 4, 4, 3], tf.float64))


class PoolingTest(_Case):

  @parameterized.product(
      pooling_type=['MAX', 'AVG'],
      config=[('SAME', (3, 3), (2, 2)), ('VALID', (2, 3), (1, 2)),
              ('SAME', (2, 2), (1, 1))])
  def testAgainstReference(self, pooling_type, config):
    padding, window, stride = config
    p = _Params(layers.PoolingLayer, pooling_type=pooling_type,
                window_shape=window, window_stride=stride, padding=padding)
    layer = p.Instantiate()

    def Ref(theta, x):
      del theta
      if pooling_type == 'MAX':
        wins = _Windows(x, window, stride, padding, -np.inf)
        return tf.reduce_max(tf.stack(list(wins.values())), 0)
      total = tf.add_n(list(_Windows(x, window, stride, padding).values()))
      count = tf.add_n(list(
          _Windows(tf.ones_like(x), window, stride, padding).values()))
      return total / count

    x = _Rand(2, 5, 7, 3)
    y = self.CheckAgainst(layer, Ref, x)
    self.CheckMeta(p, [x.shape], tf.constant(y))

  def testBadType(self):
    with self.assertRaisesRegex(ValueError, "pooling_type='MIN'"):
      _Params(layers.PoolingLayer, pooling_type='MIN',
              window_shape=[2, 2]).Instantiate()


class EmbeddingTest(_Case):

  @parameterized.parameters(True, False)
  def testLookupAndGradient(self, scale):
    p = _Params(layers.EmbeddingLayer, vocab_size=7, embedding_dim=5,
                scale_sqrt_depth=scale)
    layer = p.Instantiate()
    ids = np.array([[1, 3, 1], [6, 0, 1]])
    w = layer.theta.w.numpy()
    factor = math.sqrt(5) if scale else 1.0
    r = _Rand(2, 3, 5, seed=7)  # the cotangent _ValueAndGrads uses
    y, (dw,) = _ValueAndGrads(layer.FProp, layer.theta, [tf.constant(ids)])
    self.assertAllClose(w[ids] * factor, y, **_TOL)
    expected = np.zeros_like(w)
    np.add.at(expected, ids, r * factor)
    self.assertAllClose(expected, dw, **_TOL)
    self.CheckMeta(p, [ids.shape], tf.constant(y))

  def testLogitsTied(self):
    layer = _Params(layers.EmbeddingLayer, vocab_size=5,
                    embedding_dim=3).Instantiate()
    self.CheckAgainst(layer, lambda theta, x: x @ tf.transpose(theta.w),
                      _Rand(4, 3), method=layer.Logits)
    self.assertAllClose(
        _Rand(2, 4, 3) @ layer.theta.w.numpy().T,
        layer.Logits(layer.theta, tf.constant(_Rand(2, 4, 3))), **_TOL)


class SoftmaxCrossEntropyTest(_Case):

  def _Reference(self, logits, target, eps, weight):
    c = logits.shape[-1]
    target = (1 - eps) * target + eps / c
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -(target * log_probs).sum(-1)
    avg = (loss * weight).sum() / weight.sum()
    dlogits = (np.exp(log_probs) - target) * weight[..., None] / weight.sum()
    return log_probs, loss, avg, dlogits

  @parameterized.parameters(0.0, 0.1)
  def testClassIds(self, eps):
    logits = _Rand(2, 3, 5)
    ids = np.array([[0, 4, 2], [1, 1, 3]])
    weights = np.array([[1.0, 2.0, 0.5], [1.0, 1.0, 3.0]])
    paddings = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    weight = weights * (1 - paddings)
    log_probs, loss, avg, dlogits = self._Reference(
        logits, np.eye(5)[ids], eps, weight)
    lt = tf.constant(logits)
    with tf.GradientTape() as tape:
      tape.watch(lt)
      out = layers.SoftmaxCrossEntropy(
          lt, class_ids=ids, label_smoothing=eps, weights=weights,
          paddings=paddings)
    self.assertAllClose(log_probs, out.log_probs, **_TOL)
    self.assertAllClose(loss, out.per_example_loss, **_TOL)
    self.assertAllClose(weight, out.per_example_weight, **_TOL)
    self.assertAllClose(weight.sum(), out.total_weight, **_TOL)
    self.assertAllClose((loss * weight).sum(), out.total_loss, **_TOL)
    self.assertAllClose(avg, out.avg_loss, **_TOL)
    self.assertAllClose(dlogits, tape.gradient(out.avg_loss, lt), **_TOL)

  def testSoftLabelsAndDefaultWeights(self):
    logits = _Rand(4, 3)
    probs = np.abs(_Rand(4, 3, seed=2))
    probs /= probs.sum(-1, keepdims=True)
    _, loss, avg, _ = self._Reference(logits, probs, 0.2, np.ones(4))
    out = layers.SoftmaxCrossEntropy(
        tf.constant(logits), class_probabilities=probs, label_smoothing=0.2)
    self.assertAllClose(loss, out.per_example_loss, **_TOL)
    self.assertAllClose(avg, out.avg_loss, **_TOL)
    self.assertAllClose(loss.mean(), out.avg_loss, **_TOL)

  def testAllPaddedGivesZero(self):
    out = layers.SoftmaxCrossEntropy(
        tf.constant(_Rand(2, 3)), class_ids=[0, 1], paddings=[1.0, 1.0])
    self.assertEqual(0.0, float(out.avg_loss))

  def testErrors(self):
    logits = tf.zeros([2, 3])
    with self.assertRaisesRegex(ValueError, 'exactly one of'):
      layers.SoftmaxCrossEntropy(logits)
    with self.assertRaisesRegex(ValueError, 'exactly one of'):
      layers.SoftmaxCrossEntropy(logits, class_ids=[0, 1],
                                 class_probabilities=tf.zeros([2, 3]))
    with self.assertRaisesRegex(ValueError, 'label_smoothing=1.0'):
      layers.SoftmaxCrossEntropy(logits, class_ids=[0, 1],
                                 label_smoothing=1.0)


class _Scale(base_layer.BaseLayer):
  """NestedMap(vec [b, dim], mask [b]) -> vec * w + 1, mask passed on."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Size of the last axis.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', base_layer.WeightParams([self.params.dim]))

  def FProp(self, theta, inputs):
    return NestedMap(vec=inputs.vec * theta.w + 1.0, mask=inputs.mask)

  @classmethod
  def FPropMeta(cls, params, shapes):
    return NestedMap(flops=2 * shapes.vec.num_elements(), out_shapes=(shapes,))


class _Split(base_layer.BaseLayer):
  """x -> (x, 2 * x): a tuple, splatted into the next layer."""

  def FProp(self, theta, x):
    return x, 2.0 * x

  @classmethod
  def FPropMeta(cls, params, shape):
    return NestedMap(flops=1, out_shapes=(shape, shape))


class _Join(base_layer.BaseLayer):
  """(a, b) -> a * b."""

  def FProp(self, theta, a, b):
    return a * b

  @classmethod
  def FPropMeta(cls, params, a, b):
    return NestedMap(flops=1, out_shapes=(a,))


class SequentialTest(_Case):

  def _Seq(self, subs):
    return _Params(layers.SequentialLayer, name='seq', sub=subs)

  def testNamesThetaAndValues(self):
    p = self._Seq([
        _Params(layers.ProjectionLayer, name='proj1', input_dim=3,
                output_dim=4),
        _Params(layers.ActivationLayer, name='', activation='RELU'),
        _Params(layers.ProjectionLayer, name='out', input_dim=4,
                output_dim=2)])
    seq = p.Instantiate()
    self.assertEqual(('proj1', 'sub_1', 'out'), seq.sub_names)
    self.assertEqual(['proj1', 'sub_1', 'out'],
                     [layer.params.name for layer in seq.sub_layers])
    self.assertEqual({'proj1', 'sub_1', 'out'}, set(seq.theta))
    self.assertEqual(['seq/out/b', 'seq/out/w', 'seq/proj1/b', 'seq/proj1/w'],
                     sorted(seq.VariablesByPath()))
    seq.proj1.theta.b.assign(_Rand(4, seed=5))

    def Ref(theta, x):
      h = tf.maximum(x @ theta.proj1.w + theta.proj1.b, 0.0)
      return h @ theta.out.w + theta.out.b

    x = _Rand(5, 3)
    y = self.CheckAgainst(seq, Ref, x)
    meta = self.CheckMeta(p, [x.shape], tf.constant(y))
    self.assertEqual(2 * 5 * 12 + 20 + 20 + 2 * 5 * 8 + 10, meta.flops)

  def testNestedMapLayers(self):
    p = self._Seq([_Params(_Scale, name=f's{i}', dim=3) for i in range(3)])
    seq = p.Instantiate()
    inputs = NestedMap(vec=tf.constant(_Rand(2, 3)),
                       mask=tf.constant([1.0, 0.0], tf.float64))
    out = seq.FProp(seq.theta, inputs)
    self.assertIsInstance(out, NestedMap)
    expected = inputs.vec.numpy()
    for i in range(3):
      expected = expected * seq.theta[f's{i}'].w.numpy() + 1.0
    self.assertAllClose(expected, out.vec, **_TOL)
    self.assertAllEqual(inputs.mask, out.mask)
    shapes = inputs.Transform(lambda t: t.shape)
    meta = p.cls.FPropMeta(p, shapes)
    self.assertEqual((shapes,), meta.out_shapes)
    self.assertEqual(3 * 2 * 6, meta.flops)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(seq.FProp(seq.theta, inputs).vec)
    grads = tape.gradient(loss, [seq.theta[f's{i}'].w for i in range(3)])
    w = [seq.theta[f's{i}'].w.numpy() for i in range(3)]
    h0 = inputs.vec.numpy()
    h1 = h0 * w[0] + 1
    h2 = h1 * w[1] + 1
    self.assertAllClose((h0 * w[1] * w[2]).sum(0), grads[0], **_TOL)
    self.assertAllClose((h1 * w[2]).sum(0), grads[1], **_TOL)
    self.assertAllClose(h2.sum(0), grads[2], **_TOL)

  def testTupleSplat(self):
    p = self._Seq([_Params(_Split, name='split'),
                   _Params(_Join, name='join'),
                   _Params(_Split, name='split2')])
    seq = p.Instantiate()
    x = tf.constant(_Rand(2, 3))
    a, b = seq.FProp(seq.theta, x)
    self.assertAllClose(2 * x.numpy()**2, a, **_TOL)
    self.assertAllClose(4 * x.numpy()**2, b, **_TOL)
    meta = p.cls.FPropMeta(p, x.shape)
    self.assertEqual((x.shape, x.shape), meta.out_shapes)
    self.assertEqual(3, meta.flops)

  def testEmptyIsIdentity(self):
    seq = self._Seq([]).Instantiate()
    x = tf.constant([1.0, 2.0])
    self.assertIs(x, seq.FProp(seq.theta, x))

  def testDuplicateNames(self):
    proj = _Params(layers.ProjectionLayer, name='proj', input_dim=2,
                   output_dim=2)
    with self.assertRaisesRegex(
        ValueError, "'seq': sub-layers 0 and 2 are both named 'proj'"):
      self._Seq([proj, _Params(layers.ActivationLayer, name='a'),
                 proj]).Instantiate()
    with self.assertRaisesRegex(ValueError, "both named 'sub_1'"):
      self._Seq([proj.Copy(), _Params(layers.ActivationLayer, name=''),
                 _Params(layers.ActivationLayer,
                         name='sub_1')]).Instantiate()


class ResidualTest(_Case):

  def testAgainstReference(self):
    body = _Params(layers.ProjectionLayer, name='unused', input_dim=3,
                   output_dim=3, activation='TANH')
    p = _Params(layers.ResidualLayer, name='res', body=body)
    layer = p.Instantiate()
    self.assertEqual(['res/body/b', 'res/body/w'],
                     sorted(layer.VariablesByPath()))
    layer.body.theta.b.assign(_Rand(3, seed=9))

    def Ref(theta, x):
      return x + tf.tanh(x @ theta.body.w + theta.body.b)

    x = _Rand(4, 3)
    y = self.CheckAgainst(layer, Ref, x)
    meta = self.CheckMeta(p, [x.shape], tf.constant(y))
    self.assertEqual(2 * 4 * 9 + 12 + 4 * 12 + 12, meta.flops)

  def testShapeMismatch(self):
    body = _Params(layers.ProjectionLayer, input_dim=3, output_dim=4)
    p = _Params(layers.ResidualLayer, name='res', body=body)
    layer = p.Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"'res': body output \(2, 4\) does not match input shape "
        r'\(2, 3\)'):
      layer.FProp(layer.theta, tf.zeros([2, 3], tf.float64))
    with self.assertRaisesRegex(ValueError, 'must keep the shape'):
      p.cls.FPropMeta(p, tf.TensorShape([2, 3]))

  def testDynamicShapeMismatchInFunction(self):
    body = _Params(layers.PoolingLayer, window_shape=[2, 2],
                   window_stride=[2, 2], padding='SAME')
    layer = _Params(layers.ResidualLayer, name='res', body=body).Instantiate()
    fn = tf.function(lambda x: layer.FProp(layer.theta, x),
                     input_signature=[tf.TensorSpec([1, None, None, 1],
                                                    tf.float64)],
                     autograph=False)
    self.assertAllEqual(np.zeros([1, 1, 1, 1]),
                        fn(tf.zeros([1, 1, 1, 1], tf.float64)))
    # [1, 2, 2, 1] -> [1, 1, 1, 1] would broadcast silently without the check.
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                'body changed the shape'):
      fn(tf.zeros([1, 2, 2, 1], tf.float64))

  def testNoBody(self):
    with self.assertRaisesRegex(ValueError, "'res': set p.body"):
      _Params(layers.ResidualLayer, name='res').Instantiate()


if __name__ == '__main__':
  absltest.main()
