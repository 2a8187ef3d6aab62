"""Scaling benchmark: pipeline throughput across processes, and start-up.

  .venv/bin/python -m bench.scaling.run pipeline [--what=all|throughput|startup]
      [--rounds=10] [--warmup=2] [--ks=1,2] [--ms=1,2,4] [--modes=never]
      [--json_out=FILE]

throughput: 2 `tf.distribute.Server` workers on 127.0.0.1, worker i
pinned to core i (`local_workers.LocalWorkers`), fresh for each
recompute mode. One client process per mode (`throughput.py`) builds
every configuration of it (the stack of bench/common/stack.py, K in 1, 2,
M in 1 .. 32; partition k on task k), warms each up (--warmup), then
times --rounds rounds of one step of each, interleaved: the trainer's
step (one pass, an SGD update of each variable on its worker, only the
loss back to the client). Reported: median
seconds per step; throughput = t(K=1, M=1) / t of the same mode; ideal =
K*M / (M+K-1), the GPipe bubble's bound; measured / ideal; CPU seconds
per step of each worker process; worker CPU / wall, how many cores'
worth of work the workers did at once (up to K).

startup: one process per configuration (`startup.py`), K logical CPUs
(`devices.SplitCpu`), a narrower stack (d=64, ff=256), K in 2, 4, 8, M in
8, 32: graph ops, trace and first-call seconds, time to the first
finished step, step seconds, peak RSS; ops(M=32) / ops(M=8).

One process measures at a time. Tables go to stdout in markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.common import proc  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402

Setup = stack_lib.Setup

THROUGHPUT_KS, THROUGHPUT_MS = (1, 2), (1, 2, 4, 8, 16, 32)
STARTUP_KS, STARTUP_MS = (2, 4, 8), (8, 32)
MODES = ('never', 'always')
# Issue targets. K=2 M=8: measured / ideal at least this, per mode.
RATIO_TARGETS = {'never': 0.85, 'always': 0.8}
OPS_RATIO_TARGET = 1.2  # ops(M=32) / ops(M=8), every K and mode
FIRST_STEP_TARGET = 15.0  # seconds to the first finished step, K=8 M=32


class ChildFailed(RuntimeError):
  pass


def _RunChild(script: str, flags: List[str], timeout: float) -> dict:
  """Runs bench.scaling.`script` (a module) with `flags`; its last stdout
  line, parsed."""
  with tempfile.TemporaryFile('w+') as err:
    child = subprocess.Popen(
        [sys.executable, '-m', f'bench.scaling.{script}'] + flags,
        stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
        text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    try:
      out, _ = child.communicate(timeout=timeout)
    except BaseException as e:  # timeout, Ctrl-C: never leave it running
      child.kill()
      child.wait()
      if isinstance(e, subprocess.TimeoutExpired):
        raise ChildFailed(f'{script} {flags[-1]} took over {timeout:.0f} s '
                          '(--timeout)') from None
      raise
    if child.returncode:
      err.seek(0)
      raise ChildFailed(f'{script} {" ".join(flags[-3:])} exited with '
                        f'{child.returncode}:\n{err.read()[-3000:]}')
  return json.loads(out.strip().splitlines()[-1])


# ---- throughput -------------------------------------------------------------


def _ClientFlags(workers: local_workers.LocalWorkers, stack: stack_lib.Stack,
                 setups: List[Setup], args: argparse.Namespace) -> List[str]:
  return [f'--cluster_spec={workers.spec}',
          '--worker_pids=' + ','.join(map(str, workers.pids)),
          f'--stack={json.dumps(dataclasses.asdict(stack))}',
          f'--warmup={args.warmup}', f'--rounds={args.rounds}',
          '--setups=' + ';'.join(s.ToText() for s in setups)] + (
              ['--bubbles'] if getattr(args, 'bubbles', False) else [])


def _ServerRssMiB(workers: local_workers.LocalWorkers) -> List[float]:
  return [proc.StatusKiB('VmRSS', pid) / 1024 for pid in workers.pids]


def _OneClient(workers: local_workers.LocalWorkers, stack: stack_lib.Stack,
               setups: List[Setup], args: argparse.Namespace
               ) -> Dict[str, dict]:
  """All `setups` in one client on fresh workers; tried twice."""
  for attempt in (1, 2):
    workers.Start()
    try:
      results = _RunChild('throughput',
                          _ClientFlags(workers, stack, setups, args),
                          args.timeout)
      rss = _ServerRssMiB(workers)
      for r in results.values():
        r['server_rss'] = rss
      return results
    except ChildFailed as e:
      print(f'  attempt {attempt} failed: {str(e).splitlines()[-1]}',
            flush=True)
      if attempt == 2:
        return {s.label: {'setup': s.ToText(), 'error': str(e)}
                for s in setups}
    finally:
      workers.Stop()
  raise AssertionError('unreachable')


def MeasureThroughput(stack: stack_lib.Stack, ks: Sequence[int],
                      ms: Sequence[int], modes: Sequence[str],
                      args: argparse.Namespace) -> Dict[str, dict]:
  """label -> throughput.py's record (or {'error'}); one client per mode."""
  out = {}
  with tempfile.TemporaryDirectory(prefix='scaling_servers_') as logs:
    workers = local_workers.LocalWorkers(max(ks), logs)
    for mode in modes:
      start = time.time()
      setups = [Setup('pipe', k, m, mode) for k in ks for m in ms]
      results = _OneClient(workers, stack, setups, args)
      out.update(results)
      for label, r in results.items():
        if 'error' not in r:
          print(f'  {label}: {statistics.median(r["times"]):.3f} s/step, '
                'worker CPU s/step ' +
                ', '.join(f'{c:.3f}' for c in r['worker_cpu']) +
                f'; traced in {r["trace"]:.1f} s, first call '
                f'{r["first"]:.1f} s', flush=True)
      print(f'  {mode}: {time.time() - start:.0f} s; server RSS MiB at the '
            'end ' + str([round(x) for x in next(iter(
                results.values())).get('server_rss', [])]), flush=True)
  return out


