"""The planner: how to pipeline a model, predicted before running it.

  python -m lingvo_pipe.tools.plan --model=image.synthetic.AmoebaNetTinyGPipe
      [--num_partitions=K] [--num_micro_batches=M] [--memory_budget=2GiB]
      [--schedule=gpipe|1f1b|interleaved_1f1b|zb_h1] [--num_virtual_stages=V]
      [--split_backward]
      [--num_devices=N] [--recompute=always|except_last|never]
      [--cores=0,1]

Measures each layer of the model's pipeline once on this host's first
device (layer_profile.py: forward and backward seconds at the micro-batch
size, activation bytes from the traced gradient), splits the layers into
K x V stages minimising the slowest stage's time per micro-batch among
the splits whose every stage fits the memory budget (the DP of
partitioner.MinMaxPartition, told each stage's place in the table: 1F1B's
stage k holds K - k micro-batches, GPipe's M), and prints the predicted
step time (the schedule's table run with those costs,
schedule.Simulate via step_model.py), each stage's peak memory (and each
device's with V > 1 stages per device), the bubble of that simulation and
the balance report.

The per-layer sums choose the split; the chosen split's partitions are
then measured again, each as one SequentialLayer (as the pipeline runs
it), and the prediction printed comes from those (`Refine`): summed
layers over-count a partition's memory, because TensorFlow's executor
overlaps one layer's backward with the next and frees residuals early
(docs/DESIGN.md section 18).

Each boundary's tensor is handed on once per micro-batch each way (the
activation forward, its gradient back). What that costs is measured once
between two of the target's devices (transfer_profile.py: worker servers
pinned to the first two --cores, else this process's first two devices)
and enters the schedule as a delay on each dependency across a boundary
(step_model's hop_s); the report prints each boundary's hop. The first
partition's backward is measured without the gradient of the pipeline's
input when the model's params class says the step makes none
(PIPELINE_INPUT_GRADIENT = False: images), as the pipeline runs it
(docs/DESIGN.md section 18).

A model of R > 1 data-parallel replicas (`task.train.num_replicas`) is
planned per replica (batch / R examples, M / R micro-batches), and each
stage's gradient is all-reduced over the R copies after its last
backward: an A action of the table (schedule.WithAllReduce) whose cost is
measured once like the hand-off (transfer_profile's all-reduce over two
devices, scaled to R copies: AllReduceSeconds) for the stage's parameter
bytes. The report prints each stage's.

Without K or M it suggests them: every K from 1 to the number of devices
and every M dividing the batch (measured again for each micro-batch
size), the fastest step by the layers' sums that fits; of those within
2% of it, the fewest devices, then the fewest micro-batches, then the
least memory on a device. Without --schedule it compares GPipe and 1F1B
(with V > 1, GPipe and interleaved 1F1B) for each (K, M) the same way:
their steps are often equal (the same bubble), and then 1F1B, holding at
most K - k micro-batches on stage k where GPipe holds all M, is chosen,
and under a tight budget it fits larger M or fewer devices; with
recompute 'never' it compares ZB-H1 too, each backward measured as its
two actions run it (layer_profile's keeps_activations). The report says
which schedule and why in one line.

To plan for worker processes pinned to one core each, run the planner
pinned the same way (`taskset -c 0 python -m lingvo_pipe.tools.plan ...`):
the measured layers then get one core, as each partition will. Give it
the workers' cores too (`--cores=0,1`): the chosen split's partitions are
then measured all at once, partition k in a process pinned to the k-th
core, so each is timed beside busy neighbours, as in the pipeline's
steady state (with V > 1 stages per device, each device's process
measures its stages one after another). Partitions sharing a host's caches and
memory slow each other: on an earlier VM AmoebaNet-D's first partition's
backward took 19% longer with the other core busy (docs/DESIGN.md
section 18). Without
--cores they are measured one after another on this process's device (a
GPU's partitions do not share one).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.core import quiet

tf = quiet.ImportTensorFlow()

from lingvo_pipe.core import cluster  # noqa: E402
from lingvo_pipe.core import devices as devices_lib  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.core import partitioner  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.tools import budget_split  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import model_pipeline  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402
from lingvo_pipe.tools import transfer_profile  # noqa: E402

Profile = layer_profile.LayerProfile
Layout = step_model.Layout
_NEAR_BEST = 1.02  # suggestions within 2% of the fastest count as ties
_UNITS = {'': 1, 'b': 1, 'kb': 1e3, 'mb': 1e6, 'gb': 1e9, 'kib': 2**10,
          'mib': 2**20, 'gib': 2**30, 'tib': 2**40}


@dataclasses.dataclass(frozen=True)
class Exchange:
  """Data parallelism: R replicas, each stage's gradient all-reduced over
  its R copies at `cost` (measured over two devices, module docstring)."""
  num_replicas: int = 1
  cost: transfer_profile.TransferCost = transfer_profile.TransferCost()

  def Seconds(self, param_bytes: int) -> float:
    return transfer_profile.AllReduceSeconds(self.cost, param_bytes,
                                             self.num_replicas)


def ParseBytes(text: str) -> Optional[int]:
  """'2GiB', '512 MiB', '1.5e9' -> bytes; '' or 'none' -> None."""
  text = text.strip()
  if text.lower() in ('', 'none'):
    return None
  match = re.fullmatch(r'([0-9.eE+]+)\s*([A-Za-z]*)', text)
  unit = match and _UNITS.get(match.group(2).lower())
  try:
    value = float(match.group(1)) * unit if unit else None
  except ValueError:
    value = None
  if value is None or value <= 0:
    raise ValueError(
        f'memory_budget={text!r} is not a size; write e.g. 2GiB, 512MiB '
        'or a number of bytes.')
  return int(value)


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


def _OverBudget(result: PlanResult) -> str:
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
  result = _Predicted(name, profiles, batch_size, bounds, m, recompute,
                      budget, transfer, layout, exchange)
  over = _OverBudget(result)
  if over:
    raise ValueError(over)
  return result


def _Predicted(name: str, profiles: Sequence[Profile], batch_size: int,
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
  table = layout.Table(s_total // v, m)
  parts = step_model.Predict(profiles, bounds, m, recompute,
                             layout.schedule_name, v, layout.split_backward)
  transfer = transfer or transfer_profile.TransferCost()
  devs = table.stage_devices
  hops = [transfer.Seconds(profiles[b - 1].output_bytes)
          if devs[i] != devs[i + 1] else 0.0
          for i, b in enumerate(bounds[1:-1])]
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
      all_reduce_s=all_reduce if replicated else [])


def MeasureTransfer(num_partitions: int,
                    cores: Optional[Sequence[int]] = None
                    ) -> transfer_profile.TransferCost:
  """What a boundary tensor costs between the target's devices: worker
  servers pinned to the first two `cores`, else this process's first two
  devices; nothing to measure with one device (num_partitions: K)."""
  if num_partitions < 2:
    return transfer_profile.TransferCost(between='one partition')
  return _MeasureOnTwoDevices('transfer', cores)


def MeasureAllReduce(num_replicas: int,
                     cores: Optional[Sequence[int]] = None
                     ) -> transfer_profile.TransferCost:
  """What an all-reduce over two of the target's devices costs, measured
  where MeasureTransfer measures; nothing to measure with R = 1."""
  if num_replicas < 2:
    return transfer_profile.TransferCost(between='one replica')
  return _MeasureOnTwoDevices('all_reduce', cores)


def _MeasureOnTwoDevices(what: str, cores: Optional[Sequence[int]]
                         ) -> transfer_profile.TransferCost:
  """transfer_profile's `what` on worker servers pinned to the first two
  `cores`, else on this process's first two devices."""
  if cores:
    return transfer_profile.MeasureBetweenCores(cores, what=what)
  devs = devices_lib.DefaultDevices()
  if len(devs) < 2:
    return transfer_profile.TransferCost(
        between='not measured: this process has one device')
  if what == 'all_reduce':
    return transfer_profile.MeasureAllReduce(devs[:2])
  return transfer_profile.Measure(devs[0], devs[1])


