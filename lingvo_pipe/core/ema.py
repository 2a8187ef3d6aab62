"""Exponential moving averages of variables, kept on their devices.

  shadow = var                                  (at creation)
  shadow = decay * shadow + (1 - decay) * var   (each Update)

A constant decay, no bias correction. Shadows are created eagerly under
`tf.device(var.device)` and updated there, so a pipelined model's averages
stay with its partitions. `Substitute(theta)` swaps them into a theta for
evaluation.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap


class ExponentialMovingAverage:
  """Shadows of a set of variables; see the module docstring."""

  def __init__(self, decay: float) -> None:
    if not 0.0 <= decay < 1.0:
      raise ValueError(
          f'ExponentialMovingAverage: decay={decay} must be in [0, 1).')
    self._decay = decay
    self._vars: Dict[str, tf.Variable] = {}
    self._shadows: Dict[str, tf.Variable] = {}

  @property
  def shadows(self) -> Dict[str, tf.Variable]:
    """{var path: shadow variable}."""
    return self._shadows

  def CreateShadows(self, variables: Mapping[str, tf.Variable]) -> None:
    """Eagerly makes a shadow '<path>/ema' for each {path: variable}."""
    if not tf.executing_eagerly():
      raise RuntimeError(
          'ExponentialMovingAverage.CreateShadows must run eagerly, outside '
          'tf.function.')
    for path, var in variables.items():
      if path in self._shadows:
        continue
      with tf.device(var.device):
        self._shadows[path] = tf.Variable(
            var.read_value(), trainable=False, name=f'{path}/ema')
      self._vars[path] = var

  def Update(self) -> List[Any]:
    """Moves every shadow towards its variable; returns the assign ops."""
    ops = []
    for path, shadow in self._shadows.items():
      var = self._vars[path]
      with tf.device(var.device):
        d = tf.constant(self._decay, var.dtype)
        new = d * shadow.read_value() + (1.0 - d) * var.read_value()
        ops.append(shadow.assign(new, read_value=False))
    return ops

  def Substitute(self, theta: NestedMap) -> NestedMap:
    """`theta` with each averaged variable replaced by its shadow."""
    by_var = {self._vars[path].ref(): shadow
              for path, shadow in self._shadows.items()}
    return theta.Transform(
        lambda v: by_var.get(v.ref(), v) if isinstance(v, tf.Variable)
        else v)
