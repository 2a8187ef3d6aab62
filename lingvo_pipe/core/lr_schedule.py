"""Learning-rate schedules: multipliers of the base learning rate.

A schedule is a plain object built from its params; `Value(step)` returns
a float32 scalar tensor, works eagerly and inside tf.function, and takes
the global step as an int (any integer dtype) tensor or a Python int. The
task's learning rate at a step is `p.train.learning_rate *
schedule.Value(step)`. Values are computed in float64, then cast.

  Constant                 value
  LinearWarmupRsqrtDecay   s = step + 1
                           min(s / warmup_steps, sqrt(warmup_steps / s))
  Cosine                   s = step + 1
                           s / warmup_steps              if step < warmup
                           min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi *
                           min(1, (step - warmup) / (total - warmup))))
  Piecewise                values[i], i = #{boundaries b : b <= step}

Example, LinearWarmupRsqrtDecay with warmup_steps=4:

  step        0     1     2     3     4       8       15
  multiplier  0.25  0.5   0.75  1.0   0.894   0.667   0.5
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from lingvo_pipe.core import hyperparams


class BaseSchedule:
  """Value(step) -> float32 multiplier of the base learning rate."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    return hyperparams.InstantiableParams(cls)

  def __init__(self, params: hyperparams.Params) -> None:
    self._params = params.Copy().Freeze()
    self._CheckParams()

  @property
  def params(self) -> hyperparams.Params:
    return self._params

  def _CheckParams(self) -> None:
    """Raises ValueError for bad params; subclasses extend it."""

  def _Error(self, message: str) -> ValueError:
    return ValueError(f'{type(self).__name__}: {message}')

  def Value(self, step: Any) -> tf.Tensor:
    """The multiplier at `step` (int tensor or int), a float32 scalar."""
    step = tf.cast(tf.convert_to_tensor(step), tf.float64)
    return tf.cast(self._Value64(step), tf.float32)

  def _Value64(self, step: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError(
        f'{type(self).__name__} must implement _Value64(step).')


class Constant(BaseSchedule):
  """Always p.value."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('value', 1.0, 'The multiplier.')
    return p

  def _Value64(self, step):
    del step  # constant
    return tf.constant(self.params.value, tf.float64)


class LinearWarmupRsqrtDecay(BaseSchedule):
  """min(s / w, sqrt(w / s)) with s = step + 1, w = warmup_steps.

  Rises linearly to 1.0 at step w - 1, then decays as 1 / sqrt(s) (the
  Transformer schedule without its model-dim factor).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('warmup_steps', 4000, 'w: steps to reach the peak 1.0.')
    return p

  def _CheckParams(self) -> None:
    w = self.params.warmup_steps
    if not isinstance(w, int) or w < 1:
      raise self._Error(f'warmup_steps={w!r} must be an int >= 1.')

  def _Value64(self, step):
    s = step + 1.0
    w = tf.constant(float(self.params.warmup_steps), tf.float64)
    return tf.minimum(s / w, tf.sqrt(w / s))


class Cosine(BaseSchedule):
  """Optional linear warmup, then cosine decay to min_ratio.

  With s = step + 1, w = warmup_steps, T = total_steps:
    step < w:  s / w
    else:      min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * r)),
               r = min(1, (step - w) / (T - w))
  so it is 1.0 at step w and min_ratio from step T on.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('total_steps', 0, 'T: the decay ends at step T.')
    p.Define('warmup_steps', 0, 'w: steps of linear warmup; 0 = none.')
    p.Define('min_ratio', 0.0, 'The multiplier from step T on, in [0, 1].')
    return p

  def _CheckParams(self) -> None:
    p = self.params
    if not isinstance(p.warmup_steps, int) or p.warmup_steps < 0:
      raise self._Error(f'warmup_steps={p.warmup_steps!r} must be an int '
                        '>= 0.')
    if not isinstance(p.total_steps, int) or p.total_steps <= p.warmup_steps:
      raise self._Error(
          f'total_steps={p.total_steps!r} must be an int larger than '
          f'warmup_steps={p.warmup_steps}.')
    if not 0.0 <= p.min_ratio <= 1.0:
      raise self._Error(f'min_ratio={p.min_ratio!r} must be in [0, 1].')

  def _Value64(self, step):
    p = self.params
    w = float(p.warmup_steps)
    r = tf.minimum((step - w) / (float(p.total_steps) - w), 1.0)
    cosine = p.min_ratio + (1.0 - p.min_ratio) * 0.5 * (
        1.0 + tf.cos(math.pi * r))
    if not p.warmup_steps:
      return cosine
    return tf.where(step < w, (step + 1.0) / w, cosine)


class Piecewise(BaseSchedule):
  """values[i] where i = number of boundaries <= step.

  boundaries=[10, 20], values=[1.0, 0.1, 0.01]: steps 0-9 give 1.0, steps
  10-19 give 0.1, steps from 20 give 0.01.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('boundaries', [], 'Strictly increasing int steps.')
    p.Define('values', [1.0],
             'Multipliers, one more than boundaries.')
    return p

  def _CheckParams(self) -> None:
    p = self.params
    bounds, values = list(p.boundaries), list(p.values)
    if len(values) != len(bounds) + 1:
      raise self._Error(
          f'{len(bounds)} boundaries need {len(bounds) + 1} values, got '
          f'{len(values)}: {values}.')
    if any(not isinstance(b, int) for b in bounds) or any(
        a >= b for a, b in zip(bounds, bounds[1:])):
      raise self._Error(
          f'boundaries={bounds} must be strictly increasing ints.')

  def _Value64(self, step):
    p = self.params
    values = tf.constant(list(p.values), tf.float64)
    if not p.boundaries:
      return values[0]
    bounds = tf.constant([float(b) for b in p.boundaries], tf.float64)
    index = tf.reduce_sum(tf.cast(step >= bounds, tf.int32))
    return tf.gather(values, index)
