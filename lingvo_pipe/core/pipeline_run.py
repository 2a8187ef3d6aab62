"""One pipelined FProp and its gradient: the tasks of `schedule.py` as ops.

Each partition's work is traced once per FProp, as `tf.function`s that
the schedule then calls once per micro-batch, so the graph has K x M call
ops instead of K x M copies of the layers (docs/DESIGN.md section 2):

  Forward_k(theta_k, x) -> y                 partition k's cell
  Backward_k(theta_k, x, dy, acc) -> dx, acc + dtheta
                                             re-computes the cell under a
                                             tape, then its gradient, and
                                             adds it to the running sum

A partition that keeps its activations (recompute 'never', the last one
with 'except_last') uses `residuals.SplitCell` instead: a forward that also
returns the tensors its gradient reads, and a backward that reads them.

`PipelineRun.Call(leaves)` is a `tf.custom_gradient` function of the input
tensors and every partition's theta tensors:

  forward:   split inputs into M micro-batches (device 0)
             for each F(k, m) in schedule order:
               on device k, after F(k, m-1):  y[k][m] = Forward_k(x[k][m])
               (keeping: y[k][m], r[k][m] = forward(x[k][m]), r kept
               until B(k, m))
             concat y[K-1][*] (device K-1)
  backward:  split dy into M (device K-1)
             for each B(k, m) in schedule order:
               on device k, after B(k, m+1):
                 acc_k = zeros (m = M-1)
                 keeping: dx, acc_k = backward(r[k][m], dy[k][m], acc_k)
                 else, once dy[k][m] is also here:
                   dx, acc_k = Backward_k(theta_k, x[k][m], dy[k][m], acc_k)
             concat dx[0][*] (device 0)

"after" is a control dependency on the previous task of the same device,
so each device runs its tasks in schedule order whatever the executor
would prefer. Backward_k traces the cell under `NoStatUpdates`, so
statistics (BatchNorm) are accumulated once per micro-batch. The
functions are marked `_noinline`: the runtime runs each call as one
function instead of pasting K x M copies of the layers back into the
graph, so start-up does not grow with M either. The gradient is added to
the running sum inside the backward call, where the sum takes the fresh
gradient's buffer: a separate addition would hold a third copy of the
partition's parameters (docs/DESIGN.md section 28). The first sum starts
from zeros, so every backward call is the same function, and 0 + g is g.

Within `RecordTasks()` each task also gets runtime timestamps (start, end,
and a backward's end of re-computation) for `step_trace`, the measured
timeline; without it the graph has none.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence
from typing import Tuple

import tensorflow as tf

from lingvo_pipe.core import residuals
from lingvo_pipe.core import schedule

# Function attributes of every partition function (see module docstring).
_FUNCTION_ATTRIBUTES = {'_noinline': True}


def ShareCallBodies() -> None:
  """Stops Grappler from copying a partition function for each call.

  Grappler's function optimizer specialises a non-inlined call to its call
  site (when an input is a constant or an output goes unused), and calls
  that differ get their own copy of the body, each instantiated and
  optimised on the first step: start-up then grows with M again
  (docs/DESIGN.md section 2). This turns that optimizer off for the
  process; the runtime still inlines every ordinary (not `_noinline`)
  function call. `devices.SplitCpu`, `cluster.Connect` and the trainer
  call it; call it yourself before the first step of your own loop.
  """
  tf.config.optimizer.set_experimental_options(
      {'function_optimization': False})


def CallBodiesShared() -> bool:
  """Whether `ShareCallBodies` is in force."""
  return tf.config.optimizer.get_experimental_options().get(
      'function_optimization') is False


@dataclasses.dataclass
class RecordedTask:
  """One task's timestamp tensors (seconds since the epoch, float64).

  `start`: its inputs and its device's previous task are done (the task
  waits for this stamp); `end`: its outputs are ready (for a backward
  task d inputs and the partition's running sum of gradients, to which
  the call adds d theta); `recomputed`: a re-computing backward task's
  re-computation is done, else None.
  """
  layer: str
  device: str
  phase: str  # 'F' or 'B'
  partition: int
  micro_batch: int
  start: tf.Tensor
  end: tf.Tensor
  recomputed: Optional[tf.Tensor] = None


class TaskRecorder:
  """The tasks of every PipelineRun built while it records (RecordTasks)."""

  def __init__(self):
    self.tasks: List[RecordedTask] = []

  def Tensors(self) -> List[tf.Tensor]:
    """Every stamp, flat: return them from the function being traced."""
    return [t for task in self.tasks for t in (
        task.start, task.end,
        task.start if task.recomputed is None else task.recomputed)]


_recorder: Optional[TaskRecorder] = None


@contextlib.contextmanager
def RecordTasks() -> Iterator[TaskRecorder]:
  """Within: each PipelineRun built adds timestamps to its tasks.

  Trace the function (its first call) inside; the stamps are tensors of
  the traced graph, in `recorder.tasks`. They add a control dependency in
  front of each task and a timestamp op after it; nothing else changes.
  """
  global _recorder
  outer, _recorder = _recorder, TaskRecorder()
  try:
    yield _recorder
  finally:
    _recorder = outer


def _StampHost(device: str) -> str:
  """The device a stamp of `device` runs on: itself, or its task's CPU."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.device_type in (None, 'CPU'):
    return device
  return spec.replace(device_type='CPU', device_index=0).to_string()


