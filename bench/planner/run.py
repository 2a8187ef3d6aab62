"""The planner's predictions against measurement, per configuration.

  .venv/bin/python -m bench.planner.run [--models=transformer,amoebanet]
      [--ks=1,2] [--ms=1,4,8] [--schedules=gpipe,1f1b] [--profile_rounds=3]
      [--rounds=5] [--memory_runs=3] [--parts=memory,time] [--json_out=FILE]
      [--recompute=always|never] [--num_virtual_stages=2]

For each model, (K, M) and schedule, recompute 'always' (or 'never', which
the zero-bubble schedules need: --schedules=gpipe,1f1b,zb_h1,zb_v, and so
do split backwards: '1f1b+split' is 1F1B with PipeliningLayer's
split_backward), batch 32; a schedule that runs several stages a worker
(interleaved, looped BFS, ZB-V's two) runs --num_virtual_stages (at
least its least) on each of the K workers. 'auto' is not for this bench:
the planner searches its table with the measured costs, the worker would
run the unit-cost one:
1. Predicted (a process pinned to core 0 with `taskset`, as each worker
   will be): lingvo_pipe.tools.plan measures every layer once per
   micro-batch size (layer_profile.py) and chooses the split from their
   sums, then measures each partition of that split whole (once for all
   schedules, which split alike without a budget), all at once,
   partition k in a process pinned to core k as its worker will be
   (plan.Refine with cores, layer_profile.ProfilePartitionsTogether),
   and predicts from those the step time (the schedule's table simulated
   with those costs, each boundary's hand-off a delay measured once per
   round between two worker servers on cores 0 and 1:
   plan.MeasureTransfer; with 'never' each backward is also measured as
   ZB-H1's B and W run it, layer_profile's keeps_activations) and each
   partition's step memory (gradients +
   kept activations, as many micro-batches as the table holds: the peak
   above what stays resident between steps). The table gives the layer
   sums' prediction too, in brackets.
2. Measured: two `tf.distribute.Server` workers pinned to cores 0 and 1
   (`LocalWorkers`), partition k on task k, built with the predicted split
   and the schedule. A step is the trainer's: one pass in the schedule's
   order, each micro-batch's loss = mean(output ** 2) as its forward ends
   (FPropWithLoss), every gradient and an SGD update of each variable
   where it lives; only the loss comes back to the client (_StepFn).
   Step time, on workers with TF's defaults, as a user runs: `rounds`
   interleaved rotations (every configuration an untimed step, a timed
   one, then one of the same function with every pipeline task stamped,
   step_trace.Tracer; starting one further along each rotation:
   stack.Rotations).
3. Time is measured in `profile_rounds` rounds; each round after the
   first profiles the first round's splits whole again (as 1), then
   times them (as 2) on fresh workers. This machine runs a core at one
   of two speeds, about 1.3x apart, for 10-60 s at a time
   (docs/DESIGN.md section 18), so a prediction and a timing minutes
   apart may not be of the same machine. The table compares the fast
   state: the prediction from each partition's least F and B over the
   rounds, against the least of the rounds' median steps. It also gives
   each round's prediction against its own timing; the fastest stamped
   step's tasks put through the schedule (step_model), against the
   prediction; the schedule run with each stamped step's measured task
   times, against that step's span; and the plain step's time against
   the span of the stamped step after it (what a step spends outside its
   tasks). `--tables_from=RUN.json` prints a run's tables again (a run
   from before the schedule column reads as GPipe).
4. Step memory per worker (in the first round's split): its allocator's
   peak during a step minus what it held before the step (memory workers
   with TF_CPU_ALLOCATOR_USE_BFC=true, lingvo_pipe.tools.memory_worker),
   the most of five steps after warm-up; that is repeated on
   `memory_runs` fresh pairs of workers and the median reported with the
   range (one run's reading of a cell varies by up to a third: the
   executor's two threads order the ops differently from run to run).
   One step more runs with each worker's profiler on
   (memory_worker.TraceStep): the bytes its tensors asked for at its
   allocator's peak, against which the prediction is compared too, and
   how far the allocator's chunks exceeded them (medians over the runs).

Models: 'transformer' is bench/common's stack (8 TransformerEncoderLayers,
d=256, ff 1024, 4 heads, seq 64); 'amoebanet' is AmoebaNet-D (6, 16) of
tasks/image/amoebanet.py on 32x32x3 images (as bench/throughput). Before
measuring it waits until no `bench/memory` process runs (two busy
processes on 2 cores slow each other by 10-20%). The times are taken
right after the profile, the memory after them. Before the profile and
after the timing it times bench/common/cores.py's numpy matmul pinned to
each core alone and prints the seconds: a core that runs slower than the
other (seen on this VM) shows there rather than as a planner error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The memory pass only, on memory workers: TF's CPU allocator then keeps
# statistics (as a GPU's always does), read from each worker by
# memory_worker.ReadServerMemory. Times are taken without it, on plain
# workers (TF's defaults, as a user runs).
MEMORY_ENV = {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.common import cores  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import memory_worker  # noqa: E402

BATCH = 32
# Every registered schedule; their rules say which need recompute 'never'
# and which run V stages a worker (registry.Check).
SCHEDULES = registry.Names()
SPLIT = '+split'  # a schedule's name + SPLIT: with split_backward


def _Schedule(text: str) -> Tuple[str, bool]:
  """'1f1b+split' -> ('1f1b', True); '1f1b' -> ('1f1b', False)."""
  if text.endswith(SPLIT):
    return text[:-len(SPLIT)], True
  return text, False


def _Label(k: int, m: int, schedule: str) -> str:
  return f'{k},{m},{schedule}'


def _Parse(label: str) -> Tuple[int, int, str]:
  """'K,M,schedule' -> (K, M, schedule); 'K,M' (a run from before the
  schedules) is GPipe."""
  fields = label.split(',')
  return (int(fields[0]), int(fields[1]),
          fields[2] if len(fields) > 2 else 'gpipe')


def _Model(name: str) -> Any:
  """(layer params, input shapes of one example batch fn, inputs fn)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import transformer_layers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.nested_map import NestedMap  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tasks.image import amoebanet  # pylint: disable=g-import-not-at-top
  if name == 'transformer':
    layer_ps = [transformer_layers.TransformerEncoderLayer.Params().Set(
        name=f'layer{i}', model_dim=256, hidden_dim=1024, num_heads=4)
                for i in range(8)]
    shapes = lambda b: NestedMap(vec=tf.TensorShape([b, 64, 256]),  # noqa: E731
                                 paddings=tf.TensorShape([b, 64]))
  else:
    layer_ps = amoebanet.AmoebaNetD(num_cells=6, filters=16, num_classes=10,
                                    stem='cifar')
    shapes = lambda b: tf.TensorShape([b, 32, 32, 3])  # noqa: E731
  return layer_ps, shapes