def _Ideal(k: int, m: int) -> float:
  return stack_lib.Ideal(Setup('pipe', k, m))


def ThroughputTable(stack: stack_lib.Stack, mode: str,
                    results: Dict[str, dict]) -> str:
  """Markdown table and target lines of one recompute mode."""
  rows = {(s.k, s.m): r for r in results.values()
          if (s := Setup.FromText(r['setup'])).recompute == mode}
  med = {km: statistics.median(r['times']) for km, r in rows.items()
         if 'error' not in r}
  base = med.get((1, 1))
  lines = [f"### Throughput, recompute '{mode}'", '',
           f'{stack.Describe()}; one worker process per task, each pinned '
           'to one core.', '',
           '| K | M | median s/step | throughput | ideal | measured/ideal '
           '| worker CPU s/step (task 0, task 1) | worker CPU / wall '
           '| client CPU s/step |', '|' + '---|' * 9]
  for (k, m), r in sorted(rows.items()):
    if 'error' in r:
      lines.append(f'| {k} | {m} | error: '
                   f'{r["error"].strip().splitlines()[-1][:80]} |')
      continue
    tput = base / med[k, m] if base else None
    cpu = r['worker_cpu']
    busy = sum(cpu) / statistics.mean(r['times'])
    lines.append(
        f'| {k} | {m} | {med[k, m]:.3f} | '
        f'{_Fmt(tput)} | {_Ideal(k, m):.2f} | '
        f'{_Fmt(tput and tput / _Ideal(k, m))} | '
        f'{", ".join(f"{c:.3f}" for c in cpu)} | {busy:.2f} | '
        f'{r["client_cpu"]:.3f} |')
  lines.append('')
  lines += _ThroughputTargets(mode, rows, med, base)
  return '\n'.join(lines)


