"""Tests of LayerNorm and BatchNormLayer against numpy, in float64.

Gradients are compared with the closed-form backward pass written in
numpy; the BatchNorm statistics tests check the GPipe contract: the moving
averages after FProp on K micro-batches + UpdateStats equal those after one
FProp on the whole batch + UpdateStats.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization

_TOL = dict(atol=1e-12, rtol=1e-12)


def _Rand(*shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape)


def _NormRef(x, r, scale, bias, eps, axis):
  """Normalisation over `axis` of 2-D x and its backward pass for dy = r.

  Returns y, dx, dscale, dbias (scale and bias act on the last axis).
  """
  mean = x.mean(axis, keepdims=True)
  sigma = np.sqrt(((x - mean)**2).mean(axis, keepdims=True) + eps)
  xhat = (x - mean) / sigma
  g = r * scale
  dx = (g - g.mean(axis, keepdims=True) -
        xhat * (g * xhat).mean(axis, keepdims=True)) / sigma
  return xhat * scale + bias, dx, (r * xhat).sum(0), r.sum(0)


def _Grads(layer, x, r):
  """y and the gradients of sum(y * r) w.r.t. x and theta's leaves."""
  x = tf.constant(x)
  theta = layer.theta
  with tf.GradientTape() as tape:
    tape.watch(x)
    tape.watch(theta.Flatten())
    y = layer.FProp(theta, x)
    loss = tf.reduce_sum(y * r)
  dx, dtheta = tape.gradient(loss, (x, theta))
  return y.numpy(), dx.numpy(), dtheta


def _BatchNorm(name='bn', dim=3, decay=0.9, epsilon=1e-3):
  p = normalization.BatchNormLayer.Params().Set(
      name=name, dim=dim, decay=decay, epsilon=epsilon, dtype=tf.float64)
  return p.Instantiate()


class LayerNormTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(([4, 5],), ([2, 3, 5],))
  def testAgainstNumpy(self, shape):
    p = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=5, epsilon=1e-3, dtype=tf.float64)
    layer = p.Instantiate()
    self.assertAllEqual(np.ones([5]), layer.theta.scale)
    self.assertAllEqual(np.zeros([5]), layer.theta.bias)
    layer.theta.scale.assign(_Rand(5, seed=1))
    layer.theta.bias.assign(_Rand(5, seed=2))
    x, r = _Rand(*shape), _Rand(*shape, seed=3)
    y, dx, dtheta = _Grads(layer, x, r)
    ry, rdx, rdscale, rdbias = _NormRef(
        x.reshape(-1, 5), r.reshape(-1, 5), layer.theta.scale.numpy(),
        layer.theta.bias.numpy(), 1e-3, axis=-1)
    self.assertAllClose(ry.reshape(shape), y, **_TOL)
    self.assertAllClose(rdx.reshape(shape), dx, **_TOL)
    self.assertAllClose(rdscale, dtheta.scale, **_TOL)
    self.assertAllClose(rdbias, dtheta.bias, **_TOL)
    meta = p.cls.FPropMeta(p, tf.TensorShape(shape))
    self.assertEqual((tf.TensorShape(shape),), meta.out_shapes)
    self.assertGreater(meta.flops, 0)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, "'ln': input_dim=0 must be > 0"):
      normalization.LayerNorm.Params().Set(name='ln').Instantiate()
    layer = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=4).Instantiate()
    with self.assertRaisesRegex(ValueError, 'last dimension 3; expected 4'):
      layer.FProp(layer.theta, tf.zeros([2, 3]))


