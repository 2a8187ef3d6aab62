"""Zero-bubble tables made by simulation: W's in the gaps, and a search.

With the backward split (Qi et al. 2023, 'Zero Bubble Pipeline
Parallelism'), B(s, m) makes the input gradient, which stage s-1 waits
for, and W(s, m) the weight gradient, which nobody waits for: a W may run
whenever its device would idle. Both functions run in simulated time
(per-stage costs, per-boundary hops, as schedule.Simulate) and place an
action each time a device is free, the device free first (ties: lowest).

FillWeights keeps a table's F and B order per device, places the W's:

  x = device d's next F or B in the table, t = when d is free
  if more than max_waiting[d] W's wait:  run the oldest W
  elif x's inputs have arrived by t:     run x (a B's W starts waiting)
  elif a W waits:                        run the oldest W (fills the gap)
  else:                                  run x when its inputs arrive
  (no F or B left: the W's still waiting, oldest first)
  if each W right after its B (SplitBackwards) is shorter (a long W can
  overrun a short gap), return that instead

Search makes a table for any placement (looped, V-shaped, ...), as the
paper's automatic scheduling: warm up with the forwards memory allows,
then B's as soon as they can run, W's to fill gaps or to free memory.
Memory as schedule.InFlight counts it: (stage, micro-batch) pairs held
from F to W, summed over the device's stages.

  for each variant (warm-up cap, tie rule, W deferral limit, deeper
                    stage or older micro-batch first, W fit rule):
    d, t = the device free first, and when; d runs the first of
    1. the oldest W, if more W's wait than the deferral limit
    2. B(s, m) after F(s, m) once B(s+1, m) has arrived, or F(s, m)
       after F(s, m-1) once F(s-1, m) has arrived, if within the cap
       (max_in_flight[d]; before d's first B, the warm-up cap): by the
       tie rule, 'B', 'F', or 'other' than the phase d ran last
    3. the oldest W (a gap, or memory to free); with the fit rule, not
       if a known input arrives before the W would end
    4. nothing: d sleeps until its next input arrives
  candidates: with a looped placement the named tables (1F1B, ZB-H1,
  interleaved, GPipe), split or filled, with ZB-V's V placement ZB-V's
  table; then each variant's table (one is dropped as soon as it runs
  past the best step so far)
  return the one within max_in_flight that simulates shortest (ties: a
  named table, then fewest held: a searched table of the same simulated
  step as ZB-V's, fewer held, ran 3% slower on the workers, DESIGN 33)

No deadlock: an F of any micro-batch but the oldest part-way through d's
stages leaves room for that one's forwards left on d, so the oldest
unfinished micro-batch can always move (forwards run in micro-batch
order on each stage; a device needs max_in_flight >= its stages).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from lingvo_pipe.core import schedule

Action = schedule.Action
_Key = Tuple[str, int, int]  # an Action's phase, stage, micro-batch
_INF = math.inf


def _Checked(values: Optional[Sequence[float]], count: int, default: float,
             what: str) -> List[float]:
  """Per-stage costs (> 0) or per-boundary hops (>= 0), checked."""
  if values is None:
    return [default] * count
  values = [float(v) for v in values]
  if len(values) != count:
    raise ValueError(f'{what} has {len(values)} entries; give {count}.')
  hop = what == 'hop_s'
  if not all(v > 0 or (hop and v == 0) for v in values):
    raise ValueError(f'{what} must be {">= 0" if hop else "> 0"} each; got '
                     f'{values}.')
  return values


class _Timing:
  """Costs, and when each action placed so far ends."""

  def __init__(self, stage_devices, forward_s, backward_s, weight_s, hop_s):
    s_total = len(stage_devices)
    self.costs = {'F': _Checked(forward_s, s_total, 1.0, 'forward_s'),
                  'B': _Checked(backward_s, s_total, 1.0, 'backward_s'),
                  'W': _Checked(weight_s, s_total, 1.0, 'weight_s')}
    self.hops = _Checked(hop_s, max(s_total - 1, 0), 0.0, 'hop_s')
    self.devs = tuple(stage_devices)
    # Actions as (phase, stage, micro-batch) tuples, quick to hash.
    self.inputs: Dict[_Key, list] = {}  # (input, hop); kept by Fresh
    self.end: Dict[_Key, float] = {}
    self.arrival: Dict[_Key, float] = {}  # once every input is placed

  def Fresh(self) -> '_Timing':
    """The same costs, nothing placed."""
    other = copy.copy(self)
    other.end, other.arrival = {}, {}
    return other

  def Arrival(self, a: _Key) -> float:
    """When `a`'s inputs are on its device; infinity until all placed."""
    if a in self.arrival:
      return self.arrival[a]
    if a not in self.inputs:
      self.inputs[a] = [
          ((x.phase, x.stage, x.micro_batch), self.hops[min(x.stage, a[1])]
           if self.devs[x.stage] != self.devs[a[1]] else 0.0)
          for x in schedule.Dependencies(Action(*a), len(self.devs))]
    ends = [self.end.get(dep, _INF) + hop for dep, hop in self.inputs[a]]
    t = max(ends, default=0.0)
    if t < _INF:
      self.arrival[a] = t
    return t

  def Step(self, table: schedule.Schedule) -> float:
    return schedule.Simulate(table, self.costs['F'], self.costs['B'],
                             hop_s=self.hops, weight_s=self.costs['W']).step


