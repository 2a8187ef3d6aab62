"""Pipeline schedules as tables: which device runs which action, in order.

A schedule is data. S stages (the pipeline's cells) run on K devices,
stage s on device `stage_devices[s]`; M micro-batches flow through them.
An action is one unit of work on one micro-batch:

  F(s, m)  forward of stage s on micro-batch m (the last stage's forward
           also computes that micro-batch's loss when training)
  B(s, m)  backward: d(stage input) and d(stage variables) of micro-batch m
  W(s, m)  in a table that splits its backwards (zero bubble), B(s, m) makes
           d(stage input) only and W(s, m) d(stage variables)
  A(s)     with data-parallel replicas, the all-reduce of stage s's
           gradient over its copies, after the stage's last B (or W) on
           its device (`WithAllReduce`; written A(s, 0))

`order[d]` lists device d's actions in the order it runs them; the
pipeline emits them in exactly that order (control dependencies), so a
new schedule is a new table and nothing else. Generators (K=2, M=4,
digits are micro-batches, stage s on device s mod K):

  GPipe: every forward, then every backward in reverse
    dev 0:  F0 F1 F2 F3 .  .  B3 B2 B1 B0
    dev 1:  .  F0 F1 F2 F3 B3 B2 B1 B0
  1F1B (PipeDream-flush): K-1-d forwards to warm up, then one forward
  and one backward in turn; stage d holds at most K-d micro-batches
    dev 0:  F0 F1 .  B0 F2 B1 F3 B2 .  B3
    dev 1:  .  F0 B0 F1 B1 F2 B2 F3 B3
  Interleaved 1F1B (V stages per device, M a multiple of K): forwards
  go through the device's stages in groups of K micro-batches, with
  2(K-1-d) + (V-1)K forwards of warm-up; the bubble shrinks V times.
  ZB-H1 (zero bubble, Qi et al. 2023): 1F1B with the backward split in
  B and W; device d lets up to d W's wait, so B answers the previous
  stage at once and the W's fill the gaps; with F = B = W the bubble is a
  third of 1F1B's, and no stage holds more than K micro-batches
    dev 0:  F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3
    dev 1:  .  F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3
  Any table with kept activations may also split its backwards in place
  (`SplitBackwards`: each B followed at once by its W), e.g. 1F1B's
    dev 0:  F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 .  B3 W3
    dev 1:  .  F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3

`Validate` checks a table: every action once, on its stage's device,
every dependency met without deadlock; its error names the first bad
action. `Simulate` runs a table with per-action costs (unit, or measured)
and gives each action's start and end, the step length, each device's
idle share, and the micro-batches each stage and device holds at once:
every figure that depends on the order comes from there.
"""

from __future__ import annotations

import dataclasses
from typing import (Callable, Dict, Iterable, List, Optional, Sequence,
                    Tuple)

PHASES = ('F', 'B', 'W')
ALL_REDUCE = 'A'


@dataclasses.dataclass(frozen=True, order=True)
class Action:
  """Phase 'F', 'B' or 'W' of micro-batch `micro_batch` on stage `stage`;
  'A' (micro_batch 0): stage `stage`'s all-reduce."""
  phase: str
  stage: int
  micro_batch: int

  def __str__(self) -> str:
    return f'{self.phase}(stage {self.stage}, micro-batch {self.micro_batch})'

  @property
  def short(self) -> str:
    """'F3' / 'B3': the micro-batch only, as pictures label it; 'A'."""
    if self.phase == ALL_REDUCE:
      return ALL_REDUCE
    return f'{self.phase}{self.micro_batch}'


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A table: per device, its actions in order (module docstring)."""
  name: str
  num_micro_batches: int
  stage_devices: Tuple[int, ...]
  order: Tuple[Tuple[Action, ...], ...]
  # Whether its backwards were split after its generator made it
  # (SplitBackwards), as a zero-bubble table's, split by its generator,
  # are not.
  split_in_place: bool = False

  @property
  def num_stages(self) -> int:
    return len(self.stage_devices)

  @property
  def num_devices(self) -> int:
    return len(self.order)

  @property
  def split_backward(self) -> bool:
    """Whether backwards are split: B makes d inputs, W d variables."""
    return any(a.phase == 'W' for row in self.order for a in row)

  def StagesOf(self, device: int) -> List[int]:
    return [s for s, d in enumerate(self.stage_devices) if d == device]

  def Actions(self, phase: Optional[str] = None) -> List[Action]:
    """Every action of the table, device by device."""
    return [a for row in self.order for a in row
            if phase is None or a.phase == phase]

  def Only(self, phase: str) -> 'Schedule':
    """The same table with only `phase`'s actions (e.g. the forwards)."""
    return dataclasses.replace(self, order=tuple(
        tuple(a for a in row if a.phase == phase) for row in self.order))

  def Text(self) -> str:
    """One line per device: its actions in order (for errors, docs)."""
    return '\n'.join(f'dev {d}: ' + ' '.join(
        f'{a.phase}{a.stage}.{a.micro_batch}' for a in row)
                     for d, row in enumerate(self.order))


