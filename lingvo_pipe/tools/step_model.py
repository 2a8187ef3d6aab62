"""Predicted time and memory of one PipeliningLayer training step.

From measured per-layer costs (`layer_profile.LayerProfile`) and a split
into S stages (K devices, V stages each, placed as the schedule's table
places them), per stage s and micro-batch:

  F_s  = sum of its layers' forward_s
  B_s  = sum of its layers' backward_s, + F_s if it re-computes its forward
         (recompute 'always'; 'except_last' for all but the last)

and in a table that splits its backwards (a zero-bubble schedule, or
split_backward; recompute 'never'),
B_s and G_s, the input-gradient and the weight-gradient half as that
table's B and W run them, each measured (layer_profile's
input_backward_s and weight_backward_s).

Step time is the end of the schedule's table (registry.Make: any
registered schedule, or a .csv table) run with these costs by
`schedule.Simulate`:
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

Between worker processes a hop also takes both devices' cores for a
measured share of it (transfer_profile.MeasureBusy; `plan` passes it to
schedule.Simulate as hop_busy).

Memory of stage s, for one step, in bytes: resident, params P_s +
optimizer slots S_s; during each action of its device, the sum of
  gradients  P_s once the running sum of the gradients exists: after the
             stage's first backward (W if split), which adds its
             gradients to zeros the runtime folds away; with M = 1, only
             after its one backward
  kept       inputs x in_s: the micro-batch inputs it holds
             + in flight x H_s: the micro-batches from F(s, m) through
               B(s, m), each holding H_s = R_s if the stage keeps its
               activations, + out on the last stage (that micro-batch's
               output gradient: the loss head makes it as F(S-1, m) ends
               and frees the output, docs/DESIGN.md section 19)
             + waiting x C_s, split tables only: the micro-batches after
               B(s, m) through W(s, m), each holding what W reads: B's
               carry, the gradient at each of its layers' outputs
               (carry_bytes; + the inner outputs' gradients when summed
               over layers), the d y the stage got, and the residuals W
               reads (weight_read_bytes); B's other residuals are freed
             + during a backward of its own, its work: re-computing,
               max(W_s, P_s), W_s while one micro-batch is re-computed
               and differentiated, at least P_s: the backward call adds
               each gradient to the sum as it is made, into the
               gradient's own buffer, and the old sum, an input of the
               call, lives until the call ends (measured 2.00 P_s in all,
               docs/DESIGN.md section 26); keeping activations, K_s, the
               measured rise of the backward from kept residuals (B_s
               and G_s's rises where split), which holds its inputs to
               its end
the most of those sums over the actions is the stage's peak (resident +
gradients + kept at that action); the step memory (what a step adds over
the memory between steps) is the peak less resident.

The counts come from the table alone (`Holding`). In flight: F(s, m)
through B(s, m): M for GPipe, min(K - s, M) for 1F1B
(schedule.InFlight: through W(s, m) if split, here in flight then
waiting). An input is held through B(s, m) (W(s, m) if split) too, and
from earlier than F(s, m): a stage fed by another device from the action
before F(s, m) on its device (the input arrives while that action runs,
so 1F1B's stage s > 0 holds K - s + 1 inputs during its backwards); a
stage fed by its own device (V > 1, K = 1) from the action after
F(s - 1, m). Stage 0's inputs are slices of the
batch (views, on the batch axis), which lives through the step: all M,
whatever the schedule (an embedded batch is made in the step; a batch
fed to it is not, and then this over-counts by one batch's input).

  K=2 M=4 (inputs, in flight, waiting for W) at their most:
    gpipe  stage 0: (4, 4, 0)  stage 1: (4, 4, 0)  output gradients 4
    1f1b   stage 0: (4, 2, 0)  stage 1: (2, 1, 0)  output gradients 1
    zb_h1  stage 0: (4, 2, 0), (4, 1, 1)  stage 1: (2, 1, 1), (3, 0, 2)
           output gradients 2 (in flight or waiting)

A device with V > 1 stages holds their resident, gradients and, action
by action, the sum of what each stage holds (`PredictDevices`).

R_s is what the stage's gradient reads from its forward: its layers'
residual_bytes, plus the inputs of its inner layers that their gradients
read (input_read_bytes; the stage's own input is counted as in_s); in
H_s, the residuals as the allocator held them where measured
(kept_residual_bytes: TF shares some buffers between them).
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
K_s (without statistics: max(W_s, P_s) - R_s) is the same sum without
the residuals, which wait in H_s: max_j kept_peak_j + out_j (but where H_s
has it) + sum_{i>j} P_i; B_s's with input_peak_j and later layers'
carry_i for P_i; G_s's with weight_peak_j, without out_j (C_s has it).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.core import schedule
from lingvo_pipe.core.schedules import registry
from lingvo_pipe.tools import layer_profile

Profile = layer_profile.LayerProfile
# The schedules this model knows: F and B (and W) per stage and micro-batch,
# each micro-batch held from F(s, m) through its last backward action.
# During one action: (inputs held, micro-batches in flight, micro-batches
# between B and W, 1 if the running sum of the gradients exists, 'B' or 'W'
# if the action is one of this stage's backwards, else '').
Counts = Tuple[int, int, int, int]
State = Tuple[int, int, int, int, str]


@dataclasses.dataclass(frozen=True)
class PartitionPrediction:
  """One stage's predicted costs (module docstring); the per micro-batch
  terms input_bytes (in), hold_bytes (H), carry_bytes (C) and work_bytes
  (what its backward adds: the module docstring's work; during B where the
  table splits it, weight_work_bytes during W) let a device add up its
  stages. backward_s is B alone where the table splits it, then weight_s
  is W."""
  forward_s: float
  backward_s: float
  resident_bytes: int
  gradient_bytes: int
  kept_bytes: int
  input_bytes: int = 0
  hold_bytes: int = 0
  work_bytes: int = 0
  weight_s: float = 0.0
  carry_bytes: int = 0
  weight_work_bytes: int = 0
  sum_bytes: int = 0  # the running sum of the gradients, P

  @property
  def peak_bytes(self) -> int:
    return self.resident_bytes + self.gradient_bytes + self.kept_bytes

  @property
  def step_bytes(self) -> int:
    """What a step adds on top of the resident model: gradients and the
    kept activations."""
    return self.gradient_bytes + self.kept_bytes

  def Held(self, state: State) -> Tuple[int, int]:
    """(the running sum, what else it holds) during an action in `state`
    (module docstring)."""
    inputs, flight, waiting, sums, own = state
    return (sums * self.sum_bytes,
            inputs * self.input_bytes + flight * self.hold_bytes +
            waiting * self.carry_bytes +
            {'B': self.work_bytes, 'W': self.weight_work_bytes}.get(own, 0))


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
  """A schedule and its stages per device: K devices run K x V stages;
  with `split_backward`, each backward as B then W (PipeliningLayer's
  p.split_backward)."""
  schedule_name: str = 'gpipe'
  num_virtual_stages: int = 1
  split_backward: bool = False

  def __str__(self) -> str:
    v = self.num_virtual_stages
    return (self.schedule_name + (f' V={v}' if v > 1 else '') +
            (', split' if self.split_backward else ''))

  def Table(self, num_devices: int, m: int) -> schedule.Schedule:
    """registry.Make's table; raises its one-line ValueError."""
    return MakeTable(self.schedule_name,
                     num_devices * self.num_virtual_stages, m,
                     self.num_virtual_stages,
                     split_backward=self.split_backward)

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
              num_virtual_stages: int = 1, recompute: str = '',
              split_backward: bool = False) -> schedule.Schedule:
  """The table of S stages (registry.Make), checked by the schedule's own
  rules (registry.Check); with `recompute`, one a PipeliningLayer runs in
  that mode ('' skips that rule)."""
  k = registry.Check(schedule_name, num_stages, num_micro_batches,
                     num_virtual_stages, recompute or 'never',
                     split_backward)
  return registry.Make(schedule_name, k, num_micro_batches,
                       num_virtual_stages, split_backward=split_backward)