def _ThroughputTargets(mode: str, rows: Dict[tuple, dict],
                       med: Dict[tuple, float],
                       base: Optional[float]) -> List[str]:
  if not base:
    return ['Targets: - (no K=1 M=1 row to normalise by).']
  lines = []
  if (2, 8) in med:
    ratio = base / med[2, 8] / _Ideal(2, 8)
    goal = RATIO_TARGETS[mode] if mode in RATIO_TARGETS else None
    verdict = '' if goal is None else (
        f' (target >= {goal}: {"ok" if ratio >= goal else "MISS"})')
    lines.append(f'- K=2 M=8 measured/ideal = {ratio:.2f}{verdict}')
  for k in sorted({k for k, _ in med}):
    if (k, 8) in med and (k, 32) in med:
      # Per round, the two steps ran minutes apart at most: their ratio
      # cancels the machine's drift, and its spread shows the noise.
      paired = [b / a for a, b in zip(rows[k, 8]['times'],
                                      rows[k, 32]['times'])]
      ratio = statistics.median(paired)
      verdict = ('' if k == 1 else
                 f' (target, K>1: no worse: {"ok" if ratio <= 1 else "MISS"})')
      lines.append(
          f'- K={k}: throughput M=32 {base / med[k, 32]:.2f} vs M=8 '
          f'{base / med[k, 8]:.2f}; per round t(M=32) / t(M=8): median '
          f'{ratio:.3f}, from {min(paired):.2f} to {max(paired):.2f}'
          f'{verdict}')
  return lines or ['Targets: - (no K=2 M=8 or M=32 rows in this run).']


def _Fmt(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:.2f}'


# ---- start-up ---------------------------------------------------------------


def MeasureStartup(stack: stack_lib.Stack, ks: Sequence[int],
                   ms: Sequence[int], modes: Sequence[str],
                   args: argparse.Namespace) -> Dict[str, dict]:
  """label -> startup.py's record (or {'error'}), medians over repeats.

  One process per measurement; --startup_repeats rounds over every
  configuration, each round starting one further along (stack.Rotations),
  so a slow hour of the machine hits every configuration alike.
  """
  setups = [Setup('pipe', k, m, mode)
            for mode in modes for k in ks for m in ms]
  runs: Dict[str, List[dict]] = {s.label: [] for s in setups}
  errors: Dict[str, dict] = {}
  for setup in stack_lib.Rotations(setups, args.startup_repeats):
    if setup.label in errors:
      continue
    flags = [f'--stack={json.dumps(dataclasses.asdict(stack))}',
             f'--steps={args.startup_steps}', f'--setup={setup.ToText()}']
    start = time.time()
    try:
      r = _RunChild('startup', flags, args.timeout)
      runs[setup.label].append(r)
      print(f'  {setup.label}: {r["ops"]} ops, first step '
            f'{r["first_step"]:.1f} s, peak RSS {r["peak_rss"]:.0f} MiB; '
            f'{time.time() - start:.0f} s', flush=True)
    except ChildFailed as e:
      print(f'  {setup.label}: failed: {str(e).splitlines()[-1]}',
            flush=True)
      errors[setup.label] = {'setup': setup.ToText(), 'error': str(e)}
  out = {}
  for setup in setups:  # in table order
    if setup.label in errors:
      out[setup.label] = errors[setup.label]
      continue
    done = runs[setup.label]
    record = dict(done[0])
    for key in ('trace', 'first', 'first_step', 'step', 'peak_rss',
                'peak_hwm'):
      values = [r[key] for r in done if r[key] is not None]
      record[key] = statistics.median(values) if values else None
    record['first_step_runs'] = [r['first_step'] for r in done]
    out[setup.label] = record
  return out


