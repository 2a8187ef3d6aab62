"""Tests of DropoutLayer and ExampleKeys: hash-based, split-invariant masks."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import dropout
from lingvo_pipe.core import layers


def _Dropout(name='drop', keep_prob=0.7):
  p = dropout.DropoutLayer.Params().Set(name=name, keep_prob=keep_prob)
  return p.Instantiate()


def _Rand(*shape, seed=0):
  # Nonzero values, so a zero output always means a dropped element.
  x = np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)
  return tf.constant(x, tf.float32)


def _Kept(layer, x, keys):
  return (layer.FProp(layer.theta, x, keys) != 0).numpy()


class DropoutTest(tf.test.TestCase, parameterized.TestCase):

  def testEvalIsIdentity(self):
    layer = _Dropout()
    layer.SetTraining(False)
    x = _Rand(4, 5)
    self.assertIs(x, layer.FProp(layer.theta, x))  # no keys needed

  def testKeepProbOneIsIdentity(self):
    layer = _Dropout(keep_prob=1.0)
    x = _Rand(4, 5)
    self.assertIs(x, layer.FProp(layer.theta, x))
    keys = dropout.ExampleKeys(3, 4)
    self.assertAllEqual(x, layer.FProp(layer.theta, x, keys))

  @parameterized.parameters(0.3, 0.7, 0.9)
  def testDropFractionAndScaling(self, keep_prob):
    layer = _Dropout(keep_prob=keep_prob)
    x = _Rand(64, 32, 32)
    y = layer.FProp(layer.theta, x, dropout.ExampleKeys(5, 64)).numpy()
    kept = y != 0
    # 65536 elements: the standard deviation of the fraction is < 0.002.
    self.assertBetween(kept.mean(), keep_prob - 0.01, keep_prob + 0.01)
    # Every example keeps roughly its share too (1024 elements each).
    self.assertBetween(kept.mean(axis=(1, 2)).min(), keep_prob - 0.08, 1.0)
    self.assertBetween(kept.mean(axis=(1, 2)).max(), 0.0, keep_prob + 0.08)
    # The layer multiplies by the reciprocal (graph and eager agree).
    expected = x.numpy() * np.float32(1.0 / keep_prob)
    self.assertAllEqual(expected[kept], y[kept])
    self.assertAllEqual(np.zeros(np.sum(~kept)), y[~kept])

  def testGradientIsMaskOverKeepProb(self):
    layer = _Dropout(keep_prob=0.6)
    x = _Rand(8, 16)
    keys = dropout.ExampleKeys(1, 8)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer.FProp(layer.theta, x, keys)
    grad = tape.gradient(y, x).numpy()
    kept = y.numpy() != 0
    self.assertAllClose(kept / np.float32(0.6), grad, atol=0, rtol=1e-7)
    self.assertGreater(kept.sum(), 0)
    self.assertGreater((~kept).sum(), 0)

  def testMicroBatchesGetTheSameMasks(self):
    layer = _Dropout()
    x = _Rand(8, 3, 5)
    keys = dropout.ExampleKeys(11, 8)
    full = layer.FProp(layer.theta, x, keys)
    parts = []
    for k in range(4):
      sliced = keys[2 * k:2 * k + 2]
      by_offset = dropout.ExampleKeys(11, 2, offset=2 * k)
      self.assertAllEqual(sliced, by_offset)
      parts.append(layer.FProp(layer.theta, x[2 * k:2 * k + 2], by_offset))
    self.assertAllEqual(full, tf.concat(parts, 0))

  def testMaskFollowsTheExampleNotItsPosition(self):
    layer = _Dropout()
    x = _Rand(6, 10)
    keys = dropout.ExampleKeys(2, 6)
    perm = [3, 0, 5, 1, 4, 2]
    y = layer.FProp(layer.theta, x, keys)
    y_perm = layer.FProp(layer.theta, tf.gather(x, perm),
                         tf.gather(keys, perm))
    self.assertAllEqual(tf.gather(y, perm), y_perm)

  def testRecomputeIsIdentical(self):
    layer = _Dropout()
    x = _Rand(4, 7, 3)
    keys = dropout.ExampleKeys(9, 4)
    first = layer.FProp(layer.theta, x, keys)
    self.assertAllEqual(first, layer.FProp(layer.theta, x, keys))
    traced = tf.function(lambda a, k: layer.FProp(layer.theta, a, k),
                         autograph=False)
    self.assertAllEqual(traced(x, keys), traced(x, keys))
    # Traced and eager agree to the bit (the layer multiplies by the
    # reciprocal, as Grappler would rewrite a division anyway).
    self.assertAllEqual(first, traced(x, keys))
    # A fresh layer at the same path draws the same masks.
    self.assertAllEqual(first, _Dropout().FProp(None, x, keys))

  def testStepsExamplesAndPathsDiffer(self):
    x = _Rand(4, 256)
    layer = _Dropout()
    step0 = _Kept(layer, x, dropout.ExampleKeys(0, 4))
    step1 = _Kept(layer, x, dropout.ExampleKeys(1, 4))
    seeded = _Kept(layer, x, dropout.ExampleKeys(0, 4, seed=1))
    other = _Kept(_Dropout(name='other'), x, dropout.ExampleKeys(0, 4))
    # Independent masks with keep 0.7 differ in ~42% of the elements.
    for name, mask in [('step', step1), ('seed', seeded), ('path', other)]:
      self.assertBetween((mask != step0).mean(), 0.3, 0.55, msg=name)
    for i in range(1, 4):
      self.assertBetween((step0[i] != step0[0]).mean(), 0.3, 0.55)

  def testSameNameUnderDifferentParentsDiffers(self):
    def Build(parent):
      p = layers.SequentialLayer.Params().Set(
          name=parent, sub=[dropout.DropoutLayer.Params().Set(
              name='drop', keep_prob=0.5)])
      return p.Instantiate()

    a, b = Build('a'), Build('b')
    self.assertEqual('a/drop', a.drop.path)
    x = _Rand(2, 128)
    keys = dropout.ExampleKeys(0, 2)
    ya, yb = a.FProp(a.theta, x, keys), b.FProp(b.theta, x, keys)
    self.assertBetween(np.mean(ya.numpy() != yb.numpy()), 0.3, 0.7)

  def testExampleKeys(self):
    keys = dropout.ExampleKeys(tf.constant(4), 10).numpy()
    self.assertEqual(np.int64, keys.dtype)
    self.assertLen(set(keys.tolist()), 10)
    self.assertTrue(np.all((keys >= 0) & (keys < 2**32)))
    self.assertAllEqual(keys[3:7], dropout.ExampleKeys(4, 4, offset=3))
    self.assertNotAllEqual(keys, dropout.ExampleKeys(5, 10))

  def testMissingKeysInTraining(self):
    layer = _Dropout(name='drop7')
    with self.assertRaisesRegex(ValueError,
                                "'drop7' needs example_keys.*ExampleKeys"):
      layer.FProp(layer.theta, _Rand(2, 3))

  @parameterized.parameters(0.0, -0.1, 1.5)
  def testBadKeepProb(self, keep_prob):
    with self.assertRaisesRegex(ValueError, r'keep_prob=.* must be in \(0, 1'):
      _Dropout(keep_prob=keep_prob)

  def testFPropMeta(self):
    layer = _Dropout()
    x = _Rand(2, 3, 4)
    meta = layer.FPropMeta(layer.params, x.shape)
    out = layer.FProp(layer.theta, x, dropout.ExampleKeys(0, 2))
    self.assertEqual((out.shape,), meta.out_shapes)
    self.assertIsInstance(meta.flops, int)


def _DropPath(name='drop_path', keep_prob=0.6, burn_in_steps=0):
  return dropout.DropPathLayer.Params().Set(
      name=name, keep_prob=keep_prob,
      burn_in_steps=burn_in_steps).Instantiate()


def _Steps(step, n):
  return tf.fill([n], tf.constant(step, tf.int64))


class DropPathTest(tf.test.TestCase, parameterized.TestCase):

  def testWholeExamplesDroppedOrScaled(self):
    layer = _DropPath(keep_prob=0.6)
    x = _Rand(400, 3, 2)
    y = layer.FProp(layer.theta, x, dropout.ExampleKeys(2, 400)).numpy()
    kept = np.all(y != 0, axis=(1, 2))
    dropped = np.all(y == 0, axis=(1, 2))
    self.assertTrue(np.all(kept | dropped))  # never part of an example
    self.assertAllClose(x.numpy()[kept] / 0.6, y[kept], rtol=1e-6)
    self.assertBetween(kept.mean(), 0.5, 0.7)

  def testBurnInSchedule(self):
    layer = _DropPath(keep_prob=0.6, burn_in_steps=100)
    for step, keep in ((0, 1.0), (50, 0.8), (100, 0.6), (300, 0.6)):
      got = dropout.DropPathKeepProb(0.6, 100, _Steps(step, 3))
      self.assertAllClose([keep] * 3, got, atol=1e-15, rtol=0)
    x = _Rand(400, 2)
    keys = dropout.ExampleKeys(7, 400)
    self.assertAllEqual(x, layer.FProp(layer.theta, x, keys, _Steps(0, 400)))
    y = layer.FProp(layer.theta, x, keys, _Steps(50, 400)).numpy()
    kept = y[:, 0] != 0
    self.assertAllClose(x.numpy()[kept] / 0.8, y[kept], rtol=1e-6)
    self.assertBetween(kept.mean(), 0.7, 0.9)
    with self.assertRaisesRegex(ValueError, 'needs example_steps'):
      layer.FProp(layer.theta, x, keys)

  def testMaskFollowsTheExampleAcrossSplits(self):
    layer = _DropPath(keep_prob=0.5, burn_in_steps=10)
    x = _Rand(8, 4)
    keys, steps = dropout.ExampleKeys(3, 8), _Steps(6, 8)
    whole = layer.FProp(layer.theta, x, keys, steps)
    parts = [layer.FProp(layer.theta, a, k, s) for a, k, s in zip(
        tf.split(x, 4), tf.split(keys, 4), tf.split(steps, 4))]
    self.assertAllEqual(whole, tf.concat(parts, 0))
    self.assertAllEqual(whole[::-1], layer.FProp(
        layer.theta, x[::-1], keys[::-1], steps[::-1]))

  def testPathsDifferAndEvalIsIdentity(self):
    x = _Rand(64, 2)
    keys = dropout.ExampleKeys(1, 64)
    a, b = _DropPath('a'), _DropPath('b')
    self.assertNotAllEqual(a.FProp(a.theta, x, keys),
                           b.FProp(b.theta, x, keys))
    a.SetTraining(False)
    self.assertAllEqual(x, a.FProp(a.theta, x))

  def testGradientIsMaskOverKeep(self):
    layer = _DropPath(keep_prob=0.5)
    x = _Rand(16, 3)
    keys = dropout.ExampleKeys(4, 16)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer.FProp(layer.theta, x, keys)
    grad = tape.gradient(y, x).numpy()
    kept = y.numpy()[:, :1] != 0
    self.assertAllEqual(np.where(kept, 2.0, 0.0) * np.ones([16, 3]), grad)

  @parameterized.parameters(0.0, 1.5)
  def testBadParams(self, keep_prob):
    with self.assertRaisesRegex(ValueError, r'keep_prob=.* must be in \(0, 1'):
      _DropPath(keep_prob=keep_prob)
    with self.assertRaisesRegex(ValueError, 'burn_in_steps=-1'):
      _DropPath(burn_in_steps=-1)


if __name__ == '__main__':
  absltest.main()