def _Inputs(name: str) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.nested_map import NestedMap  # pylint: disable=g-import-not-at-top
  if name == 'transformer':
    return NestedMap(
        vec=tf.random.stateless_normal([BATCH, 64, 256], [1, 2]),
        paddings=tf.zeros([BATCH, 64]))
  return tf.random.stateless_normal([BATCH, 32, 32, 3], [1, 2])


# ---- part 1: predictions (pinned child) ------------------------------------


def _Predict(args: argparse.Namespace) -> None:
  from lingvo_pipe.core import devices  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tools import layer_profile  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tools import plan  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tools import plan_search  # pylint: disable=g-import-not-at-top
  plan.SetUpProcess()  # as `python -m lingvo_pipe.tools.plan` runs
  devices.SplitCpu(1)
  layer_ps, shapes = _Model(args.model)
  # Rounds after the first re-measure the first round's splits whole.
  fixed = json.loads(args.predicted) if args.predicted else None
  # One hand-off cost for every split: measured once, between two worker
  # servers on cores 0 and 1, as the timed workers run.
  transfer = plan.MeasureTransfer(max(args.ks), list(range(max(args.ks))))
  out = {}
  for m in args.ms:
    # The inputs are a constant batch: the pipeline makes no gradient of
    # them, and the profile should not either.
    # With 'never' partition 0 keeps its activations and, as the
    # pipeline's does, makes the inputs' gradient (plan.ProfileAt).
    never = args.recompute == 'never'
    profiles = None if fixed else layer_profile.ProfileLayers(
        layer_ps, shapes(BATCH // m), num_runs=args.timing_runs,
        input_gradient=never, keeps_activations=never)
    refined = {}  # one profile of a split, whatever the schedule
    for k, name in [(k, n) for k in args.ks for n in args.schedules]:
      label = _Label(k, m, name)
      schedule_name, split = _Schedule(name)
      layout = plan_search.Layout(
          schedule_name, _V(name, args.num_virtual_stages), split)
      if fixed:
        summed = plan_search.PlanResult(
            name=args.model, batch_size=BATCH, num_micro_batches=m,
            recompute=args.recompute, bounds=fixed[label]['bounds'],
            profiles=[], partitions=[], step_s=0.0, idle=0.0, layout=layout)
      else:
        summed = plan_search.Evaluate(args.model, profiles, BATCH, k, m,
                                      args.recompute, layout=layout)
      bounds = tuple(summed.bounds)
      if bounds in refined:
        res = plan_search.InLayout(refined[bounds], layout)
      else:
        res = refined[bounds] = plan.Refine(
            summed, layer_ps, shapes(BATCH // m), num_runs=args.timing_runs,
            cores=list(range(k)), transfer=transfer, input_gradient=False)
      # Memory per worker: a device's stages together (V > 1).
      out[label] = {
          'bounds': res.bounds, 'step_s': res.step_s,
          'v': layout.num_virtual_stages,
          'step_bytes': [d.step_bytes for d in res.devices],
          'peak_bytes': [d.peak_bytes for d in res.devices],
          'fb': [(p.forward_s, p.backward_s) for p in res.partitions],
          'w': [p.weight_s for p in res.partitions],
          'hop_s': res.hop_s, 'transfer': str(transfer),
          'hop_busy': list(transfer.busy),
          'summed_step_s': summed.step_s,
          'summed_step_bytes': [d.step_bytes for d in summed.devices]}
  print(json.dumps(out), flush=True)


# ---- part 2: measurements (client of the workers) --------------------------


def _StepFn(layer: Any) -> Any:
  """A training step as the trainer's (bench/common's stack.TrainStep): the
  loss of the output (its vec when it is a NestedMap) in one pass, every
  gradient, an SGD update of each variable on its own device; returns
  (loss,)."""
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  return stack_lib.TrainStep(
      layer, lambda inputs: stack_lib.MeanSquareLoss(layer, inputs))


def _V(schedule: str, num_virtual_stages: int) -> int:
  """Stages per worker: V for a schedule that runs several a worker (its
  definition's least, if V is below it), else one."""
  least, _ = registry.Lookup(_Schedule(schedule)[0]).stages_per_device
  return max(num_virtual_stages, least) if least > 1 else 1


def _Build(model: str, bounds: List[int], m: int, devices: List[str],
           schedule: str, recompute: str, v: int = 1) -> Any:
  from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import partitioner  # pylint: disable=g-import-not-at-top
  cells = partitioner.Cells(partitioner.NamedCopies(_Model(model)[0]), bounds)
  name, split = _Schedule(schedule)
  layer = gpipe.PipeliningLayer.Params().Set(
      name=model, cell_tpl=cells, num_micro_batches=m, recompute=recompute,
      devices=devices[:len(cells) // v], schedule=name,
      num_virtual_stages=v, split_backward=split).Instantiate()
  layer.SetTraining(True)
  return layer


def _StepMemory(fn: Any, inputs: Any, pids: List[int],
                addresses: List[str]) -> List[int]:
  """Bytes each worker's allocator peaks above what it holds before a step,
  the most of five steps: the budget must hold for every step, and with
  two threads the executor's order, and so the peak, varies."""
  readings = []
  for _ in range(5):
    before = memory_worker.ReadServerMemory(pids, addresses)
    fn(inputs)[0].numpy()
    after = memory_worker.ReadServerMemory(pids, addresses)
    readings.append([a['CPU:0']['peak'] - b['CPU:0']['current']
                     for a, b in zip(after, before)])
  return [max(r) for r in zip(*readings)]


def _TracedPeaks(fn: Any, inputs: Any, pids: List[int],
                 addresses: List[str]) -> List[List[int]]:
  """Per worker, one step traced by its profiler: [its allocator's peak
  in use, the tensors' own bytes at that peak] above what it held before
  (memory_worker.TraceStep; the allocator that peaked highest)."""
  traced = memory_worker.TraceStep(pids, addresses,
                                   lambda: fn(inputs)[0].numpy())
  out = []
  for allocators in traced:
    peak = max(allocators.values(), key=lambda a: a['in_use'])
    out.append([peak['in_use'], peak['tensors_at_peak']])
  return out


def _Replay(trace: Any) -> Dict[str, Any]:
  """One traced step: the measured span of its tasks; each stage's mean
  measured F and B (B with its re-computation; and W); and the table that
  ran
  (read back from the trace) simulated with those (schedule.Simulate, as
  step_model runs it), which misses only what the schedule misses beyond
  the tasks' own times. No hand-offs: a received input arrives inside the
  stamped task that reads it (AmoebaNet-D K=2 M=1: F1 ran 5-7 ms over its
  profile, the receive 9.5 ms; docs/DESIGN.md section 19)."""
  from lingvo_pipe.core import schedule  # pylint: disable=g-import-not-at-top
  layer, = trace.Layers()
  means = trace.MeanSeconds(layer)
  begin, end = trace.Span(layer)
  return {'span_s': end - begin, 'fb': list(zip(means['F'], means['B'])),
          'schedule_s': schedule.Simulate(
              trace.Table(layer), means['F'], means['B'],
              weight_s=means['W']).step}


def _Measure(args: argparse.Namespace) -> None:
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import step_trace  # pylint: disable=g-import-not-at-top
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  spec = cluster.ParseClusterSpec(args.cluster_spec)
  devices = cluster.Connect(spec)
  addresses = spec.job_tasks('worker')
  pids = [int(p) for p in args.pids.split(',')]
  predicted = json.loads(args.predicted)
  inputs = _Inputs(args.model)
  fns, tracers, out = {}, {}, {}
  for label, pred in predicted.items():
    k, m, name = _Parse(label)
    fn = _StepFn(_Build(args.model, pred['bounds'], m, devices, name,
                        args.recompute, pred.get('v', 1)))
    stack_lib.Prepare(fn, inputs, args.warmup)
    fns[label] = fn
    out[label] = {'times': [], 'replays': []}
    if args.part == 'time':
      tracers[label] = step_trace.Tracer(fn.python_function, inputs)
      tracers[label].Step()
    if args.part == 'memory':
      out[label]['step_bytes'] = _StepMemory(fn, inputs, pids[:k],
                                             addresses[:k])
      out[label]['traced'] = _TracedPeaks(fn, inputs, pids[:k],
                                          addresses[:k])
  rounds = args.rounds if args.part == 'time' else 0
  for label in stack_lib.Rotations(list(fns), rounds):
    # First a step untimed: a user's step follows one of its own, while
    # this one follows another configuration's, and the first step after
    # a switch sometimes ran 19-29% slower than the next (3 of 16 switches
    # in one probe of the four AmoebaNet-D configurations).
    fns[label](inputs)[0].numpy()
    start = time.perf_counter()
    fns[label](inputs)[0].numpy()
    out[label]['times'].append(time.perf_counter() - start)
    replay = _Replay(tracers[label].Run())
    # The plain step just before, against this step's tasks: what the step
    # spends outside the pipeline's tasks (its call, inputs, gradients).
    replay['plain_s'] = out[label]['times'][-1]
    out[label]['replays'].append(replay)
  print(json.dumps(out), flush=True)


# ---- the driver ------------------------------------------------------------


def _Child(args: argparse.Namespace, part: str, extra: List[str],
           pin: bool = False,
           env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
  command = [sys.executable, '-m', 'bench.planner.run', f'--part={part}',
             f'--model={args.model}', f'--ks={args.ks}', f'--ms={args.ms}',
             f'--schedules={args.schedules}', f'--recompute={args.recompute}',
             f'--num_virtual_stages={args.num_virtual_stages}',
             f'--rounds={args.rounds}', f'--warmup={args.warmup}',
             f'--timing_runs={args.timing_runs}'] + extra
  if pin:
    command = ['taskset', '-c', '0'] + command
  child = subprocess.run(command, capture_output=True, text=True,
                         timeout=args.timeout,
                         env=dict(os.environ, **(env or {})))
  if child.returncode:
    raise SystemExit(f'{part} failed:\n{child.stderr[-3000:]}')
  return json.loads(child.stdout.strip().splitlines()[-1])


def _MeasureOnWorkers(args: argparse.Namespace, part: str,
                      pred: Dict[str, Any],
                      env: Dict[str, str]) -> Dict[str, Any]:
  """The `part` ('memory' or 'time') of every configuration, on two
  fresh pinned workers (memory workers for 'memory') that, like the
  client, run with `env`."""
  workers_class = (memory_worker.MemoryWorkers if part == 'memory'
                   else local_workers.LocalWorkers)
  with tempfile.TemporaryDirectory(prefix='planner_') as logs:
    with workers_class(2, logs, cores=[0, 1], env=env) as workers:
      return _Child(args, part, [
          f'--cluster_spec={workers.spec}',
          '--pids=' + ','.join(map(str, workers.pids)),
          f'--predicted={json.dumps(pred)}'], env=env)


def _WaitIdle() -> None:
  """Until no bench/memory process runs (polls every 30 s)."""
  while subprocess.run(['pgrep', '-f', r'bench[./]memory'],
                       capture_output=True).returncode == 0:
    print('waiting: a bench/memory process is running', flush=True)
    time.sleep(30)


def _CoreSeconds() -> List[float]:
  """bench/common/cores.py's numpy matmul pinned to core 0, then core 1."""
  return [cores.Pinned('matmul', [core])[0] for core in (0, 1)]


def _Error(pred: float, meas: float) -> str:
  """'+12%'; 'n/a' where nothing was measured (--parts)."""
  return f'{(pred - meas) / meas:+.0%}' if meas else 'n/a'


def _Median(values: List[float]) -> float:
  return statistics.median(values) if values else 0.0


def _Range(errors: List[float], digits: int = 0) -> str:
  return f'{min(errors):+.{digits}%} to {max(errors):+.{digits}%}'


def _TimeCells(m: int, schedule: str, rounds: List[Dict[str, Any]],
               summed_s: float, v: int = 1) -> List[str]:
  """The table's time cells of one configuration (module docstring);
  `summed_s` is the layer sums' prediction, given in brackets.

  The machine runs a core at one of two speeds, for 10-60 s at a time
  (README): a comparison means something only between measurements at
  the same speed. The headline compares the fast state: the prediction
  from each partition's least F and B over the rounds' profiles, and the
  least of the rounds' median steps. Beside it, each round's prediction
  against its own timing (both states mixed), the fastest stamped step's
  tasks through the schedule against the prediction, the schedule
  against each stamped step's span, and the plain step against it.
  """
  from lingvo_pipe.core import schedule as schedule_lib  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tools import step_model  # pylint: disable=g-import-not-at-top
  least = lambda rows: [min(col) for col in zip(*rows)]  # noqa: E731
  prof_fb = [least(parts) for parts in zip(*[r['fb'] for r in rounds])]
  # Runs before ZB-H1 kept no W: none ran.
  prof_w = least([r.get('w') or [0.0] * len(prof_fb) for r in rounds])
  hops = [min(h) for h in zip(*[r['hop_s'] for r in rounds])]
  # Runs before the hand-offs' share of the cores was measured: none.
  busy = tuple(rounds[0].get('hop_busy', (0.0, 0.0)))
  name, split = _Schedule(schedule)
  table = step_model.MakeTable(name, len(prof_fb), m, v,
                               split_backward=split)
  pred = schedule_lib.Simulate(
      table, [f for f, _ in prof_fb], [b for _, b in prof_fb], 0.0,
      hops or None, weight_s=prof_w if table.split_backward else None,
      hop_busy=busy).step
  meas = min(_Median(r['times']) for r in rounds)
  paired = [(r['step_s'] - _Median(r['times'])) / _Median(r['times'])
            for r in rounds]
  steps = [x for r in rounds for x in r['replays']]
  # Each stamped step's tasks through the schedule, the fastest step: its
  # tasks as they ran together (both workers busy at once, K=2), where
  # the least of each task alone would pick the times when one was idle.
  tasks = min(x['schedule_s'] for x in steps) / pred - 1
  schedule = [(x['schedule_s'] - x['span_s']) / x['span_s'] for x in steps]
  outside = [(x['plain_s'] - x['span_s']) / x['span_s'] for x in steps]
  return [f'{pred:.3f} ({summed_s:.3f}) s', f'{meas:.3f} s',
          f'{_Error(pred, meas)} ({_Error(summed_s, meas)})',
          f'{_Median(paired):+.0%} ({_Range(paired)})', f'{tasks:+.0%}',
          f'{_Median(schedule):+.1%} ({_Range(schedule, 1)})',
          f'{_Median(outside):+.0%} ({_Range(outside)})']


def _Table(model: str, pred: Dict[str, Any], meas: Dict[str, Any],
           recompute: str) -> str:
  """Time cells (_TimeCells) and memory: the first round's prediction
  against the median over fresh worker pairs."""
  mib = 2**20
  lines = [f'### {model}, recompute {recompute}', '',
           '| K M | schedule | split | step predicted, fast state (layer '
           'sums) | measured, fast state | error (layer sums) | each round '
           'against its own timing: median (range) | pipeline\'s tasks '
           'through the schedule against the prediction, fastest step | '
           'schedule of the measured '
           'tasks against their span: median (range) | the step beyond its '
           'tasks\' span: median (range) | step memory per '
           'worker predicted (layer sums) | measured, median (range) | '
           'error (layer sums) | a traced step: the tensors at the '
           'allocator\'s peak, the prediction\'s error against them; the '
           'chunks above the tensors |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for label, p in pred.items():
    k, m, schedule = _Parse(label)
    rounds = meas[label]['rounds']
    t = (_TimeCells(m, schedule, rounds, p['summed_step_s'], p.get('v', 1))
         if rounds else ['n/a'] * 7)
    mem_p, mem_m = p['step_bytes'], meas[label]['step_bytes']
    runs = meas[label]['step_bytes_runs']
    measured = [f'{x / mib:.1f}' + (
        f' ({min(w) / mib:.0f}-{max(w) / mib:.0f})' if len(runs) > 1 else '')
                for x, w in zip(mem_m, zip(*runs) if runs else mem_m)]
    sum_mem = p['summed_step_bytes']
    lines.append(
        f'| {k} {m} | {schedule} | {p["bounds"]} | ' + ' | '.join(t) + ' | '
        + ', '.join(f'{x / mib:.1f} ({y / mib:.1f})'
                    for x, y in zip(mem_p, sum_mem)) + ' MiB | '
        + ', '.join(measured) + ' MiB | '
        + ', '.join(f'{_Error(a, c)} ({_Error(b, c)})'
                    for a, b, c in zip(mem_p, sum_mem, mem_m)) + ' | '
        + _TracedCell(mem_p, meas[label].get('traced_runs', [])) + ' |')
  return '\n'.join(lines)


def _TracedCell(predicted: List[int], runs: List[List[List[int]]]) -> str:
  """Medians over the runs, per worker, of the traced step's tensors at
  its peak; the prediction's error against them; the chunks' excess."""
  if not runs:
    return 'n/a'
  per_worker = list(zip(*runs))  # per worker: [in_use, tensors] per run
  tensors = [_Median([t for _, t in w]) for w in per_worker]
  chunks = [_Median([u / t - 1 for u, t in w if t > 0]) for w in per_worker]
  return (', '.join(f'{t / 2**20:.1f}' for t in tensors) + ' MiB: ' +
          ', '.join(_Error(p, t) for p, t in zip(predicted, tensors)) +
          '; chunks ' + ', '.join(f'{c:+.0%}' for c in chunks))


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='transformer,amoebanet')
  parser.add_argument('--ks', default='1,2')
  parser.add_argument('--ms', default='1,4,8')
  parser.add_argument('--schedules', default=','.join(SCHEDULES),
                      help='Schedules each (K, M) is predicted and timed '
                      f'in, of {SCHEDULES}; a name + {SPLIT!r}: with '
                      'split backwards.')
  parser.add_argument('--profile_rounds', type=int, default=3,
                      help='Rounds of (profile the splits whole, time them '
                      'on the workers); each round\'s error is its '
                      'prediction against its own timing.')
  parser.add_argument('--rounds', type=int, default=5,
                      help='Timed steps of each configuration per round.')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--timing_runs', type=int, default=7)
  parser.add_argument('--memory_runs', type=int, default=3,
                      help='Fresh worker pairs the step memory is measured '
                      'on; the median is compared.')
  parser.add_argument('--timeout', type=float, default=3600)
  parser.add_argument('--json_out', default='')
  parser.add_argument('--tables_from', default='',
                      help='Print the tables of an earlier run\'s --json_out '
                      'file, and measure nothing.')
  parser.add_argument('--recompute', default='always',
                      choices=['always', 'never'],
                      help="Every configuration's recompute mode; the "
                      "zero-bubble schedules need 'never'.")
  parser.add_argument('--num_virtual_stages', type=int, default=2,
                      help='V, stages per worker of the schedules that run '
                      'several (interleaved_1f1b, looped_bfs; zb_v runs 2).')
  parser.add_argument('--parts', default='memory,time',
                      help='What to measure: memory, time or both.')
  parser.add_argument('--wait_idle', type=int, default=1,
                      help='0: measure even if bench/memory runs (noisy).')
  parser.add_argument('--part', default='', help=argparse.SUPPRESS)
  parser.add_argument('--model', default='', help=argparse.SUPPRESS)
  parser.add_argument('--cluster_spec', default='', help=argparse.SUPPRESS)
  parser.add_argument('--pids', default='', help=argparse.SUPPRESS)
  parser.add_argument('--predicted', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.memory_runs < 1:
    parser.error(f'--memory_runs={args.memory_runs}: give at least 1.')
  names = [_Schedule(x) for x in args.schedules.split(',')]
  bad = [x for x, _ in names if x not in SCHEDULES]
  if bad:
    parser.error(f'--schedules={args.schedules}: {bad} not in {SCHEDULES}; '
                 f'give some of those (each may end in {SPLIT!r}).')
  if any(registry.Lookup(x).splits_backward or split
         for x, split in names) and args.recompute != 'never':
    parser.error(f'--schedules={args.schedules} with '
                 f'--recompute={args.recompute}: zero-bubble schedules and '
                 'split backwards keep every activation; add '
                 '--recompute=never.')
  if args.profile_rounds < 1 or args.rounds < 1:
    parser.error(f'--profile_rounds={args.profile_rounds} '
                 f'--rounds={args.rounds}: give at least 1 of each.')
  return args


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.part:
    args.ks = [int(k) for k in args.ks.split(',')]
    args.ms = [int(m) for m in args.ms.split(',')]
    args.schedules = args.schedules.split(',')
    {'predict': _Predict, 'memory': _Measure, 'time': _Measure}[
        args.part](args)
    return
  if args.tables_from:
    with open(args.tables_from) as f:
      for model, res in json.load(f).items():
        print(_Table(model, res['predicted'], res['measured'],
                     res.get('recompute', 'always')) + '\n')
    return
  if args.wait_idle:
    _WaitIdle()
  print(cli.Header(), flush=True)
  results = {}
  for model in args.models.split(','):
    args.model = model
    speeds = [_CoreSeconds()]
    pred = _Child(args, 'predict', [], pin=True)
    parts = args.parts.split(',')
    # The machine's speed drifts by a fifth over minutes (README): each
    # round profiles the splits whole again, then times them at once, and
    # each round's prediction is compared with its own timing.
    rounds = []
    for r in range(args.profile_rounds if 'time' in parts else 0):
      pred_r = pred if r == 0 else _Child(
          args, 'predict', [f'--predicted={json.dumps(pred)}'], pin=True)
      rounds.append({'predicted': pred_r,
                     'measured': _MeasureOnWorkers(args, 'time', pred, {})})
      print(f'round {r + 1}/{args.profile_rounds}, predicted against '
            'measured: ' + ', '.join(
                f'K,M,schedule={label} ' + _Error(pred_r[label]['step_s'],
                                          statistics.median(meas['times']))
                for label, meas in rounds[-1]['measured'].items()),
            flush=True)
    speeds.append(_CoreSeconds())
    memory_runs = [_MeasureOnWorkers(args, 'memory', pred, MEMORY_ENV)
                   for _ in range(args.memory_runs if 'memory' in parts
                                  else 0)]
    meas = {}
    for label in pred:
      runs = [run[label]['step_bytes'] for run in memory_runs]
      meas[label] = {
          'rounds': [{'step_s': rnd['predicted'][label]['step_s'],
                      'fb': rnd['predicted'][label]['fb'],
                      'w': rnd['predicted'][label].get('w'),
                      # Runs before the hand-off term had none.
                      'hop_s': rnd['predicted'][label].get('hop_s', []),
                      'hop_busy': rnd['predicted'][label].get(
                          'hop_busy', [0.0, 0.0]),
                      'times': rnd['measured'][label]['times'],
                      'replays': rnd['measured'][label]['replays']}
                     for rnd in rounds],
          'step_bytes': ([int(statistics.median(w)) for w in zip(*runs)]
                         if runs else [0] * len(pred[label]['step_bytes'])),
          'step_bytes_runs': runs,
          'traced_runs': [run[label]['traced'] for run in memory_runs
                          if 'traced' in run[label]]}
    results[model] = {'predicted': pred, 'measured': meas,
                      'core_seconds': speeds, 'recompute': args.recompute}
    print('\n' + _Table(model, pred, meas, args.recompute), flush=True)
    transfers = sorted({p['transfer'] for p in pred.values()
                        if p.get('hop_s')})
    if transfers:
      print('\nhand-off (first round; tools/transfer_profile.py): '
            + '; '.join(transfers), flush=True)
    print('\ncores (numpy matmul alone, s; core 0, core 1): before the '
          'profile ' + ', '.join(f'{t:.3f}' for t in speeds[0]) +
          '; after the timing ' + ', '.join(f'{t:.3f}' for t in speeds[1]),
          flush=True)
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(results, f)


if __name__ == '__main__':
  main(sys.argv[1:])