def _NewClock(device: str) -> tf.Tensor:
  """A resource handle for the stamps of `device` (see _Timestamp)."""
  global _clock_count
  _clock_count += 1
  with tf.device(_StampHost(device)):
    return tf.raw_ops.VarHandleOp(
        dtype=tf.float32, shape=[],
        shared_name=f'lingvo_pipe_clock_{_clock_count}')


_clock_count = 0


def _TimestampBody(clock: tf.Tensor) -> tf.Tensor:
  del clock  # Only there to be a resource input of the call (below).
  return tf.timestamp()


# tf.function puts every stateful op without a resource input on one chain
# in program order (automatic control dependencies): bare tf.timestamp()
# stamps would make partition 1's first forward wait for partition 0's
# second. A call with a resource input it only reads is not on that chain.
_Timestamp = tf.function(_TimestampBody, autograph=False)


def _Stamp(device: str, clock: tf.Tensor,
           deps: Sequence[Optional[tf.Tensor]]) -> tf.Tensor:
  """A timestamp on `device`'s host once `deps` exist.

  On an accelerator the stamp runs on the CPU of the same task, after a
  one-element copy of each dep to it: an accelerator op counts as done
  when it is queued, its value exists only once the copy can run.
  """
  deps = [d for d in deps if d is not None]
  host = _StampHost(device)
  if host != device:
    synced = []
    for d in deps:
      with tf.device(device):
        one = tf.reshape(d, [-1])[:1]
      with tf.device(host):
        synced.append(tf.identity(one))
    deps = synced
  with tf.device(host), tf.control_dependencies(deps):
    return _Timestamp(clock)


def _Present(t: Optional[tf.Tensor]) -> List[tf.Tensor]:
  return [] if t is None else [t]


def _After(deps: Sequence[tf.Tensor]) -> Any:
  """A scope whose ops run only after the ops producing `deps`."""
  return tf.control_dependencies(list(deps))


# Ops that take a resource but read no variable: a batch from a dataset
# iterator has no gradient to give.
_NOT_VARIABLE_READS = frozenset([
    'IteratorGetNext', 'IteratorGetNextSync', 'IteratorGetNextAsOptional',
    'OptionalGetValue', 'OptionalHasValue'])


def _MayDependOnVariables(tensors: Sequence[tf.Tensor],
                          limit: int = 20000) -> bool:
  """Whether some floating tensor here may be computed from a variable.

  Walks the graph back from `tensors`; any op with a resource input
  (other than a dataset iterator's) counts as reading a variable. True
  when unsure: eagerly, or past `limit` ops.
  """
  if tf.executing_eagerly():
    return True
  stack = [t.op for t in tensors if residuals.IsFloat(t)]
  seen = set()
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if len(seen) > limit:
      return True
    if op.type not in _NOT_VARIABLE_READS and any(
        t.dtype == tf.resource for t in op.inputs):
      return True
    stack.extend(t.op for t in op.inputs)
  return False


