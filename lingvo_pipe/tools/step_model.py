"""Predicted time and memory of one PipeliningLayer training step.

From measured per-layer costs (`layer_profile.LayerProfile`) and a split
into S stages (K devices, V stages each, stage s on device s mod K), per
stage s and micro-batch:

  F_s  = sum of its layers' forward_s
  B_s  = sum of its layers' backward_s, + F_s if it re-computes its forward
         (recompute 'always'; 'except_last' for all but the last)

Step time is the end of the schedule's table (schedule.Make: 'gpipe',
'1f1b', 'interleaved_1f1b') run with these costs by `schedule.Simulate`:
each action starts when its device's previous action and the actions it
reads are done (the pipeline's control dependencies, pipeline_engine.py).
Training runs in one pass: the loss of micro-batch m is computed as
F(S-1, m) ends, so B(S-1, m) waits for that forward only.

  K=2 M=2, F = (1, 2), B = (3, 4):
    gpipe  dev 0:  F0 0-1  F1 1-2                  B1 9-12  B0 13-16
           dev 1:          F0 1-3  F1 3-5  B1 5-9  B0 9-13
    1f1b   dev 0:  F0 0-1  F1 1-2          B0 7-10          B1 13-16
           dev 1:          F0 1-3  B0 3-7  F1 7-9  B1 9-13
    step = 16 for both; at M=4, 28 for both (equal bubbles, 1F1B holds less)

plus `overhead_s` per action (the runtime's cost of one partition function
call), and `hop_s[s]` on each dependency across the boundary between
stages s and s+1 on different devices: handing the micro-batch's output
forward, and its gradient (the same bytes) back (transfer_profile.py).
GPipe with hops of 0.5:

    dev 0:  F0 0-1  F1 1-2                      B1 10-13  B0 14-17
    dev 1:            F0 1.5-3.5  F1 3.5-5.5  B1 5.5-9.5  B0 9.5-13.5
    step = 17

Memory of stage s, for one step, in bytes:

  resident   params P_s + optimizer slots S_s
  gradients  P_s with M > 1: the running sum of the micro-batches'
             gradients (with M = 1 they are in W_s)
  kept       during each action of its device, the most of:
               inputs x in_s: the micro-batch inputs it holds
             + in flight x H_s: the micro-batches between F(s, m) and
               B(s, m), each holding H_s = R_s if the stage keeps its
               activations, + out on the last stage (that micro-batch's
               output gradient: the loss head makes it as F(S-1, m) ends
               and frees the output, docs/DESIGN.md section 19)
             + during a backward of its own, max(W_s, P_s), less R_s if
               it keeps (that micro-batch's residuals, in W_s and among
               those in flight): W_s while one micro-batch is re-computed
               and differentiated, at least P_s: the backward call adds
               each gradient to the sum as it is made, into the
               gradient's own buffer, and the old sum, an input of the
               call, lives until the call ends (measured 2.00 P_s in all,
               docs/DESIGN.md section 26)
  peak       resident + gradients + kept; the step memory (what a step
             adds over the memory between steps) is gradients + kept

The counts come from the table alone (`Holding`). In flight: F(s, m)
through B(s, m): M for GPipe, min(K - s, M) for 1F1B
(schedule.InFlight). An input is held through B(s, m) too, and from
earlier than F(s, m): a stage fed by another device from the action
before F(s, m) on its device (the input arrives while that action runs,
so 1F1B's stage s > 0 holds K - s + 1 inputs during its backwards); a
stage fed by its own device (V > 1, K = 1) from the action after
F(s - 1, m). Stage 0's inputs are slices of the batch (views, on the
batch axis), which lives through the step: all M, whatever the schedule
(an embedded batch is made in the step; a batch fed to it is not, and
then this over-counts by one batch's input).

  K=2 M=4 (inputs, in flight) at their peak:
    gpipe  stage 0: (4, 4)  stage 1: (4, 4)  output gradients 4 x out
    1f1b   stage 0: (4, 2)  stage 1: (2, 1)  output gradients 1 x out

A device with V > 1 stages holds their resident, gradients and, action
by action, the sum of what each stage holds (`PredictDevices`).

R_s is what the stage's gradient reads from its forward: its layers'
residual_bytes, plus the inputs of its inner layers that their gradients
read (input_read_bytes; the stage's own input is counted as in_s).
W_s is the most its backward holds at once: while layer j is
differentiated, the residuals of layers 0..j-1 wait, the gradients of
layers after j are done, and layer j holds its own working set, its
measured backward_peak_bytes (its residuals, the gradient's temporaries
and results; residual_bytes + its parameters' bytes where the allocator
keeps no statistics), and its output gradient (on the last stage, the
last layer's is among the held ones):
  W_s = max_j  sum_{i<j} (R_i + read_i) + read_j + backward_peak_j
               + out_j + sum_{i>j} P_i
Temporaries and the executor's concurrency are in the measured working
set; the static residuals alone missed both (docs/DESIGN.md section 17).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.core import schedule
from lingvo_pipe.tools import layer_profile

Profile = layer_profile.LayerProfile
# The schedules this model knows: F and B per stage and micro-batch, each
# micro-batch held from F(s, m) through B(s, m).
SCHEDULES = ('gpipe', '1f1b', 'interleaved_1f1b')
# During one action: (inputs held, micro-batches in flight, whether the
# action is this stage's backward).
State = Tuple[int, int, bool]


@dataclasses.dataclass(frozen=True)
class PartitionPrediction:
  """One stage's predicted costs (module docstring); the per micro-batch
  terms input_bytes (in), hold_bytes (H) and work_bytes (max(W, P) - R if
  it keeps, else max(W, P)) let a device add up its stages."""
  forward_s: float
  backward_s: float
  resident_bytes: int
  gradient_bytes: int
  kept_bytes: int
  input_bytes: int = 0
  hold_bytes: int = 0
  work_bytes: int = 0

  @property
  def peak_bytes(self) -> int:
    return self.resident_bytes + self.gradient_bytes + self.kept_bytes

  @property
  def step_bytes(self) -> int:
    """What a step adds on top of the resident model: gradients and the
    kept activations."""
    return self.gradient_bytes + self.kept_bytes

  def Kept(self, states: Sequence[State]) -> int:
    """What it holds at the most of `states` (module docstring)."""
    return max(inputs * self.input_bytes + flight * self.hold_bytes +
               (self.work_bytes if backward else 0)
               for inputs, flight, backward in states)


@dataclasses.dataclass(frozen=True)
class DevicePrediction:
  """One device's stages together (module docstring)."""
  stages: Tuple[int, ...]
  resident_bytes: int
  gradient_bytes: int
  kept_bytes: int

  @property
  def peak_bytes(self) -> int:
    return self.resident_bytes + self.gradient_bytes + self.kept_bytes

  @property
  def step_bytes(self) -> int:
    return self.gradient_bytes + self.kept_bytes


