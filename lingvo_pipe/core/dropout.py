"""Dropout whose masks are a pure function of (example, step, layer).

GPipe re-computes forward passes and splits batches into micro-batches; a
mask drawn from a random-number state would differ between the first pass
and the re-computation, and between one batch split and another. Here every
example carries an int64 key (from `ExampleKeys(step, ...)`), and each mask
element is a hash of (key, layer seed path, element index):

  h[b, i] = Mix32(key[b] ^ (i * 0x9E3779B1 + layer_salt))      (uint32)
  keep[b, i] = h[b, i] < keep_prob * 2**32

So the mask of an example does not depend on which micro-batch, partition
or device it lands in, nor on how often it is computed. Drop-path
(`DropPathLayer`) drops a whole example's output the same way, with a
keep probability that may fall with each example's training step. `Mix32` is the
murmur3 32-bit finaliser; uint32 arithmetic wraps, the same on every
device. Few ops on purpose: graph building costs about 1 ms per op here.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.nested_map import NestedMap

_GOLDEN = 0x9E3779B1


def _U32(v: int) -> tf.Tensor:
  return tf.constant(v & 0xFFFFFFFF, tf.uint32)


def Mix32(x: tf.Tensor) -> tf.Tensor:
  """The murmur3 finaliser: a bijective, well-mixing hash of uint32."""
  xor, shift = tf.bitwise.bitwise_xor, tf.bitwise.right_shift
  x = xor(x, shift(x, _U32(16))) * _U32(0x85EBCA6B)
  x = xor(x, shift(x, _U32(13))) * _U32(0xC2B2AE35)
  return xor(x, shift(x, _U32(16)))


def ExampleKeys(step: tf.Tensor, batch_size: int, *,
                seed: int = 0, offset: int = 0) -> tf.Tensor:
  """int64 [batch_size] keys, one per example of the batch at `step`.

  Example `offset + i` of step `step` always gets the same key, whatever
  batch or micro-batch it is part of. Keys are in [0, 2**32).
  """
  step = tf.cast(tf.cast(step, tf.int64) % (2**32), tf.uint32)
  step_hash = Mix32(tf.bitwise.bitwise_xor(Mix32(step), _U32(seed)))
  index = tf.cast(tf.range(offset, offset + batch_size, dtype=tf.int64),
                  tf.uint32)
  keys = Mix32(tf.bitwise.bitwise_xor(index * _U32(_GOLDEN), step_hash))
  return tf.cast(keys, tf.int64)


def _PathSalt(path: str) -> int:
  return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], 'little')


def KeepMask(example_keys: tf.Tensor, shape: tf.Tensor, salt: int,
             keep_prob: float) -> tf.Tensor:
  """bool mask of `shape` ([batch, ...]); row b depends only on key[b]."""
  per_example = tf.reduce_prod(shape[1:])
  index = tf.reshape(tf.cast(tf.range(per_example), tf.uint32), shape[1:])
  element = index * _U32(_GOLDEN) + _U32(salt)
  keys = tf.reshape(tf.cast(example_keys, tf.uint32),
                    tf.concat([shape[:1], tf.ones_like(shape[1:])], 0))
  threshold = min(int(round(keep_prob * 2**32)), 2**32 - 1)
  return Mix32(tf.bitwise.bitwise_xor(element, keys)) < _U32(threshold)


class DropoutLayer(base_layer.BaseLayer):
  """y = x * mask * (1 / keep_prob) in training, y = x in eval.

  FProp(theta, inputs [batch, ...], example_keys [batch] int64). The mask
  of example b depends only on example_keys[b], this layer's path and the
  element position (see the module docstring).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping an element.')
    return p

  def __init__(self, params):
    super().__init__(params)
    keep = self.params.keep_prob
    if not 0.0 < keep <= 1.0:
      raise ValueError(
          f"Dropout '{self.path}': keep_prob={keep} must be in (0, 1].")
    self._salt = _PathSalt(self.seed_path)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor,
            example_keys: Optional[tf.Tensor] = None) -> tf.Tensor:
    del theta  # no variables
    keep_prob = self.params.keep_prob
    if not self.training or keep_prob == 1.0:
      return inputs
    if example_keys is None:
      raise ValueError(
          f"Dropout '{self.path}' needs example_keys in training; pass "
          'dropout.ExampleKeys(step, batch_size) with the inputs.')
    if (example_keys.shape.rank != 1 or
        not example_keys.shape.is_compatible_with(inputs.shape[:1])):
      raise ValueError(
          f"Dropout '{self.path}': example_keys of shape "
          f'{example_keys.shape} do not match inputs {inputs.shape}; pass '
          'one key per example.')
    mask = KeepMask(example_keys, tf.shape(inputs), self._salt, keep_prob)
    # Multiply by the reciprocal in the input's own dtype: Grappler turns a
    # division by a constant into this anyway, and eager must agree.
    scale = tf.constant(1.0 / keep_prob, inputs.dtype)
    return tf.where(mask, inputs * scale, tf.zeros_like(inputs))

  @classmethod
  def FPropMeta(cls, params, input_shape, *unused):
    input_shape = tf.TensorShape(input_shape)
    n = base_layer.MetaNumElements(input_shape, 'DropoutLayer')
    return NestedMap(flops=10 * n, out_shapes=(input_shape,))


