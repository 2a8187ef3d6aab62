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

The functions are `stage_function.OnDevice`s. The gradient is added to
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
from lingvo_pipe.core import backward_split
from lingvo_pipe.core import hand_offs
from lingvo_pipe.core import input_gradient
from lingvo_pipe.core import micro_batches
from lingvo_pipe.core import pipeline_engine
from lingvo_pipe.core import pipeline_loss
from lingvo_pipe.core import residuals
from lingvo_pipe.core import schedule
from lingvo_pipe.core import stage_function
from lingvo_pipe.core import stamps
from lingvo_pipe.core.nested_map import NestedMap

Leaves = List[Optional[tf.Tensor]]
Head = pipeline_loss.Head


def _FirstLine(err: Exception) -> str:
  text = str(err).strip().splitlines()
  return text[0] if text else type(err).__name__


def _Shapes(structure: Any) -> str:
  return str(tf.nest.map_structure(lambda t: t.shape.as_list(), structure))


def _Floats(leaves: Sequence[Optional[tf.Tensor]]) -> List[tf.Tensor]:
  return [t for t in leaves if t is not None and residuals.IsFloat(t)]


class PipelineRun:
  """The ops of one call of a PipeliningLayer (module docstring)."""

  def __init__(self, layer: Any, num_micro_batches: int, in_structure: Any,
               thetas: List[Any], devices: List[str],
               stage_devices: Sequence[int]):
    self._layer = layer
    self._cells = layer.cells
    self._axis = layer.params.batch_dim
    self._s = len(self._cells)
    self._m = num_micro_batches
    self._thetas = thetas
    self._stage_devices = list(stage_devices)
    self._devices = [devices[d] for d in self._stage_devices]  # per stage
    self._out_structure = None
    # Per (s, m): the stage's input leaves, and when it keeps its
    # activations, its outputs and residuals.
    self._x: Dict[Tuple[int, int], Leaves] = {}
    self._kept: Dict[Tuple[int, int], Tuple[Leaves, Leaves]] = {}
    # Stage s's input structure (s = 0: the pipeline's inputs).
    self._structures: Dict[int, Any] = {0: in_structure}
    self._theta_leaves = [tf.nest.flatten(t) for t in thetas]
    # Run's theta leaves, as the gradient sums start from them; and per
    # stage which leaves its functions read in the hand-off dtype.
    self._theta_args = self._theta_leaves
    self._cast_leaves = [[v.trainable and v.dtype.is_floating
                          for v in tf.nest.flatten(cell.vars)]
                         for cell in self._cells]
    self._acc: List[Optional[Leaves]] = [None] * self._s
    self._engine = pipeline_engine.Engine(
        self, devices, self._stage_devices, layer.path, self._CheckBatch)
    self._forward_fns = [stage_function.OnDevice(self._ForwardFn(s), d)
                         for s, d in enumerate(self._devices)]
    self._backward_fns = [stage_function.OnDevice(self._BackwardFn(s, d), d)
                          for s, d in enumerate(self._devices)]
    # Stage 0 without its input gradient, and that gradient alone
    # (input_gradient.py); made only when the rule says so.
    self._backward_0_no_dx: Optional[Callable[..., Any]] = None
    self._input_gradient_fn: Optional[Callable[..., Any]] = None
    self._split_cells = {
        s: residuals.SplitCell(f'cell_{s}', self._ForwardFn(s),
                               lambda fn, d=d: stage_function.OnDevice(fn, d))
        for s, d in enumerate(self._devices)
        if layer.KeepsActivations(s)}
    # Tables that split backwards (W actions): each stage's B and W, and
    # per (s, m) what B leaves for W (dy, carry).
    self._halves: Dict[int, backward_split.BackwardSplit] = {}
    self._waiting: Dict[Tuple[int, int], Tuple[Leaves, Leaves]] = {}
    # One-pass training (Train): the loss head, and its theta as Run got it.
    self._loss: Optional[pipeline_loss.LossHead] = None
    self._head_theta: Leaves = []
    # Replicas (all_reduce.py): per stage, the devices of its R copies;
    # which entry the all-reduces belong to ('fprop' or 'train').
    self._replicas, self._replica = layer.num_replicas, layer.replica
    self._exchanges: Dict[int, all_reduce.Exchange] = {}
    self._mirror_devices = [list(copies) for copies in zip(
        *[layer.StageDevices(r) for r in range(self._replicas)])]
    self._kind = ''

  def _SetTheta(self, theta: List[Leaves]) -> None:
    """Run's theta leaves per stage. With a hand-off dtype the stage
    functions read each trainable floating leaf cast to it once per call,
    on the stage's device: cast inside, every micro-batch would make its
    own copy of the weights, and a stage keeping its activations keep
    them all. The gradient sums stay in the variables' dtype."""
    self._theta_args = theta
    dtype = self._layer.hand_off_dtype
    if dtype is None:
      self._theta_leaves = theta
      return
    self._theta_leaves = []
    for s, (leaves, cast) in enumerate(zip(theta, self._cast_leaves)):
      with tf.device(self._devices[s]), tf.name_scope(f'cell_{s}/theta'):
        self._theta_leaves.append([tf.cast(t, dtype) if c else t
                                   for t, c in zip(leaves, cast)])

  # ---- the stage functions -----------------------------------------------

  def _ForwardFn(self, s: int) -> Callable[..., Any]:
    def Forward(theta_leaves, x):
      return self._Cell(s, list(theta_leaves), list(x))
    Forward.__name__ = f'cell_{s}_forward'
    return Forward

  def _BackwardFn(self, s: int, device: str,
                  input_gradient: bool = True) -> Callable[..., Any]:
    """B(s, m)'s call: (dx, acc + dtheta[, recomputed]); dx None if unwanted."""
    stamp = stamps.Current() is not None

    def Backward(theta_leaves, x, dy, acc, *clock):
      theta_leaves, x = list(theta_leaves), list(x)
      sources = x if input_gradient else []
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape, self._cells[s].NoStatUpdates():
        tape.watch(_Floats(sources + theta_leaves))
        y = self._Cell(s, theta_leaves, x)

      def Grads():
        dx, dtheta = residuals.Gradients(tape, y, list(dy), sources,
                                         theta_leaves)
        return ((dx if input_gradient else [None] * len(x)),
                residuals.AddGradients(list(acc), dtheta))

      if not stamp:
        return Grads()
      # Recording: the gradient ops start after the re-computation's stamp.
      recomputed = stamps.Stamp(device, clock[0], y)
      with tf.control_dependencies([recomputed]):
        dx, dtheta = Grads()
      return dx, dtheta, recomputed
    Backward.__name__ = (f'cell_{s}_backward' if input_gradient else
                         f'cell_{s}_backward_without_input_gradient')
    return Backward

  def _Cell(self, s: int, theta_leaves: List[tf.Tensor],
            x: List[tf.Tensor]) -> List[tf.Tensor]:
    """Stage s's cell on flat leaves; records its output structure."""
    inputs = tf.nest.pack_sequence_as(self._structures[s], x)
    try:
      out = self._cells[s].FProp(
          tf.nest.pack_sequence_as(self._thetas[s], theta_leaves), inputs)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
      source = ('the pipeline inputs' if s == 0 else
                f"the output of partition {s - 1} ('cell_{s - 1}')")
      raise ValueError(
          f"PipeliningLayer '{self._layer.path}': partition {s} "
          f"('cell_{s}') cannot take {source} of shapes {_Shapes(inputs)}: "
          f'{_FirstLine(err)}') from err
    self._structures[s + 1] = out
    return hand_offs.CastFloats(tf.nest.flatten(out),
                                self._layer.hand_off_dtype)

  def _CheckBatch(self, s: int, m: int, x: Leaves, y: Leaves) -> None:
    want = x[0].shape[self._axis]
    for t in y:
      if t.shape.rank is None or t.shape.rank <= self._axis or (
          t.shape[self._axis] != want):
        raise ValueError(
            f"PipeliningLayer '{self._layer.path}': partition {s} "
            f"('cell_{s}') returned shape {t.shape}; every output needs "
            f'the micro-batch ({want}) on axis {self._axis}.')

  def _PrepareInputGradient(self, leaves: Leaves) -> None:
    if input_gradient.Separate(0 in self._split_cells, leaves):
      device = self._devices[0]
      self._backward_0_no_dx = stage_function.OnDevice(
          self._BackwardFn(0, device, input_gradient=False), device)
      self._input_gradient_fn = stage_function.OnDevice(
          input_gradient.InputGradientBody(
              lambda t, x: self._Cell(0, t, x), self._cells[0].NoStatUpdates),
          device)

  # ---- StageOps: what each action computes --------------------------------

  def Forward(self, s: int, m: int, x: Leaves) -> Leaves:
    self._x[(s, m)] = x
    if s not in self._split_cells:
      return list(self._forward_fns[s](self._theta_leaves[s], x))
    y, kept = self._split_cells[s].Forward(self._theta_leaves[s], x)
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
    self._acc[s] = self._halves[s].Weight(self._theta_leaves[s], x, kept, dy,
                                          y, carry, self._Zeros(s))
    return list(self._acc[s])

  def Backward(self, s: int, m: int, dy: Leaves, clock: Optional[tf.Tensor]
               ) -> Tuple[Leaves, Leaves, Optional[tf.Tensor]]:
    """B(s, m) (pipeline_engine.StageOps)."""
    theta_leaves = self._theta_leaves[s]
    if s in self._halves:  # B makes dx; W(s, m) the rest, later
      y, kept = self._kept[(s, m)]
      dx, carry = self._halves[s].Input(theta_leaves, self._x[(s, m)], kept,
                                        dy, y)
      self._waiting[(s, m)] = (dy, carry)
      return list(dx), list(carry), None
    x = self._x.pop((s, m))
    acc = self._Zeros(s)
    if s in self._split_cells:
      y, kept = self._kept.pop((s, m))
      dx, sums = self._split_cells[s].Backward(theta_leaves, x, kept, dy, y,
                                               acc)
      self._acc[s] = list(sums)
      return list(dx), list(sums), None
    # Re-computation starts once this device's previous action is done AND
    # dy is here (a data input of the call): otherwise the executor may
    # re-compute while stage s+1 is still busy and hold the activations.
    clock_args = [clock] if clock is not None else []
    if s == 0 and self._input_gradient_fn is not None and (
        input_gradient.IsStateful(self._input_gradient_fn, theta_leaves, x,
                                  dy)):
      # A stateful call always runs: it would re-compute for nothing.
      self._backward_0_no_dx = self._input_gradient_fn = None
    if s == 0 and self._backward_0_no_dx is not None:
      out = self._backward_0_no_dx(theta_leaves, x, dy, acc, *clock_args)
      dx = self._input_gradient_fn(theta_leaves, x, dy)
    else:
      out = self._backward_fns[s](theta_leaves, x, dy, acc, *clock_args)
      dx = out[0]
    self._acc[s] = list(out[1])
    recomputed = out[2] if clock is not None else None
    return list(dx), list(out[1]), recomputed

  def AllReduce(self, s: int, done: Callable[[Leaves], None]) -> None:
    """A(s) (pipeline_engine.StageOps): stage s's sums over its copies.

    In one pass (Train) by placed ops (all_reduce.Exchange): the replicas'
    traces register their sums and the last builds everyone's, which
    Train's gradient reads once every replica has run. Through FProp each
    replica's backward runs inside its own gradient call, so its sums go
    by the collective (all_reduce.Sum), matched by keys.
    """
    sums = self._Zeros(s)
    key = (self._layer.path, self._kind, s)
    if not any(t is not None for t in sums):  # a stage with no weights
      done(list(sums))
      return
    if self._kind == 'train':
      graph = next(t for t in sums if t is not None).graph
      self._exchanges[s] = all_reduce.ExchangeOf(
          graph, key, self._replicas, self._mirror_devices[s])
      self._exchanges[s].Add(self._replica, sums, done)
      return
    self._acc[s] = all_reduce.Sum(sums, self._mirror_devices[s],
                                  self._devices[s], key)
    done(list(self._acc[s]))

  def _StageSums(self) -> List[Leaves]:
    """Every stage's sums; a replicated stage's from its exchange."""
    for s, exchange in self._exchanges.items():
      if self._replica not in exchange.results:
        raise RuntimeError(
            f"PipeliningLayer '{self._layer.path}': stage {s}'s all-reduce "
            'is read before every replica was traced; read the gradients '
            'after the last replica has run.')
      self._acc[s] = exchange.results[self._replica]
    return self._acc

  def _WithAllReduce(self, table: schedule.Schedule,
                     kind: str) -> schedule.Schedule:
    """`table`, with an A after each stage's last backward if replicated."""
    if self._replicas == 1:
      return table
    self._kind = kind
    return schedule.WithAllReduce(table)

  def Loss(self, m: int, y: Leaves) -> Tuple[Leaves, Leaves]:
    """Micro-batch m's loss and d y, on the last device (Train)."""
    return self._loss.Call(m, y, self._structures[self._s], self._head_theta)

  def _SplitBackwards(self) -> None:
    """B and W of every stage, for a table with W actions (zero bubble):
    every stage must keep its activations (backward_split.py)."""
    missing = [s for s in range(self._s) if s not in self._split_cells]
    if missing:
      raise ValueError(
          f"PipeliningLayer '{self._layer.path}': a table that splits its "
          f"backwards needs recompute='never' (stages {missing} re-compute); "
          'set p.recompute.')
    self._halves = {
        s: backward_split.BackwardSplit(
            cell, f'cell_{s}',
            lambda fn, d=self._devices[s]: stage_function.OnDevice(fn, d))
        for s, cell in self._split_cells.items()}

  def _ArgDevices(self, num_in: int, sizes: Sequence[int]) -> List[str]:
    """The device of each argument of Call's and Train's Run: `num_in`
    inputs on stage 0's, then each stage's `sizes[s]` theta leaves on its."""
    return [self._devices[0]] * num_in + [
        self._devices[s] for s, n in enumerate(sizes) for _ in range(n)]

  # ---- the differentiable FProp -------------------------------------------

  def Call(self, leaves: Leaves, table: schedule.Schedule) -> Any:
    """The pipeline's outputs for the whole batch; differentiable."""
    self._PrepareInputGradient(leaves)
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
      self._out_structure = self._structures[self._s]
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
        self._engine.Run(self._WithAllReduce(table.Only('B'), 'fprop'),
                         back)
        dxs = micro_batches.Concat(back.input_grads, self._axis,
                                   self._devices[0])
        return dxs + [g for part in self._acc for g in part]

      return outputs, Grad

    flat_out = Run(*leaves, *[x for t in self._theta_leaves for x in t])
    if not isinstance(flat_out, (list, tuple)):
      flat_out = [flat_out]
    return tf.nest.pack_sequence_as(self._out_structure, list(flat_out))

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
    self._PrepareInputGradient(leaves)
    if table.split_backward:
      self._SplitBackwards()
    last = self._devices[-1]
    side = [tf.convert_to_tensor(t) for t in tf.nest.flatten(batch)]
    self._loss = pipeline_loss.LossHead(
        f"PipeliningLayer '{self._layer.path}'", head, head_theta,
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
      self._engine.Run(self._WithAllReduce(table, 'train'), flow,
                       with_loss=True)
      loss, metrics = self._loss.Combine(self._m)
      dxs = micro_batches.Concat(flow.input_grads, self._axis, self._devices[0])

      def Grad(dloss, *unused_metric_grads, variables=None):
        if variables:
          raise ValueError(
              f"PipeliningLayer '{self._layer.path}': the loss head reads "
              f'variables {[v.name for v in variables]} directly; pass '
              'them in its head_theta.')
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
