"""The planner: how to pipeline a model, predicted before running it.

  python -m lingvo_pipe.tools.plan --model=image.synthetic.AmoebaNetTinyGPipe
      [--num_partitions=K] [--num_micro_batches=M] [--memory_budget=2GiB]
      [--num_devices=N] [--recompute=always|except_last|never]
      [--cores=0,1]

Measures each layer of the model's pipeline once on this host's first
device (layer_profile.py: forward and backward seconds at the micro-batch
size, activation bytes from the traced gradient), splits the layers into
K partitions minimising the slowest partition's time per micro-batch
among the splits whose every partition fits the memory budget
(partitioner.MinMaxPartition with a memory constraint), and prints the
predicted step time (the GPipe schedule's critical path, step_model.py),
each partition's peak memory, the bubble and the balance report.

The per-layer sums choose the split; the chosen split's partitions are
then measured again, each as one SequentialLayer (as the pipeline runs
it), and the prediction printed comes from those (`Refine`): summed
layers over-count a partition's memory, because TensorFlow's executor
overlaps one layer's backward with the next and frees residuals early
(docs/DESIGN.md section 31).

Each boundary's tensor is handed on once per micro-batch each way (the
activation forward, its gradient back). What that costs is measured once
between two of the target's devices (transfer_profile.py: worker servers
pinned to the first two --cores, else this process's first two devices)
and enters the schedule as a delay on each dependency across a boundary
(step_model's hop_s); the report prints each boundary's hop. The first
partition's backward is measured without the gradient of the pipeline's
input when the model's params class says the step makes none
(PIPELINE_INPUT_GRADIENT = False: images), as the pipeline runs it
(docs/DESIGN.md section 33).

Without K or M it suggests them: every K from 1 to the number of devices
and every M dividing the batch (measured again for each micro-batch
size), the fastest step by the layers' sums that fits; of those within
2% of it, the fewest devices, then the fewest micro-batches.

To plan for worker processes pinned to one core each, run the planner
pinned the same way (`taskset -c 0 python -m lingvo_pipe.tools.plan ...`):
the measured layers then get one core, as each partition will. Give it
the workers' cores too (`--cores=0,1`): the chosen split's partitions are
then measured all at once, partition k in a process pinned to the k-th
core, so each is timed beside busy neighbours, as in the pipeline's
steady state. Partitions sharing a host's caches and memory slow each
other: on an earlier VM AmoebaNet-D's first partition's backward took 19%
longer with the other core busy (docs/DESIGN.md section 31). Without
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
from typing import Any, Dict, List, Optional, Sequence

from lingvo_pipe.core import quiet

tf = quiet.ImportTensorFlow()

from lingvo_pipe.core import cluster  # noqa: E402
from lingvo_pipe.core import devices as devices_lib  # noqa: E402
from lingvo_pipe.core import partitioner  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import model_pipeline  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402
from lingvo_pipe.tools import transfer_profile  # noqa: E402

Profile = layer_profile.LayerProfile
_NEAR_BEST = 1.02  # suggestions within 2% of the fastest count as ties
_UNITS = {'': 1, 'b': 1, 'kb': 1e3, 'mb': 1e6, 'gb': 1e9, 'kib': 2**10,
          'mib': 2**20, 'gib': 2**30, 'tib': 2**40}


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


# ---- the split under a budget --------------------------------------------


def _LayerCosts(profiles: Sequence[Profile], recompute: str) -> List[float]:
  """Time per micro-batch of each layer, re-computation included."""
  again = recompute != 'never'
  return [p.forward_s * (2 if again else 1) + p.backward_s
          for p in profiles]


def _PartPeak(profiles: Sequence[Profile], m: int, recompute: str,
              s: int, e: int) -> int:
  last = e == len(profiles)
  keeps = recompute == 'never' or (recompute == 'except_last' and last)
  return step_model.PredictPartition(profiles[s:e], m, keeps,
                                     last).peak_bytes


def Split(profiles: Sequence[Profile], num_partitions: int, m: int,
          recompute: str = 'always',
          budget: Optional[int] = None) -> List[int]:
  """Bounds of the min-max time split whose partitions all fit `budget`.

  Raises partitioner.NoFeasibleSplit if no split of K partitions fits.
  """
  def Fits(s: int, e: int) -> bool:
    return _PartPeak(profiles, m, recompute, s, e) <= budget

  return partitioner.MinMaxPartition(_LayerCosts(profiles, recompute),
                                     num_partitions,
                                     None if budget is None else Fits)


def LeastPeak(profiles: Sequence[Profile], num_partitions: int, m: int,
              recompute: str = 'always') -> int:
  """The smallest per-device budget any split of K partitions fits."""
  n = len(profiles)
  peaks = sorted({_PartPeak(profiles, m, recompute, s, e)
                  for s in range(n) for e in range(s + 1, n + 1)})
  lo, hi = 0, len(peaks) - 1  # peaks[hi] (the whole model) always fits
  while lo < hi:
    mid = (lo + hi) // 2
    try:
      Split(profiles, num_partitions, m, recompute, peaks[mid])
      hi = mid
    except partitioner.NoFeasibleSplit:
      lo = mid + 1
  return peaks[lo]


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
  partitions: List[step_model.PartitionPrediction]
  step_s: float
  idle: float
  budget: Optional[int] = None
  why: str = ''
  # Set by Refine: one profile per partition, each measured whole, and
  # the cores they were measured on at once (None: one after another).
  partition_profiles: Optional[List[Profile]] = None
  cores: Optional[List[int]] = None
  # What a boundary tensor costs to hand on (transfer_profile), and so
  # each boundary's hop per micro-batch (step_model's hop_s).
  transfer: transfer_profile.TransferCost = transfer_profile.TransferCost()
  hop_s: List[float] = dataclasses.field(default_factory=list)

  @property
  def num_partitions(self) -> int:
    return len(self.partitions)

  def Report(self) -> partitioner.BalanceReport:
    costs = _LayerCosts(self.profiles, self.recompute)
    parts = []
    for a, b in zip(self.bounds, self.bounds[1:]):
      layer_ps = self.profiles[a:b]
      parts.append(partitioner.PartitionStats(
          layer_names=tuple(p.name for p in layer_ps),
          layer_costs=tuple(costs[a:b]), cost=sum(costs[a:b]),
          num_params=sum(p.num_params for p in layer_ps),
          activation_bytes=sum(p.output_bytes for p in layer_ps)))
    return partitioner.BalanceReport('time', self.num_micro_batches,
                                     tuple(parts))

  def __str__(self) -> str:
    k, m = self.num_partitions, self.num_micro_batches
    lines = [f"Plan for '{self.name}': K={k} partitions, M={m} micro-batches "
             f'of {self.batch_size // m} (batch {self.batch_size}), '
             f'recompute={self.recompute}' + (
                 f', budget {Bytes(self.budget)} per device'
                 if self.budget else '')]
    if self.why:
      lines.append(f'Suggested: {self.why}')
    lines.append(
        f'Predicted step: {self.step_s:.3f} s (forward + backward of the '
        f'pipeline); bubble {schedule.BubbleFraction(k, m):.1%} by '
        f'(K-1)/(M+K-1), {self.idle:.1%} idle by the predicted schedule')
    how = ('each partition measured whole' if self.partition_profiles
           else 'sums of the layers measured one by one')
    if self.partition_profiles and self.cores:
      how += f', all at once on cores {self.cores}'
    if self.hop_s and self.transfer.measured:
      lines.append('  Hand-offs per micro-batch, each way: ' + ', '.join(
          f'{i}->{i + 1} {h * 1e3:.2f} ms' for i, h in enumerate(self.hop_s))
          + f'; transfer {self.transfer}')
    elif self.hop_s:
      lines.append(f'  Hand-offs between partitions counted as free '
                   f'({self.transfer.between}; --cores measures them '
                   'between worker processes)')
    lines.append(f'  part  F/micro    B/micro    peak memory = resident + '
                 f'gradients + kept activations ({how})')
    for i, part in enumerate(self.partitions):
      fwd, bwd = part.forward_s * 1e3, part.backward_s * 1e3
      lines.append(
          f'  {i:<4}  {fwd:7.2f} ms {bwd:7.2f} ms '
          f'{Bytes(part.peak_bytes):>10} = {Bytes(part.resident_bytes)} '
          f'+ {Bytes(part.gradient_bytes)} + {Bytes(part.kept_bytes)}')
    over = [i for i, part in enumerate(self.partitions)
            if self.budget and part.peak_bytes > self.budget]
    if over:
      lines.append(
          f'  partitions {over} measured whole exceed the budget, which '
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


def Evaluate(name: str, profiles: Sequence[Profile], batch_size: int,
             num_partitions: int, m: int, recompute: str = 'always',
             budget: Optional[int] = None,
             transfer: Optional[transfer_profile.TransferCost] = None
             ) -> PlanResult:
  """The best split of K partitions for M micro-batches, predicted."""
  n = len(profiles)
  if not 1 <= num_partitions <= n:
    raise ValueError(
        f'num_partitions={num_partitions} but the pipeline has {n} layers; '
        f'use between 1 and {n}.')
  try:
    bounds = Split(profiles, num_partitions, m, recompute, budget)
  except partitioner.NoFeasibleSplit:
    raise ValueError(_TooSmall(profiles, num_partitions, m, recompute,
                               budget)) from None
  return _Predicted(name, profiles, batch_size, bounds, m, recompute, budget,
                    transfer)


def _Predicted(name: str, profiles: Sequence[Profile], batch_size: int,
               bounds: List[int], m: int, recompute: str,
               budget: Optional[int],
               transfer: Optional[transfer_profile.TransferCost] = None
               ) -> PlanResult:
  """The prediction for a split; each boundary's hop is `transfer` of the
  last layer's output before it (one micro-batch)."""
  parts = step_model.Predict(profiles, bounds, m, recompute)
  fwd = [p.forward_s for p in parts]
  bwd = [p.backward_s for p in parts]
  transfer = transfer or transfer_profile.TransferCost()
  hops = [transfer.Seconds(profiles[b - 1].output_bytes)
          for b in bounds[1:-1]]
  return PlanResult(
      name=name, batch_size=batch_size, num_micro_batches=m,
      recompute=recompute, bounds=bounds, profiles=list(profiles),
      partitions=parts, step_s=step_model.StepSeconds(fwd, bwd, m, 0.0, hops),
      idle=step_model.IdleFraction(fwd, bwd, m, 0.0, hops), budget=budget,
      transfer=transfer, hop_s=hops)