# ---- what each stage holds -------------------------------------------------


def _InputSpan(table: schedule.Schedule, pos: Dict[schedule.Action, int],
               d: int, s: int, m: int) -> range:
  """The positions in device d's row during which stage s holds input m
  (module docstring)."""
  row_end, b = len(table.order[d]), pos[_Last(table, s, m)]
  if s == 0:
    return range(row_end)
  if table.stage_devices[s - 1] == d:
    return range(pos[schedule.Action('F', s - 1, m)] + 1, b + 1)
  return range(max(pos[schedule.Action('F', s, m)] - 1, 0), b + 1)


def _Last(table: schedule.Schedule, s: int, m: int) -> schedule.Action:
  """The action after which stage s holds nothing of micro-batch m."""
  return schedule.Action('W' if table.split_backward else 'B', s, m)


def Holding(table: schedule.Schedule) -> List[List[Dict[int, Counts]]]:
  """Per device, per action in its order: {stage of the device: (inputs
  held, micro-batches in flight, micro-batches between B and W, 1 if the
  running sum exists)} while the action runs (module docstring). It
  depends on the order alone, not on the costs."""
  out = []
  for d, row in enumerate(table.order):
    pos = {a: i for i, a in enumerate(row)}
    counts = [{s: [0, 0, 0, 0] for s in table.StagesOf(d)} for _ in row]
    for s in table.StagesOf(d):
      lasts = [pos[_Last(table, s, m)]
               for m in range(table.num_micro_batches)]
      for i in range(min(lasts) + 1, len(row)):
        counts[i][s][3] = 1
      for m, last in enumerate(lasts):
        for i in _InputSpan(table, pos, d, s, m):
          counts[i][s][0] += 1
        b = pos[schedule.Action('B', s, m)]
        for i in range(pos[schedule.Action('F', s, m)], b + 1):
          counts[i][s][1] += 1
        for i in range(b + 1, last + 1):  # none unless split
          counts[i][s][2] += 1
    out.append([{s: tuple(c) for s, c in at.items()} for at in counts])
  return out


