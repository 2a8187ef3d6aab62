"""Predicting a pipeline split's step and memory, and choosing K, M and
the schedule, from measured profiles; plan.py measures them and runs the
command line.

`Evaluate` splits the layers onto K devices for one (K, M, schedule) and
predicts the step by running the schedule's table with the profiles'
costs (step_model.Predict, schedule.Simulate); `Suggest` compares every
(K, M, schedule) the same way and picks as plan.py's docstring says.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.core import partitioner
from lingvo_pipe.core import schedule
from lingvo_pipe.core import schedule_search
from lingvo_pipe.core.schedules import registry
from lingvo_pipe.tools import budget_split
from lingvo_pipe.tools import layer_profile
from lingvo_pipe.tools import step_model
from lingvo_pipe.tools import transfer_profile

Profile = layer_profile.LayerProfile
Layout = step_model.Layout
_NEAR_BEST = 1.02  # suggestions within 2% of the fastest count as ties


@dataclasses.dataclass(frozen=True)
class Exchange:
  """Data parallelism: R replicas, each stage's gradient all-reduced over
  its R copies at `cost` (measured over two devices, plan.py's
  docstring)."""
  num_replicas: int = 1
  cost: transfer_profile.TransferCost = transfer_profile.TransferCost()

  def Seconds(self, param_bytes: int) -> float:
    return transfer_profile.AllReduceSeconds(self.cost, param_bytes,
                                             self.num_replicas)


def Bytes(x: float) -> str:
  return partitioner.Bytes(int(x))


# ---- one plan ------------------------------------------------------------


@dataclasses.dataclass
class PlanResult:
  """A split and its predictions; `str()` is the printed report."""
  name: str
  batch_size: int
  num_micro_batches: int
  recompute: str
  bounds: List[int]
  profiles: List[Profile]
  partitions: List[step_model.PartitionPrediction]  # one per stage
  step_s: float
  idle: float
  budget: Optional[int] = None
  why: str = ''
  # Set by Refine: one profile per partition, each measured whole, and
  # the cores of the devices they were measured on at once (None: one
  # after another).
  partition_profiles: Optional[List[Profile]] = None
  cores: Optional[List[int]] = None
  # What a boundary tensor costs to hand on (transfer_profile), and so
  # each boundary's hop per micro-batch (step_model's hop_s).
  transfer: transfer_profile.TransferCost = transfer_profile.TransferCost()
  hop_s: List[float] = dataclasses.field(default_factory=list)
  layout: Layout = Layout()
  # Per device: its stages' memory together, and its time in its actions
  # per step (the simulation's).
  devices: List[step_model.DevicePrediction] = dataclasses.field(
      default_factory=list)
  busy_s: List[float] = dataclasses.field(default_factory=list)
  why_schedule: str = ''  # set when the schedule was suggested
  # R > 1 replicas: the exchange, and each stage's all-reduce (A action).
  exchange: Exchange = Exchange()
  all_reduce_s: List[float] = dataclasses.field(default_factory=list)
  # The table predicted (for a searched schedule, the one found with
  # these costs: plan writes it as a .csv file).
  table: Optional[schedule.Schedule] = None

  @property
  def num_partitions(self) -> int:
    """S, the stages (K x V)."""
    return len(self.partitions)

  @property
  def num_devices(self) -> int:
    return self.num_partitions // self.layout.num_virtual_stages

  @property
  def peak_bytes(self) -> int:
    """The most one device holds."""
    return max(d.peak_bytes for d in self.devices)

  def Report(self) -> partitioner.BalanceReport:
    costs = budget_split.LayerCosts(self.profiles, self.recompute)
    parts = []
    for a, b in zip(self.bounds, self.bounds[1:]):
      layer_ps = self.profiles[a:b]
      parts.append(partitioner.PartitionStats(
          layer_names=tuple(p.name for p in layer_ps),
          layer_costs=tuple(costs[a:b]), cost=sum(costs[a:b]),
          num_params=sum(p.num_params for p in layer_ps),
          activation_bytes=sum(p.output_bytes for p in layer_ps)))
    return partitioner.BalanceReport(
        'time', self.num_micro_batches, tuple(parts),
        self.layout.schedule_name, self.layout.num_virtual_stages)

  def _Head(self) -> List[str]:
    m, v = self.num_micro_batches, self.layout.num_virtual_stages
    shape = (f'K={self.num_devices} devices x V={v} stages' if v > 1 else
             f'K={self.num_partitions} partitions')
    lines = [f"Plan for '{self.name}': {shape}, M={m} micro-batches "
             f'of {self.batch_size // m} (batch {self.batch_size}), '
             f'schedule {self.layout.schedule_name}' + (
                 ' (backwards split: split_backward)'
                 if self.layout.split_backward else '') +
             f', recompute={self.recompute}' + (
                 f', per replica of {self.exchange.num_replicas}'
                 if self.exchange.num_replicas > 1 else '') + (
                 f', budget {Bytes(self.budget)} per device'
                 if self.budget else '')]
    if self.why:
      lines.append(f'Suggested: {self.why}')
    if self.why_schedule:
      lines.append(f'Schedule: {self.why_schedule}')
    lines.append(
        f'Predicted step: {self.step_s:.3f} s (forward + backward of the '
        f'pipeline, the {self.layout.schedule_name} table run with these '
        f'costs and hand-offs); bubble {self.idle:.1%} idle')
    if self.hop_s and self.transfer.measured:
      lines.append('  Hand-offs per micro-batch, each way: ' + ', '.join(
          f'{i}->{i + 1} {h * 1e3:.2f} ms' for i, h in enumerate(self.hop_s))
          + f'; transfer {self.transfer}')
    elif self.hop_s:
      lines.append(f'  Hand-offs between partitions counted as free '
                   f'({self.transfer.between}; --cores measures them '
                   'between worker processes)')
    r = self.exchange.num_replicas
    if r > 1 and self.exchange.cost.measured:
      lines.append(f'  All-reduce over the {r} copies after each stage\'s '
                   'last backward: ' + ', '.join(
                       f'stage {s} {t * 1e3:.1f} ms'
                       for s, t in enumerate(self.all_reduce_s))
                   + f'; measured {self.exchange.cost}')
    elif r > 1:
      lines.append(f'  All-reduce over the {r} copies counted as free '
                   f'({self.exchange.cost.between})')
    return lines

  def _Memory(self) -> List[str]:
    how = ('each partition measured whole' if self.partition_profiles
           else 'sums of the layers measured one by one')
    if self.partition_profiles and self.cores:
      how += f', all at once on cores {self.cores}'
    split = any(p.weight_s for p in self.partitions)
    lines = [f'  part  F/micro    B/micro    {"W/micro    " * split}peak '
             f'memory = resident + gradients + kept activations ({how})']
    for i, part in enumerate(self.partitions):
      times = [part.forward_s, part.backward_s] + [part.weight_s] * split
      lines.append(
          f'  {i:<4}  ' + ''.join(f'{t * 1e3:7.2f} ms ' for t in times) +
          f'{Bytes(part.peak_bytes):>10} = {Bytes(part.resident_bytes)} '
          f'+ {Bytes(part.gradient_bytes)} + {Bytes(part.kept_bytes)}')
    if self.layout.num_virtual_stages > 1:
      for d, dev in enumerate(self.devices):
        lines.append(
            f'  device {d} (stages {", ".join(map(str, dev.stages))}): busy '
            f'{self.busy_s[d]:.3f} s of the step, peak '
            f'{Bytes(dev.peak_bytes)} = {Bytes(dev.resident_bytes)} + '
            f'{Bytes(dev.gradient_bytes)} + {Bytes(dev.kept_bytes)}')
    return lines

  def __str__(self) -> str:
    lines = self._Head() + self._Memory()
    over = [i for i, dev in enumerate(self.devices)
            if self.budget and dev.peak_bytes > self.budget]
    if over:
      what = ('partitions' if self.layout.num_virtual_stages == 1
              else 'devices')
      lines.append(
          f'  {what} {over} measured whole exceed the budget, which '
          'their layers\' sums fitted: raise --memory_budget or use more '
          'partitions or micro-batches.')
    if any(p.backward_peak_bytes is None
           for p in self.profiles + (self.partition_profiles or [])):
      lines.append(
          '  (activations from the traced gradient only: TensorFlow kept no '
          'allocator statistics here, so temporaries are not counted; '
          'python -m lingvo_pipe.tools.plan measures them)')
    lines.append(str(self.Report()))
    return '\n'.join(lines)


def OverBudget(result: PlanResult) -> str:
  """'' if every device fits; else what to change, one line."""
  if not result.budget or result.peak_bytes <= result.budget:
    return ''
  d, dev = max(enumerate(result.devices), key=lambda x: x[1].peak_bytes)
  return (f'memory_budget={Bytes(result.budget)} is too small for '
          f'K={result.num_devices} M={result.num_micro_batches} '
          f'{result.layout}: device {d} holds its stages {list(dev.stages)} '
          f'at once, {Bytes(dev.peak_bytes)}; raise --memory_budget to '
          f'{Bytes(dev.peak_bytes)} or use more devices.')


def Evaluate(name: str, profiles: Sequence[Profile], batch_size: int,
             num_partitions: int, m: int, recompute: str = 'always',
             budget: Optional[int] = None,
             transfer: Optional[transfer_profile.TransferCost] = None,
             layout: Layout = Layout(),
             exchange: Exchange = Exchange()) -> PlanResult:
  """The best split onto K = num_partitions devices (K x V stages) for M
  micro-batches in the layout's schedule, predicted."""
  n, v = len(profiles), layout.num_virtual_stages
  if not 1 <= num_partitions * v <= n:
    stages = f' x num_virtual_stages={v}' if v > 1 else ''
    raise ValueError(
        f'num_partitions={num_partitions}{stages} but the pipeline has {n} '
        f'layers; use between 1 and {n // v}.')
  layout.Table(num_partitions, m)  # the schedule's own error first
  try:
    bounds = budget_split.Split(profiles, num_partitions, m, recompute,
                                budget, layout)
  except partitioner.NoFeasibleSplit:
    raise ValueError(_TooSmall(profiles, num_partitions, m, recompute,
                               budget, layout)) from None
  result = Predicted(name, profiles, batch_size, bounds, m, recompute,
                      budget, transfer, layout, exchange)
  over = OverBudget(result)
  if over:
    raise ValueError(over)
  return result