def MeasureTransfer(num_partitions: int,
                    cores: Optional[Sequence[int]] = None
                    ) -> transfer_profile.TransferCost:
  """What a boundary tensor costs between the target's devices: worker
  servers pinned to the first two `cores`, else this process's first two
  devices; nothing to measure with one partition or one device."""
  if num_partitions < 2:
    return transfer_profile.TransferCost(between='one partition')
  if cores:
    return transfer_profile.MeasureBetweenCores(cores)
  devs = devices_lib.DefaultDevices()
  if len(devs) < 2:
    return transfer_profile.TransferCost(
        between='not measured: this process has one device')
  return transfer_profile.Measure(devs[0], devs[1])


def Refine(result: PlanResult, layers: Sequence[Any], input_shapes: Any,
           optimizer_p: Any = None, num_runs: int = 5,
           cores: Optional[Sequence[int]] = None,
           transfer: Optional[transfer_profile.TransferCost] = None,
           input_gradient: bool = True) -> PlanResult:
  """`result` with its split's partitions measured whole (module
  docstring): `layers` are the pipeline's layer params, `input_shapes`
  the first layer's inputs for one micro-batch. With `cores` (one per
  partition), the partitions are measured all at once, each pinned to its
  core (layer_profile.ProfilePartitionsTogether); else one after another
  on the current device. The hand-offs between partitions cost
  `transfer`, measured (MeasureTransfer) if not given. `input_gradient`:
  whether the step differentiates the pipeline's input
  (layer_profile.ProfileLayers'); a first partition that keeps its
  activations makes that gradient anyway, as the pipeline's does."""
  input_gradient = input_gradient or step_model.KeepsActivations(
      result.recompute, 0, len(result.bounds) - 1)
  if cores:
    parts = layer_profile.ProfilePartitionsTogether(
        layers, result.bounds, input_shapes, cores, optimizer_p=optimizer_p,
        num_runs=num_runs, input_gradient=input_gradient)
  else:
    parts = layer_profile.ProfilePartitions(
        layers, result.bounds, input_shapes, optimizer_p=optimizer_p,
        num_runs=num_runs, input_gradient=input_gradient)
  m, k = result.num_micro_batches, len(parts)
  if transfer is None:
    transfer = MeasureTransfer(k, cores)
  predicted = _Predicted(result.name, parts, result.batch_size,
                         list(range(k + 1)), m, result.recompute,
                         result.budget, transfer)
  return dataclasses.replace(
      result, partitions=predicted.partitions, step_s=predicted.step_s,
      idle=predicted.idle, partition_profiles=parts,
      cores=list(cores)[:k] if cores else None, transfer=transfer,
      hop_s=predicted.hop_s)


