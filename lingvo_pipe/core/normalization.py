"""Normalisation layers: LayerNorm and BatchNorm with GPipe semantics.

BatchNorm under GPipe normalises each micro-batch with that micro-batch's
own statistics (as if it were the whole batch), but its moving averages
must see the whole mini-batch. So FProp only *adds* the micro-batch's sums
to accumulators, and `UpdateStats()` (called once per training step, after
every micro-batch ran) folds the accumulated statistics into the moving
averages:

  for each micro-batch x_k:            # FProp, training, update_stats
    acc_sum += sum(x_k); acc_sum_sq += sum(x_k**2); acc_count += rows(x_k)
  UpdateStats():
    mean = acc_sum / acc_count
    var = acc_sum_sq / acc_count - mean**2       # biased, whole batch
    moving = decay * moving + (1 - decay) * stat  # mean and variance
    acc_* = 0

Re-computation in the backward pass runs FProp again: wrap it in
`layer.NoStatUpdates()` so a micro-batch is counted once.
"""

from __future__ import annotations

from typing import Any, List

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap


def _CheckDim(layer: base_layer.BaseLayer, key: str) -> int:
  dim = layer.params.Get(key)
  if not isinstance(dim, int) or dim <= 0:
    raise ValueError(
        f"{type(layer).__name__} '{layer.path}': {key}={dim!r} must be > 0.")
  return dim


def _CheckLastDim(layer: base_layer.BaseLayer, x: tf.Tensor,
                  dim: int) -> None:
  last = x.shape[-1] if x.shape.rank else None
  if last is not None and last != dim:
    raise ValueError(
        f"{type(layer).__name__} '{layer.path}': input shape {x.shape} has "
        f'last dimension {last}; expected {dim}.')


def _ElementwiseMeta(name: str, input_shape: Any,
                     flops_per_element: int) -> NestedMap:
  shape = tf.TensorShape(input_shape)
  n = base_layer.MetaNumElements(shape, name)
  return NestedMap(flops=flops_per_element * n, out_shapes=(shape,))