def _Run(chooser, timing: _Timing, table: schedule.Schedule,
         bound: float = _INF) -> Optional[schedule.Schedule]:
  """`table` with the order the chooser makes (module docstring); None
  once an action would end after `bound`.

  `chooser` has Left(d) (work left), Pick(d, t) (the action to run at t,
  or None to sleep), Wake(d) (when d may next run something) and Ran(a).
  A device decides only once every earlier event is placed.
  """
  k = table.num_devices
  clock, asleep = [0.0] * k, [False] * k
  rows: List[List[_Key]] = [[] for _ in range(k)]
  while True:
    live = [d for d in range(k) if chooser.Left(d)]
    if not live:
      return dataclasses.replace(table, order=tuple(
          tuple(Action(*a) for a in row) for row in rows))
    d = min(live, key=lambda e: (clock[e], e))
    if clock[d] == _INF:
      raise ValueError(f"Schedule '{table.name}': every device waits.")
    a = chooser.Pick(d, clock[d])
    if a is None:
      asleep[d], clock[d] = True, chooser.Wake(d)
      continue
    asleep[d] = False
    timing.end[a] = clock[d] = clock[d] + timing.costs[a[0]][a[1]]
    if clock[d] > bound + 1e-9:
      return None
    rows[d].append(a)
    chooser.Ran(a)
    for s in (a[1] - 1, a[1] + 1):  # what `a` hands on may wake
      if 0 <= s < len(timing.devs) and asleep[timing.devs[s]]:
        clock[timing.devs[s]] = chooser.Wake(timing.devs[s])


class _Fixed:
  """FillWeights' chooser: the F and B order given, the W's free."""

  def __init__(self, bare: schedule.Schedule, timing: _Timing,
               max_waiting: Sequence[float]):
    self.rows = [collections.deque((a.phase, a.stage, a.micro_batch)
                                   for a in row) for row in bare.order]
    self.waiting = [collections.deque() for _ in bare.order]
    self.timing, self.limit = timing, max_waiting

  def Left(self, d: int) -> bool:
    return bool(self.rows[d] or self.waiting[d])

  def Pick(self, d: int, t: float) -> Optional[_Key]:
    row, waiting = self.rows[d], self.waiting[d]
    if waiting and (not row or len(waiting) > self.limit[d]):
      return waiting[0]
    if self.timing.Arrival(row[0]) <= t:
      return row[0]
    return waiting[0] if waiting else None

  def Wake(self, d: int) -> float:
    return self.timing.Arrival(self.rows[d][0]) if self.rows[d] else _INF

  def Ran(self, a: _Key) -> None:
    d = self.timing.devs[a[1]]
    (self.waiting if a[0] == 'W' else self.rows)[d].popleft()
    if a[0] == 'B':
      self.waiting[d].append(('W',) + a[1:])


