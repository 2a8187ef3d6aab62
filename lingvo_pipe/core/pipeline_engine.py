"""The engine: a schedule's actions as ops, each device's in table order.

`Engine.Run(table, ...)` walks the table (`schedule.RunOrder`: every
action after the actions it reads) and emits each action under its
device's scope, with a control dependency on what that device's previous
action produced:

  for (d, action) in RunOrder(table):
    with tf.device(device d), after(last[d]):
      F(s, m):  y = stage.Forward(s, m, x[s][m])        x[s+1][m] = y
                s = S-1 and a loss:  dy[S-1][m] = stage.Loss(m, y)
      B(s, m):  dx = stage.Backward(s, m, dy[s][m])     dy[s-1][m] = dx
      W(s, m):  stage.Weight(s, m)   (tables that split the backward)
      A(s):     all_reduce(s, done)        (replicas: the stage's sums over
                                           its copies, to `done`; the
                                           caller says how)
    last[d] = the action's outputs   (not an A's: the device goes on with
                                      its next action while it runs)

The engine knows the order and where values go; `StageOps` (the
pipeline's functions) knows what an action computes, and what it keeps
between a forward and its backward. Nothing here depends on which
schedule the table is. Within `stamps.RecordTasks()` each action is
stamped when it may start and when its outputs are ready.

Stage 0's input gradient is not part of its device's chain: the caller
often has no use for it (images, token ids), and then the runtime prunes
it (input_gradient.py).
"""

from __future__ import annotations

import dataclasses
from typing import (Any, Callable, Dict, List, Optional, Protocol, Sequence,
                    Tuple)

import tensorflow as tf

from lingvo_pipe.core import schedule
from lingvo_pipe.core import stamps

Leaves = List[Optional[tf.Tensor]]


class StageOps(Protocol):
  """What each action computes (pipeline_run.PipelineRun implements it)."""

  def Forward(self, s: int, m: int, x: Leaves) -> Leaves:
    """F(s, m): the stage's outputs; keeps what B(s, m) will need."""

  def Loss(self, m: int, y: Leaves) -> Tuple[Leaves, Leaves]:
    """Micro-batch m's loss on the last stage's outputs y: (dy, outputs
    its device's next action waits for)."""

  def Backward(self, s: int, m: int, dy: Leaves, clock: Optional[tf.Tensor]
               ) -> Tuple[Leaves, Leaves, Optional[tf.Tensor]]:
    """B(s, m): (d inputs, the stage's running gradient sums (or, in a
    table with W actions, what W(s, m) will read), the stamp of the end of
    re-computation when recording, else None)."""

  def Weight(self, s: int, m: int) -> Leaves:
    """W(s, m): the stage's running gradient sums."""


# A(s): stage s's gradient sums over its mirrored copies; `done` gets them
# once they are built (in one pass, when the last replica's trace reaches
# its A(s)).
AllReduce = Callable[[int, Callable[[Leaves], None]], None]


@dataclasses.dataclass
class Flow:
  """What one Run gives and gets, per micro-batch."""
  inputs: Dict[int, Leaves] = dataclasses.field(default_factory=dict)
  # The last stage's outputs (forwards) and stage 0's input gradients.
  outputs: Dict[int, Leaves] = dataclasses.field(default_factory=dict)
  input_grads: Dict[int, Leaves] = dataclasses.field(default_factory=dict)
  # d (last stage's outputs) for a table of backwards only.
  output_grads: Dict[int, Leaves] = dataclasses.field(default_factory=dict)


def _Present(t: Optional[tf.Tensor]) -> List[tf.Tensor]:
  return [] if t is None else [t]


