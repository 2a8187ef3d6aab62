"""Data parallelism: R replicas of a (pipelined) model, one set of variables.

GPipe scales by pipelining inside a replica and by data parallelism across
replicas. Here replica r runs every PipeliningLayer on its own devices
(partition k on device r * K + k of the layer's `devices`), on slice r of
the batch; the variables exist once, on replica 0's devices, so a
checkpoint holds one copy and a run can resume with another R:

  batch [B] --split--> slice 0 [B/R] .. slice R-1 [B/R]   (example keys of
                                                           the whole batch)
  for r in 0 .. R-1:                       (the runtime runs them at once)
    theta_r = read every variable           (on its device; TF sends the
                                             values to replica r's devices)
    metrics_r = task.FProp(theta_r, slice r)   pipelines on replica r
  metrics = sum_r value_r * weight_r / sum_r weight_r,  weight sum_r weight_r
  grad(var) = add_n(d loss / d theta_r[var] for r = 0 .. R-1)
              on var's device: TensorFlow moves replica r's gradient there

The gradient is that of the whole batch's loss (a sum over examples is a
sum over slices), so R replicas of M micro-batches train as one replica
with the whole batch and R x M micro-batches (the same micro-batch size;
BatchNorm normalises per micro-batch). BatchNorm's accumulators are
single variables too, so every replica's micro-batches add to them and
the moving averages see the whole batch.

Why one copy and a sum on the variable's device rather than mirrored
copies and an all-reduce: docs/DESIGN.md section 14 (measured).
Layers outside pipelines run where the train step runs (the trainer's
process), for every replica.
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap


def SplitBatch(batch: NestedMap, num_replicas: int,
               where: str) -> List[NestedMap]:
  """[slice r of every batched leaf (axis 0)] for r < num_replicas.

  Scalars go to every replica whole. A batch size that is not a multiple of
  `num_replicas` is an error naming both numbers.
  """
  leaves = tf.nest.flatten(batch)
  sizes = {int(x.shape[0]) for x in leaves
           if x.shape.rank and x.shape[0] is not None}
  for size in sizes:
    if size % num_replicas:
      raise ValueError(
          f'{where}: batch size {size} does not split into num_replicas='
          f'{num_replicas} equal slices; use a batch size that is a '
          f'multiple of {num_replicas}.')
  parts = []
  for x in leaves:
    if x.shape.rank:
      parts.append(tf.split(x, num_replicas, axis=0))
    else:
      parts.append([x] * num_replicas)
  return [tf.nest.pack_sequence_as(batch, [p[r] for p in parts])
          for r in range(num_replicas)]


def CombineMetrics(per_replica: Sequence[Mapping[str, Tuple[Any, Any]]]
                   ) -> NestedMap:
  """{name: (weighted mean of the values, sum of the weights)}."""
  out = NestedMap()
  for name in per_replica[0]:
    values = [m[name][0] for m in per_replica]
    weights = [tf.cast(m[name][1], values[0].dtype) for m in per_replica]
    total = tf.add_n(weights)
    mean = tf.math.divide_no_nan(
        tf.add_n([v * w for v, w in zip(values, weights)]), total)
    out[name] = (mean, total)
  return out


def SumGradients(per_replica: Sequence[Sequence[Optional[Any]]],
                 variables: Sequence[tf.Variable]) -> List[Optional[Any]]:
  """Each variable's gradient summed over replicas, on its own device.

  The sum runs in replica order; a replica without a gradient (None)
  adds nothing, and a variable without any stays None.
  """
  out = []
  for i, var in enumerate(variables):
    grads = [g[i] for g in per_replica if g[i] is not None]
    if not grads:
      out.append(None)
      continue
    with tf.device(var.device), tf.name_scope('sum_over_replicas'):
      out.append(tf.add_n([tf.convert_to_tensor(g) for g in grads]))
  return out


def _ReadAll(theta: NestedMap) -> Tuple[NestedMap, dict]:
  """theta with every variable read on its device; {id(var): read}."""
  reads = {}

  def Read(v: Any) -> Any:
    if not isinstance(v, tf.Variable):
      return v
    with tf.device(v.device):
      reads[id(v)] = tf.convert_to_tensor(v)
    return reads[id(v)]

  return theta.Transform(Read), reads


def LossAndGradients(
    fprop: Callable[[NestedMap, NestedMap, int], Mapping[str, Any]],
    theta: NestedMap, batch: NestedMap, variables: Sequence[tf.Variable],
    num_replicas: int, where: str) -> Tuple[NestedMap, List[Optional[Any]]]:
  """(combined metrics, summed gradient of each of `variables`).

  fprop(theta_r, slice_r, r) runs replica r's forward and returns its
  metrics {name: (value, weight)} with 'loss'.
  """
  slices = SplitBatch(batch, num_replicas, where)
  per_replica, watched = [], []
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    for r, piece in enumerate(slices):
      theta_r, reads = _ReadAll(theta)
      mine = [reads.get(id(v)) for v in variables]
      tape.watch([t for t in mine if t is not None])
      watched.append(mine)
      with tf.name_scope(f'replica_{r}'):
        per_replica.append(fprop(theta_r, piece, r))
    metrics = CombineMetrics(per_replica)
  flat = [t for mine in watched for t in mine if t is not None]
  grads = iter(tape.gradient(metrics.loss[0], flat))
  per_replica_grads = [[None if t is None else next(grads) for t in mine]
                       for mine in watched]
  return metrics, SumGradients(per_replica_grads, variables)