def StartupTable(stack: stack_lib.Stack, results: Dict[str, dict]) -> str:
  """Markdown table (all modes) and target lines."""
  rows = {}  # in run order: mode, K, M
  for r in results.values():
    s = Setup.FromText(r['setup'])
    rows[s.recompute, s.k, s.m] = r
  ok = {key: r for key, r in rows.items() if 'error' not in r}
  m0 = min(m for _, _, m in rows)
  lines = ['### Start-up', '',
           f'{stack.Describe()}; K logical CPUs in one process '
           '(devices.SplitCpu), one process per measurement; times and RSS '
           'are medians over the measurements of a row.', '',
           '| recompute | K | M | graph ops | trace s | first call s '
           '| first step s | first step, each run | step s | peak RSS MiB '
           f'| ops / ops(M={m0}) |',
           '|' + '---|' * 11]
  targets = []
  for (mode, k, m), r in rows.items():
    if 'error' in r:
      lines.append(f'| {mode} | {k} | {m} | error: '
                   f'{r["error"].strip().splitlines()[-1][:80]} |')
      continue
    ratio = None
    if m != m0 and (mode, k, m0) in ok:
      ratio = r['ops'] / ok[mode, k, m0]['ops']
      if m0 == 8 and m == 32:
        verdict = 'ok' if ratio <= OPS_RATIO_TARGET else 'MISS'
        targets.append(f'- {mode} K={k}: ops M=32 / M=8 = {ratio:.2f} '
                       f'(target <= {OPS_RATIO_TARGET}: {verdict})')
    if k == 8 and m == 32:
      verdict = 'ok' if r['first_step'] < FIRST_STEP_TARGET else 'MISS'
      targets.append(f'- {mode} K=8 M=32: first step {r["first_step"]:.1f} s, '
                     f'median (target < {FIRST_STEP_TARGET:.0f} s: '
                     f'{verdict})')
    lines.append(
        f'| {mode} | {k} | {m} | {r["ops"]} | {r["trace"]:.2f} | '
        f'{r["first"]:.2f} | {r["first_step"]:.2f} | '
        f'{", ".join(f"{t:.1f}" for t in r.get("first_step_runs", []))} | '
        f'{_Fmt(r["step"])} | '
        f'{r["peak_rss"]:.0f} | {_Fmt(ratio)} |')
  lines += [''] + (targets or ['Targets: - (no M=8/M=32 or K=8 M=32 rows '
                               'in this run).'])
  return '\n'.join(lines)


# ---- main -------------------------------------------------------------------


def _Ints(text: Optional[str], default: Sequence[int]) -> List[int]:
  return list(default) if text is None else [int(x) for x in text.split(',')]


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--what', default='all',
                      choices=('all', 'throughput', 'startup'))
  parser.add_argument('--rounds', type=int, default=10,
                      help='Throughput: timed rounds, one step of every '
                      'configuration each.')
  parser.add_argument('--warmup', type=int, default=2,
                      help='Untimed steps first (the first call is one).')
  parser.add_argument('--startup_repeats', type=int, default=3,
                      help='Start-up: measurements of each configuration '
                      '(medians reported).')
  parser.add_argument('--startup_steps', type=int, default=3,
                      help='Steps after the first whose median is "step s".')
  parser.add_argument('--ks', default=None,
                      help='Comma-separated K (default 1,2 for throughput, '
                      '2,4,8 for startup).')
  parser.add_argument('--ms', default=None,
                      help='Comma-separated M (default 1,2,4,8,16,32 for '
                      'throughput, 8,32 for startup).')
  parser.add_argument('--modes', default=','.join(MODES),
                      help='Comma-separated recompute modes.')
  parser.add_argument('--json_out', default=None,
                      help='Also write every raw measurement here.')
  parser.add_argument('--tables_from', default=None,
                      help='Measure nothing: print the tables of the JSON '
                      'that --json_out wrote.')
  parser.add_argument('--timeout', type=float, default=1800,
                      help='Seconds one child process may take.')
  for field in dataclasses.fields(stack_lib.Stack):
    # A flag of the field's type; a bool one as --halves / --no-halves
    # (type=bool would read 'False' as true).
    kind = ({'action': argparse.BooleanOptionalAction}
            if isinstance(field.default, bool)
            else {'type': type(field.default)})
    parser.add_argument(f'--{field.name}', default=field.default,
                        help='Throughput stack (and startup, except d, ff).',
                        **kind)
  parser.add_argument('--startup_model_dim', type=int, default=64)
  parser.add_argument('--startup_hidden_dim', type=int, default=256)
  args = parser.parse_args(argv)
  for what, ks, ms in (('throughput', THROUGHPUT_KS, THROUGHPUT_MS),
                       ('startup', STARTUP_KS, STARTUP_MS)):
    if args.what not in ('all', what):
      continue
    for k in _Ints(args.ks, ks):
      if args.num_layers % k:
        parser.error(f'{what}: K={k} does not divide --num_layers='
                     f'{args.num_layers}; change --ks.')
    for m in _Ints(args.ms, ms):
      if args.batch % m:
        parser.error(f'{what}: M={m} does not divide --batch={args.batch}; '
                     'change --ms.')
  return args