class Engine:
  """Emits tables of one pipeline call; devices' chains span Run calls."""

  def __init__(self, ops: StageOps, devices: Sequence[str],
               stage_devices: Sequence[int], layer_path: str,
               check_batch: Any = None):
    self._ops = ops
    self._devices = list(devices)
    self._stage_devices = list(stage_devices)
    self._path = layer_path
    self._check_batch = check_batch
    self._recorder = stamps.Current()
    # One clock handle per device, made before any action (stamps.py).
    self._clocks = ({d: stamps.NewClock(d) for d in self._devices}
                    if self._recorder is not None else {})
    self._last: Dict[int, List[tf.Tensor]] = {}
    self._ends: Dict[Tuple[str, int, int], tf.Tensor] = {}
    self._done: List[schedule.Action] = []  # by earlier Run calls

  def DeviceOf(self, stage: int) -> str:
    return self._devices[self._stage_devices[stage]]

  def Run(self, table: schedule.Schedule, flow: Flow,
          with_loss: bool = False,
          all_reduce: Optional[AllReduce] = None) -> Flow:
    """Emits every action of `table` (module docstring).

    `flow.inputs[m]`: stage 0's inputs of micro-batch m (for forwards);
    `flow.output_grads[m]`: d outputs of the last stage, for a table of
    backwards that follows a table of forwards. With `with_loss`, the last
    stage's forward is followed by `ops.Loss`, whose dy feeds B(S-1, m).
    A table with A actions needs `all_reduce`.
    """
    last_stage = len(self._stage_devices) - 1
    x = {(0, m): v for m, v in flow.inputs.items()}
    dy = {(last_stage, m): v for m, v in flow.output_grads.items()}
    order = schedule.RunOrder(table, self._done)
    self._done += [a for _, a in order]
    for d, a in order:
      s, m = a.stage, a.micro_batch
      scope = {'F': f'fwd_{m}', 'B': f'bwd_{m}', 'W': f'wgt_{m}',
               schedule.ALL_REDUCE: 'all_reduce'}[a.phase]
      with tf.device(self._devices[d]), tf.name_scope(f'cell_{s}/{scope}'):
        if a.phase == schedule.ALL_REDUCE:
          self._AllReduce(d, s, all_reduce)
        elif a.phase == 'W':
          self._Weight(d, s, m)
        elif a.phase == 'F':
          y = self._Forward(d, s, m, x.pop((s, m)))
          if s < last_stage:
            x[(s + 1, m)] = y
          elif with_loss:
            dy[(s, m)] = self._Loss(d, m, y)
          else:
            flow.outputs[m] = y
        else:
          dx = self._Backward(d, s, m, dy.pop((s, m)))
          if s:
            dy[(s - 1, m)] = dx
          else:
            flow.input_grads[m] = dx
    return flow

  def _Begin(self, d: int, deps: Sequence[Optional[tf.Tensor]],
             producers: Sequence[Tuple[str, int, int]]
             ) -> Optional[tf.Tensor]:
    """An action's start stamp when recording (the action waits for it).

    It waits for the action's inputs and its device's previous action, and
    for the end stamps of the actions that made its inputs: a stamp runs
    when a thread is free, so a consumer's start could otherwise be stamped
    before its producer's end.
    """
    if self._recorder is None:
      return None
    device = self._devices[d]
    return stamps.Stamp(device, self._clocks[device],
                        list(deps) + [self._ends[p] for p in producers
                                      if p in self._ends])

  def _Finish(self, d: int, phase: str, s: int, m: int,
              start: Optional[tf.Tensor], outputs: Leaves,
              recomputed: Optional[tf.Tensor] = None) -> Optional[tf.Tensor]:
    if self._recorder is None:
      return None
    device = self._devices[d]
    end = self._ends[(phase, s, m)] = stamps.Stamp(
        device, self._clocks[device], outputs)
    self._recorder.tasks.append(stamps.RecordedTask(
        self._path, device, phase, s, m, start, end, recomputed))
    return end

  def _Forward(self, d: int, s: int, m: int, x: Leaves) -> Leaves:
    after = list(self._last.get(d, []))
    start = self._Begin(d, after + x, [('F', s - 1, m)] if s else [])
    with tf.control_dependencies(after + _Present(start)):
      y = self._ops.Forward(s, m, x)
    end = self._Finish(d, 'F', s, m, start, y)
    if self._check_batch is not None:
      self._check_batch(s, m, x, y)
    self._last[d] = [t for t in y if t is not None] + _Present(end)
    return y

  def _Loss(self, d: int, m: int, y: Leaves) -> Leaves:
    with tf.control_dependencies(self._last[d]):
      dy, outputs = self._ops.Loss(m, y)
    self._last[d] = [t for t in outputs if t is not None]
    return dy

  def _Weight(self, d: int, s: int, m: int) -> None:
    after = list(self._last.get(d, []))
    start = self._Begin(d, after, [('B', s, m)])
    with tf.control_dependencies(after + _Present(start)):
      sums = self._ops.Weight(s, m)
    end = self._Finish(d, 'W', s, m, start, sums)
    self._last[d] = [t for t in sums if t is not None] + _Present(end)

  def _AllReduce(self, d: int, s: int, all_reduce: AllReduce) -> None:
    """The collectives wait for the stage's sums only, not for the
    device's chain. When recording, the task starts as the device's
    previous action ends and ends when every sum is in: its length is the
    exchange not hidden behind that action."""
    start = self._Begin(d, list(self._last.get(d, [])), [])

    def Done(sums: Leaves) -> None:
      self._Finish(d, schedule.ALL_REDUCE, s, 0, start, sums)
    all_reduce(s, Done)

  def _Backward(self, d: int, s: int, m: int, dy: Leaves) -> Leaves:
    after = list(self._last.get(d, []))
    last_stage = len(self._stage_devices) - 1
    start = self._Begin(d, after + list(dy),
                        [('B', s + 1, m)] if s < last_stage else [])
    clock = self._clocks.get(self._devices[d])
    with tf.control_dependencies(after + _Present(start)):
      dx, sums, recomputed = self._ops.Backward(s, m, dy, clock)
    # Nothing may wait for stage 0's input gradient (module docstring).
    mine = list(sums) + (list(dx) if s else [])
    end = self._Finish(d, 'B', s, m, start, mine, recomputed)
    self._last[d] = [t for t in mine if t is not None] + _Present(end)
    return dx
