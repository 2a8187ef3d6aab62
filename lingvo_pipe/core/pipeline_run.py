"""One call of a PipeliningLayer: its stage functions and its two entries.

Each stage's work is traced once per call, as `tf.function`s that the
engine (pipeline_engine.py) calls once per action, so the graph has
S x M call ops instead of S x M copies of the layers (docs/DESIGN.md
section 2):

  Forward_s(theta_s, x) -> y                 stage s's cell
  Backward_s(theta_s, x, dy, acc) -> dx, acc + dtheta
                                             re-computes the cell under a
                                             tape, then its gradient, and
                                             adds it to the running sum
  Loss(head_theta, y, batch_m, W, acc)       one-pass training only: the
    -> l_m, metrics_m, dy, acc + dhead       loss of micro-batch m and its
                                             gradient, on the last device
                                             (pipeline_loss.py)

A stage that keeps its activations (recompute 'never', the last one with
'except_last') uses `residuals.SplitCell` instead: a forward that also
returns the tensors its gradient reads, and a backward that reads them.

Two entries, both `tf.custom_gradient` functions of the inputs and every
stage's theta:

  Call(inputs) -> outputs     the differentiable FProp: every forward of
                              the table, then (in the gradient) every
                              backward; with GPipe's table, whatever the
                              layer's schedule, since all forwards come
                              before the caller's loss
  Train(inputs, ...) -> loss  one pass: the whole table, each micro-batch's
                              loss computed as soon as the last stage's
                              forward ends; returns the loss and metrics,
                              and the gradient (computed in the pass) times
                              d loss

The functions are `stage_function.OnDevice`s, made per stage by
`stage_calls.StageCalls` from what the layer hands the call
(`stage_calls.Stages`: cells, devices, placement, recompute, replicas).
The gradient is added to
the running sum inside the backward call, where the sum takes the fresh
gradient's buffer: a separate addition would hold a third copy of the
stage's parameters (docs/DESIGN.md section 26). The first sum starts
from zeros, so every backward call is the same function, and 0 + g is g.
Backward_s traces the cell under `NoStatUpdates`, so statistics
(BatchNorm) are accumulated once per micro-batch.

With a hand-off dtype (the layer's fprop_dtype, e.g. bfloat16), every
floating tensor a stage returns is cast to it inside the stage's
functions, so what devices send each other is in it both ways, and the
stages read their trainable weights cast to it once per call; the
gradient sums stay in the variables' dtype (docs/DESIGN.md section 32).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import all_reduce
from lingvo_pipe.core import micro_batches
from lingvo_pipe.core import pipeline_engine
from lingvo_pipe.core import pipeline_loss
from lingvo_pipe.core import residuals
from lingvo_pipe.core import schedule
from lingvo_pipe.core import stage_calls
from lingvo_pipe.core import stage_function
from lingvo_pipe.core.nested_map import NestedMap

Leaves = List[Optional[tf.Tensor]]
Head = pipeline_loss.Head


class PipelineRun:
  """The ops of one call of a PipeliningLayer (module docstring).

  Per action (pipeline_engine.StageOps): Forward, Backward, Weight, Loss,
  and the all-reduce of replicas, by placed ops in one pass
  (_SumByExchange) or by the collective in FProp's gradient
  (_SumByCollective); what each stage runs is `stage_calls.StageCalls`'.
  """

  def __init__(self, stages: stage_calls.Stages, num_micro_batches: int,
               in_structure: Any, thetas: List[Any]):
    self._calls = stage_calls.StageCalls(stages, in_structure, thetas)
    self._where = self._calls.where
    self._path = stages.path
    self._axis = stages.batch_dim
    self._s = len(stages.cells)
    self._m = num_micro_batches
    self._devices = stages.devices  # per stage
    self._inputs: Leaves = []  # the pipeline's, as Call or Train got them
    # Run's theta leaves per stage, as the gradient sums start from them,
    # and as the stage functions read them (StageCalls.CastTheta).
    self._theta_args = [tf.nest.flatten(t) for t in thetas]
    self._theta_leaves = self._theta_args
    # Per (s, m): the stage's input leaves; its outputs and residuals when
    # it keeps its activations; what B(s, m) leaves W(s, m) (dy, carry).
    self._x: Dict[Tuple[int, int], Leaves] = {}
    self._kept: Dict[Tuple[int, int], Tuple[Leaves, Leaves]] = {}
    self._waiting: Dict[Tuple[int, int], Tuple[Leaves, Leaves]] = {}
    self._acc: List[Optional[Leaves]] = [None] * self._s
    self._engine = pipeline_engine.Engine(
        self, stages.device_names, stages.placement, stages.path,
        self._calls.CheckBatch)
    # One-pass training (Train): the loss head, and its theta as Run got it.
    self._loss: Optional[pipeline_loss.LossHead] = None
    self._head_theta: Leaves = []
    # Replicas (all_reduce.py): per stage, the devices of its R copies.
    self._replicas, self._replica = stages.num_replicas, stages.replica
    self._exchanges: Dict[int, all_reduce.Exchange] = {}
    self._mirror_devices = [list(copies) for copies in stages.mirrors]

  def _SetTheta(self, theta: List[Leaves]) -> None:
    """Run's theta leaves per stage (StageCalls.CastTheta)."""
    self._theta_args = theta
    self._theta_leaves = self._calls.CastTheta(theta)

  # ---- StageOps: what each action computes --------------------------------

  def Forward(self, s: int, m: int, x: Leaves) -> Leaves:
    self._x[(s, m)] = x
    if s not in self._calls.kept:
      return list(self._calls.forward[s](self._theta_leaves[s], x))
    y, kept = self._calls.kept[s].Forward(self._theta_leaves[s], x)
    self._kept[(s, m)] = (list(y), list(kept))
    return list(y)

  def _Zeros(self, s: int) -> Leaves:
    """Stage s's running gradient sums, from zeros at its first use."""
    if self._acc[s] is None:
      with tf.name_scope('zeros'):
        self._acc[s] = [tf.zeros_like(t) if residuals.IsFloat(t) else None
                        for t in self._theta_args[s]]
    return self._acc[s]

  def Weight(self, s: int, m: int) -> Leaves:
    """W(s, m) (pipeline_engine.StageOps): d theta from what B(s, m) left."""
    x = self._x.pop((s, m))
    y, kept = self._kept.pop((s, m))
    dy, carry = self._waiting.pop((s, m))
    self._acc[s] = self._calls.halves[s].Weight(
        self._theta_leaves[s], x, kept, dy, y, carry, self._Zeros(s))
    return list(self._acc[s])

  def Backward(self, s: int, m: int, dy: Leaves, clock: Optional[tf.Tensor]
               ) -> Tuple[Leaves, Leaves, Optional[tf.Tensor]]:
    """B(s, m) (pipeline_engine.StageOps)."""
    theta_leaves = self._theta_leaves[s]
    if s in self._calls.halves:  # B makes dx; W(s, m) the rest, later
      y, kept = self._kept[(s, m)]
      dx, carry = self._calls.halves[s].Input(theta_leaves, self._x[(s, m)],
                                              kept, dy, y)
      self._waiting[(s, m)] = (dy, carry)
      return list(dx), list(carry), None
    x = self._x.pop((s, m))
    acc = self._Zeros(s)
    if s in self._calls.kept:
      y, kept = self._kept.pop((s, m))
      dx, sums = self._calls.kept[s].Backward(theta_leaves, x, kept, dy, y,
                                              acc)
      self._acc[s] = list(sums)
      return list(dx), list(sums), None
    # Re-computation starts once this device's previous action is done AND
    # dy is here (a data input of the call): otherwise the executor may
    # re-compute while stage s+1 is still busy and hold the activations.
    clock_args = [clock] if clock is not None else []
    backward, dx_fn = (self._calls.Stage0(self._inputs, theta_leaves, x, dy)
                       if s == 0 else (self._calls.backward[s], None))
    out = backward(theta_leaves, x, dy, acc, *clock_args)
    dx = out[0] if dx_fn is None else dx_fn(theta_leaves, x, dy)
    self._acc[s] = list(out[1])
    recomputed = out[2] if clock is not None else None
    return list(dx), list(out[1]), recomputed

  def _SumByExchange(self, s: int, done: Callable[[Leaves], None]) -> None:
    """A(s) in one pass (Train): stage s's sums over its copies by placed
    ops (all_reduce.Exchange): the replicas' traces register their sums
    and the last builds everyone's, which Train's gradient reads once
    every replica has run."""
    sums = self._Zeros(s)
    if not any(t is not None for t in sums):  # a stage with no weights
      done(list(sums))
      return
    graph = next(t for t in sums if t is not None).graph
    self._exchanges[s] = all_reduce.ExchangeOf(
        graph, (self._path, 'train', s), self._replicas,
        self._mirror_devices[s])
    self._exchanges[s].Add(self._replica, sums, done)

  def _SumByCollective(self, s: int, done: Callable[[Leaves], None]) -> None:
    """A(s) in FProp's gradient: each replica's backward runs inside its
    own gradient call, so its sums go by the collective (all_reduce.Sum),
    matched by keys."""
    sums = self._Zeros(s)
    if any(t is not None for t in sums):  # else a stage with no weights
      self._acc[s] = sums = all_reduce.Sum(
          sums, self._mirror_devices[s], self._devices[s],
          (self._path, 'fprop', s))
    done(list(sums))

  def _StageSums(self) -> List[Leaves]:
    """Every stage's sums; a replicated stage's from its exchange."""
    for s, exchange in self._exchanges.items():
      if self._replica not in exchange.results:
        raise RuntimeError(
            f"{self._where}: stage {s}'s all-reduce is read before every "
            'replica was traced; read the gradients after the last replica '
            'has run.')
      self._acc[s] = exchange.results[self._replica]
    return self._acc

  def _WithAllReduce(self, table: schedule.Schedule) -> schedule.Schedule:
    """`table`, with an A after each stage's last backward if replicated."""
    if self._replicas == 1:
      return table
    return schedule.WithAllReduce(table)

  def Loss(self, m: int, y: Leaves) -> Tuple[Leaves, Leaves]:
    """Micro-batch m's loss and d y, on the last device (Train)."""
    return self._loss.Call(m, y, self._calls.structures[self._s],
                           self._head_theta)

  def _ArgDevices(self, num_in: int, sizes: Sequence[int]) -> List[str]:
    """The device of each argument of Call's and Train's Run: `num_in`
    inputs on stage 0's, then each stage's `sizes[s]` theta leaves on its."""
    return [self._devices[0]] * num_in + [
        self._devices[s] for s, n in enumerate(sizes) for _ in range(n)]

  # ---- the differentiable FProp -------------------------------------------

  def Call(self, leaves: Leaves, table: schedule.Schedule) -> Any:
    """The pipeline's outputs for the whole batch; differentiable."""
    self._inputs = leaves
    num_in = len(leaves)
    sizes = [len(t) for t in self._theta_leaves]

    devices = self._ArgDevices(num_in, sizes)

    @tf.custom_gradient
    def Run(*args):
      args = _Cut(args, devices)
      self._SetTheta(_Unflatten(list(args[num_in:]), sizes))
      flow = pipeline_engine.Flow(inputs=micro_batches.Split(
          list(args[:num_in]), self._m, self._axis, self._devices[0]))
      self._engine.Run(table.Only('F'), flow)
      outputs = micro_batches.Concat(flow.outputs, self._axis,
                                     self._devices[-1])

      def Grad(*dys):
        # An output without a gradient (None) stays None: it contributes
        # nothing, and a zero tensor here would be a constant that Grappler
        # specialises every call of the last stage's backward for.
        dys = [dy if residuals.IsFloat(y) else None
               for dy, y in zip(dys, outputs)]
        back = pipeline_engine.Flow(output_grads=micro_batches.Split(
            dys, self._m, self._axis, self._devices[-1]))
        self._engine.Run(self._WithAllReduce(table.Only('B')), back,
                         all_reduce=self._SumByCollective)
        dxs = micro_batches.Concat(back.input_grads, self._axis,
                                   self._devices[0])
        return dxs + [g for part in self._acc for g in part]

      return outputs, Grad

    flat_out = Run(*leaves, *[x for t in self._theta_leaves for x in t])
    if not isinstance(flat_out, (list, tuple)):
      flat_out = [flat_out]
    return tf.nest.pack_sequence_as(self._calls.structures[self._s],
                                    list(flat_out))

  # ---- one-pass training --------------------------------------------------

  def Train(self, leaves: Leaves, table: schedule.Schedule,
            head: pipeline_loss.Head, head_theta: Any, batch: Any,
            total_weight: tf.Tensor,
            normaliser: Optional[tf.Tensor] = None) -> NestedMap:
    """Runs the whole table once; metrics {name: (value, weight)}.

    `batch` (any nest, batch on the pipeline's batch axis; scalars go to
    every micro-batch) is split like the inputs and given to `head` with
    the last stage's outputs of the same micro-batch (pipeline_loss.py).
    Only the loss is differentiable; its gradient reaches the inputs,
    every stage's theta and `head_theta`.
    """
    self._inputs = leaves
    if table.split_backward:
      self._calls.SplitBackwards()
    last = self._devices[-1]
    side = [tf.convert_to_tensor(t) for t in tf.nest.flatten(batch)]
    self._loss = pipeline_loss.LossHead(
        self._where, head, head_theta,
        micro_batches.Split(side, self._m, self._axis, last), batch,
        total_weight, last,
        lambda fn: stage_function.OnDevice(fn, last),
        total_weight if normaliser is None else normaliser)
    num_in, num_head = len(leaves), len(self._loss.theta_leaves)
    sizes = [len(t) for t in self._theta_leaves]
    devices = self._ArgDevices(num_in, sizes) + [last] * num_head

    @tf.custom_gradient
    def Run(*args):
      args = _Cut(args, devices)
      self._SetTheta(_Unflatten(list(args[num_in:len(args) - num_head]),
                                sizes))
      self._head_theta = list(args[len(args) - num_head:])
      flow = pipeline_engine.Flow(inputs=micro_batches.Split(
          list(args[:num_in]), self._m, self._axis, self._devices[0]))
      self._engine.Run(self._WithAllReduce(table), flow, with_loss=True,
                       all_reduce=self._SumByExchange)
      loss, metrics = self._loss.Combine(self._m)
      dxs = micro_batches.Concat(flow.input_grads, self._axis, self._devices[0])

      def Grad(dloss, *unused_metric_grads, variables=None):
        if variables:
          raise ValueError(
              f'{self._where}: the loss head reads variables '
              f'{[v.name for v in variables]} directly; pass them in its '
              'head_theta.')
        # Read here, not above: the replicas' all-reduces are built when
        # the last replica is traced (AllReduce).
        grads = (dxs + [g for part in self._StageSums() for g in part] +
                 self._loss.grads)
        return [_Scaled(g, dloss, device) for g, device in zip(grads,
                                                               devices)]

      return [loss] + metrics, Grad

    flat = Run(*leaves, *[x for t in self._theta_leaves for x in t],
               *self._loss.theta_leaves)
    return self._loss.Metrics(flat[0], list(flat[1:]))