def _TooSmall(profiles: Sequence[Profile], k: int, m: int, recompute: str,
              budget: int) -> str:
  """One line: the budget K needs, and the K that fits this budget."""
  need = LeastPeak(profiles, k, m, recompute)
  more = next((j for j in range(k + 1, len(profiles) + 1)
               if LeastPeak(profiles, j, m, recompute) <= budget), None)
  hint = (f'use K={more} partitions' if more else
          'no K fits at this M (try more micro-batches)')
  return (f'memory_budget={Bytes(budget)} is too small for K={k} M={m}: '
          f'its best split needs {Bytes(need)} on one device; raise '
          f'--memory_budget to {Bytes(need)} or {hint}.')


# ---- suggestions ---------------------------------------------------------


def Divisors(n: int) -> List[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def Suggest(name: str, profiles_by_m: Dict[int, List[Profile]],
            batch_size: int, ks: Sequence[int], recompute: str = 'always',
            budget: Optional[int] = None,
            transfer: Optional[transfer_profile.TransferCost] = None
            ) -> PlanResult:
  """The fastest predicted (K, M) that fits (module docstring)."""
  plans, smallest = [], None
  for m, profiles in sorted(profiles_by_m.items()):
    for k in ks:
      if k > len(profiles):
        continue
      try:
        bounds = Split(profiles, k, m, recompute, budget)
      except partitioner.NoFeasibleSplit:
        need = LeastPeak(profiles, k, m, recompute)
        smallest = min(smallest or (math.inf,), (need, k, m))
        continue
      plans.append(_Predicted(name, profiles, batch_size, bounds, m,
                              recompute, budget, transfer))
  if not plans:
    need, k, m = smallest
    raise ValueError(
        f'memory_budget={Bytes(budget)} fits no K in {list(ks)} and M in '
        f'{sorted(profiles_by_m)}; the least any needs is {Bytes(need)} '
        f'per device (K={k} M={m}): raise --memory_budget or add devices.')
  best = min(p.step_s for p in plans)
  chosen = min((p for p in plans if p.step_s <= best * _NEAR_BEST),
               key=lambda p: (p.num_partitions, p.num_micro_batches))
  runner_up = sorted((p for p in plans if p is not chosen),
                     key=lambda p: p.step_s)[:1]
  fits = f' that fits {Bytes(budget)} per device' if budget else ''
  other = ''.join(f'; next K={p.num_partitions} M={p.num_micro_batches} '
                  f'{p.step_s:.3f} s' for p in runner_up)
  chosen.why = (f'K={chosen.num_partitions} M={chosen.num_micro_batches}: '
                f'the fastest step{fits} by its layers\' sums '
                f'({chosen.step_s:.3f} s, '
                f'{len(plans)} (K, M) fit; fewest devices and micro-batches '
                f'within 2%){other}.')
  return chosen


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
    return layer_profile.ProfileLayers(
        pipe.layers, pipe.InputShapes(pipe.batch_size // m),
        optimizer_p=pipe.optimizer, num_runs=num_runs,
        input_gradient=pipe.input_gradient or
        (recompute or pipe.recompute) == 'never')


def PlanModel(pipe: model_pipeline.ModelPipeline,
              num_partitions: int = 0, num_micro_batches: int = 0,
              budget: Optional[int] = None, num_devices: int = 0,
              recompute: str = '', num_runs: int = 5,
              cores: Optional[Sequence[int]] = None) -> PlanResult:
  """Measures and plans `pipe`; 0 for K or M suggests it; `cores` as
  Refine's."""
  recompute = recompute or pipe.recompute
  n = len(pipe.layers)
  if num_partitions > n:
    raise ValueError(
        f'num_partitions={num_partitions} but {pipe.name} has {n} layers; '
        f'use between 1 and {n}.')
  ms = ([num_micro_batches] if num_micro_batches else
        [m for m in Divisors(pipe.batch_size) if m <= 64])
  profiles = {m: ProfileAt(pipe, m, num_runs, recompute) for m in ms}
  num_devices = num_devices or (len(cores) if cores else
                                devices_lib.NumCores())
  ks = [num_partitions] if num_partitions else list(
      range(1, min(num_devices, n) + 1))
  transfer = MeasureTransfer(max(ks), cores)
  if num_partitions and num_micro_batches:
    result = Evaluate(pipe.name, profiles[ms[0]], pipe.batch_size,
                      num_partitions, ms[0], recompute, budget, transfer)
  else:
    result = Suggest(pipe.name, profiles, pipe.batch_size, ks, recompute,
                     budget, transfer)
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
                      help='K; 0 suggests it.')
  parser.add_argument('--num_micro_batches', type=int, default=0,
                      help='M; 0 suggests it.')
  parser.add_argument('--memory_budget', default='',
                      help='Per device, e.g. 2GiB; empty: no limit.')
  parser.add_argument('--num_devices', type=int, default=0,
                      help='Devices K may use when suggested; 0: the cores.')
  parser.add_argument('--recompute', default='',
                      choices=['', 'always', 'except_last', 'never'],
                      help="Recompute mode; empty: the model's.")
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
  cores = _Cores(args.cores)
  if cores and args.num_partitions > len(cores):
    raise ValueError(
        f'--num_partitions={args.num_partitions} but --cores={args.cores} '
        f'gives {len(cores)}: give one core per partition.')
  pipe = model_pipeline.FromRegistry(args.model, args.model_params_override)
  return str(PlanModel(pipe, args.num_partitions, args.num_micro_batches,
                       budget, args.num_devices, args.recompute,
                       args.num_timing_runs, cores))


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
  (docs/DESIGN.md section 20).
  """
  os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  cluster.EnsureInterOpThreads()


def main() -> None:
  SetUpProcess()
  try:
    print(Main(sys.argv[1:]), flush=True)
  except (ValueError, LookupError) as err:
    raise SystemExit(f'plan: {err}') from None


if __name__ == '__main__':
  main()
