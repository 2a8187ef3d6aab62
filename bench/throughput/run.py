"""The paper's Table 2 on this machine: normalised throughput over K and M.

  .venv/bin/python -m bench.throughput.run [--model=transformer]
      [--rounds=5] [--warmup=2] [--ms=1,4,8,32] [--filters=16]
      [--schedules=gpipe,1f1b] [--parts=workers,logical] [--json_out=FILE]

--model=transformer: bench/common's Transformer stack (stack.py: 8 encoder
layers, d=256, batch 32); --model=amoebanet: AmoebaNet-D (6, --filters)
of lingvo_pipe.tasks.image.amoebanet (the published cells, CIFAR stem),
on 32x32 images, batch 32, partitioned by flops. GPipe's re-computation
('always'); a step is the trainer's (bench/common's stack.TrainStep): the
forward, the loss (mean square of the output), every variable's gradient
and an SGD update of each variable on its own device. Per schedule
(--schedules; K=1 runs GPipe's only, every schedule is the same there) and
(K, M):

  throughput   batch / median step time, over `rounds` rounds in which
               every configuration of the part runs one step, starting one
               further along each round (interleaved: the machine's drift
               hits all alike)
  normalised   throughput / that of K=2 M=1 (the paper's normalisation)
  ideal        the schedule's table simulated with equal stages, backward
               twice the forward, free hand-offs (K M / (M + K - 1) for
               GPipe and 1F1B), normalised the same way (K=2 M=1: 1)
  bubble       measured by step_trace (one traced step after warm-up)
               beside the ideal bubble of the order that ran

Part 1: K=1 and K=2 on two worker processes, each pinned to one core
(`LocalWorkers`), partition k on task k: real parallel devices. Part 2:
K=4 and K=8 on 8 logical CPUs of one process, which share the 2 cores:
it shows the schedule's overheads, not a speed-up (2 cores cannot run 4
or 8 partitions at once), and its normalisation is to its own K=2 M=1 on
the same logical CPUs. One client process per part (connecting to a
cluster changes a process for good). Nothing else should run meanwhile.
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
from typing import List, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402

def _Label(k: int, m: int, schedule: str = 'gpipe') -> str:
  return f'K={k} M={m}' + ('' if schedule == 'gpipe' else f' {schedule}')


def _Schedules(k: int, schedules: List[str]) -> List[str]:
  """Every schedule is GPipe's order with one device."""
  return ['gpipe'] if k == 1 else schedules


def _Ideal(k: int, m: int, schedule: str) -> float:
  """The table's throughput against one device, equal stages (normalised
  by the caller)."""
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  return stack_lib.Ideal(stack_lib.Setup('pipe', k, m, None, schedule))


# ---- the client (a subprocess) ---------------------------------------------


def _Client(args: argparse.Namespace) -> None:
  from lingvo_pipe.core import quiet  # pylint: disable=g-import-not-at-top
  tf = quiet.ImportTensorFlow()
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import devices as devices_lib  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import step_trace  # pylint: disable=g-import-not-at-top
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  if args.cluster_spec:
    devices = cluster.Connect(cluster.ParseClusterSpec(args.cluster_spec))
  else:
    devices = devices_lib.SplitCpu(max(args.ks))
  stack = stack_lib.Stack()
  if args.model == 'transformer':
    inputs, describe = stack_lib.Inputs(stack), stack.Describe()
  else:
    inputs, describe = _AmoebaInputs(), _AmoebaText(args.filters)
  steps, out = {}, {}
  configs = [(k, m, sched) for k in args.ks for m in args.ms
             for sched in _Schedules(k, args.schedules)]
  for k, m, sched in configs:
    setup = stack_lib.Setup('pipe', k, m, 'always', sched)
    if args.model == 'transformer':
      layer = stack_lib.BuildModel(stack, setup, devices)
      fn = stack_lib.TrainStepFunction(layer, setup, devices[0])
    else:
      fn = _AmoebaStep(k, m, devices, args.filters, sched)
    label = _Label(k, m, sched)
    steps[label] = stack_lib.Prepare(fn, inputs, args.warmup).fn
    trace = step_trace.Measure(fn.python_function, inputs, warmup=1)
    layer_path = trace.Layers()[0]
    out[label] = {
        'k': k, 'm': m, 'schedule': sched, 'times': [],
        'bubble': trace.Bubble(layer_path),
        'ideal_bubble': trace.IdealBubble(layer_path, measured=False),
        'busy': trace.BusyFractions(layer_path), 'devices': devices[:k]}
  for label in stack_lib.Rotations(list(steps), args.rounds):
    begin = time.perf_counter()
    steps[label](inputs)[0].numpy()
    out[label]['times'].append(time.perf_counter() - begin)
  print(json.dumps({'batch': int(tf.nest.flatten(inputs)[0].shape[0]),
                    'stack': describe, 'configs': out}), flush=True)


# AmoebaNet-D with the published cells, CIFAR-sized.
_AMOEBA = dict(num_cells=6, num_classes=10, stem='cifar')
_AMOEBA_BATCH = 32


def _AmoebaText(filters: int) -> str:
  return (f'AmoebaNet-D (L, D) = (6, {filters}) of lingvo_pipe.tasks.image.'
          f'amoebanet, 32x32x3 images, batch {_AMOEBA_BATCH}, float32')