def Refine(result: PlanResult, layers: Sequence[Any], input_shapes: Any,
           optimizer_p: Any = None, num_runs: int = 5,
           cores: Optional[Sequence[int]] = None,
           transfer: Optional[transfer_profile.TransferCost] = None,
           input_gradient: bool = True,
           exchange: Optional[Exchange] = None) -> PlanResult:
  """`result` with its split's partitions measured whole (module
  docstring): `layers` are the pipeline's layer params, `input_shapes`
  the first layer's inputs for one micro-batch. With `cores` (one per
  partition), the partitions are measured all at once, each pinned to its
  core (layer_profile.ProfilePartitionsTogether; with V > 1 stages per
  device, one process per device measures its stages, one per core);
  else one after another on the current device. The hand-offs cost
  `transfer`, measured (MeasureTransfer) if not given. `input_gradient`:
  whether the step differentiates the pipeline's input
  (layer_profile.ProfileLayers'); a first partition that keeps its
  activations makes that gradient anyway, as the pipeline's does.
  `exchange`: the replicas' all-reduce, by default `result`'s."""
  input_gradient = input_gradient or step_model.KeepsActivations(
      result.recompute, 0, len(result.bounds) - 1)
  together = bool(cores)
  how = dict(optimizer_p=optimizer_p, num_runs=num_runs,
             input_gradient=input_gradient,
             keeps_activations=result.recompute == 'never')
  if together:
    parts = layer_profile.ProfilePartitionsTogether(
        layers, result.bounds, input_shapes, cores,
        num_virtual_stages=result.layout.num_virtual_stages, **how)
  else:
    parts = layer_profile.ProfilePartitions(layers, result.bounds,
                                            input_shapes, **how)
  if transfer is None:
    transfer = MeasureTransfer(result.num_devices, cores)
  predicted = _Predicted(result.name, parts, result.batch_size,
                         list(range(len(parts) + 1)),
                         result.num_micro_batches, result.recompute,
                         result.budget, transfer, result.layout,
                         exchange or result.exchange)
  return dataclasses.replace(
      predicted, bounds=result.bounds, profiles=result.profiles,
      why=result.why, why_schedule=result.why_schedule,
      partition_profiles=parts,
      cores=list(cores)[:result.num_devices] if together else None)