def _Bare(table: schedule.Schedule) -> schedule.Schedule:
  """`table`'s F's and B's only, in its order."""
  return schedule.Schedule(
      name=table.name, num_micro_batches=table.num_micro_batches,
      stage_devices=tuple(table.stage_devices),
      order=tuple(tuple(a for a in row if a.phase in ('F', 'B'))
                  for row in table.order))


def FillWeights(table: schedule.Schedule,
                forward_s: Optional[Sequence[float]] = None,
                backward_s: Optional[Sequence[float]] = None,
                weight_s: Optional[Sequence[float]] = None,
                hop_s: Optional[Sequence[float]] = None,
                max_waiting: Optional[Sequence[int]] = None,
                name: Optional[str] = None) -> schedule.Schedule:
  """`table`'s F and B order per device, with W's placed in the gaps.

  Costs per stage (F = B = W = 1 by default), `hop_s` per boundary (0 by
  default), as schedule.Simulate. Device d lets at most `max_waiting[d]`
  W's wait (default: any number). `table`'s own W's (and A's: add them
  again with schedule.WithAllReduce) are dropped first. Never simulates
  longer than schedule.SplitBackwards of the F and B order. Validated;
  named `name` (default: `table`'s name + '_filled').
  """
  bare = _Bare(table)
  schedule.Validate(bare)
  limit = [_INF] * bare.num_devices
  if max_waiting is not None:
    limit = [int(w) for w in max_waiting]
    if len(limit) != bare.num_devices or min(limit, default=0) < 0:
      raise ValueError(f'max_waiting must be {bare.num_devices} counts >= '
                       f'0, one per device; got {list(max_waiting)}.')
  timing = _Timing(bare.stage_devices, forward_s, backward_s, weight_s,
                   hop_s)
  bare = dataclasses.replace(bare, name=name or f'{table.name}_filled')
  filled = _Run(_Fixed(bare, timing, limit), timing, bare)
  schedule.Validate(filled)
  in_place = schedule.SplitBackwards(bare)
  return in_place if timing.Step(filled) > timing.Step(in_place) else filled


@dataclasses.dataclass(frozen=True)
class _Variant:
  """One run of the greedy scheduler (module docstring)."""
  cap: Sequence[int]  # per device: most (stage, micro-batch) pairs held
  warm_up: Sequence[int]  # the same, before the device's first B
  prefer: str  # when an F and a B can both run: 'B', 'F' or 'other'
  max_waiting: Sequence[float]  # per device: most W's left waiting
  deep_first: bool  # deeper stage first, else older micro-batch first
  fit: bool  # no W into a gap it overruns (as far as arrivals are known)


