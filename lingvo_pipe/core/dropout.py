"""Dropout whose masks are a pure function of (example, step, layer).

GPipe re-computes forward passes and splits batches into micro-batches; a
mask drawn from a random-number state would differ between the first pass
and the re-computation, and between one batch split and another. Here every
example carries an int64 key (from `ExampleKeys(step, ...)`), and each mask
element is a hash of (key, layer path, element index):

  u[b, i] = Hash(key[b], Hash(layer_salt, i)) / 2**32
  keep[b, i] = u[b, i] < keep_prob

So the mask of an example does not depend on which micro-batch, partition
or device it lands in, nor on how often it is computed.

All arithmetic is int64 on values below 2**32 times constants below 2**27,
so nothing overflows and the hash is the same on every device.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.nested_map import NestedMap

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B


def Mix32(x: tf.Tensor) -> tf.Tensor:
  """A bijective 32-bit integer hash on int64 values in [0, 2**32)."""
  x = tf.bitwise.bitwise_and(
      tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x) * _MIX,
      _MASK32)
  x = tf.bitwise.bitwise_and(
      tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x) * _MIX,
      _MASK32)
  return tf.bitwise.bitwise_xor(tf.bitwise.right_shift(x, 16), x)


def _Const64(v: int) -> tf.Tensor:
  return tf.constant(v & _MASK32, tf.int64)


def ExampleKeys(step: tf.Tensor, batch_size: int,
                seed: int = 0, offset: int = 0) -> tf.Tensor:
  """int64 [batch_size] keys, one per example of the batch at `step`.

  Example `offset + i` of step `step` always gets the same key, whatever
  batch or micro-batch it is part of.
  """
  step = tf.cast(step, tf.int64)
  step_hash = Mix32(tf.bitwise.bitwise_xor(
      Mix32(tf.bitwise.bitwise_and(step, _MASK32)), _Const64(seed)))
  index = tf.range(offset, offset + batch_size, dtype=tf.int64)
  return Mix32(tf.bitwise.bitwise_xor(Mix32(index), step_hash))


def _PathSalt(path: str) -> int:
  return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], 'little')


def KeepMask(example_keys: tf.Tensor, shape: tf.Tensor, salt: int,
             keep_prob: float) -> tf.Tensor:
  """bool mask of `shape` ([batch, ...]); row b depends only on key[b]."""
  shape = tf.cast(shape, tf.int64)
  per_example = tf.reduce_prod(shape[1:])
  index = tf.reshape(tf.range(per_example, dtype=tf.int64), shape[1:])
  element_hash = Mix32(tf.bitwise.bitwise_xor(Mix32(index), _Const64(salt)))
  keys = tf.reshape(tf.cast(example_keys, tf.int64),
                    tf.concat([shape[:1], tf.ones_like(shape[1:])], 0))
  h = Mix32(tf.bitwise.bitwise_xor(element_hash, keys))
  threshold = int(round(keep_prob * 2**32))
  return h < threshold


class DropoutLayer(base_layer.BaseLayer):
  """y = x * mask / keep_prob in training, y = x in eval.

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
    mask = KeepMask(example_keys, tf.shape(inputs), self._salt, keep_prob)
    return tf.where(mask, inputs / tf.cast(keep_prob, inputs.dtype),
                    tf.zeros_like(inputs))

  @classmethod
  def FPropMeta(cls, params, input_shape, *unused):
    return NestedMap(flops=10 * input_shape.num_elements(),
                     out_shapes=(input_shape,))
