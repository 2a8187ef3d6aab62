"""Tests of the learning-rate schedules against numpy formulas."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import lr_schedule

_STEPS = (0, 1, 2, 3, 4, 5, 9, 10, 11, 19, 20, 21, 50, 99, 100, 101, 1000)


def _NpRsqrt(step, w):
  s = step + 1.0
  return min(s / w, math.sqrt(w / s))


def _NpCosine(step, total, warmup, min_ratio):
  if step < warmup:
    return (step + 1.0) / warmup
  r = min(1.0, (step - warmup) / (total - warmup))
  return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * r))


def _NpPiecewise(step, boundaries, values):
  return values[sum(1 for b in boundaries if b <= step)]


_CASES = (
    ('Constant', lr_schedule.Constant.Params().Set(value=0.3),
     lambda s: 0.3),
    ('Rsqrt', lr_schedule.LinearWarmupRsqrtDecay.Params().Set(
        warmup_steps=10), lambda s: _NpRsqrt(s, 10)),
    ('RsqrtWarmup1', lr_schedule.LinearWarmupRsqrtDecay.Params().Set(
        warmup_steps=1), lambda s: _NpRsqrt(s, 1)),
    ('Cosine', lr_schedule.Cosine.Params().Set(total_steps=100),
     lambda s: _NpCosine(s, 100, 0, 0.0)),
    ('CosineWarmupMin', lr_schedule.Cosine.Params().Set(
        total_steps=100, warmup_steps=10, min_ratio=0.1),
     lambda s: _NpCosine(s, 100, 10, 0.1)),
    ('Piecewise', lr_schedule.Piecewise.Params().Set(
        boundaries=[10, 20, 100], values=[1.0, 0.5, 0.1, 0.01]),
     lambda s: _NpPiecewise(s, [10, 20, 100], [1.0, 0.5, 0.1, 0.01])),
    ('PiecewiseOneValue', lr_schedule.Piecewise.Params().Set(
        boundaries=[], values=[0.7]), lambda s: 0.7),
)


class LrScheduleTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def testAgainstNumpyInFunction(self, params, reference):
    schedule = params.Instantiate()
    value = tf.function(schedule.Value, autograph=False)
    for step in _STEPS:
      got = value(tf.constant(step, tf.int64))
      self.assertEqual(tf.float32, got.dtype)
      self.assertEqual([], got.shape.as_list())
      self.assertAllClose(np.float32(reference(step)), got.numpy(),
                          atol=0, rtol=1e-7, msg=f'step {step}')

  @parameterized.named_parameters(*_CASES)
  def testEagerWithPythonAndInt32Steps(self, params, reference):
    schedule = params.Instantiate()
    for step in (0, 7, 20):
      want = np.float32(reference(step))
      self.assertAllClose(want, schedule.Value(step), atol=0, rtol=1e-7)
      self.assertAllClose(want, schedule.Value(tf.constant(step, tf.int32)),
                          atol=0, rtol=1e-7)

  def testRsqrtTable(self):
    # The table in lr_schedule's docstring.
    schedule = lr_schedule.LinearWarmupRsqrtDecay.Params().Set(
        warmup_steps=4).Instantiate()
    got = [schedule.Value(s).numpy() for s in (0, 1, 2, 3, 4, 8, 15)]
    self.assertAllClose([0.25, 0.5, 0.75, 1.0, 0.894, 0.667, 0.5], got,
                        atol=1e-3)

  def testCosineEndpoints(self):
    schedule = lr_schedule.Cosine.Params().Set(
        total_steps=25, warmup_steps=5, min_ratio=0.2).Instantiate()
    self.assertAllClose(0.2, schedule.Value(0))  # (0 + 1) / 5
    self.assertAllClose(1.0, schedule.Value(4))
    self.assertAllClose(1.0, schedule.Value(5))
    self.assertAllClose(0.6, schedule.Value(15))  # half-way down
    self.assertAllClose(0.2, schedule.Value(25))
    self.assertAllClose(0.2, schedule.Value(10**6))

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'warmup_steps=0 must be'):
      lr_schedule.LinearWarmupRsqrtDecay.Params().Set(
          warmup_steps=0).Instantiate()
    with self.assertRaisesRegex(ValueError, 'total_steps=10 must be an int '
                                'larger than warmup_steps=10'):
      lr_schedule.Cosine.Params().Set(
          total_steps=10, warmup_steps=10).Instantiate()
    with self.assertRaisesRegex(ValueError, 'min_ratio=1.5'):
      lr_schedule.Cosine.Params().Set(
          total_steps=10, min_ratio=1.5).Instantiate()
    with self.assertRaisesRegex(ValueError, '2 boundaries need 3 values'):
      lr_schedule.Piecewise.Params().Set(
          boundaries=[1, 2], values=[1.0, 2.0]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'strictly increasing'):
      lr_schedule.Piecewise.Params().Set(
          boundaries=[2, 2], values=[1.0, 2.0, 3.0]).Instantiate()


if __name__ == '__main__':
  absltest.main()