class _Greedy:
  """Search's chooser: any ready action, by the variant's rules."""

  def __init__(self, stages: List[List[int]], num_micro_batches: int,
               timing: _Timing, variant: _Variant):
    self.stages, self.m_total = stages, num_micro_batches
    self.timing, self.v = timing, variant
    self.next_f = [0] * len(timing.devs)  # per stage, forwards in order
    self.pending: List[List[_Key]] = [[] for _ in stages]  # B's to run
    self.waiting = [collections.deque() for _ in stages]  # W's to run
    self.held = [0] * len(stages)  # (stage, micro-batch) pairs, F..W
    self.last = [''] * len(stages)  # the last F or B each device ran
    self.warm = [True] * len(stages)  # no B run yet

  def Left(self, d: int) -> bool:
    return bool(self.pending[d] or self.waiting[d] or any(
        self.next_f[s] < self.m_total for s in self.stages[d]))

  def _Forwards(self, d: int) -> List[_Key]:
    """The next F of each of d's stages that memory lets in."""
    cap = (self.v.warm_up if self.warm[d] else self.v.cap)[d]
    return [('F', s, self.next_f[s]) for s in self.stages[d]
            if self.next_f[s] < self.m_total and self._Fits(d, s, cap)]

  def _Fits(self, d: int, stage: int, cap: int) -> bool:
    """Whether F on `stage` fits: the oldest micro-batch part-way through
    d's stages always may; any other leaves room for the oldest's rest."""
    before = [self.next_f[s] for s in self.stages[d]]
    if self.next_f[stage] == before[-1] < before[0]:
      return self.held[d] + 1 <= cap
    after = [n + (s == stage) for n, s in zip(before, self.stages[d])]
    rest = sum(n <= after[-1] for n in after) if after[-1] < after[0] else 0
    return self.held[d] + 1 + rest <= cap

  def Pick(self, d: int, t: float) -> Optional[_Key]:
    waiting = self.waiting[d]
    if waiting and len(waiting) > self.v.max_waiting[d]:
      return waiting[0]
    key = ((lambda a: (-a[1], a[2])) if self.v.deep_first
           else (lambda a: (a[2], -a[1])))
    b, f = (min((x for x in xs if self.timing.Arrival(x) <= t), key=key,
                default=None)
            for xs in (self.pending[d], self._Forwards(d)))
    prefer = self.v.prefer
    if prefer == 'other':
      prefer = 'B' if self.last[d] == 'F' else 'F'
    for a in ((f, b) if prefer == 'F' else (b, f)):
      if a is not None:
        return a
    if waiting and self.v.fit and self.Wake(d) < t + self.timing.costs[
        'W'][waiting[0][1]]:
      return None  # an F or B arrives before the W would end
    return waiting[0] if waiting else None

  def Wake(self, d: int) -> float:
    return min((self.timing.Arrival(x)
                for x in self.pending[d] + self._Forwards(d)), default=_INF)

  def Ran(self, a: _Key) -> None:
    phase, stage, m = a
    d = self.timing.devs[stage]
    if phase == 'F':
      self.next_f[stage] += 1
      self.pending[d].append(('B', stage, m))
      self.held[d] += 1
    elif phase == 'B':
      self.pending[d].remove(a)
      self.waiting[d].append(('W', stage, m))
    else:
      self.waiting[d].popleft()
      self.held[d] -= 1
    if phase != 'W':
      self.last[d] = phase
      self.warm[d] = self.warm[d] and phase == 'F'


def _Variants(stages: List[List[int]], limit: List[int]) -> List[_Variant]:
  """Warm-ups (all the memory, less, or 1F1B's staircase), the three tie
  rules, three W deferral limits (any, d, none), both stage orders (with
  more than one stage a device), and W's into any gap or only a fit."""
  k, v_d = len(stages), [len(s) for s in stages]
  warm_ups = {tuple(max(v_d[d], limit[d] - r * v_d[d]) for d in range(k))
              for r in (0, 2)}
  warm_ups.add(tuple(max(v_d[d], limit[d] - d * v_d[d]) for d in range(k)))
  waits = sorted({(_INF,) * k, tuple(range(k)), (0,) * k})
  return [_Variant(*x) for x in itertools.product(
      [tuple(limit)], sorted(warm_ups), ('B', 'F', 'other'), waits,
      (False, True) if max(v_d) > 1 else (False,), (False, True))
          if max(x[3]) or not x[-1]]  # no W waits: nothing to fit


def _Named(devs: Tuple[int, ...], m: int) -> List[schedule.Schedule]:
  """The named tables of a looped placement, or ZB-V's of its V (none for
  another)."""
  from lingvo_pipe.core.schedules import zb_v  # pylint: disable=g-import-not-at-top
  k = max(devs) + 1
  v = len(devs) // k
  if devs == zb_v.VStageDevices(k):
    return [zb_v.ZeroBubbleV(k, m)]
  if devs != schedule.LoopedStageDevices(k, v):
    return []
  if v == 1:
    return [schedule.OneFOneB(k, m), schedule.ZeroBubbleH1(k, m),
            schedule.GPipe(k, m)]
  return [schedule.GPipe(k, m, v)] + (
      [schedule.Interleaved1F1B(k, m, v)] if m % k == 0 else [])


