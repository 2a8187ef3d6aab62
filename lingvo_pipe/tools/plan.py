"""The planner: how to pipeline a model, predicted before running it.

  python -m lingvo_pipe.tools.plan --model=image.synthetic.AmoebaNetTinyGPipe
      [--num_partitions=K] [--num_micro_batches=M] [--memory_budget=2GiB]
      [--schedule=NAME|table.csv|auto] [--num_virtual_stages=V]
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
least memory on a device. Without --schedule it compares every
registered schedule its rules allow (GPipe, 1F1B, 1F1B ahead; with V > 1,
GPipe and the interleaved ones) for each (K, M) the same way: their
steps are often equal (the same bubble), and then 1F1B, holding at most
K - k micro-batches on stage k where GPipe holds all M, is chosen (1F1B
ahead, one more, where measured hand-offs make it faster), and under a
tight budget it fits larger M or fewer devices; with
recompute 'never' it compares ZB-H1 too, each backward measured as its
two actions run it (layer_profile's keeps_activations). The report says
which schedule and why in one line.

A model in length buckets (MTInput's bucket_upper_bound) is planned for
the bucket whose batch holds the most tokens; then each bucket is
predicted on that split, K, M and schedule, its partitions measured at
its own micro-batch shape (`BucketReport`: step, bubble, the busiest
device's peak memory, the most marked), and suggested M divide every
bucket's batch.

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
import os
import re
import sys
from typing import Any, List, Optional, Sequence

from lingvo_pipe.core import quiet

tf = quiet.ImportTensorFlow()

from lingvo_pipe.core import cluster  # noqa: E402
from lingvo_pipe.core import devices as devices_lib  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.core import partitioner  # noqa: E402
from lingvo_pipe.core import schedule_file  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import model_pipeline  # noqa: E402
from lingvo_pipe.tools import plan_search  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402
from lingvo_pipe.tools import transfer_profile  # noqa: E402

Profile = layer_profile.LayerProfile
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


def Refine(result: plan_search.PlanResult, layers: Sequence[Any],
           input_shapes: Any,
           optimizer_p: Any = None, num_runs: int = 5,
           cores: Optional[Sequence[int]] = None,
           transfer: Optional[transfer_profile.TransferCost] = None,
           input_gradient: bool = True,
           exchange: Optional[plan_search.Exchange] = None
           ) -> plan_search.PlanResult:
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
  together = bool(cores)
  parts = _MeasurePartitions(result, layers, input_shapes, optimizer_p,
                             num_runs, cores, input_gradient)
  if transfer is None:
    transfer = MeasureTransfer(result.num_devices, cores)
  predicted = plan_search.Predicted(
      result.name, parts, result.batch_size, list(range(len(parts) + 1)),
      result.num_micro_batches, result.recompute, result.budget, transfer,
      result.layout, exchange or result.exchange)
  return dataclasses.replace(
      predicted, bounds=result.bounds, profiles=result.profiles,
      why=result.why, why_schedule=result.why_schedule,
      partition_profiles=parts,
      cores=list(cores)[:result.num_devices] if together else None)


# ---- measuring and the command line ---------------------------------------


def ProfileAt(pipe: model_pipeline.ModelPipeline, m: int,
              num_runs: int = 5, recompute: str = '') -> List[Profile]:
  """Each layer's profile at micro-batch batch / m, on the first device;
  the first layer's without the input gradient where the step makes none
  (recompute 'never' keeps partition 0's activations, which makes it)."""
  if m < 1 or pipe.batch_size % m:
    raise ValueError(
        f'num_micro_batches={m} does not divide the batch of '
        f'{pipe.batch_size}; use one of '
        f'{plan_search.Divisors(pipe.batch_size)}.')
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
              split_backward: bool = False) -> plan_search.PlanResult:
  """Measures and plans `pipe`; 0 for K or M, '' for the schedule
  suggests it; `cores` as Refine's."""
  recompute = recompute or pipe.recompute
  if schedule_name:  # the schedule's own rules, recompute's among them
    registry.Check(schedule_name, registry.Lookup(schedule_name).num_stages
                   or num_virtual_stages * max(num_partitions, 1), None,
                   num_virtual_stages, recompute)
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
        [m for m in plan_search.Divisors(pipe.batch_size) if m <= 64 and
         all(batch % m == 0 for _, batch, _ in pipe.buckets)])
  uneven = [(bound, batch) for bound, batch, _ in pipe.buckets
            if num_micro_batches and batch % num_micro_batches]
  if uneven:
    raise ValueError(
        f'length buckets (bound, batch) {uneven}: the batch does not split '
        f'into M={num_micro_batches} micro-batches; change '
        'bucket_batch_limit or --num_micro_batches.')
  profiles = {m: ProfileAt(pipe, m, num_runs, recompute) for m in ms}
  num_devices = num_devices or (len(cores) if cores else
                                devices_lib.NumCores())
  # Every replica's pipeline has its own K devices.
  per_replica = max(num_devices // pipe.num_replicas, 1)
  ks = [num_partitions] if num_partitions else list(
      range(1, min(per_replica, n // v) + 1))
  transfer = MeasureTransfer(max(ks), cores)
  exchange = plan_search.Exchange(
      pipe.num_replicas, MeasureAllReduce(pipe.num_replicas, cores))
  layouts = plan_search.Layouts(schedule_name, v, recompute, split_backward)
  if num_partitions and num_micro_batches and len(layouts) == 1:
    result = plan_search.Evaluate(
        pipe.name, profiles[ms[0]], pipe.batch_size, num_partitions, ms[0],
        recompute, budget, transfer, layouts[0], exchange)
  else:
    result = plan_search.Suggest(pipe.name, profiles, pipe.batch_size, ks,
                                 recompute, budget, transfer, layouts,
                                 exchange)
  m = result.num_micro_batches
  with tf.device(devices_lib.DefaultDevices()[0]):
    return Refine(result, pipe.layers, pipe.InputShapes(pipe.batch_size // m),
                  pipe.optimizer, num_runs, cores, transfer,
                  pipe.input_gradient)


def _MeasurePartitions(result: plan_search.PlanResult, layers: Sequence[Any],
                       input_shapes: Any, optimizer_p: Any, num_runs: int,
                       cores: Optional[Sequence[int]],
                       input_gradient: bool) -> List[Profile]:
  """One profile per partition of `result`'s split at `input_shapes`
  (Refine's docstring: with `cores` all at once, else one by one)."""
  input_gradient = input_gradient or step_model.KeepsActivations(
      result.recompute, 0, len(result.bounds) - 1)
  how = dict(optimizer_p=optimizer_p, num_runs=num_runs,
             input_gradient=input_gradient,
             keeps_activations=result.recompute == 'never')
  if cores:
    return layer_profile.ProfilePartitionsTogether(
        layers, result.bounds, input_shapes, cores,
        num_virtual_stages=result.layout.num_virtual_stages, **how)
  return layer_profile.ProfilePartitions(layers, result.bounds,
                                         input_shapes, **how)


def BucketReport(result: plan_search.PlanResult,
                 pipe: model_pipeline.ModelPipeline, num_runs: int = 5,
                 cores: Optional[Sequence[int]] = None) -> str:
  """Each length bucket of `pipe`'s input on `result`'s split, K, M and
  schedule (the plan is made for the bucket whose batch holds the most
  tokens, its partitions measured by Refine): the other buckets'
  partitions measured at their micro-batch shapes; each bucket's
  predicted step, bubble and busiest device's peak memory, the most of
  any bucket marked (what the budget must hold)."""
  m = result.num_micro_batches
  planned = pipe.InputShapes(pipe.batch_size // m)
  rows = []
  for i, (bound, batch, _) in enumerate(pipe.buckets):
    shapes = pipe.InputShapes(batch // m, i)
    if result.partition_profiles and shapes == planned:
      rows.append((bound, batch, result))  # Refine measured this one
      continue
    with tf.device(devices_lib.DefaultDevices()[0]):
      parts = _MeasurePartitions(result, pipe.layers, shapes, pipe.optimizer,
                                 num_runs, cores, pipe.input_gradient)
    rows.append((bound, batch, plan_search.Predicted(
        result.name, parts, batch, list(range(len(parts) + 1)), m,
        result.recompute, result.budget, result.transfer, result.layout,
        result.exchange)))
  most = max(r.peak_bytes for _, _, r in rows)
  lines = [f'Length buckets, each on the split above (M={m}; planned for '
           f'the batch of {pipe.batch_size} holding the most tokens):',
           '  bucket  batch  step      bubble  peak memory of a device']
  for bound, batch, r in rows:
    over = result.budget and r.peak_bytes > result.budget
    lines.append(
        f'  {bound:<6}  {batch:<5}  {r.step_s:.3f} s  {r.idle:6.1%}  '
        f'{partitioner.Bytes(r.peak_bytes)}' +
        (' (the most)' if r.peak_bytes == most and len(rows) > 1 else '') +
        (' OVER THE BUDGET: lower this bucket\'s bucket_batch_limit'
         if over else ''))
  return '\n'.join(lines)


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
                      help='The table the pipeline runs (a registered '
                      "schedule, or a table's .csv file); empty: the "
                      'fastest that fits, ties to the one holding less.')
  parser.add_argument('--num_virtual_stages', type=int, default=1,
                      help='V, stages per device (interleaved_1f1b, or '
                      'gpipe); the split has K x V partitions.')
  parser.add_argument('--split_backward', action='store_true',
                      help="With --schedule and recompute 'never': each "
                      'backward as B, the input gradient, then W '
                      '(PipeliningLayer.split_backward). Without '
                      "--schedule, recompute 'never' compares both.")
  parser.add_argument('--schedule_csv', default='schedule_auto.csv',
                      help='With --schedule=auto: where to write the table '
                      'searched from the measured costs, for the trainer '
                      "(task.network.schedule : PATH).")
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
  result = PlanModel(pipe, args.num_partitions, args.num_micro_batches,
                     budget, args.num_devices, args.recompute,
                     args.num_timing_runs, cores, args.schedule,
                     args.num_virtual_stages, args.split_backward)
  report = str(result)
  if pipe.buckets:
    report += '\n' + BucketReport(result, pipe, args.num_timing_runs, cores)
  if args.schedule and registry.Lookup(args.schedule).searched:
    report += '\n' + Searched(result, args.schedule_csv)
  return report


def Searched(result: plan_search.PlanResult, path: str) -> str:
  """Writes `result`'s searched table to `path` (schedule_file.Dump) and
  says how it compares with every named schedule on the same split and
  costs (plan_search.InLayout)."""
  if os.path.dirname(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  schedule_file.Dump(result.table, path)
  v = result.layout.num_virtual_stages
  lines = [f'Searched table written to {path} (K={result.num_devices} '
           f'M={result.num_micro_batches}); train with it: '
           f'--model_params_override="task.network.schedule : '
           f'{os.path.abspath(path)}"',
           f'  {result.layout.schedule_name}: step {result.step_s:.3f} s, '
           f'bubble {result.idle:.1%}, holding '
           f'{plan_search.Bytes(result.peak_bytes)} on the fullest device']
  for layout in plan_search.Layouts('', v, result.recompute):
    if not layout.HasTable(result.num_devices, result.num_micro_batches):
      continue
    other = plan_search.InLayout(result, layout)
    held = plan_search.Bytes(other.peak_bytes)
    lines.append(f'  {layout}: step {other.step_s:.3f} s, bubble '
                 f'{other.idle:.1%}, holding {held}')
  return '\n'.join(lines)


def _CheckSchedule(name: str, v: int) -> None:
  """--schedule's V rule (its definition's), before anything is measured."""
  if v < 1:
    raise ValueError(f'--num_virtual_stages={v}; use 1 or more.')
  if name and registry.Lookup(name).num_devices is None:
    try:
      registry.Check(name, v, None, v)  # one device of V stages
    except ValueError as err:
      raise ValueError(f'--schedule={name}: {err}') from None


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