def _Check(num_devices: int, num_micro_batches: int,
           num_virtual_stages: int) -> None:
  if num_devices < 1 or num_micro_batches < 1 or num_virtual_stages < 1:
    raise ValueError(
        f'A schedule needs K >= 1 devices, M >= 1 micro-batches and V >= 1 '
        f'stages per device, got K={num_devices}, M={num_micro_batches}, '
        f'V={num_virtual_stages}.')


def LoopedStageDevices(num_devices: int,
                       num_virtual_stages: int = 1) -> Tuple[int, ...]:
  """Stage s on device s mod K, for K x V stages."""
  return tuple(s % num_devices
               for s in range(num_devices * num_virtual_stages))


def GPipe(num_devices: int, num_micro_batches: int,
          num_virtual_stages: int = 1,
          stage_devices: Optional[Sequence[int]] = None) -> Schedule:
  """Every forward, then every backward (module docstring).

  Forwards in order of the clock tick s + m (then stage), backwards in
  the reverse of that order: with V = 1, F(k, m) at tick k + m. Stages
  on `stage_devices` (default: stage s on device s mod K), so any
  schedule's placement has a GPipe order (FProp's).
  """
  _Check(num_devices, num_micro_batches, num_virtual_stages)
  stage_devices = tuple(stage_devices if stage_devices is not None else
                        LoopedStageDevices(num_devices, num_virtual_stages))
  order = []
  for d in range(num_devices):
    fwd = sorted(((s + m, s, m) for s in range(len(stage_devices))
                  if stage_devices[s] == d
                  for m in range(num_micro_batches)))
    order.append(tuple([Action('F', s, m) for _, s, m in fwd] +
                       [Action('B', s, m) for _, s, m in reversed(fwd)]))
  return Schedule('gpipe', num_micro_batches, stage_devices, tuple(order))


def OneFOneB(num_devices: int, num_micro_batches: int) -> Schedule:
  """PipeDream-flush 1F1B: device d warms up with K-1-d forwards.

  Then it alternates one forward and one backward, oldest micro-batch
  first, and ends with the backwards left: at most K-d micro-batches in
  flight on stage d, whatever M.
  """
  _Check(num_devices, num_micro_batches, 1)
  k, m_total = num_devices, num_micro_batches
  order = tuple(
      WarmUpThenAlternate([Action('F', d, m) for m in range(m_total)],
                          [Action('B', d, m) for m in range(m_total)],
                          k - 1 - d)
      for d in range(k))
  return Schedule('1f1b', m_total, LoopedStageDevices(k), order)


def WarmUpThenAlternate(forwards: List[Action], backwards: List[Action],
                        warmup: int) -> Tuple[Action, ...]:
  """`warmup` forwards (at most all), then one forward and one backward
  in turn, then the backwards left: one device's row of a 1F1B table."""
  warmup = min(warmup, len(forwards))
  row = forwards[:warmup]
  for f, b in zip(forwards[warmup:], backwards):
    row += [f, b]
  return tuple(row + backwards[len(forwards) - warmup:])


