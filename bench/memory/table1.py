"""The paper's Table 1 on this machine: the largest model within a budget.

  .venv/bin/python -m bench.memory.run table1 [--model=transformer]
      [--budget_mib=128] [--m=8] [--setups=naive,1,2,4] [--repeats=1]
      [--schedule=gpipe] [--num_virtual_stages=1] [--recompute=always]
      [--dtype=float32] [--json_out=FILE]

For a memory budget per device, finds the largest model of a family that
trains one step (forward, loss, every gradient, an Adam update), in four
set-ups as GPipe's Table 1:

  naive        no pipeline, no re-computation, one device
  pipeline-1   PipeliningLayer, K=1, M micro-batches, re-computation
  pipeline-2   K=2: partition k on device k, re-computation
  pipeline-4   K=4

A pipeline's step is the trainer's one pass (`FPropWithLoss`, through
bench/common's `MeanSquareLoss`: each micro-batch's loss on the last
device as its forward ends) in the order of --schedule (one of
schedules/registry.py's Names()): 'gpipe' (every forward, then every backward),
'1f1b' (stage k holds at most K-k micro-batches between forward and
backward), 'interleaved_1f1b' with --num_virtual_stages=V stages per
device (K x V partitions, M a multiple of K), ... --recompute is the
pipelines' re-computation mode ('always', as the paper's Table 1). Rows
of another schedule than GPipe's name it ('pipeline-2 1f1b'). The loss
is mean(output ** 2): a Transformer's last vec, AmoebaNet-D's logits.
--dtype=bfloat16 sets the model's fprop_dtype (float32 variables and
Adam slots; bfloat16 compute and hand-offs; the loss in float32); its
rows say so ('pipeline-2 bfloat16').

Families: --model=transformer grows the number of bench/common Transformer
encoder layers (d=128, ff=512, 4 heads, seq 64, batch 32); --model=
amoebanet grows the filters D of lingvo_pipe.tasks.image.amoebanet's
AmoebaNet-D (6, D) (the published cells, CIFAR stem) on 16x16 images,
batch 32 (partitioned by flops).

A device is a `tf.distribute.Server` process on 127.0.0.1, one per
partition (naive and pipeline-1 use one): a memory worker of
lingvo_pipe.tools.memory_worker (`MemoryWorkers`), which reports its
allocator on SIGUSR1. Its memory is what TensorFlow's allocator holds for
tensors there, as a GPU's memory would be counted: the servers run with
TF_CPU_ALLOCATOR_USE_BFC=true, so the CPU allocator keeps statistics,
and `MemoryWorkers.ReadMemory` reads them. One client process per probe
builds and runs the model; per server it reads:

  param      allocator bytes after the client created the variables and
             Adam's slots, minus before (measured); beside it the exact
             bytes of those variables
  activation the allocator's peak during the second step (the first
             traces, optimises and runs once) minus its bytes before it:
             activations kept for the backward, the re-computation's
             working set, gradients and temporaries
  runtime    resident memory (RSS) after the first step minus after
             building: the optimised graphs and their kernels, kept
             between steps. Not counted: on an accelerator they live in
             host memory, and they do not grow with the model's width
             (AmoebaNet-D (6, D), pipeline-1 M=8: 171, 161, 179 MiB for
             D = 16, 32, 64), so they hold no tensors. A pipeline keeps
             more of it than the plain model (functions per partition):
             161 against 62 MiB at D=32, 55 against 25 MiB for 8
             Transformer layers (when a partition had three functions).
  device     param + activation: what an accelerator's memory would hold.

The first version read activations from RSS with glibc's mmap threshold
lowered; that under-reads small tensors (glibc keeps freed small blocks
resident, and the next step reuses them without RSS rising:
docs/DESIGN.md section 17), which flattered the pipelines' small
micro-batches.

A model fits when every device's `device` is within --budget_mib. The
search: the smallest size must fit; then sizes grow (doubling, later
interpolating between the largest fit and the smallest failure, memory
being monotone in size) until the gap is one size step or 5%. The
largest size that fitted is reported beside the smallest that did not.
With --repeats=N each size is probed N times, in fresh processes, and
the probe with the median worst device stands for it: one reading of the
same size moved by up to 15% (AmoebaNet-D naive D=32: 109-131 MiB), as
the executor's two threads order the ops differently from run to run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import memory_worker  # noqa: E402

SETUPS = {'naive': 'naive', '1': 'pipeline-1', '2': 'pipeline-2',
          '4': 'pipeline-4'}

# The families, and how far apart two sizes of one are.
_TRANSFORMER = dict(model_dim=128, hidden_dim=512, num_heads=4, seq_len=64,
                    batch=32)
_AMOEBA_CELLS, _AMOEBA_BATCH, _AMOEBA_IMAGE = 6, 32, 16
_AMOEBA_STEP = 4  # filters D move in steps of 4


def _Describe(model: str, dtype: str) -> str:
  if model == 'transformer':
    t = _TRANSFORMER
    return (f'L TransformerEncoderLayers, d={t["model_dim"]}, ff='
            f'{t["hidden_dim"]}, {t["num_heads"]} heads, seq {t["seq_len"]}, '
            f'batch {t["batch"]}, {dtype}')
  return (f'AmoebaNet-D ({_AMOEBA_CELLS}, D) of lingvo_pipe.tasks.image.'
          f'amoebanet (CIFAR stem), {_AMOEBA_IMAGE}x{_AMOEBA_IMAGE}x3 '
          f'images, batch {_AMOEBA_BATCH}, {dtype}')


def _SizeStep(model: str, stages: int) -> int:
  """Sizes are multiples of this: K x V equal stages of layers, or D."""
  return stages if model == 'transformer' else _AMOEBA_STEP


def _Label(setup: str, args: argparse.Namespace) -> str:
  """The row's name: pipeline-K, with the schedule when not GPipe's and
  the dtype when not float32."""
  dtype = '' if args.dtype == 'float32' else f' {args.dtype}'
  if setup == 'naive' or args.schedule == 'gpipe':
    return SETUPS[setup] + dtype
  virtual = (f' V={args.num_virtual_stages}'
             if args.num_virtual_stages > 1 else '')
  return f'{SETUPS[setup]} {args.schedule}{virtual}{dtype}'



# ---- one probe (a client subprocess with its own servers) ------------------


def _Build(args: argparse.Namespace,
           devices: List[str]) -> Tuple[Any, Any]:
  """(layer, inputs) of one set-up of --model; --k=0 means naive."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import layers  # pylint: disable=g-import-not-at-top
  k, m = args.k, args.m
  if args.model == 'transformer':
    from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
    stack = stack_lib.Stack(num_layers=args.size, dtype=args.dtype,
                            **_TRANSFORMER)
    setup = (stack_lib.Setup('plain') if k == 0 else
             stack_lib.Setup('pipe', k, m, args.recompute, args.schedule,
                             args.num_virtual_stages))
    return (stack_lib.BuildModel(stack, setup, devices),
            stack_lib.Inputs(stack))
  from lingvo_pipe.tasks.image import amoebanet  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tasks.image import model as model_lib  # pylint: disable=g-import-not-at-top
  layer_ps = amoebanet.AmoebaNetD(num_cells=_AMOEBA_CELLS, filters=args.size,
                                  num_classes=10, stem='cifar')
  fprop = None if args.dtype == 'float32' else tf.as_dtype(args.dtype)
  if k == 0:
    with tf.device(devices[0]):
      layer = layers.SequentialLayer.Params().Set(
          name='amoebanet', sub=layer_ps, fprop_dtype=fprop).Instantiate()
  else:
    p = model_lib.GPipeNetworkParams(
        layer_ps, k, m,
        tf.TensorShape([_AMOEBA_BATCH // m, _AMOEBA_IMAGE, _AMOEBA_IMAGE, 3]),
        recompute=args.recompute, schedule=args.schedule,
        num_virtual_stages=args.num_virtual_stages)
    layer = p.Set(name='amoebanet', devices=devices[:k],
                  fprop_dtype=fprop).Instantiate()
  layer.SetTraining(True)
  inputs = tf.random.stateless_normal(
      [_AMOEBA_BATCH, _AMOEBA_IMAGE, _AMOEBA_IMAGE, 3], [1, 2])
  return layer, tf.cast(inputs, args.dtype)


def Probe(num_workers: int,
          build: Callable[[List[str]], Tuple[Any, Any]]) -> dict:
  """Per server: params, param and activation MiB (module docstring).

  Starts `num_workers` servers, `build(device names)` -> (layer, inputs)
  makes the model there, and one step is the trainer's: loss =
  bench/common's `MeanSquareLoss` (a PipeliningLayer in one pass,
  FPropWithLoss, in its schedule's order; any other layer on the first
  device), every gradient, an Adam update. Call it in a fresh process:
  the allocator's peaks are the servers' whole life.
  """
  from bench.common import proc  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix='table1_') as logs, \
      memory_worker.MemoryWorkers(
          num_workers, logs,
          env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}) as workers:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import optimizer  # pylint: disable=g-import-not-at-top
    from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
    devices = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
    pids = workers.pids

    def Held() -> List[int]:
      return [r['CPU:0']['current'] for r in workers.ReadMemory()]

    idle = Held()
    layer, inputs = build(devices)
    variables = layer.vars.Flatten()
    adam = optimizer.Adam.Params().Set(name='adam').Instantiate()
    adam.CreateSlots(variables)
    built = Held()
    built_rss = [proc.StatusKiB('VmRSS', pid) for pid in pids]
    # A pipeline places its own ops; the plain model runs on device 0.
    scope = (None if isinstance(layer, gpipe.PipeliningLayer)
             else devices[0])

    def Step(x):
      with tf.device(scope):
        with tf.GradientTape() as tape:
          loss = stack_lib.MeanSquareLoss(layer, x)
        grads = tape.gradient(loss, variables)
        with tf.control_dependencies(adam.Apply(1e-4, zip(grads, variables))):
          return tf.identity(loss)

    step = tf.function(Step, autograph=False)
    step(inputs).numpy()  # traces, optimises, runs once
    warm_rss = [proc.StatusKiB('VmRSS', pid) for pid in pids]
    base = Held()  # and each peak starts again
    loss = float(step(inputs))
    peak = [r['CPU:0']['peak'] for r in workers.ReadMemory()]
    if not math.isfinite(loss):
      raise SystemExit(f'probe: loss {loss}')
    params, exact = [0] * num_workers, [0] * num_workers
    task_of = {tf.DeviceSpec.from_string(d).task: i
               for i, d in enumerate(devices[:num_workers])}
    trainable = {id(v) for v in variables}
    for var in variables + list(adam.SlotVariables().values()):
      task = task_of.get(tf.DeviceSpec.from_string(var.device).task)
      if task is None:  # Adam's step counter lives on the client
        continue
      size = var.shape.num_elements()
      exact[task] += size * var.dtype.size
      if id(var) in trainable:
        params[task] += size
  mib = lambda n: n / 2**20  # noqa: E731
  return {'params': params, 'exact_param_mib': [mib(e) for e in exact],
          'param_mib': [mib(b - i) for b, i in zip(built, idle)],
          'activation_mib': [mib(p - b) for p, b in zip(peak, base)],
          'base_mib': [mib(b) for b in base],
          'peak_mib': [mib(p) for p in peak],
          'runtime_mib': [(w - b) / 1024 for w, b in zip(warm_rss, built_rss)],
          'loss': loss}