def _AmoebaInputs():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.random.stateless_normal([_AMOEBA_BATCH, 32, 32, 3], [1, 2])


def _AmoebaStep(k: int, m: int, devices: List[str], filters: int,
                schedule: str):
  """tf.function: images -> (loss,), stack.TrainStep's; split by flops."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tasks.image import amoebanet  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.tasks.image import model  # pylint: disable=g-import-not-at-top
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  p = model.GPipeNetworkParams(
      amoebanet.AmoebaNetD(filters=filters, **_AMOEBA), k, m,
      tf.TensorShape([_AMOEBA_BATCH // m, 32, 32, 3]), schedule=schedule)
  layer = p.Set(name='amoebanet', devices=devices[:k]).Instantiate()
  layer.SetTraining(True)
  return stack_lib.TrainStep(
      layer, lambda images: stack_lib.MeanSquareLoss(layer, images))


# ---- the driver ------------------------------------------------------------


def _RunClient(args: argparse.Namespace, ks: List[int], spec: str) -> dict:
  command = [sys.executable, '-m', 'bench.throughput.run', '--client',
             f'--model={args.model}',
             '--ks=' + ','.join(map(str, ks)), f'--ms={args.ms}',
             f'--rounds={args.rounds}', f'--warmup={args.warmup}',
             f'--filters={args.filters}',
             '--schedules=' + ','.join(args.schedules)]
  if spec:
    command.append(f'--cluster_spec={spec}')
  child = subprocess.run(command, capture_output=True, text=True,
                         timeout=args.timeout,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  if child.returncode:
    raise SystemExit(f'client failed:\n{child.stderr[-3000:]}')
  return json.loads(child.stdout.strip().splitlines()[-1])


def _Table(res: dict, ks: List[int], ms: List[int],
           schedules: List[str]) -> str:
  configs = res['configs']
  base = statistics.median(configs[_Label(2, 1)]['times'])
  base_ideal = _Ideal(2, 1, 'gpipe')
  lines = ['| K | schedule | ' + ' | '.join(f'M={m}' for m in ms) + ' |',
           '|---|---|' + '---|' * len(ms)]
  for k in ks:
    for sched in _Schedules(k, schedules):
      cells = []
      for m in ms:
        rec = configs[_Label(k, m, sched)]
        t = statistics.median(rec['times'])
        ideal = _Ideal(k, m, sched) / base_ideal
        cells.append(f'{base / t:.2f} ({ideal:.2f}); bubble '
                     f'{rec["bubble"]:.0%} ({rec["ideal_bubble"]:.0%})')
      lines.append(f'| {k} | {sched} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  lines.append('Cells: normalised throughput (ideal of the schedule); '
               'measured bubble (ideal bubble of that order). K=2 M=1 '
               f'median step: {base:.3f} s for {res["batch"]} examples.')
  return '\n'.join(lines)


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--ms', default='1,4,8,32')
  parser.add_argument('--model', choices=['transformer', 'amoebanet'],
                      default='transformer')
  parser.add_argument('--filters', type=int, default=16,
                      help='AmoebaNet-D\'s D (--model=amoebanet).')
  parser.add_argument('--schedules', default='gpipe',
                      help='Comma-separated schedules (gpipe, 1f1b).')
  parser.add_argument('--parts', default='workers,logical',
                      help='workers: K=1, 2 on two worker processes; '
                      'logical: K=2, 4, 8 on logical CPUs.')
  parser.add_argument('--timeout', type=float, default=3600)
  parser.add_argument('--json_out', default='')
  parser.add_argument('--client', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--ks', help=argparse.SUPPRESS)
  parser.add_argument('--cluster_spec', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.parts = args.parts.split(',')
  args.schedules = args.schedules.split(',')
  unknown = set(args.parts) - {'workers', 'logical'}
  if unknown or not args.parts:
    parser.error(f'--parts={",".join(args.parts)}: give workers, logical '
                 'or both.')
  if args.filters < 1:
    parser.error(f'--filters={args.filters}: give a positive D.')
  if args.client:
    args.ks = [int(k) for k in args.ks.split(',')]
    args.ms = [int(m) for m in args.ms.split(',')]
  return args


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.client:
    _Client(args)
    return
  ms = [int(m) for m in args.ms.split(',')]
  print(cli.Header(), flush=True)
  results = {}
  if 'workers' in args.parts:
    with tempfile.TemporaryDirectory(prefix='table2_') as logs:
      with local_workers.LocalWorkers(2, logs, cores=[0, 1]) as workers:
        part1 = results['workers'] = _RunClient(args, [1, 2], workers.spec)
    print(f'\nModel: {part1["stack"]}; re-computation always.\n\n'
          '### K=1, 2 on two worker processes, one core each\n\n' +
          _Table(part1, [1, 2], ms, args.schedules), flush=True)
  if 'logical' in args.parts:
    part2 = results['logical'] = _RunClient(args, [2, 4, 8], '')
    if 'workers' not in args.parts:
      print(f'\nModel: {part2["stack"]}; re-computation always.')
    print('\n### K=2, 4, 8 on 8 logical CPUs sharing 2 cores (overheads, '
          'not speed)\n\n' + _Table(part2, [2, 4, 8], ms, args.schedules),
          flush=True)
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(results, f)


if __name__ == '__main__':
  main(sys.argv[1:])