def Interleaved1F1B(num_devices: int, num_micro_batches: int,
                    num_virtual_stages: int) -> Schedule:
  """Interleaved 1F1B (Narayanan et al. 2021): V stages per device.

  Device d runs stages d, d + K, ..., d + (V-1)K. Its i-th forward is on
  micro-batch (i // KV) K + i mod K of its stage number (i mod KV) // K;
  its i-th backward the same with the stages taken last first. It warms
  up with 2(K-1-d) + (V-1)K forwards (at most MV), then alternates.
  """
  _Check(num_devices, num_micro_batches, num_virtual_stages)
  k, m_total, v = num_devices, num_micro_batches, num_virtual_stages

  def Nth(i: int, phase: str, d: int) -> Action:
    group, within = divmod(i, k * v)
    chunk = within // k
    if phase == 'B':
      chunk = v - 1 - chunk
    return Action(phase, chunk * k + d, group * k + within % k)

  total = m_total * v
  order = tuple(
      WarmUpThenAlternate([Nth(i, 'F', d) for i in range(total)],
                          [Nth(i, 'B', d) for i in range(total)],
                          2 * (k - 1 - d) + (v - 1) * k)
      for d in range(k))
  return Schedule('interleaved_1f1b', m_total, LoopedStageDevices(k, v),
                  order)


def ZeroBubbleH1(num_devices: int, num_micro_batches: int) -> Schedule:
  """ZB-H1: 1F1B's order with each backward split into B and W.

  Device d warms up with K-1-d forwards, then runs one forward and one B
  in turn, oldest first; a W waits while at most d others wait (the last
  device defers most: its B's are what every earlier device is waiting
  for); each B of the cool-down is followed by the oldest W, and the W's
  left end the table. Every stage holds at most K micro-batches between
  F and W; with F, B and W of one cost each the bubble is
  (K-1)/(3M+K-1), against 1F1B's (K-1)/(M+K-1).
  """
  one_f = OneFOneB(num_devices, num_micro_batches)
  order = []
  for d, row in enumerate(one_f.order):
    forwards_left = sum(a.phase == 'F' for a in row)
    waiting: List[int] = []
    out = []
    for a in row:
      out.append(a)
      forwards_left -= a.phase == 'F'
      if a.phase == 'B':
        waiting.append(a.micro_batch)
        if len(waiting) > d or not forwards_left:
          out.append(Action('W', d, waiting.pop(0)))
    order.append(tuple(out + [Action('W', d, m) for m in waiting]))
  return Schedule('zb_h1', num_micro_batches, one_f.stage_devices,
                  tuple(order))


def SplitBackwards(table: Schedule) -> Schedule:
  """`table` with each B(s, m) followed at once by W(s, m): the same order
  and the same micro-batches held, but the input gradient goes to the
  previous stage before the weight gradient is made. A table that already
  splits its backwards is returned as it is."""
  if table.split_backward:
    return table
  return dataclasses.replace(table, split_in_place=True, order=tuple(
      tuple(x for a in row for x in (
          (a, Action('W', a.stage, a.micro_batch)) if a.phase == 'B'
          else (a,)))
      for row in table.order))


# ---- definitions: each schedule with the rules its tables need ------------


@dataclasses.dataclass(frozen=True)
class Definition:
  """A schedule: its generator, its placement and the rules it needs.

  `make(K, M, V)` returns the table (Make validates it); `placement(K, V)`
  the device of each of the K x V stages, known before M (a layer places
  its variables at construction). The rules, checked by `registry.Check`
  with one line naming the schedule, the rule and what to set:

    stages_per_device   (least, most) V; most None: any
    splits_backward     its tables split each backward in B and W, which
                        needs every stage's activations (recompute 'never')
    m_multiple_of_k     M a multiple of K
    least_micro_batches M >= this function of K (e.g. K)

  `searched`: its table is searched from costs (unit costs here; the
  planner searches with measured ones and writes a file).

  A table read from a file (`schedule_file.Definition`) fixes K, S and M:
  `num_devices`, `num_stages` and `num_micro_batches` are then set.
  """
  name: str
  make: Callable[[int, int, int], 'Schedule']
  placement: Callable[[int, int], Tuple[int, ...]] = (
      lambda k, v: LoopedStageDevices(k, v))
  stages_per_device: Tuple[int, Optional[int]] = (1, 1)
  splits_backward: bool = False
  m_multiple_of_k: bool = False
  least_micro_batches: Callable[[int], int] = lambda k: 1
  searched: bool = False
  num_devices: Optional[int] = None
  num_stages: Optional[int] = None
  num_micro_batches: Optional[int] = None

  def NumDevices(self, num_stages: int, num_virtual_stages: int) -> int:
    """K for S stages, V a device (a file's own K)."""
    if self.num_devices is not None:
      return self.num_devices
    return num_stages // max(num_virtual_stages, 1)