def _Header() -> str:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return (f'command: {cli.Text()}\n'
          f'date: {time.strftime("%Y-%m-%d %H:%M:%S %Z")}; nproc: '
          f'{len(os.sched_getaffinity(0))}; TensorFlow {tf.__version__}; '
          f'load average at start: {os.getloadavg()}')


def _TablesFrom(path: str) -> str:
  """The tables of a run, from the JSON its --json_out wrote."""
  with open(path) as f:
    raw = json.load(f)
  tables = [raw['header']]
  if 'throughput' in raw:
    stack = stack_lib.Stack(**raw['throughput_stack'])
    modes = dict.fromkeys(Setup.FromText(r['setup']).recompute
                          for r in raw['throughput'].values())
    tables += [ThroughputTable(stack, mode, raw['throughput'])
               for mode in modes]
  if 'startup' in raw:
    tables.append(StartupTable(stack_lib.Stack(**raw['startup_stack']),
                               raw['startup']))
  return '\n\n'.join(tables)


def _Terminate(signum, unused_frame) -> None:
  raise KeyboardInterrupt(f'signal {signum}')  # runs every finally


def Stoppable(run: Callable[[Sequence[str]], None],
              argv: Sequence[str]) -> None:
  """run(argv), which SIGTERM and Ctrl-C end through every finally (the
  workers and children stop), and the process then exits saying so."""
  signal.signal(signal.SIGTERM, _Terminate)
  try:
    run(argv)
  except KeyboardInterrupt as interrupt:
    sys.exit(f'Interrupted ({interrupt or "Ctrl-C"}); servers and children '
             'stopped.')


def main(argv: Sequence[str]) -> None:
  Stoppable(_Main, argv)


def _Main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.tables_from:
    print(_TablesFrom(args.tables_from))
    return
  header = _Header()
  print(header, flush=True)
  fields = [f.name for f in dataclasses.fields(stack_lib.Stack)]
  stack = stack_lib.Stack(**{f: getattr(args, f) for f in fields})
  modes = args.modes.split(',')
  start = time.time()
  raw, tables = {'header': header}, []
  if args.what in ('all', 'throughput'):
    raw['throughput_stack'] = dataclasses.asdict(stack)
    raw['throughput'] = MeasureThroughput(
        stack, _Ints(args.ks, THROUGHPUT_KS), _Ints(args.ms, THROUGHPUT_MS),
        modes, args)
    tables += [ThroughputTable(stack, mode, raw['throughput'])
               for mode in modes]
  if args.what in ('all', 'startup'):
    small = dataclasses.replace(stack, model_dim=args.startup_model_dim,
                                hidden_dim=args.startup_hidden_dim)
    raw['startup_stack'] = dataclasses.asdict(small)
    raw['startup'] = MeasureStartup(
        small, _Ints(args.ks, STARTUP_KS), _Ints(args.ms, STARTUP_MS),
        modes, args)
    tables.append(StartupTable(small, raw['startup']))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(raw, f, indent=1)
  print(f'\nload average at end: {os.getloadavg()}; '
        f'{time.time() - start:.0f} s in all.\n')
  print('\n\n'.join([header] + tables))


if __name__ == '__main__':
  main(sys.argv[1:])