@dataclasses.dataclass(frozen=True)
class Layout:
  """A schedule and its stages per device: K devices run K x V stages."""
  schedule_name: str = 'gpipe'
  num_virtual_stages: int = 1

  def __str__(self) -> str:
    v = self.num_virtual_stages
    return self.schedule_name + (f' V={v}' if v > 1 else '')

  def Table(self, num_devices: int, m: int) -> schedule.Schedule:
    """schedule.Make's table; raises its one-line ValueError."""
    return MakeTable(self.schedule_name,
                     num_devices * self.num_virtual_stages, m,
                     self.num_virtual_stages)

  def HasTable(self, num_devices: int, m: int) -> bool:
    """Whether the schedule runs K devices and M micro-batches."""
    try:
      self.Table(num_devices, m)
    except ValueError:
      return False
    return True


def KeepsActivations(recompute: str, k: int, num_partitions: int) -> bool:
  """As PipeliningLayer: which stages keep their activations."""
  return recompute == 'never' or (recompute == 'except_last' and
                                  k == num_partitions - 1)


def MakeTable(schedule_name: str, num_stages: int, num_micro_batches: int,
              num_virtual_stages: int = 1) -> schedule.Schedule:
  """The table of S stages on S / V devices (schedule.Make)."""
  if schedule_name not in SCHEDULES:
    raise ValueError(f'The planner models the schedules {SCHEDULES}, not '
                     f'{schedule_name!r}; use one of those.')
  v = num_virtual_stages
  if v < 1 or num_stages % v:
    raise ValueError(
        f'num_virtual_stages={v} must divide the {num_stages} stages '
        '(K = stages / V devices); change V or the split.')
  return schedule.Make(schedule_name, num_stages // v, num_micro_batches, v)


# ---- what each stage holds -------------------------------------------------


def _InputSpan(table: schedule.Schedule, pos: Dict[schedule.Action, int],
               d: int, s: int, m: int) -> range:
  """The positions in device d's row during which stage s holds input m
  (module docstring)."""
  row_end, b = len(table.order[d]), pos[schedule.Action('B', s, m)]
  if s == 0:
    return range(row_end)
  if table.stage_devices[s - 1] == d:
    return range(pos[schedule.Action('F', s - 1, m)] + 1, b + 1)
  return range(max(pos[schedule.Action('F', s, m)] - 1, 0), b + 1)


def Holding(table: schedule.Schedule
            ) -> List[List[Dict[int, Tuple[int, int]]]]:
  """Per device, per action in its order: {stage of the device: (inputs
  held, micro-batches in flight)} while the action runs (module
  docstring). It depends on the order alone, not on the costs."""
  out = []
  for d, row in enumerate(table.order):
    pos = {a: i for i, a in enumerate(row)}
    counts = [{s: [0, 0] for s in table.StagesOf(d)} for _ in row]
    for s in table.StagesOf(d):
      for m in range(table.num_micro_batches):
        f, b = pos[schedule.Action('F', s, m)], pos[schedule.Action('B', s, m)]
        for i in _InputSpan(table, pos, d, s, m):
          counts[i][s][0] += 1
        for i in range(f, b + 1):
          counts[i][s][1] += 1
    out.append([{s: (c[0], c[1]) for s, c in at.items()} for at in counts])
  return out


def StageStates(table: schedule.Schedule) -> List[List[State]]:
  """Per stage, the distinct (inputs, in flight, own backward) over its
  device's actions."""
  states: List[set] = [set() for _ in range(table.num_stages)]
  for row, held in zip(table.order, Holding(table)):
    for a, at in zip(row, held):
      for s, (inputs, flight) in at.items():
        states[s].add((inputs, flight, a.phase == 'B' and a.stage == s))
  return [sorted(x) for x in states]


# ---- memory ---------------------------------------------------------------


def PartitionResidualBytes(profiles: Sequence[Profile]) -> int:
  """R of one stage's layers (module docstring)."""
  return (sum(p.residual_bytes for p in profiles) +
          sum(p.input_read_bytes for p in profiles[1:]))


def BackwardWorkingBytes(part: Sequence[Profile], is_last: bool) -> int:
  """W: the most one micro-batch's backward holds (module docstring)."""
  earlier, later_params, most = 0, sum(p.param_bytes for p in part), 0
  for j, p in enumerate(part):
    read = p.input_read_bytes if j else 0
    work = (p.backward_peak_bytes if p.backward_peak_bytes is not None
            else p.residual_bytes + p.param_bytes)
    later_params -= p.param_bytes
    # Its output gradient: the next layer's d input, or received; the last
    # stage's are counted with its micro-batches in flight.
    dy = 0 if is_last and j == len(part) - 1 else p.output_bytes
    most = max(most, earlier + read + work + dy + later_params)
    earlier += p.residual_bytes + read
  return most


def PredictPartition(part: Sequence[Profile], num_micro_batches: int,
                     keeps: bool, is_last: bool,
                     states: Optional[Sequence[State]] = None
                     ) -> PartitionPrediction:
  """One stage of layers `part` (module docstring); `states` from
  StageStates, by default GPipe's: M inputs and M in flight."""
  m = num_micro_batches
  fwd = sum(p.forward_s for p in part)
  params = sum(p.param_bytes for p in part)
  residuals = PartitionResidualBytes(part) if keeps else 0
  pred = PartitionPrediction(
      forward_s=fwd,
      backward_s=sum(p.backward_s for p in part) + (0.0 if keeps else fwd),
      resident_bytes=params + sum(p.slot_bytes for p in part),
      gradient_bytes=params if m > 1 else 0, kept_bytes=0,
      input_bytes=part[0].input_bytes,
      hold_bytes=residuals + (part[-1].output_bytes if is_last else 0),
      work_bytes=max(BackwardWorkingBytes(part, is_last), params) -
      residuals)
  return dataclasses.replace(
      pred, kept_bytes=pred.Kept(states or [(m, m, True)]))


def Predict(profiles: Sequence[Profile], bounds: Sequence[int],
            num_micro_batches: int, recompute: str = 'always',
            schedule_name: str = 'gpipe', num_virtual_stages: int = 1
            ) -> List[PartitionPrediction]:
  """Per stage of the split `bounds` (MinMaxPartition's form), in the
  schedule's table."""
  s_total = len(bounds) - 1
  table = MakeTable(schedule_name, s_total, num_micro_batches,
                    num_virtual_stages)
  states = StageStates(table)
  return [PredictPartition(profiles[a:b], num_micro_batches,
                           KeepsActivations(recompute, k, s_total),
                           k == s_total - 1, states[k])
          for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def PredictDevices(stages: Sequence[PartitionPrediction],
                   table: schedule.Schedule) -> List[DevicePrediction]:
  """Per device of `table`: its stages' resident and gradients, and the
  most they hold at once over its actions (module docstring)."""
  out = []
  for d, (row, held) in enumerate(zip(table.order, Holding(table))):
    mine = table.StagesOf(d)
    kept = max(sum(stages[s].Kept([(i, f, a.phase == 'B' and a.stage == s)])
                   for s, (i, f) in at.items())
               for a, at in zip(row, held))
    out.append(DevicePrediction(
        stages=tuple(mine),
        resident_bytes=sum(stages[s].resident_bytes for s in mine),
        gradient_bytes=sum(stages[s].gradient_bytes for s in mine),
        kept_bytes=kept))
  return out


# ---- time -----------------------------------------------------------------

Task = Tuple[str, int, int]  # (phase, stage, micro-batch)


def Simulate(forward_s: Sequence[float], backward_s: Sequence[float],
             num_micro_batches: int, overhead_s: float = 0.0,
             hop_s: Sequence[float] = (), schedule_name: str = 'gpipe',
             num_virtual_stages: int = 1) -> schedule.Simulation:
  """The schedule's table for these S stages run with these costs
  (module docstring); `hop_s` has one entry per boundary (S - 1), or none
  for free hops."""
  table = MakeTable(schedule_name, len(forward_s), num_micro_batches,
                    num_virtual_stages)
  return schedule.Simulate(table, forward_s, backward_s, overhead_s,
                           list(hop_s) if len(hop_s) else None)


def TaskTimes(forward_s: Sequence[float], backward_s: Sequence[float],
              num_micro_batches: int, overhead_s: float = 0.0,
              hop_s: Sequence[float] = (), schedule_name: str = 'gpipe',
              num_virtual_stages: int = 1
              ) -> Dict[Task, Tuple[float, float]]:
  """(start, end) of every action of the schedule (module docstring)."""
  sim = Simulate(forward_s, backward_s, num_micro_batches, overhead_s,
                 hop_s, schedule_name, num_virtual_stages)
  return {(a.phase, a.stage, a.micro_batch): t for a, t in sim.times.items()}


def StepSeconds(forward_s: Sequence[float], backward_s: Sequence[float],
                num_micro_batches: int, overhead_s: float = 0.0,
                hop_s: Sequence[float] = (), schedule_name: str = 'gpipe',
                num_virtual_stages: int = 1) -> float:
  """The schedule's critical path: when the last action ends."""
  return Simulate(forward_s, backward_s, num_micro_batches, overhead_s,
                  hop_s, schedule_name, num_virtual_stages).step


def IdleFraction(forward_s: Sequence[float], backward_s: Sequence[float],
                 num_micro_batches: int, overhead_s: float = 0.0,
                 hop_s: Sequence[float] = (), schedule_name: str = 'gpipe',
                 num_virtual_stages: int = 1) -> float:
  """Predicted bubble: idle share of the devices over the step (a hop
  counts as idle: the device waits for it)."""
  return Simulate(forward_s, backward_s, num_micro_batches, overhead_s,
                  hop_s, schedule_name, num_virtual_stages).bubble