_DEFINED: Dict[str, Definition] = {}


def Register(definition: Definition) -> Definition:
  """Makes `definition` known by its name (p.schedule; registry.py lists
  and checks every one); a second definition of the same name replaces
  the first."""
  _DEFINED[definition.name] = definition
  return definition


def Unregister(name: str) -> None:
  """Forgets the definition registered as `name` (e.g. a test's own)."""
  _DEFINED.pop(name, None)


def Defined() -> Dict[str, Definition]:
  """Every registered definition by name, in registration order (the
  registry imports the schedules defined in other files first)."""
  return dict(_DEFINED)


def WithAllReduce(table: Schedule) -> Schedule:
  """`table` with A(s) right after stage s's last B (W if the table splits
  its backwards) on its device: the stage's gradient is final there, and
  its all-reduce over the replicas can run while the device goes on with
  its other stages' backwards. Stages without a backward in the table
  (a table of forwards) get none."""
  last = 'W' if table.split_backward else 'B'
  order = []
  for row in table.order:
    final = {a.stage: i for i, a in enumerate(row) if a.phase == last}
    after = {i: s for s, i in final.items()}
    out: List[Action] = []
    for i, a in enumerate(row):
      if a.phase == ALL_REDUCE:
        continue
      out.append(a)
      if i in after:
        out.append(Action(ALL_REDUCE, after[i], 0))
    order.append(tuple(out))
  return dataclasses.replace(table, order=tuple(order))


# ---- validation ------------------------------------------------------------


def Dependencies(action: Action, num_stages: int) -> List[Action]:
  """The actions whose outputs `action` reads."""
  s, m = action.stage, action.micro_batch
  if action.phase == ALL_REDUCE:
    return []  # after its stage's backwards on the same device (Validate)
  if action.phase == 'F':
    return [Action('F', s - 1, m)] if s else []
  if action.phase == 'W':
    return [Action('B', s, m)]
  deps = [Action('F', s, m)]
  if s + 1 < num_stages:
    deps.append(Action('B', s + 1, m))
  return deps


def Validate(table: Schedule) -> None:
  """Raises ValueError naming the first bad action; None if the table runs.

  Checks: every stage has a device; each device lists only actions of its
  own stages; every F and B (and W, if the table splits its backwards) of
  every (stage, micro-batch) appears exactly once, and an A(s), if any,
  once per stage after its every backward; and the table runs to the end,
  each device in its order, every action after the actions it reads (no
  deadlock).
  """
  where = f"Schedule '{table.name}'"
  num_stages, m_total = table.num_stages, table.num_micro_batches
  for s, d in enumerate(table.stage_devices):
    if not 0 <= d < table.num_devices:
      raise ValueError(f'{where}: stage {s} is on device {d}, but the table '
                       f'has devices 0..{table.num_devices - 1}.')
  seen = set()
  last = 'W' if table.split_backward else 'B'
  for d, row in enumerate(table.order):
    for i, a in enumerate(row):
      if a.phase == ALL_REDUCE and a.micro_batch == 0 and (
          0 <= a.stage < num_stages):
        early = [b for b in row[i + 1:]
                 if b.phase == last and b.stage == a.stage]
        if early:
          raise ValueError(f'{where}: {a} on device {d} comes before '
                           f'{early[0]}; the all-reduce goes after the '
                           "stage's last backward.")
      elif a.phase not in PHASES or not (
          0 <= a.stage < num_stages and 0 <= a.micro_batch < m_total):
        raise ValueError(f'{where}: device {d} lists {a}, which is not an '
                         f'action of {num_stages} stages and {m_total} '
                         'micro-batches.')
      if table.stage_devices[a.stage] != d:
        raise ValueError(
            f'{where}: {a} is on device {d}, but stage {a.stage} runs on '
            f'device {table.stage_devices[a.stage]}.')
      if a in seen:
        raise ValueError(f'{where}: {a} appears twice.')
      seen.add(a)
  for phase in PHASES if table.split_backward else ('F', 'B'):
    for s in range(num_stages):
      for m in range(m_total):
        if Action(phase, s, m) not in seen:
          raise ValueError(f'{where}: {Action(phase, s, m)} is missing.')
  RunOrder(table)