def _FirstLine(err: Exception) -> str:
  text = str(err).strip().splitlines()
  return text[0] if text else type(err).__name__


def _Shapes(structure: Any) -> str:
  return str(tf.nest.map_structure(lambda t: t.shape.as_list(), structure))


def _OnDevice(fn: Callable[..., Any], device: str) -> Callable[..., Any]:
  """`fn` as a non-inlined tf.function whose every op is on `device`."""

  def Body(*args):
    with tf.device(device):
      return fn(*args)

  Body.__name__ = fn.__name__
  return tf.function(Body, autograph=False,
                     experimental_attributes=_FUNCTION_ATTRIBUTES)


class PipelineRun:
  """The ops of one FProp of a PipeliningLayer (see module docstring)."""

  def __init__(self, layer: Any, num_micro_batches: int, in_structure: Any,
               thetas: List[Any], devices: List[str]):
    self._layer = layer
    self._cells = layer.cells
    self._devices = list(devices)
    self._axis = layer.params.batch_dim
    self._k = len(self._cells)
    self._m = num_micro_batches
    self._thetas = thetas
    self._out_structure = None
    # Per (k, m): the partition's input leaves, and when it keeps its
    # activations, its outputs and residuals.
    self._x: Dict[Tuple[int, int], List[tf.Tensor]] = {}
    self._kept: Dict[Tuple[int, int],
                     Tuple[List[tf.Tensor], List[tf.Tensor]]] = {}
    # Partition k's input structure (k = 0: the pipeline's inputs).
    self._structures: Dict[int, Any] = {0: in_structure}
    # Full-batch outputs, and each device's last forward task's outputs.
    self._outputs: List[tf.Tensor] = []
    self._last_forward: Dict[int, List[tf.Tensor]] = {}
    self._recorder = _recorder
    # One clock handle per device, made before any task (_Timestamp).
    self._clocks = ({d: _NewClock(d) for d in self._devices}
                    if _recorder is not None else {})
    self._ends: Dict[Tuple[str, int, int], tf.Tensor] = {}
    self._forward_fns = [_OnDevice(self._ForwardFn(k), d)
                         for k, d in enumerate(self._devices)]
    self._backward_fns = [_OnDevice(self._BackwardFn(k, d), d)
                          for k, d in enumerate(self._devices)]
    # Partition 0 without its input gradient, and that gradient alone (see
    # _BackwardTask); made only when the inputs come from no variable.
    self._backward_0_no_dx: Optional[Callable[..., Any]] = None
    self._input_gradient_fn: Optional[Callable[..., Any]] = None
    self._split_cells = {
        k: residuals.SplitCell(f'cell_{k}', self._ForwardFn(k),
                               lambda fn, d=d: _OnDevice(fn, d))
        for k, d in enumerate(self._devices)
        if layer._KeepsActivations(k)}  # pylint: disable=protected-access

  # ---- the partition functions ------------------------------------------

  def _ForwardFn(self, k: int) -> Callable[..., Any]:
    def Forward(theta_leaves, x):
      return self._Cell(k, list(theta_leaves), list(x))
    Forward.__name__ = f'cell_{k}_forward'
    return Forward

  def _BackwardFn(self, k: int, device: str,
                  input_gradient: bool = True) -> Callable[..., Any]:
    """B(k, m)'s call: (dx, acc + dtheta[, recomputed]); dx None if unwanted."""
    stamp = self._recorder is not None

    def Backward(theta_leaves, x, dy, acc, *clock):
      theta_leaves, x = list(theta_leaves), list(x)
      sources = x if input_gradient else []
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape, self._cells[k].NoStatUpdates():
        tape.watch([t for t in sources + theta_leaves
                    if residuals.IsFloat(t)])
        y = self._Cell(k, theta_leaves, x)

      def Grads():
        dx, dtheta = residuals.Gradients(tape, y, list(dy), sources,
                                         theta_leaves)
        return ((dx if input_gradient else [None] * len(x)),
                residuals.AddGradients(list(acc), dtheta))

      if not stamp:
        return Grads()
      # Recording: the gradient ops start after the re-computation's stamp.
      recomputed = _Stamp(device, clock[0], y)
      with tf.control_dependencies([recomputed]):
        dx, dtheta = Grads()
      return dx, dtheta, recomputed
    Backward.__name__ = (f'cell_{k}_backward' if input_gradient else
                         f'cell_{k}_backward_without_input_gradient')
    return Backward

  def _InputGradientFn(self) -> Callable[..., Any]:
    """d(pipeline inputs) of one micro-batch alone: partition 0 again."""

    def InputGradient(theta_leaves, x, dy):
      theta_leaves, x = list(theta_leaves), list(x)
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape, self._cells[0].NoStatUpdates():
        tape.watch([t for t in x if residuals.IsFloat(t)])
        y = self._Cell(0, theta_leaves, x)
      return residuals.Gradients(tape, y, list(dy), x, [])[0]
    InputGradient.__name__ = 'cell_0_input_gradient'
    return InputGradient

  # ---- recording (RecordTasks) -----------------------------------------

  def _Begin(self, k: int, deps: List[Optional[tf.Tensor]],
             producers: List[Tuple[str, int, int]]) -> Optional[tf.Tensor]:
    """A task's start stamp when recording (the task must wait for it).

    It waits for the task's inputs and its device's previous task, and for
    the end stamps of the tasks that made its inputs: a stamp runs when a
    thread is free, so a consumer's start could otherwise be stamped before
    its producer's end.
    """
    if self._recorder is None:
      return None
    device = self._devices[k]
    return _Stamp(device, self._clocks[device],
                  list(deps) + [self._ends[p] for p in producers])

  def _Finish(self, phase: str, k: int, m: int, start: Optional[tf.Tensor],
              outputs: List[Optional[tf.Tensor]],
              recomputed: Optional[tf.Tensor] = None) -> Optional[tf.Tensor]:
    """A task's end stamp when recording; records the task."""
    if self._recorder is None:
      return None
    device = self._devices[k]
    end = self._ends[(phase, k, m)] = _Stamp(device, self._clocks[device],
                                             outputs)
    self._recorder.tasks.append(RecordedTask(
        self._layer.path, device, phase, k, m, start, end, recomputed))
    return end

  # ---- forward ---------------------------------------------------------

  def Call(self, leaves: List[tf.Tensor]) -> Any:
    theta_leaves = [tf.nest.flatten(t) for t in self._thetas]
    sizes = [len(t) for t in theta_leaves]
    num_in = len(leaves)
    if 0 not in self._split_cells and not _MayDependOnVariables(leaves):
      device = self._devices[0]
      self._backward_0_no_dx = _OnDevice(
          self._BackwardFn(0, device, input_gradient=False), device)
      self._input_gradient_fn = _OnDevice(self._InputGradientFn(), device)

    @tf.custom_gradient
    def Run(*args):
      xs = list(args[:num_in])
      flat_thetas, start = [], num_in
      for size in sizes:
        flat_thetas.append(list(args[start:start + size]))
        start += size
      outputs = self._Forward(xs, flat_thetas)

      def Grad(*dys):
        return self._Backward(list(dys), flat_thetas)

      return outputs, Grad

    flat_theta_args = [x for t in theta_leaves for x in t]
    flat_out = Run(*leaves, *flat_theta_args)
    if not isinstance(flat_out, (list, tuple)):
      flat_out = [flat_out]
    return tf.nest.pack_sequence_as(self._out_structure, list(flat_out))

  def _Split(self, leaves: List[Optional[tf.Tensor]], device: str
             ) -> List[List[Optional[tf.Tensor]]]:
    """[leaf] -> [micro-batch][leaf]; a None leaf stays None."""
    with tf.device(device), tf.name_scope('split'):
      parts = [[None] * self._m if x is None else
               tf.split(x, self._m, axis=self._axis) for x in leaves]
    return [[p[m] for p in parts] for m in range(self._m)]

  def _Concat(self, per_micro: List[List[Optional[tf.Tensor]]], device: str
              ) -> List[Optional[tf.Tensor]]:
    """[micro-batch][leaf] -> [leaf], None where a leaf has no values."""
    out = []
    with tf.device(device), tf.name_scope('concat'):
      for i in range(len(per_micro[0])):
        column = [row[i] for row in per_micro]
        if any(c is None for c in column):
          out.append(None)
        else:
          out.append(tf.concat(column, axis=self._axis))
    return out

  def _Forward(self, xs: List[tf.Tensor],
               thetas: List[List[tf.Tensor]]) -> List[tf.Tensor]:
    micro = self._Split(xs, self._devices[0])
    state = {(0, m): micro[m] for m in range(self._m)}
    last_on_device = self._last_forward
    outputs = [None] * self._m
    for task in schedule.GPipeSchedule(self._k, self._m, backward=False):
      k, m = task.partition, task.micro_batch
      with tf.device(self._devices[k]), tf.name_scope(f'cell_{k}/fwd_{m}'):
        x = state.pop((k, m))
        self._x[(k, m)] = x
        after = list(last_on_device.get(k, []))
        start = self._Begin(k, after + x, [('F', k - 1, m)] if k else [])
        with _After(after + _Present(start)):
          y_leaves = self._RunForward(k, m, thetas[k], x)
        end = self._Finish('F', k, m, start, y_leaves)
      self._CheckBatch(k, m, y_leaves)
      last_on_device[k] = y_leaves + _Present(end)
      if k + 1 < self._k:
        state[(k + 1, m)] = y_leaves
      else:
        outputs[m] = y_leaves
    self._out_structure = self._structures[self._k]
    self._outputs = self._Concat(outputs, self._devices[-1])
    return self._outputs

  def _RunForward(self, k: int, m: int, theta_leaves: List[tf.Tensor],
                  x: List[tf.Tensor]) -> List[tf.Tensor]:
    if k not in self._split_cells:
      return list(self._forward_fns[k](theta_leaves, x))
    y, kept = self._split_cells[k].Forward(theta_leaves, x)
    self._kept[(k, m)] = (list(y), list(kept))
    return list(y)

  def _Cell(self, k: int, theta_leaves: List[tf.Tensor],
            x: List[tf.Tensor]) -> List[tf.Tensor]:
    """Partition k's cell on flat leaves; records its output structure."""
    inputs = tf.nest.pack_sequence_as(self._structures[k], x)
    try:
      out = self._cells[k].FProp(
          tf.nest.pack_sequence_as(self._thetas[k], theta_leaves), inputs)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
      source = ('the pipeline inputs' if k == 0 else
                f"the output of partition {k - 1} ('cell_{k - 1}')")
      raise ValueError(
          f"PipeliningLayer '{self._layer.path}': partition {k} "
          f"('cell_{k}') cannot take {source} of shapes {_Shapes(inputs)}: "
          f'{_FirstLine(err)}') from err
    self._structures[k + 1] = out
    return tf.nest.flatten(out)

  def _CheckBatch(self, k: int, m: int, leaves: List[tf.Tensor]) -> None:
    want = self._x[(k, m)][0].shape[self._axis]
    for y in leaves:
      if y.shape.rank is None or y.shape.rank <= self._axis or (
          y.shape[self._axis] != want):
        raise ValueError(
            f"PipeliningLayer '{self._layer.path}': partition {k} "
            f"('cell_{k}') returned shape {y.shape}; every output needs "
            f'the micro-batch ({want}) on axis {self._axis}.')

  # ---- backward --------------------------------------------------------

  def _Backward(self, dys: List[Optional[tf.Tensor]],
                thetas: List[List[tf.Tensor]]) -> List[Optional[tf.Tensor]]:
    # An output without a gradient (None) stays None: it contributes
    # nothing, and a zero tensor here would be a constant that Grappler
    # specialises every call of the last partition's backward for.
    last = self._devices[-1]
    dys = [dy if residuals.IsFloat(y) else None
           for dy, y in zip(dys, self._outputs)]
    micro_dy = self._Split(dys, last)
    dstate = {(self._k - 1, m): micro_dy[m] for m in range(self._m)}
    acc: List[Optional[List[Optional[tf.Tensor]]]] = [None] * self._k
    last_on_device = dict(self._last_forward)
    dx0: List[Optional[List[Optional[tf.Tensor]]]] = [None] * self._m
    for task in schedule.GPipeSchedule(self._k, self._m):
      if task.phase != 'B':
        continue
      k, m = task.partition, task.micro_batch
      with tf.device(self._devices[k]), tf.name_scope(f'cell_{k}/bwd_{m}'):
        dx, acc[k], stamps = self._BackwardTask(
            k, m, thetas[k], dstate.pop((k, m)), last_on_device[k], acc[k])
        # The task ends with its outputs, the running sum included. Nothing
        # here may depend on the first partition's input gradient: the
        # caller often has no use for it (images, token ids) and then the
        # runtime prunes it.
        mine = acc[k] if k == 0 else dx + acc[k]
        end = self._Finish('B', k, m, stamps[0], mine, stamps[1])
      last_on_device[k] = [t for t in (dx if k > 0 else []) + acc[k]
                           if t is not None] + _Present(end)
      if k > 0:
        dstate[(k - 1, m)] = dx
      else:
        dx0[m] = dx
    dxs = self._Concat(dx0, self._devices[0])
    return dxs + [g for part in acc for g in part]

  def _BackwardTask(self, k: int, m: int, theta_leaves: List[tf.Tensor],
                    dy: List[Optional[tf.Tensor]], after: List[tf.Tensor],
                    acc: Optional[List[Optional[tf.Tensor]]]
                    ) -> Tuple[List[Optional[tf.Tensor]],
                               List[Optional[tf.Tensor]],
                               Tuple[Optional[tf.Tensor],
                                     Optional[tf.Tensor]]]:
    """B(k, m): (d inputs, acc + d theta_k, stamps), None where not floating.

    `acc`: the running sum of partition k's gradients, None at its first
    task (the sum then starts from zeros, made when the task starts).
    stamps: (start, recomputed) when recording (RecordTasks), recomputed
    None without re-computation; (None, None) otherwise.
    """
    x = self._x.pop((k, m))
    y, kept = self._kept.pop((k, m), ([], []))  # the forward's, if kept
    start = self._Begin(k, after + x + list(dy) + y + kept,
                        [('B', k + 1, m)] if k + 1 < self._k else [])
    after = list(after) + _Present(start)
    if acc is None:
      with _After(after), tf.name_scope('zeros'):
        acc = [tf.zeros_like(t) if residuals.IsFloat(t) else None
               for t in theta_leaves]
    if k in self._split_cells:
      with _After(after):
        dx, dtheta = self._split_cells[k].Backward(theta_leaves, x, kept, dy,
                                                   y, acc)
      return list(dx), list(dtheta), (start, None)
    # Re-compute only once this device's previous backward is done AND
    # the gradient from partition k+1 is here (a data input of the call):
    # otherwise the executor may re-compute while partition k+1 is still
    # busy and hold this partition's activations meanwhile.
    clock = [self._clocks[self._devices[k]]] if self._recorder else []
    if k == 0 and self._input_gradient_fn is not None and (
        self._input_gradient_fn.get_concrete_function(
            theta_leaves, x, dy).function_def.signature.is_stateful):
      # A stateful call always runs: it would re-compute for nothing.
      self._backward_0_no_dx = self._input_gradient_fn = None
    if k == 0 and self._backward_0_no_dx is not None:
      # The inputs come from no variable: the caller most likely wants no
      # gradient of them (images, a batch it did not watch). B(0, m) then
      # leaves it out, and a separate call re-computes partition 0 for
      # it; nothing depends on that call unless the caller uses d(inputs)
      # (a tape that watched them), so otherwise the runtime prunes it.
      with _After(after):
        out = self._backward_0_no_dx(theta_leaves, x, dy, acc, *clock)
        dx = self._input_gradient_fn(theta_leaves, x, dy)
      recomputed = out[2] if self._recorder is not None else None
      return list(dx), list(out[1]), (start, recomputed)
    with _After(after):
      out = self._backward_fns[k](theta_leaves, x, dy, acc, *clock)
    recomputed = out[2] if self._recorder is not None else None
    return list(out[0]), list(out[1]), (start, recomputed)