class BatchNormTest(tf.test.TestCase, parameterized.TestCase):

  def testVariables(self):
    bn = _BatchNorm()
    self.assertEqual(['beta', 'gamma', 'moving_mean', 'moving_variance'],
                     sorted(bn.theta))
    self.assertEqual(['acc_count', 'acc_sum', 'acc_sum_sq'],
                     sorted(bn.accumulators))
    self.assertEqual([False, False], [bn.theta.moving_mean.trainable,
                                      bn.theta.moving_variance.trainable])
    self.assertEqual([True, True], [bn.theta.beta.trainable,
                                    bn.theta.gamma.trainable])
    self.assertAllEqual(np.ones([3]), bn.theta.moving_variance)
    self.assertEqual([], bn.accumulators.acc_count.shape)

  def testTrainingUsesBatchStatistics(self):
    bn = _BatchNorm()
    bn.theta.gamma.assign(_Rand(3, seed=1))
    bn.theta.beta.assign(_Rand(3, seed=2))
    bn.theta.moving_mean.assign(_Rand(3, seed=4))  # must not be used
    x, r = _Rand(4, 2, 3), _Rand(4, 2, 3, seed=3)
    y, dx, dtheta = _Grads(bn, x, r)
    ry, rdx, rdgamma, rdbeta = _NormRef(
        x.reshape(-1, 3), r.reshape(-1, 3), bn.theta.gamma.numpy(),
        bn.theta.beta.numpy(), 1e-3, axis=0)
    self.assertAllClose(ry.reshape(x.shape), y, **_TOL)
    self.assertAllClose(rdx.reshape(x.shape), dx, **_TOL)
    self.assertAllClose(rdgamma, dtheta.gamma, **_TOL)
    self.assertAllClose(rdbeta, dtheta.beta, **_TOL)
    self.assertIsNone(dtheta.moving_mean)
    self.assertIsNone(dtheta.moving_variance)

  def testEvalUsesMovingStatistics(self):
    bn = _BatchNorm()
    gamma, beta = _Rand(3, seed=1), _Rand(3, seed=2)
    mm, mv = _Rand(3, seed=4), np.abs(_Rand(3, seed=5)) + 0.5
    for var, value in zip([bn.theta.gamma, bn.theta.beta,
                           bn.theta.moving_mean, bn.theta.moving_variance],
                          [gamma, beta, mm, mv]):
      var.assign(value)
    bn.SetTraining(False)
    x, r = _Rand(5, 3), _Rand(5, 3, seed=3)
    y, dx, dtheta = _Grads(bn, x, r)
    inv = 1 / np.sqrt(mv + 1e-3)
    self.assertAllClose((x - mm) * inv * gamma + beta, y, **_TOL)
    self.assertAllClose(r * inv * gamma, dx, **_TOL)
    self.assertAllClose((r * (x - mm) * inv).sum(0), dtheta.gamma, **_TOL)
    self.assertAllClose(r.sum(0), dtheta.beta, **_TOL)
    self.assertAllClose(-(r * inv * gamma).sum(0), dtheta.moving_mean,
                        **_TOL)
    self.assertAllClose((r * (x - mm) * gamma).sum(0) * -0.5 * inv**3,
                        dtheta.moving_variance, **_TOL)
    # Eval never accumulates, even with update_stats on.
    self.assertTrue(bn.update_stats)
    self.assertAllEqual(0.0, bn.accumulators.acc_count)
    self.assertAllEqual(np.zeros(3), bn.accumulators.acc_sum)

  def testMicroBatchesMatchFullBatch(self):
    x = _Rand(8, 2, 3) * 2.0 + 1.5
    micro, full = _BatchNorm(), _BatchNorm()
    outs = [micro.FProp(micro.theta, tf.constant(x[2 * k:2 * k + 2]))
            for k in range(4)]
    # Each micro-batch is normalised with its own statistics.
    for k, y in enumerate(outs):
      ref, _, _, _ = _NormRef(x[2 * k:2 * k + 2].reshape(-1, 3),
                              np.zeros([4, 3]), 1.0, 0.0, 1e-3, axis=0)
      self.assertAllClose(ref.reshape(2, 2, 3), y, **_TOL)
    acc = micro.accumulators
    self.assertAllClose(16.0, acc.acc_count, **_TOL)
    self.assertAllClose(x.reshape(-1, 3).sum(0), acc.acc_sum, **_TOL)
    self.assertAllClose((x**2).reshape(-1, 3).sum(0), acc.acc_sum_sq,
                        **_TOL)
    full.FProp(full.theta, tf.constant(x))
    micro.UpdateStats()
    full.UpdateStats()
    rows = x.reshape(-1, 3)
    expected_mean = 0.1 * rows.mean(0)
    expected_var = 0.9 * 1.0 + 0.1 * rows.var(0)
    for bn in (micro, full):
      self.assertAllClose(expected_mean, bn.theta.moving_mean, **_TOL)
      self.assertAllClose(expected_var, bn.theta.moving_variance, **_TOL)
      for name, value in bn.accumulators.FlattenItems():
        self.assertAllEqual(np.zeros(value.shape), value, msg=name)
    self.assertAllClose(full.theta.moving_mean, micro.theta.moving_mean,
                        **_TOL)
    self.assertAllClose(full.theta.moving_variance,
                        micro.theta.moving_variance, **_TOL)

  def testTwoStepsApplyDecayTwice(self):
    bn = _BatchNorm(decay=0.75)
    x1, x2 = _Rand(6, 3, seed=1), _Rand(4, 3, seed=2) + 3.0
    bn.FProp(bn.theta, tf.constant(x1))
    bn.UpdateStats()
    bn.FProp(bn.theta, tf.constant(x2))
    bn.UpdateStats()
    mean = 0.75 * (0.25 * x1.mean(0)) + 0.25 * x2.mean(0)
    var = 0.75 * (0.75 + 0.25 * x1.var(0)) + 0.25 * x2.var(0)
    self.assertAllClose(mean, bn.theta.moving_mean, **_TOL)
    self.assertAllClose(var, bn.theta.moving_variance, **_TOL)

  def testNoStatUpdates(self):
    seq = layers.SequentialLayer.Params().Set(
        name='seq', dtype=tf.float64,
        sub=[normalization.BatchNormLayer.Params().Set(name='bn', dim=3)])
    seq = seq.Instantiate()
    bn = seq.bn
    x = tf.constant(_Rand(4, 3))
    with seq.NoStatUpdates():
      self.assertFalse(bn.update_stats)
      y = seq.FProp(seq.theta, x)
    self.assertTrue(bn.update_stats)
    for name, value in bn.accumulators.FlattenItems():
      self.assertAllEqual(np.zeros(value.shape), value, msg=name)
    # Same output as a counted call: only the bookkeeping differs.
    self.assertAllEqual(y, seq.FProp(seq.theta, x))
    self.assertAllClose(4.0, bn.accumulators.acc_count, **_TOL)
    bn.SetUpdateStats(False)
    seq.FProp(seq.theta, x)
    self.assertAllClose(4.0, bn.accumulators.acc_count, **_TOL)

  def testUpdateWithNothingAccumulatedIsNoOp(self):
    bn = _BatchNorm()
    bn.theta.moving_mean.assign([1.0, 2.0, 3.0])
    bn.theta.moving_variance.assign([4.0, 5.0, 6.0])
    bn.UpdateStats()
    tf.function(bn.UpdateStats, autograph=False)()
    self.assertAllEqual([1.0, 2.0, 3.0], bn.theta.moving_mean)
    self.assertAllEqual([4.0, 5.0, 6.0], bn.theta.moving_variance)

  def testInsideTfFunction(self):
    x = _Rand(8, 3) - 0.5
    eager, traced, together = _BatchNorm(), _BatchNorm(), _BatchNorm()
    for k in range(4):
      eager.FProp(eager.theta, tf.constant(x[2 * k:2 * k + 2]))
    eager.UpdateStats()

    @tf.function(autograph=False)
    def Forward(xs):
      return [traced.FProp(traced.theta, xs[k]) for k in range(4)]

    Forward(tf.constant(x.reshape(4, 2, 3)))
    self.assertAllClose(8.0, traced.accumulators.acc_count, **_TOL)
    tf.function(traced.UpdateStats, autograph=False)()

    @tf.function(autograph=False)
    def Step(xs):
      for k in range(4):
        together.FProp(together.theta, xs[k])
      together.UpdateStats()

    Step(tf.constant(x.reshape(4, 2, 3)))
    for bn in (traced, together):
      self.assertAllClose(eager.theta.moving_mean, bn.theta.moving_mean,
                          **_TOL)
      self.assertAllClose(eager.theta.moving_variance,
                          bn.theta.moving_variance, **_TOL)
      self.assertAllEqual(0.0, bn.accumulators.acc_count)
    self.assertAllClose(0.1 * x.mean(0), eager.theta.moving_mean, **_TOL)

  def testFPropMeta(self):
    bn = _BatchNorm()
    x = tf.zeros([2, 4, 4, 3], tf.float64)
    meta = bn.FPropMeta(bn.params, x.shape)
    self.assertEqual((bn.FProp(bn.theta, x).shape,), meta.out_shapes)
    self.assertIsInstance(meta.flops, int)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, "'bn': dim=0 must be > 0"):
      _BatchNorm(dim=0)
    with self.assertRaisesRegex(ValueError, r'decay=1.5 must be in \[0, 1\]'):
      _BatchNorm(decay=1.5)
    bn = _BatchNorm()
    with self.assertRaisesRegex(ValueError, 'last dimension 2; expected 3'):
      bn.FProp(bn.theta, tf.zeros([4, 2], tf.float64))
    with self.assertRaisesRegex(ValueError, 'rank >= 2'):
      bn.FProp(bn.theta, tf.zeros([3], tf.float64))


if __name__ == '__main__':
  absltest.main()