def RunOrder(table: Schedule, done_before: Iterable[Action] = ()
             ) -> List[Tuple[int, Action]]:
  """(device, action) in an order that meets every dependency.

  Devices take turns: each runs its next actions while their inputs are
  done (`done_before`: actions already run, for a table of backwards that
  follows its forwards). Raises ValueError naming the first action that
  can never run.
  """
  done = set(done_before)
  pos = [0] * table.num_devices
  out: List[Tuple[int, Action]] = []
  total = sum(len(row) for row in table.order)
  while len(out) < total:
    progressed = False
    for d, row in enumerate(table.order):
      while pos[d] < len(row) and all(
          dep in done for dep in Dependencies(row[pos[d]], table.num_stages)):
        done.add(row[pos[d]])
        out.append((d, row[pos[d]]))
        pos[d] += 1
        progressed = True
    if not progressed:
      d = min(d for d in range(table.num_devices)
              if pos[d] < len(table.order[d]))
      a = table.order[d][pos[d]]
      missing = next(x for x in Dependencies(a, table.num_stages)
                     if x not in done)
      raise ValueError(
          f"Schedule '{table.name}' deadlocks: {a} on device {d} waits for "
          f'{missing}, which device {table.stage_devices[missing.stage]} '
          'never reaches first.')
  return out


# ---- simulation --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Simulation:
  """A table run with costs: times, idle shares and what is held."""
  table: Schedule
  times: Dict[Action, Tuple[float, float]]  # (start, end)
  step: float  # when the last action ends
  busy: Tuple[float, ...]  # per device: time in its actions
  peak_in_flight: Tuple[int, ...]  # per stage: micro-batches held at once
  peak_device_in_flight: Tuple[int, ...]  # per device, over its stages

  @property
  def bubble(self) -> float:
    """Idle share of the devices over the step (0 with one device)."""
    if self.step <= 0:
      return 0.0
    return 1.0 - sum(self.busy) / (len(self.busy) * self.step)

  def DeviceBubble(self, device: int) -> float:
    return 1.0 - self.busy[device] / self.step if self.step > 0 else 0.0


def _PerStage(values: Optional[Sequence[float]], num_stages: int,
              default: float, what: str) -> List[float]:
  if values is None:
    return [default] * num_stages
  values = list(values)
  if len(values) != num_stages:
    raise ValueError(f'{what} has {len(values)} entries for {num_stages} '
                     'stages; give one per stage.')
  return values


def Simulate(table: Schedule, forward_s: Optional[Sequence[float]] = None,
             backward_s: Optional[Sequence[float]] = None,
             overhead_s: float = 0.0,
             hop_s: Optional[Sequence[float]] = None,
             weight_s: Optional[Sequence[float]] = None,
             all_reduce_s: Optional[Sequence[float]] = None,
             hop_busy: Tuple[float, float] = (0.0, 0.0)) -> Simulation:
  """Runs the table: each action starts when its device's previous action
  and the actions it reads are done, and lasts its stage's cost.

  Costs are per stage (default: unit forwards, backwards twice as long;
  with split backwards B and W one unit each), plus `overhead_s` per
  action. `hop_s[s]` (one per stage boundary, S-1) delays a dependency
  between stage s and s+1 when they are on different devices: the
  hand-off of the activation forward and of its gradient back. A hand-off
  may also take the two devices' own time (worker processes copy it on
  their cores): `hop_busy` = (sender, receiver), the share of the hop
  each loses. The sender's next action starts that much later; the
  receiver's action lasts longer by its share of the part of the hop
  during which it was still running earlier actions (an idle receiver
  loses nothing). An A(s) lasts `all_reduce_s[s]` (default 0) and holds
  no device: its device goes on with its next action (the exchange runs
  beside it).
  """
  s_total = table.num_stages
  split = table.split_backward
  costs = {'F': _PerStage(forward_s, s_total, 1.0, 'forward_s'),
           'B': _PerStage(backward_s, s_total, 1.0 if split else 2.0,
                          'backward_s'),
           'W': _PerStage(weight_s, s_total, 1.0, 'weight_s'),
           ALL_REDUCE: _PerStage(all_reduce_s, s_total, 0.0,
                                 'all_reduce_s')}
  hops = list(hop_s) if hop_s is not None else [0.0] * max(s_total - 1, 0)
  if len(hops) != max(s_total - 1, 0):
    raise ValueError(f'hop_s has {len(hops)} entries for {s_total} stages; '
                     f'give one per boundary, {s_total - 1}.')
  devs = table.stage_devices
  free = [0.0] * table.num_devices
  busy = [0.0] * table.num_devices
  times: Dict[Action, Tuple[float, float]] = {}
  order = list(RunOrder(table))
  sends = _Sends(order, s_total, devs, hops) if hop_busy[0] else {}
  for d, a in order:
    ready, received = free[d], 0.0
    for dep in Dependencies(a, s_total):
      delay = 0.0
      if devs[dep.stage] != d:
        delay = hops[min(dep.stage, a.stage)]
        # The part of the hop while this device still ran earlier actions.
        received += min(delay, max(free[d] - times[dep][1], 0.0))
      ready = max(ready, times[dep][1] + delay)
    if a.phase == ALL_REDUCE:
      times[a] = (ready, ready + costs[a.phase][a.stage])
      continue
    cost = costs[a.phase][a.stage] + overhead_s + hop_busy[1] * received
    times[a] = (ready, ready + cost)
    sent = hop_busy[0] * sends.get(a, 0.0)
    free[d] = ready + cost + sent
    busy[d] += cost + sent
  stage_peak, device_peak = InFlight(table)
  step = max((e for _, e in times.values()), default=0.0)
  return Simulation(table, times, step, tuple(busy), stage_peak, device_peak)