class LayerNorm(base_layer.BaseLayer):
  """Normalises over the last axis, with a learnt scale and bias.

  y = (x - mean) / sqrt(var + epsilon) * scale + bias, where mean and the
  (biased) var are taken over the last axis of x.

  x [..., input_dim] -> y [..., input_dim]; `scale` (init 1) and `bias`
  (init 0) are [input_dim].
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last axis.')
    p.Define('epsilon', 1e-6, 'Added to the variance.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    dim = _CheckDim(self, 'input_dim')
    self.CreateVariable('scale', base_layer.WeightParams(
        [dim], base_layer.WeightInit.Constant(1.0)))
    self.CreateVariable('bias', base_layer.WeightParams(
        [dim], base_layer.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    _CheckLastDim(self, inputs, self.params.input_dim)
    scale = tf.cast(theta.scale, inputs.dtype)
    bias = tf.cast(theta.bias, inputs.dtype)
    return _Normalized(inputs, self.params.epsilon) * scale + bias

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    return _ElementwiseMeta(cls.__name__, input_shape, 8)


def _Normalized(x: tf.Tensor, epsilon: float) -> tf.Tensor:
  """(x - mean) * rsqrt(var + epsilon) over the last axis of x, in x's
  dtype; bfloat16 and float16 take mean, variance and normalisation in
  float32.

  Its gradient is written out, keeping only the result and rsqrt
  [..., 1]. With y the result, r the rsqrt and g the output gradient,
  dx = r (g - mean(g) - y mean(g y)). TensorFlow's gradient of the
  composed ops is 41 more graph ops a Transformer layer, and 16 layer
  norms took 61 ms where this takes 53 (docs/DESIGN.md section 11); in
  half precision it would also keep x - mean in float32, twice the bytes
  of the activation it normalises (section 32).
  """

  @tf.custom_gradient
  def Normalized(x):
    x32 = base_layer.AtLeastFloat32(x)
    centred = x32 - tf.reduce_mean(x32, axis=-1, keepdims=True)
    inv = tf.math.rsqrt(
        tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + epsilon)
    y = tf.cast(centred * inv, x.dtype)

    def Grad(dy: tf.Tensor) -> tf.Tensor:
      g, y32 = base_layer.AtLeastFloat32(dy), base_layer.AtLeastFloat32(y)
      dx = inv * (g - tf.reduce_mean(g, axis=-1, keepdims=True) -
                  y32 * tf.reduce_mean(g * y32, axis=-1, keepdims=True))
      return tf.cast(dx, x.dtype)

    return y, Grad

  return Normalized(x)


class BatchNormLayer(base_layer.BaseLayer):
  """Batch normalisation over every axis but the last, for GPipe.

  x [..., dim] -> y = (x - mean) / sqrt(var + epsilon) * gamma + beta.
  Training: mean and var (biased) are those of the given batch (one
  micro-batch under GPipe); if `update_stats`, the batch's sums are added to
  the accumulators `acc_sum` [dim], `acc_sum_sq` [dim], `acc_count` [].
  Eval: mean and var are theta.moving_mean and theta.moving_variance.
  `UpdateStats()` folds the accumulators into the moving averages and
  zeroes them (see the module docstring); it does nothing if no rows were
  accumulated.

  Variables (theta): beta, gamma (trainable), moving_mean, moving_variance
  (not trainable). Accumulators are not in theta.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('dim', 0, 'Size of the last (channel) axis.')
    p.Define('decay', 0.99,
             'Moving-average momentum: moving = decay * moving + '
             '(1 - decay) * batch statistic.')
    p.Define('epsilon', 1e-3, 'Added to the variance.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    dim = _CheckDim(self, 'dim')
    p = self.params
    if not 0.0 <= p.decay <= 1.0:
      raise ValueError(
          f"BatchNormLayer '{self.path}': decay={p.decay} must be in [0, 1].")
    wp, init = base_layer.WeightParams, base_layer.WeightInit.Constant
    self.CreateVariable('beta', wp([dim], init(0.0)))
    self.CreateVariable('gamma', wp([dim], init(1.0)))
    self.CreateVariable('moving_mean', wp([dim], init(0.0), trainable=False))
    self.CreateVariable('moving_variance',
                        wp([dim], init(1.0), trainable=False))
    self.CreateAccumulator('acc_sum', [dim])
    self.CreateAccumulator('acc_sum_sq', [dim])
    self.CreateAccumulator('acc_count', [])

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    p = self.params
    _CheckLastDim(self, inputs, p.dim)
    rank = inputs.shape.rank
    if rank is None or rank < 2:
      raise ValueError(
          f"BatchNormLayer '{self.path}': input shape {inputs.shape} needs "
          'a known rank >= 2 ([batch, ..., dim]).')
    axes = list(range(rank - 1))
    # Half-precision inputs are normalised in float32 (Keras' rule), the
    # output cast back: the moments' reductions are float32.
    x = base_layer.AtLeastFloat32(inputs)
    theta = theta.Transform(lambda v: tf.cast(v, x.dtype))
    # `x - mean` once: written twice, the gradient keeps both copies
    # (one for the variance, one for the scale), a second activation-sized
    # tensor per layer (docs/DESIGN.md, section 17).
    if self.training:
      mean = tf.reduce_mean(x, axis=axes)
      centered = x - mean
      var = tf.reduce_mean(tf.square(centered), axis=axes)
      if self.update_stats:
        self._Accumulate(inputs, axes)
    else:
      centered = x - theta.moving_mean
      var = theta.moving_variance
    inv = tf.math.rsqrt(var + p.epsilon) * theta.gamma
    return tf.cast(centered * inv + theta.beta, inputs.dtype)

  def _Accumulate(self, inputs: tf.Tensor, axes: List[int]) -> None:
    acc = self._accumulators
    x = tf.stop_gradient(tf.cast(inputs, acc.acc_sum.dtype))
    rows = tf.reduce_prod(tf.shape(x, out_type=tf.int64)[:-1])
    acc.acc_sum.assign_add(tf.reduce_sum(x, axis=axes))
    acc.acc_sum_sq.assign_add(tf.reduce_sum(tf.square(x), axis=axes))
    acc.acc_count.assign_add(tf.cast(rows, acc.acc_count.dtype))

  def _UpdateOwnStats(self) -> List[Any]:
    acc, var = self._accumulators, self._vars
    count = acc.acc_count.read_value()
    total = acc.acc_sum.read_value()
    total_sq = acc.acc_sum_sq.read_value()
    has_rows = count > 0
    safe_count = tf.where(has_rows, count, tf.ones_like(count))
    mean = total / safe_count
    variance = tf.maximum(total_sq / safe_count - tf.square(mean), 0.0)
    decay = self.params.decay

    def Moving(moving: tf.Variable, stat: tf.Tensor) -> tf.Tensor:
      old = moving.read_value()
      new = decay * old + (1.0 - decay) * tf.cast(stat, old.dtype)
      return tf.where(has_rows, new, old)

    new_mean = Moving(var.moving_mean, mean)
    new_variance = Moving(var.moving_variance, variance)
    return [
        var.moving_mean.assign(new_mean),
        var.moving_variance.assign(new_variance),
        acc.acc_sum.assign(tf.zeros_like(total)),
        acc.acc_sum_sq.assign(tf.zeros_like(total_sq)),
        acc.acc_count.assign(tf.zeros_like(count)),
    ]

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    return _ElementwiseMeta(cls.__name__, input_shape, 10)