def Predicted(name: str, profiles: Sequence[Profile], batch_size: int,
               bounds: List[int], m: int, recompute: str,
               budget: Optional[int],
               transfer: Optional[transfer_profile.TransferCost] = None,
               layout: Layout = Layout(),
               exchange: Exchange = Exchange()) -> PlanResult:
  """The prediction for a split; each boundary's hop is `transfer` of the
  last layer's output before it (one micro-batch), free between stages
  on one device; with replicas, each stage's all-reduce is `exchange` of
  its parameters' bytes."""
  s_total = len(bounds) - 1
  v = layout.num_virtual_stages
  table = step_model.MakeTable(layout.schedule_name, s_total, m, v,
                               recompute, layout.split_backward)
  parts = step_model.Predict(profiles, bounds, m, recompute,
                             layout.schedule_name, v, table=table)
  transfer = transfer or transfer_profile.TransferCost()

  def Hops(devs: Sequence[int]) -> List[float]:
    return [transfer.Seconds(profiles[b - 1].output_bytes)
            if devs[i] != devs[i + 1] else 0.0
            for i, b in enumerate(bounds[1:-1])]

  hops = Hops(table.stage_devices)
  if registry.Lookup(layout.schedule_name).searched:
    # The table searched with these costs (the stages' costs do not
    # depend on the order; what they hold does: predicted again).
    _, table, hops = SearchPlacements(
        layout.schedule_name, m, [p.forward_s for p in parts],
        [p.backward_s for p in parts], [p.weight_s for p in parts],
        Placements(s_total // v, v), Hops)
    parts = step_model.Predict(profiles, bounds, m, recompute,
                               layout.schedule_name, v, table=table)
  all_reduce = [exchange.Seconds(sum(p.param_bytes for p in profiles[a:b]))
                for a, b in zip(bounds, bounds[1:])]
  replicated = exchange.num_replicas > 1
  sim = schedule.Simulate(
      schedule.WithAllReduce(table) if replicated else table,
      [p.forward_s for p in parts], [p.backward_s for p in parts], 0.0,
      hops, all_reduce_s=all_reduce if replicated else None,
      weight_s=[p.weight_s for p in parts] if table.split_backward else None,
      hop_busy=transfer.busy)
  return PlanResult(
      name=name, batch_size=batch_size, num_micro_batches=m,
      recompute=recompute, bounds=bounds, profiles=list(profiles),
      partitions=parts, step_s=sim.step, idle=sim.bubble, budget=budget,
      transfer=transfer, hop_s=hops, layout=layout,
      devices=step_model.PredictDevices(parts, table),
      busy_s=list(sim.busy), exchange=exchange,
      all_reduce_s=all_reduce if replicated else [], table=table)


def Placements(num_devices: int, num_virtual_stages: int
               ) -> List[Tuple[int, ...]]:
  """Every placement a registered schedule gives K devices of V stages
  (looped first; with V = 2 also ZB-V's V): where a search may put them."""
  out = []
  for name in registry.Names():
    try:
      registry.Check(name, num_devices * num_virtual_stages, None,
                     num_virtual_stages)
    except ValueError:
      continue
    placed = registry.Placement(name, num_devices, num_virtual_stages)
    if placed not in out:
      out.append(placed)
  return out


def SearchPlacements(name: str, m: int, forward_s: Sequence[float],
                     backward_s: Sequence[float], weight_s: Sequence[float],
                     placements: Sequence[Sequence[int]], hops_of: Any
                     ) -> Tuple[float, schedule.Schedule, List[float]]:
  """schedule_search.Search's table for the stages' costs on each of
  `placements`: (simulated step, table, hops) of the one with the
  shortest step, its hops `hops_of(placement)`."""
  best = None
  for devs in placements:
    hops = hops_of(devs)
    table = schedule_search.Search(devs, m, forward_s, backward_s, weight_s,
                                   hops, name=name)
    step = schedule.Simulate(table, forward_s, backward_s, hop_s=hops,
                             weight_s=weight_s).step
    if best is None or step < best[0]:
      best = (step, table, hops)
  return best


def InLayout(result: PlanResult, layout: Layout) -> PlanResult:
  """The same split and measurements predicted in another schedule (the
  partitions measured whole if `result` was refined, else its layers'
  sums): one profile, compared across schedules."""
  parts = result.partition_profiles
  k_stages = len(result.bounds) - 1
  predicted = Predicted(
      result.name, parts or result.profiles, result.batch_size,
      list(range(k_stages + 1)) if parts else result.bounds,
      result.num_micro_batches, result.recompute, result.budget,
      result.transfer, layout, result.exchange)
  return dataclasses.replace(
      predicted, bounds=result.bounds, profiles=result.profiles,
      partition_profiles=parts, cores=result.cores)


def _TooSmall(profiles: Sequence[Profile], k: int, m: int, recompute: str,
              budget: int, layout: Layout = Layout()) -> str:
  """One line: the budget K needs, and the K that fits this budget."""
  v = layout.num_virtual_stages
  need = budget_split.LeastPeak(profiles, k, m, recompute, layout)
  more = next((j for j in range(k + 1, len(profiles) // v + 1)
               if layout.HasTable(j, m) and budget_split.LeastPeak(
                   profiles, j, m, recompute, layout) <= budget), None)
  hint = (f'use K={more} partitions' if more else
          'no K fits at this M (try more micro-batches)')
  return (f'memory_budget={Bytes(budget)} is too small for K={k} M={m} '
          f'{layout}: its best split needs {Bytes(need)} on one device; '
          f'raise --memory_budget to {Bytes(need)} or {hint}.')


# ---- suggestions ---------------------------------------------------------


def Divisors(n: int) -> List[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def Layouts(schedule_name: str = '', num_virtual_stages: int = 1,
            recompute: str = '', split_backward: bool = False
            ) -> List[Layout]:
  """The schedules to compare: the given one, else every registered
  schedule whose rules allow V stages a device and the recompute mode
  (registry.Check); where every stage keeps its activations (recompute
  'never') each that does not split its backwards itself also with them
  split. Schedules searched from costs (schedule.Definition.searched) are
  left to `plan --schedule=auto`."""
  v = num_virtual_stages
  if schedule_name:
    return [Layout(schedule_name, v, split_backward)]
  whole, split, zero_bubble = [], [], []
  for name in registry.Names():
    defn = registry.Lookup(name)
    try:
      registry.Check(name, v, None, v, recompute or 'never')
    except ValueError:
      continue
    if defn.searched:
      continue
    if defn.splits_backward:
      zero_bubble.append(Layout(name, v))
      continue
    whole.append(Layout(name, v))
    if recompute == 'never':
      split.append(Layout(name, v, True))
  return whole + split + zero_bubble


def _Candidates(name: str, profiles_by_m: Dict[int, List[Profile]],
                batch_size: int, ks: Sequence[int], recompute: str,
                budget: Optional[int],
                transfer: Optional[transfer_profile.TransferCost],
                layouts: Sequence[Layout],
                exchange: Exchange = Exchange()
                ) -> Tuple[List[PlanResult], Any]:
  """Every (K, M, layout) whose best split fits, predicted; and the
  least memory (need, K, M, layout) of those that do not."""
  plans, smallest = [], None
  for m, profiles in sorted(profiles_by_m.items()):
    for k in ks:
      for layout in layouts:
        if (k * layout.num_virtual_stages > len(profiles) or
            not layout.HasTable(k, m)):
          continue
        try:
          bounds = budget_split.Split(profiles, k, m, recompute, budget,
                                      layout)
        except partitioner.NoFeasibleSplit:
          need = budget_split.LeastPeak(profiles, k, m, recompute, layout)
          smallest = min(smallest or (math.inf,), (need, k, m, layout),
                         key=lambda x: x[:3])
          continue
        plan = Predicted(name, profiles, batch_size, bounds, m, recompute,
                          budget, transfer, layout, exchange)
        if OverBudget(plan):
          smallest = min(smallest or (math.inf,),
                         (plan.peak_bytes, k, m, layout),
                         key=lambda x: x[:3])
          continue
        plans.append(plan)
  return plans, smallest


def Suggest(name: str, profiles_by_m: Dict[int, List[Profile]],
            batch_size: int, ks: Sequence[int], recompute: str = 'always',
            budget: Optional[int] = None,
            transfer: Optional[transfer_profile.TransferCost] = None,
            layouts: Sequence[Layout] = (Layout(),),
            exchange: Exchange = Exchange()) -> PlanResult:
  """The fastest predicted (K, M, schedule) that fits (plan.py's docstring)."""
  plans, smallest = _Candidates(name, profiles_by_m, batch_size, ks,
                                recompute, budget, transfer, layouts,
                                exchange)
  if not plans:
    need, k, m, layout = smallest
    if len(ks) == 1 and len(profiles_by_m) == 1 and len(layouts) == 1:
      raise ValueError(_TooSmall(profiles_by_m[m], k, m, recompute, budget,
                                 layout))
    raise ValueError(
        f'memory_budget={Bytes(budget)} fits no K in {list(ks)} and M in '
        f'{sorted(profiles_by_m)}; the least any needs is {Bytes(need)} '
        f'per device (K={k} M={m} {layout}): raise --memory_budget or add '
        'devices.')
  best = min(p.step_s for p in plans)
  near = [p for p in plans if p.step_s <= best * _NEAR_BEST]
  chosen = min(near, key=lambda p: (p.num_devices, p.num_micro_batches,
                                    p.peak_bytes))
  if len(ks) > 1 or len(profiles_by_m) > 1:
    chosen.why = _WhyShape(chosen, plans, budget)
  if len(layouts) > 1:
    chosen.why_schedule = _WhySchedule(chosen, plans, layouts)
  return chosen


def _WhyShape(chosen: PlanResult, plans: List[PlanResult],
              budget: Optional[int]) -> str:
  """One line: why this K and M."""
  shapes = {(p.num_devices, p.num_micro_batches) for p in plans}
  runner_up = sorted((p for p in plans if
                      (p.num_devices, p.num_micro_batches) !=
                      (chosen.num_devices, chosen.num_micro_batches)),
                     key=lambda p: p.step_s)[:1]
  fits = f' that fits {Bytes(budget)} per device' if budget else ''
  other = ''.join(f'; next K={p.num_devices} M={p.num_micro_batches} '
                  f'{p.layout} {p.step_s:.3f} s' for p in runner_up)
  return (f'K={chosen.num_devices} M={chosen.num_micro_batches}: '
          f'the fastest step{fits} by its layers\' sums '
          f'({chosen.step_s:.3f} s, {len(shapes)} (K, M) fit; fewest '
          f'devices, then micro-batches, then memory within 2%){other}.')


def _WhySchedule(chosen: PlanResult, plans: List[PlanResult],
                 layouts: Sequence[Layout]) -> str:
  """One line: why this schedule, against the others at the same K, M."""
  same = {p.layout: p for p in plans
          if (p.num_devices, p.num_micro_batches) ==
          (chosen.num_devices, chosen.num_micro_batches)}
  k, n = chosen.num_devices, len(chosen.profiles)
  reasons = []
  for layout in layouts:
    other = same.get(layout)
    if layout == chosen.layout:
      continue
    if not layout.HasTable(k, chosen.num_micro_batches):
      reasons.append(f'{layout} has no table for K={k} '
                     f'M={chosen.num_micro_batches}')
    elif other is None and k * layout.num_virtual_stages > n:
      reasons.append(f'{layout} needs more stages than the {n} layers')
    elif other is None:
      reasons.append(f'{layout} does not fit the budget there')
    elif other.step_s > chosen.step_s * _NEAR_BEST:
      reasons.append(f'{other.step_s / chosen.step_s - 1:.1%} faster than '
                     f'{layout} ({chosen.step_s:.3f} against '
                     f'{other.step_s:.3f} s)')
    else:
      less = other.peak_bytes - chosen.peak_bytes
      held = (f'{Bytes(less)} less than its {Bytes(other.peak_bytes)}'
              if less else 'the same')
      reasons.append(
          f'as fast as {layout} within 2% ({chosen.step_s:.3f} against '
          f'{other.step_s:.3f} s), holding {Bytes(chosen.peak_bytes)} per '
          f'device, {held}')
  return (f'{chosen.layout} at K={chosen.num_devices} '
          f'M={chosen.num_micro_batches}: ' + '; '.join(reasons) + '.')