def PrintProbe(record: dict) -> None:
  """A probe process's last line: its record, for RunProbe."""
  print(json.dumps(record), flush=True)
  # The servers are gone: skip TF's teardown, which would try to remove
  # the step's functions from them and complain on stderr.
  os._exit(0)


def RunProbe(command: List[str], what: str, timeout: float) -> dict:
  """Runs a probe process (`command`, ending with PrintProbe) afresh.

  Its record, plus device_mib = param + activation per server.
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  child = subprocess.run(command, capture_output=True, text=True,
                         timeout=timeout, env=env)
  if child.returncode:
    raise SystemExit(f'probe {what} failed:\n{child.stderr[-3000:]}')
  rec = json.loads(child.stdout.strip().splitlines()[-1])
  rec['device_mib'] = [p + a for p, a in zip(rec['param_mib'],
                                             rec['activation_mib'])]
  return rec


def _RunProbe(args: argparse.Namespace, size: int, k: int, m: int) -> dict:
  """One probe of --model at `size` in a fresh client; k == 0 is naive."""
  command = [sys.executable, '-m', 'bench.memory.table1', '--probe',
             f'--model={args.model}', f'--size={size}', f'--k={k}',
             f'--m={m}', f'--schedule={args.schedule}',
             f'--num_virtual_stages={args.num_virtual_stages}',
             f'--recompute={args.recompute}', f'--dtype={args.dtype}']
  rec = RunProbe(command, f'{args.model} size {size} K={k} M={m}',
                 args.timeout)
  rec['size'] = size
  return rec


# ---- the search --------------------------------------------------------------


def Largest(fits: Callable[[int], Tuple[bool, float]], start: int, step: int,
            budget: float, tolerance: float = 0.05,
            max_probes: int = 12) -> Tuple[Optional[int], Optional[int],
                                           List[Tuple[int, float]]]:
  """(largest size that fits, smallest that did not, [(size, memory)]).

  `fits(size)` -> (fits, memory). Sizes are multiples of `step`, from
  `start`. Memory is assumed to grow with size: the next size interpolates
  between the largest fit and the smallest failure (or doubles while there
  is no failure), and the search stops when they are one step or
  `tolerance` apart. (None, start, ...) if even `start` does not fit.
  """
  tried: List[Tuple[int, float]] = []

  def Try(size: int) -> bool:
    ok, memory = fits(size)
    tried.append((size, memory))
    return ok

  if not Try(start):
    return None, start, tried
  lo, hi = start, None
  while len(tried) < max_probes:
    if hi is not None and (hi - lo <= step or hi - lo <= tolerance * lo):
      break
    mem = dict(tried)
    if hi is None:
      guess = 2 * lo
      if len(tried) >= 2:  # extrapolate the last two fits, at most x4
        (s0, m0), (s1, m1) = sorted(tried)[-2:]
        if m1 > m0:
          guess = min(4 * lo, int(s1 + (budget - m1) * (s1 - s0) / (m1 - m0)))
          guess = max(guess, lo + step)
    else:
      m_lo, m_hi = mem[lo], mem[hi]
      guess = lo + (hi - lo) * (budget - m_lo) / max(m_hi - m_lo, 1e-9)
      guess = int(guess)
    guess = max(lo + step, guess // step * step)
    if hi is not None:
      guess = min(guess, hi - step)
    if Try(guess):
      lo = guess
    else:
      hi = guess
  return lo, hi, tried


# ---- the driver --------------------------------------------------------------


def _Search(args: argparse.Namespace, setup: str,
            log: Callable[[str], None]) -> dict:
  k = 0 if setup == 'naive' else int(setup)
  m = 1 if setup == 'naive' else args.m
  label = _Label(setup, args)
  step = _SizeStep(args.model,
                   1 if k == 0 else k * args.num_virtual_stages)
  start = step * math.ceil(args.start / step)
  records: Dict[int, dict] = {}

  def Fits(size: int) -> Tuple[bool, float]:
    begin = time.perf_counter()
    runs = sorted((_RunProbe(args, size, k, m)
                   for _ in range(args.repeats)),
                  key=lambda r: max(r['device_mib']))
    rec = records[size] = runs[(len(runs) - 1) // 2]
    worst = max(rec['device_mib'])
    log(f'  {label} size {size}: device MiB ' + ', '.join(
        f'{d:.0f}' for d in rec['device_mib']) +
        (' (median of ' + ', '.join(f'{max(r["device_mib"]):.0f}'
                                    for r in runs) + ')'
         if len(runs) > 1 else '') +
        f' ({"fits" if worst <= args.budget_mib else "over"}; '
        f'{time.perf_counter() - begin:.0f} s)')
    return worst <= args.budget_mib, worst

  lo, hi, tried = Largest(Fits, start, step, args.budget_mib)
  return {'setup': label, 'k': k, 'm': m, 'largest': lo,
          'next_over': hi, 'record': records.get(lo), 'tried': tried}


def _Row(res: dict) -> str:
  rec = res['record']
  if rec is None:
    return (f'| {res["setup"]} | none (size {res["next_over"]} is over) '
            '| | | | | | |')
  params = sum(rec['params'])
  return (f'| {res["setup"]} | {res["largest"]} ({res["next_over"]}) | '
          f'{params / 1e6:.2f} M | {sum(rec["param_mib"]):.0f} '
          f'({sum(rec["exact_param_mib"]):.0f}) | '
          f'{max(rec["activation_mib"]):.0f} | '
          f'{max(rec["runtime_mib"]):.0f} | '
          f'{max(rec["device_mib"]):.0f} | {len(res["tried"])} |')


def _Table(results: List[dict], args: argparse.Namespace) -> str:
  size_name = 'L' if args.model == 'transformer' else 'D'
  lines = [f'| set-up | largest {size_name} (next, over) | parameters | '
           'parameter MiB, measured (exact) | peak activation MiB, worst '
           'device | runtime MiB (not counted), worst device | device MiB, '
           'worst | probes |',
           '|---|---|---|---|---|---|---|---|']
  lines += [_Row(res) for res in results]
  naive = next((r for r in results if r['k'] == 0), None)
  if naive and naive['record']:
    base = sum(naive['record']['params'])
    ratios = [f'{r["setup"]} {sum(r["record"]["params"]) / base:.1f}x'
              for r in results if r['record'] and r is not naive]
    lines += ['', 'Parameters against naive: ' + ', '.join(ratios) + '.']
  return '\n'.join(lines)


def _ScheduleText(args: argparse.Namespace) -> str:
  if args.schedule == 'interleaved_1f1b':
    return f'schedule {args.schedule} V={args.num_virtual_stages}'
  return f'schedule {args.schedule}'


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--model', choices=['transformer', 'amoebanet'],
                      default='transformer')
  parser.add_argument('--budget_mib', type=float, default=128,
                      help='memory budget of each device (MiB)')
  parser.add_argument('--m', type=int, default=8,
                      help='micro-batches of the pipeline set-ups')
  parser.add_argument('--setups', default='naive,1,2,4',
                      help='of naive, 1, 2, 4 (pipeline-K)')
  parser.add_argument('--schedule', default='gpipe',
                      choices=registry.Names(),
                      help='schedule of the pipeline set-ups')
  parser.add_argument('--num_virtual_stages', type=int, default=1,
                      help='V stages per device (interleaved_1f1b)')
  parser.add_argument('--recompute', default='always',
                      choices=['always', 'except_last', 'never'],
                      help='re-computation of the pipeline set-ups')
  parser.add_argument('--dtype', default='float32',
                      choices=['float32', 'bfloat16'],
                      help="the model's fprop_dtype (variables float32)")
  parser.add_argument('--start', type=int, default=4,
                      help='smallest size tried (layers or filters)')
  parser.add_argument('--timeout', type=float, default=1800,
                      help='seconds per probe')
  parser.add_argument('--repeats', type=int, default=1,
                      help='Probes per size; the median one counts.')
  parser.add_argument('--json_out', default='')
  parser.add_argument('--probe', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--size', type=int, help=argparse.SUPPRESS)
  parser.add_argument('--k', type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  bad = [s for s in args.setups.split(',') if s not in SETUPS]
  if bad:
    parser.error(f'--setups={args.setups}: {bad} unknown; use some of '
                 'naive,1,2,4.')
  if args.budget_mib <= 0 or args.m < 1:
    parser.error('--budget_mib must be positive and --m at least 1.')
  if args.repeats < 1:
    parser.error(f'--repeats={args.repeats}: give at least 1.')
  if args.num_virtual_stages < 1 or (
      args.num_virtual_stages > 1 and args.schedule != 'interleaved_1f1b'):
    parser.error(f'--num_virtual_stages={args.num_virtual_stages}: more '
                 'than 1 needs --schedule=interleaved_1f1b.')
  return args


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.probe:
    PrintProbe(Probe(max(args.k, 1), lambda devices: _Build(args, devices)))
  print(f'{cli.Header()}\nModel: {_Describe(args.model, args.dtype)}; '
        f'budget {args.budget_mib:g} MiB per device; pipelines M={args.m}, '
        f'{_ScheduleText(args)}, re-computation {args.recompute}; Adam.',
        flush=True)
  results = []
  for setup in args.setups.split(','):
    results.append(_Search(args, setup, lambda s: print(s, flush=True)))
  print('\n' + _Table(results, args), flush=True)
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'args': vars(args), 'results': results}, f)


if __name__ == '__main__':
  main(sys.argv[1:])