def _Cut(args: Sequence[Any], devices: Sequence[str]) -> List[Any]:
  """Eagerly, each argument of a pipeline's custom gradient cut from the
  caller's tapes (tf.stop_gradient, on the device that reads it):
  `tf.custom_gradient` lets the tapes record its function's ops, and a
  tape that sees a stage function called on a tensor it watches builds
  that function's forward and backward functions at once, which Run's
  own Grad never uses. Traced, TensorFlow defers that work: no ops added.
  """
  if not tf.executing_eagerly():
    return list(args)
  out = []
  for x, device in zip(args, devices, strict=True):
    if x is None or x.dtype in (tf.resource, tf.variant):
      out.append(x)
      continue
    with tf.device(device):
      out.append(tf.stop_gradient(x))
  return out


def _Scaled(grad: Optional[tf.Tensor], dloss: tf.Tensor,
            device: str) -> Optional[tf.Tensor]:
  """grad * d(caller's loss)/d(our loss), on the gradient's device."""
  if grad is None:
    return None
  with tf.device(device):
    return grad * tf.cast(dloss, grad.dtype)


def _Unflatten(flat: List[tf.Tensor], sizes: Sequence[int]
               ) -> List[List[tf.Tensor]]:
  out, start = [], 0
  for size in sizes:
    out.append(list(flat[start:start + size]))
    start += size
  return out