def _Sends(order: Sequence[Tuple[int, Action]], s_total: int,
           devs: Sequence[int], hops: Sequence[float]
           ) -> Dict[Action, float]:
  """Per action, the hops of what it hands to other devices."""
  sends: Dict[Action, float] = {}
  for d, a in order:
    for dep in Dependencies(a, s_total):
      if devs[dep.stage] != d:
        sends[dep] = sends.get(dep, 0.0) + hops[min(dep.stage, a.stage)]
  return sends


def InFlight(table: Schedule) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
  """Most micro-batches held at once, per stage and per device.

  A micro-batch is held on stage s from F(s, m) until B(s, m), or until
  W(s, m) when the table splits its backwards: its input (and its
  activations when the stage keeps them) wait for it. The order on each
  device alone decides it, not the timing.
  """
  last = 'W' if table.split_backward else 'B'
  stage_peak = [0] * table.num_stages
  device_peak = [0] * table.num_devices
  for d, row in enumerate(table.order):
    held = {s: 0 for s in table.StagesOf(d)}
    for a in row:
      held[a.stage] += {'F': 1, last: -1}.get(a.phase, 0)
      stage_peak[a.stage] = max(stage_peak[a.stage], held[a.stage])
      device_peak[d] = max(device_peak[d], sum(held.values()))
  return tuple(stage_peak), tuple(device_peak)


def Ticks(table: Schedule) -> Dict[Action, int]:
  """Each action's start on a clock where every action takes one tick."""
  sim = Simulate(table, [1.0] * table.num_stages, [1.0] * table.num_stages)
  return {a: int(round(t[0])) for a, t in sim.times.items()}


def Timeline(table: Schedule) -> str:
  """The table as an ASCII chart: one row per device, one cell per tick
  (every action one tick; '.' is idle)."""
  ticks = Ticks(table)
  num_ticks = max(ticks.values()) + 1
  cells = [['.'] * num_ticks for _ in range(table.num_devices)]
  multi = table.num_stages > table.num_devices
  for a, t in ticks.items():
    label = f'{a.phase}{a.micro_batch}'
    cells[table.stage_devices[a.stage]][t] = (
        f'{label}s{a.stage}' if multi else label)
  width = max(len(c) for row in cells for c in row)
  return '\n'.join(
      f'dev {d}: ' + ' '.join(c.ljust(width) for c in row).rstrip()
      for d, row in enumerate(cells))


# ---- the schedules defined here --------------------------------------------

Register(Definition(
    'gpipe', GPipe, stages_per_device=(1, None)))
Register(Definition(
    '1f1b', lambda k, m, v: OneFOneB(k, m)))
Register(Definition(
    'interleaved_1f1b', Interleaved1F1B, stages_per_device=(2, None),
    m_multiple_of_k=True))
Register(Definition(
    'zb_h1', lambda k, m, v: ZeroBubbleH1(k, m), splits_backward=True))