def _Limits(max_in_flight: Union[None, int, Sequence[int]],
            stages: List[List[int]]) -> List[int]:
  """Per device: most (stage, micro-batch) pairs held, checked."""
  k, need = len(stages), [len(s) for s in stages]
  if max_in_flight is None:
    return [k * n for n in need]
  limit = ([int(max_in_flight)] * k if isinstance(max_in_flight, int)
           else [int(x) for x in max_in_flight])
  if len(limit) != k or any(x < n for x, n in zip(limit, need)):
    raise ValueError(f'max_in_flight must give each of the {k} devices at '
                     f'least its number of stages, {need}; got {limit}.')
  return limit


def _Candidates(stages: List[List[int]], empty: schedule.Schedule,
                timing: _Timing, limit: List[int],
                bound: Callable[[], float]):
  """Search's tables: the named ones split or filled, then each variant's
  (dropped once it ends after `bound()`, the best step so far)."""
  for table in _Named(empty.stage_devices, empty.num_micro_batches):
    if table.split_backward:  # its own W's: as it is
      yield table, True
      continue
    bare, run = _Bare(table), timing.Fresh()
    yield schedule.SplitBackwards(table), True
    yield _Run(_Fixed(bare, run, [_INF] * len(stages)), run, bare), True
  seen = set()
  for variant in _Variants(stages, limit):
    run = timing.Fresh()
    table = _Run(_Greedy(stages, empty.num_micro_batches, run, variant),
                 run, empty, bound())
    if table is not None and table.order not in seen:
      seen.add(table.order)
      yield table, False


def Search(stage_devices: Sequence[int], num_micro_batches: int,
           forward_s: Optional[Sequence[float]] = None,
           backward_s: Optional[Sequence[float]] = None,
           weight_s: Optional[Sequence[float]] = None,
           hop_s: Optional[Sequence[float]] = None,
           max_in_flight: Union[None, int, Sequence[int]] = None,
           name: str = 'auto') -> schedule.Schedule:
  """A zero-bubble table (with W's) for stage s on stage_devices[s].

  Costs per stage (F = B = W = 1 by default), `hop_s` per boundary (0 by
  default), as schedule.Simulate. Device d holds at most
  `max_in_flight[d]` (stage, micro-batch) pairs from F to W, counted as
  schedule.InFlight counts them (an int: the same for every device).
  Default: K per stage of the device, i.e. K micro-batches' activations
  (ZB-H1's bound: K with one stage a device, 2K for V-shaped as ZB-V).
  Returns the candidate that simulates shortest (module docstring).
  """
  devs = tuple(int(d) for d in stage_devices)
  if not devs or min(devs) < 0 or num_micro_batches < 1:
    raise ValueError(f'Search needs stages on devices >= 0 and M >= 1; got '
                     f'stage_devices={devs}, M={num_micro_batches}.')
  stages = [[s for s, e in enumerate(devs) if e == d]
            for d in range(max(devs) + 1)]
  if not all(stages):
    raise ValueError(f'Every device needs a stage; got stage_devices={devs}.')
  timing = _Timing(devs, forward_s, backward_s, weight_s, hop_s)
  limit = _Limits(max_in_flight, stages)
  empty = schedule.Schedule(name=name, num_micro_batches=num_micro_batches,
                            stage_devices=devs, order=((),) * len(stages))
  best_key, best = (_INF,), None
  for table, named in _Candidates(stages, empty, timing, limit,
                                  lambda: best_key[0]):
    held = schedule.InFlight(table)[1]
    if any(h > x for h, x in zip(held, limit)):
      continue
    key = (round(timing.Step(table), 9), not named, max(held), sum(held))
    if key < best_key:
      best_key, best = key, table
  best = dataclasses.replace(best, name=name)
  schedule.Validate(best)
  return best