def DropPathKeepProb(keep_prob: float, burn_in_steps: int,
                     example_steps: Optional[tf.Tensor]) -> tf.Tensor:
  """float64 keep probability per example: [batch], or a scalar.

  keep(t) = 1 - min(1, t / burn_in_steps) * (1 - keep_prob) at training
  step t: 1 at the start, keep_prob from step burn_in_steps on (the
  schedule of Zoph et al. 2018 and Real et al. 2019). burn_in_steps = 0
  means keep_prob from the start (example_steps unused).
  """
  if burn_in_steps == 0:
    return tf.constant(keep_prob, tf.float64)
  progress = tf.minimum(
      tf.cast(example_steps, tf.float64) / float(burn_in_steps), 1.0)
  return 1.0 - progress * (1.0 - keep_prob)


class DropPathLayer(base_layer.BaseLayer):
  """Drops each example's whole input: y[b] = x[b] * mask[b] / keep[b].

  FProp(theta, inputs [batch, ...], example_keys [batch] int64,
  example_steps [batch] int64 (needed if burn_in_steps > 0)). In training,
  mask[b] = Mix32(key[b] ^ layer_salt) < keep[b] * 2**32, with keep[b]
  from DropPathKeepProb at example_steps[b]; in eval, y = x. Like
  DropoutLayer, example b's mask depends only on its key, its step and
  this layer's path: the same in every micro-batch split, on every device
  and in re-computation.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping an example (at the '
             'end of the burn-in).')
    p.Define('burn_in_steps', 0,
             'Training steps over which the keep probability falls '
             'linearly from 1 to keep_prob; 0: keep_prob from the start.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = f"DropPathLayer '{self.path}'"
    if not 0.0 < p.keep_prob <= 1.0:
      raise ValueError(f'{where}: keep_prob={p.keep_prob} must be in (0, 1].')
    if not isinstance(p.burn_in_steps, int) or p.burn_in_steps < 0:
      raise ValueError(f'{where}: burn_in_steps={p.burn_in_steps!r} must be '
                       'an int >= 0.')
    self._salt = _PathSalt(self.seed_path)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor,
            example_keys: Optional[tf.Tensor] = None,
            example_steps: Optional[tf.Tensor] = None) -> tf.Tensor:
    del theta  # no variables
    p = self.params
    if not self.training or p.keep_prob == 1.0:
      return inputs
    where = f"DropPathLayer '{self.path}'"
    if example_keys is None:
      raise ValueError(
          f'{where} needs example_keys in training; pass '
          'dropout.ExampleKeys(step, batch_size) with the inputs.')
    if example_steps is None and p.burn_in_steps:
      raise ValueError(
          f'{where} needs example_steps (each example\'s training step) '
          'for its burn-in; pass them with the inputs or set '
          'burn_in_steps=0.')
    keep = DropPathKeepProb(p.keep_prob, p.burn_in_steps, example_steps)
    hashed = Mix32(tf.bitwise.bitwise_xor(
        tf.cast(example_keys, tf.uint32), _U32(self._salt)))
    kept = tf.cast(hashed, tf.float64) < keep * 2.0**32
    scale = tf.where(kept, 1.0 / keep, tf.zeros_like(keep))
    scale = tf.cast(scale, inputs.dtype)
    shape = tf.concat([tf.shape(scale), tf.ones([inputs.shape.rank - 1],
                                                tf.int32)], 0)
    return inputs * tf.reshape(scale, shape)

  @classmethod
  def FPropMeta(cls, params, input_shape, *unused):
    input_shape = tf.TensorShape(input_shape)
    n = base_layer.MetaNumElements(input_shape, 'DropPathLayer')
    return NestedMap(flops=n, out_shapes=(input_shape,))
