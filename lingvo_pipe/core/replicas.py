"""Data parallelism: R replicas, each pipeline partition mirrored on each.

GPipe scales by pipelining inside a replica and by data parallelism across
replicas. Replica r runs every PipeliningLayer on its own devices
(partition k on device r * K + k of the layer's `devices`), on slice r of
the batch, with M / R of the pipeline's micro-batches (of the size one
replica would run). Each partition's trainable variables have a copy on
every replica's device (`Mirrors`): replica 0's are the layer's own
variables, the ones checkpoints hold; replicas 1 .. R-1 have copies that
start equal to them and stay equal:

  batch [B] --split--> slice 0 [B/R] .. slice R-1 [B/R]   (example keys of
                                                           the whole batch)
  for r in 0 .. R-1:                       (the runtime runs them at once)
    metrics_r = the task's training pass on slice r, replica r's copies
      ... B(s, last) on device r*K + k ... A(s): the stage's gradient sums
      all-reduced over its R copies (all_reduce.py), every copy gets the
      whole batch's gradient
  each copy is updated by its own optimizer slots, with the same gradient:
  the copies stay bitwise equal

Variables outside the pipelines (embeddings before one, a loss head
after) have one copy where the step runs: each replica's gradient of
them is summed there (`SumGradients`). BatchNorm's accumulators stay
single variables, so the moving averages see the whole batch.

The gradient is that of the whole batch's loss (a sum over examples is a
sum over slices), so R replicas of M / R micro-batches train as one
replica with the whole batch and M micro-batches. In a one-pass training
step each replica's micro-batch losses are divided by the whole batch's
loss weight, so the replicas' losses add up to the batch's
(`CombineMetrics(..., summed=('loss',))`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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


def CombineMetrics(per_replica: Sequence[Mapping[str, Tuple[Any, Any]]],
                   summed: Sequence[str] = ()) -> NestedMap:
  """{name: (weighted mean of the values, sum of the weights)}; the metrics
  in `summed` are plain sums of the values (already divided by the whole
  batch's weight)."""
  out = NestedMap()
  for name in per_replica[0]:
    values = [m[name][0] for m in per_replica]
    weights = [tf.cast(m[name][1], values[0].dtype) for m in per_replica]
    total = tf.add_n(weights)
    if name in summed:
      out[name] = (tf.add_n(values), total)
      continue
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


def ReadAll(theta: NestedMap) -> Tuple[NestedMap, Dict[int, tf.Tensor]]:
  """theta with every variable read on its device; {id(var): read}."""
  reads = {}

  def Read(v: Any) -> Any:
    if not isinstance(v, tf.Variable):
      return v
    with tf.device(v.device):
      reads[id(v)] = tf.convert_to_tensor(v)
    return reads[id(v)]

  return theta.Transform(Read), reads


def _Pipelines(task: Any) -> List[Any]:
  return [layer for layer in task.Layers()
          if hasattr(layer, 'StageDevices') and hasattr(layer, 'cells')]


class Mirrors:
  """Replicas 1 .. R-1's copies of every pipeline's trainable variables.

  Made eagerly (BaseTask.CreateTrainState), each copy on its replica's
  device of the partition, with the value its variable has then. The
  copies are not checkpointed: after a restore `Sync` sets them from
  replica 0's (BaseTask.SyncMirrors also sets their optimizer slots).
  """

  def __init__(self, task: Any, num_replicas: int):
    if not tf.executing_eagerly():
      raise RuntimeError('Mirrors must be made eagerly, before tracing the '
                         'train step.')
    self.num_replicas = num_replicas
    # id(variable) -> [its copy in replica 1, ..., R-1]
    self._copies: Dict[int, List[tf.Variable]] = {}
    self._primaries: List[tf.Variable] = []
    self._paths: Dict[int, str] = {}
    for layer in _Pipelines(task):
      where = [layer.StageDevices(r) for r in range(num_replicas)]
      for s, cell in enumerate(layer.cells):
        for path, var in cell.VariablesByPath().items():
          if not var.trainable:
            continue
          copies = []
          for r in range(1, num_replicas):
            with tf.device(where[r][s]):
              copies.append(tf.Variable(
                  var.read_value(), trainable=False, dtype=var.dtype,
                  name=f'{path}/replica_{r}'))
          self._copies[id(var)] = copies
          self._primaries.append(var)
          self._paths[id(var)] = path

  def __contains__(self, var: tf.Variable) -> bool:
    return id(var) in self._copies

  def Copy(self, var: tf.Variable, replica: int) -> tf.Variable:
    """`var`'s copy in `replica` (`var` itself for replica 0 or a variable
    that is not mirrored)."""
    if replica == 0 or id(var) not in self._copies:
      return var
    return self._copies[id(var)][replica - 1]

  def Substitute(self, theta: NestedMap, replica: int) -> NestedMap:
    """theta with each mirrored variable replaced by replica's copy."""
    return theta.Transform(
        lambda v: self.Copy(v, replica) if isinstance(v, tf.Variable) else v)

  def CopiesByPath(self, replica: int) -> Dict[str, tf.Variable]:
    """{variable path: its copy in `replica` >= 1}."""
    return {self._paths[id(v)]: self._copies[id(v)][replica - 1]
            for v in self._primaries}

  def Sync(self) -> None:
    """Sets every copy to its variable's value (eagerly)."""
    for var in self._primaries:
      for copy in self._copies[id(var)]:
        copy.assign(var.read_value())

  def Unequal(self) -> List[str]:
    """Paths of variables some copy of which differs in any bit."""
    bad = []
    for var in self._primaries:
      want = var.numpy().tobytes()
      if any(c.numpy().tobytes() != want for c in self._copies[id(var)]):
        bad.append(self._paths[id(var)])
    return bad
