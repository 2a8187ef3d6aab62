"""Schedules side by side: throughput on two pinned workers, and start-up.

  .venv/bin/python -m bench.scaling.run schedules
      [--what=all|throughput|startup] [--rounds=10] [--modes=never,always]
      [--json_out=FILE]
  .venv/bin/python -m bench.scaling.run schedules --what=pictures
      [--pictures=docs/schedules]

throughput: two `tf.distribute.Server` workers on 127.0.0.1, worker i
pinned to core i, fresh for each recompute mode; one client
(`throughput.py`) builds bench/common's stack (8 Transformer layers, d=256)
in every configuration below, warms each up, then times --rounds rounds
of one training step of each, interleaved: the trainer's step (one pass,
`FPropWithLoss`; an SGD update of each variable on its worker; only the
loss comes back, `stack.TrainStepFunction`). Configurations: K=1 M=1 (the
baseline); K=2 M=8 with GPipe and 1F1B (and zero bubble, ZB-H1, with
recompute 'never', the only mode it runs); K=2 M=4 with GPipe, 1F1B and
interleaved 1F1B (V=2: four stages of two layers, stage s on worker
s mod 2); K=2 M=32 with GPipe and 1F1B; with recompute 'never', GPipe,
1F1B and interleaved 1F1B also with split_backward (each B, the input
gradient, then its W). Reported: median seconds per
step, throughput = t(K=1 M=1) / t, and the ideal of each schedule, the
throughput its table reaches when every stage's forward costs the same
and a backward twice that, hand-offs free (`schedule.Simulate`):
K*M/(M+K-1) for GPipe and 1F1B, more for interleaved (ZB-H1's ideal
takes its B and W as one backward each: 2/3 and 1/3 of it; so does
a split table). Each
configuration's bubble is measured too (step_trace, one traced step)
beside the ideal bubble of its order.

startup: K=8 M=32, K logical CPUs in one process per measurement
(`startup.py`), --startup_repeats measurements, medians: the start-up
stack (8 layers d=64) in every schedule, one stage per device (GPipe,
1F1B, ZB-H1) or, for interleaved 1F1B (V=2: 16 stages), each layer as its
two residual sub-layers (`Stack.halves`, the same function); and a
16-layer stack, twice the model, in GPipe and interleaved 1F1B.

pictures: the measured timeline (step_trace) of one training step of each
schedule on the two pinned workers (the trainer's step, as throughput's),
K=2 M=8 recompute 'never' (interleaved with V=2), written as
<schedule>.svg and .json into --pictures.

Targets (docs/DESIGN.md sections 2 and 29): 1F1B K=2 M=8 reaches at least
0.9 of GPipe's ideal; interleaved K=2 V=2 M=4 beats GPipe K=2 M=4 by at
least half of what the two ideals predict; K=8 M=32 first step at most
10 s for every schedule on the 8-layer model. The throughput targets are
judged with backwards whole and, with recompute 'never', split (each
against GPipe split the same way).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402
from bench.scaling import pipeline as scaling  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402

Setup = stack_lib.Setup
ONE_F_ONE_B_TARGET = 0.9  # of GPipe's ideal, K=2 M=8
INTERLEAVED_SHARE_TARGET = 0.5  # of the predicted gain over GPipe, M=4
FIRST_STEP_TARGET = 10.0  # seconds, K=8 M=32


def ThroughputSetups(mode: str) -> List[Setup]:
  never = mode == 'never'
  zero_bubble = ['zb_h1'] if never else []
  splits = (False, True) if never else (False,)
  return ([Setup('pipe', 1, 1, mode)] +
          [Setup('pipe', 2, 8, mode, s, 1, split)
           for split in splits for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 8, mode, s) for s in zero_bubble] +
          [Setup('pipe', 2, 4, mode, s) for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 4, mode, s, v, split) for split in splits
           for s, v in (('gpipe', 1), ('interleaved_1f1b', 2))
           if split or s != 'gpipe'] +
          [Setup('pipe', 2, 32, mode, s) for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 32, mode, '1f1b', 1, True)] * never)


Ideal = stack_lib.Ideal


def MeasureThroughput(stack: stack_lib.Stack, modes: Sequence[str],
                      args: argparse.Namespace) -> Dict[str, dict]:
  out = {}
  with tempfile.TemporaryDirectory(prefix='schedules_servers_') as logs:
    workers = local_workers.LocalWorkers(2, logs)
    for mode in modes:
      start = time.time()
      results = scaling._OneClient(  # pylint: disable=protected-access
          workers, stack, ThroughputSetups(mode), args)
      out.update(results)
      for label, r in results.items():
        if 'error' not in r:
          print(f'  {label}: {statistics.median(r["times"]):.3f} s/step, '
                f'first call {r["first"]:.1f} s', flush=True)
      print(f'  {mode}: {time.time() - start:.0f} s', flush=True)
  return out


def ThroughputTable(stack: stack_lib.Stack, mode: str,
                    results: Dict[str, dict]) -> str:
  rows = [(Setup.FromText(r['setup']), r) for r in results.values()
          if Setup.FromText(r['setup']).recompute == mode]
  med = {s: statistics.median(r['times']) for s, r in rows
         if 'error' not in r}
  base = next((t for s, t in med.items() if s.k == 1), None)
  lines = [f"### Schedules, recompute '{mode}'", '',
           f'{stack.Describe()}; one worker process per task, each pinned '
           'to one core.', '',
           '| schedule | K | V | M | median s/step | throughput | ideal '
           '| of its ideal | of GPipe\'s ideal | bubble (ideal) '
           '| worker CPU s/step |',
           '|' + '---|' * 11]
  for s, r in rows:
    if 'error' in r:
      lines.append(f'| {_Name(s)} | {s.k} | {s.v} | {s.m} | error: '
                   f'{r["error"].strip().splitlines()[-1][:80]} |')
      continue
    tput = base / med[s]
    gpipe_ideal = Ideal(dataclasses.replace(s, schedule='gpipe', v=1,
                                            split=False))
    lines.append(
        f'| {_Name(s)} | {s.k} | {s.v} | {s.m} | {med[s]:.3f} | '
        f'{tput:.2f} | {Ideal(s):.2f} | {tput / Ideal(s):.2f} | '
        f'{tput / gpipe_ideal:.2f} | {_Bubble(r)} | '
        f'{", ".join(f"{c:.3f}" for c in r["worker_cpu"])} |')
  lines += [''] + Targets(med, base)
  return '\n'.join(lines)


def _Name(setup: Setup) -> str:
  return setup.schedule + (', split' if setup.split else '')


def _Bubble(record: dict) -> str:
  if 'bubble' not in record:
    return '-'
  return f'{record["bubble"]:.0%} ({record["ideal_bubble"]:.0%})'


def Targets(med: Dict[Setup, float], base: float) -> List[str]:
  """The module docstring's throughput targets, met or missed: with
  backwards whole and, where measured, split."""
  def Find(m: int, sched: str, split: bool) -> Setup:
    return next((s for s in med if s.k == 2 and s.m == m and
                 s.schedule == sched and s.split == split), None)

  lines = []
  for split in (False, True):
    one = Find(8, '1f1b', split)
    if one is not None:
      ratio = base / med[one] / Ideal(Setup('pipe', 2, 8, one.recompute))
      lines.append(f'- 1F1B K=2 M=8{", split" * split}: {ratio:.2f} of '
                   f"GPipe's ideal (target >= {ONE_F_ONE_B_TARGET}: "
                   f'{"ok" if ratio >= ONE_F_ONE_B_TARGET else "MISS"})')
  for split in (False, True):
    inter, gpipe = Find(4, 'interleaved_1f1b', split), Find(4, 'gpipe', split)
    if inter is not None and gpipe is not None:
      predicted = Ideal(inter) / Ideal(gpipe) - 1.0
      measured = med[gpipe] / med[inter] - 1.0
      share = measured / predicted
      lines.append(
          f'- interleaved K=2 V=2 M=4 against GPipe K=2 M=4'
          f'{", both split" * split}: {measured:+.1%} (ideal '
          f'{predicted:+.1%}; {share:.2f} of it, target >= '
          f'{INTERLEAVED_SHARE_TARGET}: '
          f'{"ok" if share >= INTERLEAVED_SHARE_TARGET else "MISS"})')
  return lines


# The start-up models: key -> (encoder layers, as halves, table label).
STARTUP_MODELS = {'8': (8, False, '8 layers'),
                  '8h': (8, True, '8 layers as 16 halves'),
                  '16': (16, False, '16 layers')}


def StartupRuns(modes: Sequence[str]) -> List[Tuple[str, Setup]]:
  """(model key, setup): the 8-layer stack for every schedule (as its 16
  sub-layers where interleaving needs K x V = 16 stages); a 16-layer stack,
  twice the model, for GPipe and interleaving beside it."""
  runs = []
  for mode in modes:
    runs += [('8', Setup('pipe', 8, 32, mode, s)) for s in ('gpipe', '1f1b')]
    if mode == 'never':
      runs.append(('8', Setup('pipe', 8, 32, mode, 'zb_h1')))
    runs += [('8h', Setup('pipe', 8, 32, mode, 'interleaved_1f1b', 2)),
             ('16', Setup('pipe', 8, 32, mode, 'gpipe')),
             ('16', Setup('pipe', 8, 32, mode, 'interleaved_1f1b', 2))]
  return runs


def MeasureStartup(args: argparse.Namespace) -> Dict[str, dict]:
  runs = StartupRuns(args.modes.split(','))
  times: Dict[int, List[float]] = {i: [] for i in range(len(runs))}
  for i in stack_lib.Rotations(list(range(len(runs))), args.startup_repeats):
    model, setup = runs[i]
    layers, halves, label = STARTUP_MODELS[model]
    stack = stack_lib.Stack(num_layers=layers, model_dim=64, hidden_dim=256,
                            halves=halves)
    r = scaling._RunChild(  # pylint: disable=protected-access
        'startup', [f'--stack={json.dumps(dataclasses.asdict(stack))}',
                       '--steps=1', f'--setup={setup.ToText()}'],
        args.timeout)
    times[i].append(r['first_step'])
    print(f'  {label}, {setup.label}: first step '
          f'{r["first_step"]:.1f} s, {r["ops"]} ops', flush=True)
  return {f'{model}:{setup.ToText()}': {'first_step_runs': times[i]}
          for i, (model, setup) in enumerate(runs)}


def StartupTable(results: Dict[str, dict]) -> str:
  """The first step of every run; the target holds the 8-layer model's
  slowest median (every schedule on the same model)."""
  lines = ['### Start-up, K=8 M=32', '',
           'Transformer layers d=64, ff=256; K logical CPUs in one '
           'process per measurement.', '',
           '| model | schedule | V | recompute | first step s (median) '
           '| each run |', '|---|---|---|---|---|---|']
  worst = {}
  for key, r in results.items():
    model, text = key.split(':')
    s = Setup.FromText(text)
    med = statistics.median(r['first_step_runs'])
    layers = STARTUP_MODELS[model][0]
    worst[layers] = max(worst.get(layers, 0.0), med)
    lines.append(f'| {STARTUP_MODELS[model][2]} | {s.schedule} | {s.v} | '
                 f'{s.recompute} | {med:.1f} | ' +
                 ', '.join(f'{t:.1f}' for t in r['first_step_runs']) + ' |')
  lines.append('')
  if 8 in worst:
    lines.append(f'- 8 layers, every schedule: slowest median {worst[8]:.1f} '
                 f's (target <= {FIRST_STEP_TARGET:.0f} s: '
                 f'{"ok" if worst[8] <= FIRST_STEP_TARGET else "MISS"})')
  if 16 in worst:
    lines.append(f'- 16 layers (twice the model, no target): slowest median '
                 f'{worst[16]:.1f} s')
  return '\n'.join(lines)


PICTURES = [Setup('pipe', 2, 8, 'never', s, v) for s, v in (
    ('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2), ('zb_h1', 1))]


def PicturesClient(spec: str, directory: str) -> None:
  """In a child process (it connects to the workers): one measured step
  of each of PICTURES, written into `directory`."""
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import step_trace  # pylint: disable=g-import-not-at-top
  devices = cluster.Connect(cluster.ParseClusterSpec(spec))
  stack = stack_lib.Stack()
  inputs = stack_lib.Inputs(stack)
  for setup in PICTURES:
    layer = stack_lib.BuildModel(stack, setup, devices)
    step = stack_lib.TrainStepFunction(layer, setup, devices[0])
    trace = step_trace.Measure(step.python_function, inputs, warmup=3)
    trace.Write(os.path.join(directory, setup.schedule))
    print(trace.Summary().splitlines()[0], flush=True)


def Pictures(args: argparse.Namespace) -> None:
  os.makedirs(args.pictures, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix='schedules_servers_') as logs:
    with local_workers.LocalWorkers(2, logs) as workers:
      out = subprocess.run(
          [sys.executable, '-m', 'bench.scaling.schedules',
           '--pictures_client',
           f'--cluster_spec={workers.spec}', f'--pictures={args.pictures}'],
          capture_output=True, text=True, timeout=args.timeout)
  if out.returncode:
    raise SystemExit(f'pictures failed:\n{out.stderr[-3000:]}')
  print(out.stdout, end='')


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--what', default='all',
                      choices=('all', 'throughput', 'startup', 'pictures'))
  parser.add_argument('--pictures', default='docs/schedules',
                      help='Directory of the measured timelines.')
  parser.add_argument('--pictures_client', action='store_true',
                      help=argparse.SUPPRESS)
  parser.add_argument('--cluster_spec', default='', help=argparse.SUPPRESS)
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--modes', default='never,always')
  parser.add_argument('--startup_repeats', type=int, default=3)
  parser.add_argument('--timeout', type=float, default=1800)
  parser.add_argument('--json_out', default=None)
  return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
  scaling.Stoppable(_Main, argv)


def _Main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.pictures_client:
    PicturesClient(args.cluster_spec, args.pictures)
    return
  if args.what == 'pictures':
    Pictures(args)
    return
  args.bubbles = True  # throughput.py measures each bubble too
  header = scaling._Header()  # pylint: disable=protected-access
  print(header, flush=True)
  stack = stack_lib.Stack()
  raw, tables = {'header': header}, []
  if args.what in ('all', 'throughput'):
    raw['throughput'] = MeasureThroughput(stack, args.modes.split(','), args)
    tables += [ThroughputTable(stack, mode, raw['throughput'])
               for mode in args.modes.split(',')]
  if args.what in ('all', 'startup'):
    raw['startup'] = MeasureStartup(args)
    tables.append(StartupTable(raw['startup']))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(raw, f, indent=1)
  print('\n\n'.join([header] + tables))


if __name__ == '__main__':
  main(sys.argv[1:])