def _OwnBackward(a: schedule.Action, s: int) -> str:
  return a.phase if a.phase in ('B', 'W') and a.stage == s else ''


def StageStates(table: schedule.Schedule) -> List[List[State]]:
  """Per stage, the distinct (inputs, in flight, waiting for W, sum,
  own backward) over its device's actions."""
  states: List[set] = [set() for _ in range(table.num_stages)]
  for row, held in zip(table.order, Holding(table)):
    for a, at in zip(row, held):
      for s, counts in at.items():
        states[s].add(counts + (_OwnBackward(a, s),))
  return [sorted(x) for x in states]


# ---- memory ---------------------------------------------------------------


def PartitionResidualBytes(profiles: Sequence[Profile],
                           held: bool = False) -> int:
  """R of one stage's layers (module docstring); `held`: as the allocator
  held them after a kept forward where measured (kept_residual_bytes)."""
  measured = held and all(p.kept_residual_bytes is not None
                          for p in profiles)
  return (sum(p.kept_residual_bytes if measured else p.residual_bytes
              for p in profiles) +
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


def KeptWorkingBytes(part: Sequence[Profile], is_last: bool,
                     what: str) -> Optional[int]:
  """What the backward of a stage that keeps its activations adds while
  it runs (module docstring): 'kept' the whole backward, 'input' B,
  'weight' W; None where the layers' peaks were not measured."""
  peaks = [getattr(p, f'{what}_backward_peak_bytes') for p in part]
  if any(x is None for x in peaks):
    return None
  # What the later layers' backwards left: their gradients (B: carry).
  done = [p.carry_bytes if what == 'input' else p.param_bytes for p in part]
  later, most = sum(done), 0
  for j, (p, peak) in enumerate(zip(part, peaks)):
    later -= done[j]
    # The gradient arriving at its output, but where C or H has it.
    dy = (0 if what == 'weight' or (is_last and j == len(part) - 1)
          else p.output_bytes)
    most = max(most, later + peak + dy)
  return most


def _Halves(part: Sequence[Profile]) -> Tuple[float, float, int]:
  """(B_s, W_s, C_s) of a stage whose backward a table splits (module
  docstring)."""
  if any(p.input_backward_s is None or p.weight_backward_s is None
         for p in part):
    raise ValueError(
        f'{part[0].name}: a table that splits its backwards needs each '
        'backward measured in two halves; profile with '
        'keeps_activations=True '
        "(the planner does at recompute 'never').")
  return (sum(p.input_backward_s for p in part),
          sum(p.weight_backward_s for p in part),
          sum(p.carry_bytes + p.output_bytes + p.weight_read_bytes
              for p in part))


def PredictPartition(part: Sequence[Profile], num_micro_batches: int,
                     keeps: bool, is_last: bool,
                     states: Optional[Sequence[State]] = None,
                     split: bool = False) -> PartitionPrediction:
  """One stage of layers `part` (module docstring); `states` from
  StageStates, by default GPipe's: M inputs and M in flight; `split`: a
  table with W actions (the stage must keep its activations)."""
  m = num_micro_batches
  fwd = sum(p.forward_s for p in part)
  params = sum(p.param_bytes for p in part)
  residuals = PartitionResidualBytes(part) if keeps else 0
  held = PartitionResidualBytes(part, held=True) if keeps else 0
  backward, weight, carry = sum(p.backward_s for p in part), 0.0, 0
  work = max(BackwardWorkingBytes(part, is_last), params) - residuals
  weight_work = 0
  if keeps:
    if all(p.kept_backward_s is not None for p in part):
      backward = sum(p.kept_backward_s for p in part)
    work = _Or(KeptWorkingBytes(part, is_last, 'kept'), work)
  if split:
    backward, weight, carry = _Halves(part)
    work, weight_work = (_Or(KeptWorkingBytes(part, is_last, 'input'), work),
                         _Or(KeptWorkingBytes(part, is_last, 'weight'), 0))
  pred = PartitionPrediction(
      forward_s=fwd, weight_s=weight, carry_bytes=carry,
      backward_s=backward + (0.0 if keeps else fwd),
      resident_bytes=params + sum(p.slot_bytes for p in part),
      gradient_bytes=0, kept_bytes=0, input_bytes=part[0].input_bytes,
      hold_bytes=held + (part[-1].output_bytes if is_last else 0),
      work_bytes=work, weight_work_bytes=weight_work, sum_bytes=params)
  sums, kept = max(map(pred.Held, states or [(m, m, 0, int(m > 1), 'B')]),
                   key=sum)
  return dataclasses.replace(pred, gradient_bytes=sums, kept_bytes=kept)


def _Or(measured: Optional[int], otherwise: int) -> int:
  return otherwise if measured is None else measured


def Predict(profiles: Sequence[Profile], bounds: Sequence[int],
            num_micro_batches: int, recompute: str = 'always',
            schedule_name: str = 'gpipe', num_virtual_stages: int = 1,
            split_backward: bool = False,
            table: Optional[schedule.Schedule] = None
            ) -> List[PartitionPrediction]:
  """Per stage of the split `bounds` (MinMaxPartition's form), in the
  schedule's table (or `table`, one searched from costs)."""
  s_total = len(bounds) - 1
  if table is None:
    table = MakeTable(schedule_name, s_total, num_micro_batches,
                      num_virtual_stages, recompute, split_backward)
  states = StageStates(table)
  return [PredictPartition(profiles[a:b], num_micro_batches,
                           KeepsActivations(recompute, k, s_total),
                           k == s_total - 1, states[k], table.split_backward)
          for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def PredictDevices(stages: Sequence[PartitionPrediction],
                   table: schedule.Schedule) -> List[DevicePrediction]:
  """Per device of `table`: its stages' resident and gradients, and the
  most they hold at once over its actions (module docstring)."""
  out = []
  for d, (row, held) in enumerate(zip(table.order, Holding(table))):
    mine = table.StagesOf(d)
    sums, kept = max(
        ([sum(x) for x in zip(*[
            stages[s].Held(counts + (_OwnBackward(a, s),))
            for s, counts in at.items()])] for a, at in zip(row, held)),
        key=sum)
    out.append(DevicePrediction(
        stages=tuple(mine),
        resident_bytes=sum(stages[s].resident_bytes for s in mine),
        gradient_bytes=sums, kept_bytes=kept))
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
