"""One-pass training's loss: each micro-batch's, on the pipeline's last device.

A loss head maps the last stage's outputs of one micro-batch, and that
micro-batch's slice of a batch (labels, paddings), to metrics {name:
(value, weight)} with 'loss' (BaseTask.ComputeLoss's form). Right after
the last stage's forward of micro-batch m, one call on the last device
computes

  l_m   = value_m * weight_m / W         (W: the whole batch's weight of
                                          'loss', known before any forward;
                                          of every replica's slice with
                                          data parallelism)
  dy_m  = d l_m / d outputs              (B(S-1, m)'s output gradient)
  acc  += d l_m / d head_theta           (variables after the pipeline)

so the loss is sum_m l_m, the same weighted mean as the head's over the
whole batch, and every schedule optimises the same objective. Other
metrics are combined by weight afterwards, as replicas' are
(`replicas.CombineMetrics`); they have no gradient. The head
must read its variables through `head_theta` only: a variable it reads
directly would get no gradient (the pipeline's custom gradient says so).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import replicas
from lingvo_pipe.core import residuals
from lingvo_pipe.core.nested_map import NestedMap

Leaves = List[Optional[tf.Tensor]]
# (head_theta, last stage's outputs, batch) of one micro-batch -> metrics.
Head = Callable[[NestedMap, Any, Any], Mapping[str, Tuple[Any, Any]]]


class LossHead:
  """The loss of each micro-batch, and its gradients (module docstring).

  `wrap(fn)` makes the tf.function that runs on the last device (the
  pipeline's non-inlined functions); `batch` is given already split, one
  list of leaves per micro-batch, with its structure.
  """

  def __init__(self, where: str, head: Head, head_theta: Any,
               batch: Dict[int, Leaves], batch_structure: Any,
               total_weight: tf.Tensor, device: str,
               wrap: Callable[[Callable[..., Any]], Any],
               normaliser: Optional[tf.Tensor] = None):
    self._where = where
    self._head = head
    self._theta_structure = head_theta
    with tf.device(device):
      self.theta_leaves = [tf.convert_to_tensor(t)
                           for t in tf.nest.flatten(head_theta)]
      self._total_weight = tf.convert_to_tensor(total_weight)
      self._normaliser = tf.convert_to_tensor(
          total_weight if normaliser is None else normaliser)
    self._batch = batch
    self._batch_structure = batch_structure
    self._device = device
    self._fn = wrap(self._Body())
    self._out_structure: Any = None
    self._acc: Optional[Leaves] = None
    self._per_micro: Dict[int, Tuple[tf.Tensor, List[tf.Tensor]]] = {}
    self.metric_names: List[str] = []

  @property
  def grads(self) -> Leaves:
    """d loss / d head_theta leaves, summed over the micro-batches."""
    return list(self._acc or [None] * len(self.theta_leaves))

  def Call(self, m: int, y: Leaves, out_structure: Any,
           theta_leaves: Leaves) -> Tuple[Leaves, Leaves]:
    """(dy of micro-batch m, the tensors its device's next action waits
    for); `theta_leaves` are the head's theta as the caller holds them."""
    self._out_structure = out_structure
    if self._acc is None:
      with tf.name_scope('zeros'):
        self._acc = [tf.zeros_like(t) if residuals.IsFloat(t) else None
                     for t in theta_leaves]
    loss, metrics, dy, self._acc = self._fn(
        theta_leaves, y, self._batch[m], self._normaliser, self._acc)
    self._per_micro[m] = (loss, list(metrics))
    return list(dy), [loss] + [t for t in self._acc if t is not None]

  def _Body(self) -> Callable[..., Any]:
    def Loss(head_theta, y, batch, total_weight, acc):
      head_theta, y = list(head_theta), list(y)
      sources = y + head_theta
      floats = [t is not None and residuals.IsFloat(t) for t in sources]
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape:
        tape.watch([t for t, f in zip(sources, floats) if f])
        metrics = self._head(
            tf.nest.pack_sequence_as(self._theta_structure, head_theta),
            tf.nest.pack_sequence_as(self._out_structure, y),
            tf.nest.pack_sequence_as(self._batch_structure, list(batch)))
        value, weight = self._Checked(metrics)
        share = tf.stop_gradient(tf.cast(weight, value.dtype) /
                                 tf.cast(total_weight, value.dtype))
        loss = value * share
      grads = iter(tape.gradient(loss, [t for t, f in zip(sources, floats)
                                        if f]))
      full = [next(grads) if f else None for f in floats]
      dy, dhead = full[:len(y)], full[len(y):]
      flat = [tf.convert_to_tensor(v) for name in self.metric_names
              for v in metrics[name]]
      new_acc = [None if a is None else (a if g is None else a + g)
                 for a, g in zip(acc, dhead)]
      return loss, flat, dy, new_acc

    Loss.__name__ = 'loss_head'
    return Loss

  def _Checked(self, metrics: Any) -> Tuple[tf.Tensor, tf.Tensor]:
    if not isinstance(metrics, Mapping) or 'loss' not in metrics:
      raise ValueError(f"{self._where}: the loss head must return metrics "
                       f"with a 'loss' entry, got {metrics!r}.")
    for name, pair in metrics.items():
      if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f'{self._where}: loss head metric {name!r} must be '
                         f'a (value, weight) pair, got {pair!r}.')
    self.metric_names = sorted(metrics)
    value, weight = metrics['loss']
    return tf.convert_to_tensor(value), tf.convert_to_tensor(weight)

  def Combine(self, num_micro_batches: int
              ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """The loss (sum of the micro-batches' shares, m = 0, 1, ...) and every
    metric's (weighted mean, total weight), flat in `metric_names` order."""
    per = [self._per_micro[m] for m in range(num_micro_batches)]
    with tf.device(self._device), tf.name_scope('metrics'):
      loss = per[0][0]
      for share, _ in per[1:]:
        loss = loss + share
      combined = replicas.CombineMetrics([
          {name: (metrics[2 * i], metrics[2 * i + 1])
           for i, name in enumerate(self.metric_names)}
          for _, metrics in per])
      flat = [t for name in self.metric_names for t in combined[name]]
      total = combined['loss'][1]
      check = tf.debugging.assert_near(
          total, tf.cast(self._total_weight, total.dtype), rtol=1e-6,
          message=(f"{self._where}: the micro-batches' loss weights do not "
                   'add up to the loss weight given; give the sum of '
                   "ComputeLoss's 'loss' weights over the batch "
                   '(base_model.OnePass.loss_weight)'))
      with tf.control_dependencies([check]):
        loss = tf.identity(loss)
    return loss, flat

  def Metrics(self, loss: tf.Tensor, flat: List[tf.Tensor]) -> NestedMap:
    """{name: (value, weight)} from Combine's outputs; 'loss' is `loss`."""
    out = NestedMap()
    for i, name in enumerate(self.metric_names):
      out[name] = (flat[2 * i], flat[2 * i + 1])
    out.loss = (loss, out.loss[1])
    return out