def InLayout(result: PlanResult, layout: Layout) -> PlanResult:
  """The same split and measurements predicted in another schedule (the
  partitions measured whole if `result` was refined, else its layers'
  sums): one profile, compared across schedules."""
  parts = result.partition_profiles
  k_stages = len(result.bounds) - 1
  predicted = _Predicted(
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
  """The schedules to compare: the given one, else GPipe and 1F1B (with
  V > 1: GPipe and interleaved 1F1B, V stages per device); where every
  stage keeps its activations (recompute 'never') each also with its
  backwards split, and ZB-H1 (V = 1)."""
  v = num_virtual_stages
  if schedule_name:
    return [Layout(schedule_name, v, split_backward)]
  names = ('gpipe', '1f1b') if v == 1 else ('gpipe', 'interleaved_1f1b')
  splits = (False, True) if recompute == 'never' else (False,)
  zero_bubble = [Layout('zb_h1')] if recompute == 'never' and v == 1 else []
  return [Layout(name, v, split) for split in splits
          for name in names] + zero_bubble


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
        plan = _Predicted(name, profiles, batch_size, bounds, m, recompute,
                          budget, transfer, layout, exchange)
        if _OverBudget(plan):
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
  """The fastest predicted (K, M, schedule) that fits (module docstring)."""
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


# ---- measuring and the command line ---------------------------------------


def ProfileAt(pipe: model_pipeline.ModelPipeline, m: int,
              num_runs: int = 5, recompute: str = '') -> List[Profile]:
  """Each layer's profile at micro-batch batch / m, on the first device;
  the first layer's without the input gradient where the step makes none
  (recompute 'never' keeps partition 0's activations, which makes it)."""
  if m < 1 or pipe.batch_size % m:
    raise ValueError(
        f'num_micro_batches={m} does not divide the batch of '
        f'{pipe.batch_size}; use one of {Divisors(pipe.batch_size)}.')
  with tf.device(devices_lib.DefaultDevices()[0]):
    never = (recompute or pipe.recompute) == 'never'
    return layer_profile.ProfileLayers(
        pipe.layers, pipe.InputShapes(pipe.batch_size // m),
        optimizer_p=pipe.optimizer, num_runs=num_runs,
        input_gradient=pipe.input_gradient or never,
        keeps_activations=never)


def PlanModel(pipe: model_pipeline.ModelPipeline,
              num_partitions: int = 0, num_micro_batches: int = 0,
              budget: Optional[int] = None, num_devices: int = 0,
              recompute: str = '', num_runs: int = 5,
              cores: Optional[Sequence[int]] = None,
              schedule_name: str = '', num_virtual_stages: int = 1,
              split_backward: bool = False) -> PlanResult:
  """Measures and plans `pipe`; 0 for K or M, '' for the schedule
  suggests it; `cores` as Refine's."""
  recompute = recompute or pipe.recompute
  step_model.CheckRecompute(schedule_name, recompute)
  if split_backward and (not schedule_name or recompute != 'never'):
    raise ValueError(
        f"--split_backward goes with --schedule and recompute 'never' (got "
        f'--schedule={schedule_name!r}, recompute={recompute!r}); without '
        "--schedule, recompute 'never' compares both.")
  n, v = len(pipe.layers), num_virtual_stages
  if num_partitions * v > n:
    raise ValueError(
        f'num_partitions={num_partitions} x num_virtual_stages={v} but '
        f'{pipe.name} has {n} layers; use between 1 and {n // v}.')
  ms = ([num_micro_batches] if num_micro_batches else
        [m for m in Divisors(pipe.batch_size) if m <= 64])
  profiles = {m: ProfileAt(pipe, m, num_runs, recompute) for m in ms}
  num_devices = num_devices or (len(cores) if cores else
                                devices_lib.NumCores())
  # Every replica's pipeline has its own K devices.
  per_replica = max(num_devices // pipe.num_replicas, 1)
  ks = [num_partitions] if num_partitions else list(
      range(1, min(per_replica, n // v) + 1))
  transfer = MeasureTransfer(max(ks), cores)
  exchange = Exchange(pipe.num_replicas,
                      MeasureAllReduce(pipe.num_replicas, cores))
  layouts = Layouts(schedule_name, v, recompute, split_backward)
  if num_partitions and num_micro_batches and len(layouts) == 1:
    result = Evaluate(pipe.name, profiles[ms[0]], pipe.batch_size,
                      num_partitions, ms[0], recompute, budget, transfer,
                      layouts[0], exchange)
  else:
    result = Suggest(pipe.name, profiles, pipe.batch_size, ks, recompute,
                     budget, transfer, layouts, exchange)
  m = result.num_micro_batches
  with tf.device(devices_lib.DefaultDevices()[0]):
    return Refine(result, pipe.layers, pipe.InputShapes(pipe.batch_size // m),
                  pipe.optimizer, num_runs, cores, transfer,
                  pipe.input_gradient)


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m lingvo_pipe.tools.plan',
      description=__doc__.split('\n')[0])
  parser.add_argument('--model', required=True,
                      help='Registered model, e.g. '
                      'image.synthetic.AmoebaNetTinyGPipe.')
  parser.add_argument('--num_partitions', type=int, default=0,
                      help='K, the devices (K x V partitions); 0 suggests '
                      'it.')
  parser.add_argument('--num_micro_batches', type=int, default=0,
                      help='M; 0 suggests it.')
  parser.add_argument('--memory_budget', default='',
                      help='Per device, e.g. 2GiB; empty: no limit.')
  parser.add_argument('--num_devices', type=int, default=0,
                      help='Devices of all replicas together (K x R) when K '
                      'is suggested; 0: the cores.')
  parser.add_argument('--recompute', default='',
                      choices=['', 'always', 'except_last', 'never'],
                      help="Recompute mode; empty: the model's.")
  parser.add_argument('--schedule', default='',
                      choices=[''] + list(step_model.SCHEDULES),
                      help='The table the pipeline runs; empty: the '
                      'fastest that fits, ties to the one holding less.')
  parser.add_argument('--num_virtual_stages', type=int, default=1,
                      help='V, stages per device (interleaved_1f1b, or '
                      'gpipe); the split has K x V partitions.')
  parser.add_argument('--split_backward', action='store_true',
                      help="With --schedule and recompute 'never': each "
                      'backward as B, the input gradient, then W '
                      '(PipeliningLayer.split_backward). Without '
                      "--schedule, recompute 'never' compares both.")
  parser.add_argument('--num_timing_runs', type=int, default=5)
  parser.add_argument('--cores', default='',
                      help='For worker processes pinned to this host\'s '
                      'cores, one per partition, e.g. 0,1: the split\'s '
                      'partitions are then measured all at once, each '
                      'pinned to its core. Empty: one after another here.')
  parser.add_argument('--model_params_override', default='',
                      help="Params text, lines of 'path : value'.")
  return parser.parse_args(argv)


def Main(argv: Sequence[str]) -> str:
  """Runs the planner on command-line arguments; returns the report."""
  args = _Args(argv)
  for flag in ('num_partitions', 'num_micro_batches', 'num_devices'):
    if getattr(args, flag) < 0:
      raise ValueError(f'--{flag}={getattr(args, flag)}; use 0 (suggest) '
                       'or more.')
  budget = ParseBytes(args.memory_budget)
  _CheckSchedule(args.schedule, args.num_virtual_stages)
  cores = _Cores(args.cores)
  if cores and args.num_partitions > len(cores):
    raise ValueError(
        f'--num_partitions={args.num_partitions} but --cores={args.cores} '
        f'gives {len(cores)}: give one core per partition.')
  pipe = model_pipeline.FromRegistry(args.model, args.model_params_override)
  return str(PlanModel(pipe, args.num_partitions, args.num_micro_batches,
                       budget, args.num_devices, args.recompute,
                       args.num_timing_runs, cores, args.schedule,
                       args.num_virtual_stages, args.split_backward))


def _CheckSchedule(name: str, v: int) -> None:
  if v < 1:
    raise ValueError(f'--num_virtual_stages={v}; use 1 or more.')
  if name == 'interleaved_1f1b' and v < 2:
    raise ValueError('--schedule=interleaved_1f1b runs V >= 2 stages per '
                     'device; give --num_virtual_stages=2 or more.')
  if name in ('1f1b', 'zb_h1') and v > 1:
    raise ValueError(f'--schedule={name} runs one stage per device, got '
                     f'--num_virtual_stages={v}; use '
                     '--schedule=interleaved_1f1b.')


def _Cores(text: str) -> Optional[List[int]]:
  if not text:
    return None
  try:
    return [int(c) for c in text.split(',')]
  except ValueError:
    raise ValueError(f'--cores={text}: give core numbers separated by '
                     'commas, e.g. --cores=0,1.') from None


def SetUpProcess() -> None:
  """Makes this process profile as a worker runs; call it before
  TensorFlow makes its devices (importing it is still in time).

  The CPU allocator then keeps statistics (layer_profile measures each
  layer's backward with them), and a process on one core runs two
  inter-op threads, as a worker server does (cluster.
  EnsureInterOpThreads); both change the memory a backward holds
  (docs/DESIGN.md section 17).
  """
  os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  cluster.EnsureInterOpThreads()


def main() -> None:
  SetUpProcess()
  try:
    print(Main(sys.argv[1:]), flush=True)
  except (ValueError, model_registry.UnknownModelError) as err:
    raise SystemExit(f'plan: {err}') from None


if __name__ == '__main__':
  main()
