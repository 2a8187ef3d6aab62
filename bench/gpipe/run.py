"""GPipe benchmark: step time and peak memory of PipeliningLayer.

  .venv/bin/python -m bench.gpipe.run [--what=time,memory]
      [--steps=10] [--warmup=2] [--lingvo_python=/tmp/lingvo_venv/bin/python]

Step time (2 logical CPUs): every configuration of bench/common's
`stack.py` under two thread settings, one `timing.py` process each (the
framework's default, each op on cores / 2 intra-op threads, and TF's
default pools); each builds, traces and warms up every configuration,
then `--steps` interleaved rounds run every (setting, configuration)
once, starting one further along each time, so a change of machine load
hits all of them alike. Reported: median and min seconds per step, and
median / median of the faster unpipelined row, on which the targets are
judged.

Peak memory (K=2, M in 1, 2, 4, 8, recompute 'always' and 'never'): one
subprocess per configuration (`memory.py`, which explains the method),
the whole process; then per device, each partition on its own TF server
process (`device_memory.py`).

Lingvo 0.14.2 (optional, --lingvo_python): `lingvo_step.py` in that
Python, one subprocess per configuration, after our timings.
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
from typing import Dict, List, Optional, Sequence

from bench.common import cli
from bench.common import stack as stack_lib

HERE = os.path.dirname(os.path.abspath(__file__))
Setup = stack_lib.Setup

# The configurations compared with Lingvo 0.14.2.
LINGVO_KEYS = ('unpipelined', 'K=2 M=8', 'K=1 M=8', 'K=2 M=1')
# The targets, as a multiple of the unpipelined step.
TARGETS = {'K=2 M=8 never': 1.2, 'K=2 M=8 always': 1.5}


def TimeSetups() -> List[Setup]:
  # K=1 has only a last partition: 'except_last' is 'never' there.
  return [
      Setup('plain'),
      Setup('loop', m=8),
      Setup('pipe', 1, 8, 'always'), Setup('pipe', 1, 8, 'never'),
      Setup('pipe', 2, 1, 'always'), Setup('pipe', 2, 1, 'never'),
      Setup('pipe', 2, 8, 'always'), Setup('pipe', 2, 8, 'except_last'),
      Setup('pipe', 2, 8, 'never'),
  ]


# ---- step time -------------------------------------------------------------


def CpuTimes() -> Dict[str, int]:
  """Machine-wide CPU time so far from /proc/stat, in clock ticks."""
  with open('/proc/stat') as f:
    fields = f.readline().split()[1:9]
  names = ('user', 'nice', 'system', 'idle', 'iowait', 'irq', 'softirq',
           'steal')
  return dict(zip(names, map(int, fields)))


def Steal(before: Dict[str, int], after: Dict[str, int]) -> str:
  """How much of the machine's time a hypervisor gave to other guests."""
  total = sum(after.values()) - sum(before.values())
  steal = after['steal'] - before['steal']
  return f'{100.0 * steal / max(total, 1):.1f}% of CPU time stolen'


THREADS = ('shared', 'tf')  # timing.py's settings; the first is ours


def _StartTiming(threads: str, stack: stack_lib.Stack,
                 setups: Sequence[Setup], warmup: int, log) -> subprocess.Popen:
  args = [sys.executable, '-m', 'bench.gpipe.timing',
          f'--threads={threads}', f'--warmup={warmup}',
          f'--stack={json.dumps(vars(stack))}',
          '--setups=' + ';'.join(s.ToText() for s in setups)]
  return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=log, text=True, bufsize=1,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))


def _Read(child: subprocess.Popen, threads: str, log) -> str:
  line = child.stdout.readline()
  if not line:
    log.seek(0)
    raise RuntimeError(f'timing.py --threads={threads} died:\n'
                       f'{log.read()[-3000:]}')
  return line.strip()


def MeasureTimes(stack: stack_lib.Stack, setups: Sequence[Setup],
                 warmup: int, steps: int) -> Dict[str, Dict[str, dict]]:
  """threads -> label -> {times, cpu, trace, first}: seconds.

  One `timing.py` process per thread setting (THREADS), built side by
  side; then `steps` rounds, each running every (setting, setup) once,
  starting one further along each time, one step at a time. `times` are
  wall-clock seconds per step, `cpu` the CPU seconds of that process.
  """
  logs = {t: tempfile.TemporaryFile('w+') for t in THREADS}
  children = {t: _StartTiming(t, stack, setups, warmup, logs[t])
              for t in THREADS}
  out: Dict[str, Dict[str, dict]] = {t: {} for t in THREADS}
  try:
    for t, child in children.items():
      while (line := _Read(child, t, logs[t])) != 'ready':
        built = json.loads(line)
        out[t][built['label']] = {'trace': built['trace'],
                                  'first': built['first'],
                                  'times': [], 'cpu': []}
        print(f'  {t:6s} {built["label"]}: traced in {built["trace"]:.1f} s, '
              f'first step {built["first"]:.1f} s', flush=True)
    order = [(t, s.label) for t in THREADS for s in setups]
    for t, label in stack_lib.Rotations(order, steps):
      children[t].stdin.write(label + '\n')
      step = json.loads(_Read(children[t], t, logs[t]))
      out[t][label]['times'].append(step['wall'])
      out[t][label]['cpu'].append(step['cpu'])
  finally:
    for child in children.values():
      if child.poll() is None:
        child.stdin.close()
        child.wait(timeout=60)
  return out


def _Ratio(value: Optional[float], base: Optional[float]) -> str:
  return '-' if value is None or not base else f'{value / base:.2f}x'


def BestUnpipelined(results: Dict[str, Dict[str, dict]]) -> str:
  """The thread setting under which the unpipelined step was fastest."""
  return min(THREADS, key=lambda t: statistics.median(
      results[t]['unpipelined']['times']))


def TimeTable(stack: stack_lib.Stack, results: Dict[str, Dict[str, dict]],
              steps: int) -> str:
  best = BestUnpipelined(results)
  base_times = results[best]['unpipelined']['times']
  base = statistics.median(base_times)
  base_cpu = statistics.median(results[best]['unpipelined']['cpu'])
  head = (f'{"configuration":<20} {"threads":>7} {"median s":>8} '
          f'{"min s":>5} {"ratio":>5} {"paired":>6} {"same":>5} '
          f'{"target":>10} {"cpu s":>5} {"cpu ratio":>9} {"trace s":>7} '
          f'{"1st s":>5}')
  lines = [f'Step time: {stack.Describe()}.',
           f'{steps} interleaved rounds; wall-clock seconds per step. '
           'threads: shared = the framework\'s',
           'default (devices.SplitCpu: each op gets cores / 2 intra-op '
           'threads), tf = TF\'s default pools;',
           'one process each, steps of both interleaved. ratio = median / '
           'median of the faster unpipelined',
           f'row (threads={best}); paired = median over rounds of (step / '
           'that unpipelined step of the same',
           'round); same = median / median of unpipelined with the same '
           'threads; cpu s = median CPU',
           'seconds of the process per step (all threads), cpu ratio to '
           'the same unpipelined row as ratio.',
           f'2 logical CPUs on {os.cpu_count()} cores. trace s: tracing; '
           '1st s: first call (graph optimisation,',
           'kernels, one step). Targets are judged on the shared rows '
           'against the faster unpipelined row.', '', head, '-' * len(head)]
  for t in THREADS:
    same_base = statistics.median(results[t]['unpipelined']['times'])
    for label, r in results[t].items():
      med, cpu = statistics.median(r['times']), statistics.median(r['cpu'])
      paired = statistics.median(
          a / b for a, b in zip(r['times'], base_times))
      target = TARGETS.get(label) if t == THREADS[0] else None
      verdict = ''
      if target is not None:
        verdict = f'<={target} ' + ('ok' if med / base <= target else 'MISS')
      lines.append(f'{label:<20} {t:>7} {med:>8.2f} {min(r["times"]):>5.2f} '
                   f'{med / base:>4.2f}x {paired:>5.2f}x '
                   f'{med / same_base:>4.2f}x {verdict:>10} {cpu:>5.2f} '
                   f'{cpu / base_cpu:>8.2f}x {r["trace"]:>7.1f} '
                   f'{r["first"]:>5.1f}')
  return '\n'.join(lines)


# ---- Lingvo ----------------------------------------------------------------


def MeasureLingvo(python: str, stack: stack_lib.Stack, warmup: int,
                  steps: int) -> Dict[str, List[float]]:
  """'unpipelined' / 'K=k M=m' -> Lingvo's seconds per step."""
  out = {}
  for label, config in (('unpipelined', 'seq'), ('K=2 M=1', '2,1'),
                        ('K=2 M=8', '2,8'), ('K=1 M=8', '1,8')):
    args = [python, os.path.join(HERE, 'lingvo_step.py'),
            f'--config={config}', f'--steps={steps}', f'--warmup={warmup}']
    args += [f'--{k}={v}' for k, v in vars(stack).items()]
    print(f'  Lingvo {label} ...', flush=True)
    done = subprocess.run(args, capture_output=True, text=True, check=False,
                          cwd='/tmp', env=dict(os.environ, PYTHONPATH=''))
    if done.returncode:
      raise RuntimeError(f'Lingvo {label} failed:\n{done.stderr[-3000:]}')
    out[label] = json.loads(done.stdout.strip().splitlines()[-1])['times']
  return out


def LingvoTable(ours: Dict[str, Dict[str, dict]],
                lingvo: Optional[Dict[str, List[float]]]) -> str:
  """Ratios to each library's own unpipelined step, side by side.

  Ours: the framework's default threads, to the faster unpipelined row.
  """
  med = {k: statistics.median(v['times'])
         for k, v in ours[THREADS[0]].items()}
  base = statistics.median(ours[BestUnpipelined(ours)]['unpipelined']['times'])
  lmed = {k: statistics.median(v) for k, v in (lingvo or {}).items()}
  head = (f'{"configuration":<12} {"ours always":>12} {"ours never":>11} '
          f'{"Lingvo here":>16}')
  lines = ['Against Lingvo 0.14.2 (TF1 graph mode, re-computes like '
           "'always'); each ratio is to that", "library's own unpipelined "
           'step. "Lingvo here" ran in subprocesses of this run, after our '
           'timings.', '', head, '-' * len(head)]
  for key in LINGVO_KEYS:
    always = med.get(f'{key} always', med.get(key))
    never = med.get(f'{key} never', med.get(key))
    here = '-'
    if key in lmed:
      here = f'{_Ratio(lmed[key], lmed["unpipelined"])} ({lmed[key]:.2f} s)'
    lines.append(f'{key:<12} {_Ratio(always, base):>12} '
                 f'{_Ratio(never, base):>11} {here:>16}')
  return '\n'.join(lines)


# ---- memory ----------------------------------------------------------------


def MemorySetups(ms: Sequence[int]) -> List[Setup]:
  """K=2 with each M, recompute 'always' then 'never'."""
  return [Setup('pipe', 2, m, mode) for mode in ('always', 'never')
          for m in ms]


def _MemoryChild(setup: Setup, stack: stack_lib.Stack,
                 steps: int) -> subprocess.Popen:
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072',
             TF_ENABLE_ONEDNN_OPTS='0', TF_CPP_MIN_LOG_LEVEL='2')
  args = [sys.executable, '-m', 'bench.gpipe.memory',
          f'--setup={setup.ToText()}', f'--steps={steps}',
          f'--stack={json.dumps(vars(stack))}']
  return subprocess.Popen(args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)


def MeasureMemory(stack: stack_lib.Stack, ms: Sequence[int],
                  steps: int, jobs: int) -> Dict[str, dict]:
  """label -> memory.py's figures; `jobs` children at a time."""
  setups = MemorySetups(ms)
  out, running = {}, []
  while setups or running:
    while setups and len(running) < jobs:
      setup = setups.pop(0)
      running.append((setup, _MemoryChild(setup, stack, steps)))
    setup, child = running.pop(0)
    stdout, stderr = child.communicate()
    if child.returncode:
      raise RuntimeError(f'memory.py {setup.label} failed:\n{stderr[-3000:]}')
    out[setup.label] = json.loads(stdout.strip().splitlines()[-1])
    print(f'  {setup.label}: {out[setup.label]}', flush=True)
  return out


def MeasureDeviceMemory(stack: stack_lib.Stack, ms: Sequence[int],
                        steps: int) -> Dict[str, dict]:
  """label -> device_memory.py's figures; one configuration at a time."""
  out = {}
  for setup in MemorySetups(ms):
    child = subprocess.run(
        [sys.executable, '-m', 'bench.gpipe.device_memory',
         f'--setup={setup.ToText()}', f'--steps={steps}',
         f'--stack={json.dumps(vars(stack))}'],
        capture_output=True, text=True, env=dict(os.environ,
                                                 TF_CPP_MIN_LOG_LEVEL='2'))
    if child.returncode:
      raise RuntimeError(
          f'device_memory.py {setup.label} failed:\n{child.stderr[-3000:]}')
    out[setup.label] = json.loads(child.stdout.strip().splitlines()[-1])
    print(f'  {setup.label}: {out[setup.label]}', flush=True)
  return out


def _Falls(label: str, values: List[float]) -> str:
  falls = all(round(a) > round(b) for a, b in zip(values, values[1:]))
  return (f'{label} {"falls" if falls else "does NOT fall"} at every step '
          f'of M ({" > ".join(f"{v:.0f}" for v in values)}).')


def DeviceMemoryTable(stack: stack_lib.Stack,
                      results: Dict[str, dict]) -> str:
  head = (f'{"configuration":<18} {"task 0 MiB":>10} {"task 1 MiB":>10} '
          f'{"max":>5} {"base":>6}')
  lines = [f'Peak memory per device: {stack.Describe()}; K=2, one '
           'tf.distribute.Server per partition.',
           'task k = peak RSS of server k during the step - its RSS after '
           'tracing and one warm-up step. MiB.', '', head, '-' * len(head)]
  for label, r in results.items():
    act = r['activation']
    lines.append(f'{label:<18} {act[0]:>10.0f} {act[1]:>10.0f} '
                 f'{max(act):>5.0f} {max(r["base"]):>6.0f}')
  for mode in ('always', 'never'):
    peaks = [max(r['activation']) for label, r in results.items()
             if label.endswith(mode)]
    lines.append(_Falls(f"'{mode}': the worst device's activation memory",
                        peaks))
  return '\n'.join(lines)


def MemoryTable(stack: stack_lib.Stack, results: Dict[str, dict]) -> str:
  head = (f'{"configuration":<18} {"activation MiB":>14} '
          f'{"step peak":>9} {"base":>6} {"lifetime":>9}')
  lines = [f'Peak memory: {stack.Describe()}; K=2.',
           'activation = peak RSS during steps - RSS after tracing and one '
           'warm-up step;', 'lifetime = peak RSS of the process - RSS after '
           'building. MiB.', '', head, '-' * len(head)]
  for label, r in results.items():
    lines.append(f'{label:<18} {r["activation"]:>14.0f} '
                 f'{r["step_peak"]:>9.0f} {r["base"]:>6.0f} '
                 f'{r["lifetime"]:>9.0f}')
  for mode in ('always', 'never'):
    acts = [r['activation'] for label, r in results.items()
            if label.endswith(mode)]
    lines.append(_Falls(f"'{mode}': activation memory", acts))
  return '\n'.join(lines)


# ---- main ------------------------------------------------------------------


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--what', default='time,memory',
                      help='Comma-separated: time, memory.')
  parser.add_argument('--steps', type=int, default=10,
                      help='Timed steps per configuration.')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--memory_steps', type=int, default=1,
                      help='Steps after the warm-up in each memory run.')
  parser.add_argument('--memory_jobs', type=int, default=2,
                      help='Memory subprocesses run at a time.')
  parser.add_argument('--memory_ms', default='1,2,4,8')
  parser.add_argument('--lingvo_python', default=None,
                      help='A Python with lingvo==0.14.2 (own venv).')
  parser.add_argument('--lingvo_steps', type=int, default=3)
  parser.add_argument('--json_out', default=None,
                      help='Also write every raw measurement here.')
  for field in stack_lib.Stack.__dataclass_fields__:
    parser.add_argument(f'--{field}', type=int,
                        default=getattr(stack_lib.Stack, field))
  return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  what = set(args.what.split(','))
  stack = stack_lib.Stack(**{f: getattr(args, f)
                             for f in stack_lib.Stack.__dataclass_fields__})
  start = time.time()
  print(f'load average at start: {os.getloadavg()}', flush=True)
  tables, raw = [], {'stack': vars(stack)}
  if 'memory' in what:  # first: its parent must not yet hold big models
    ms = [int(m) for m in args.memory_ms.split(',')]
    raw['memory'] = MeasureMemory(stack, ms, args.memory_steps,
                                  args.memory_jobs)
    tables.append(MemoryTable(stack, raw['memory']))
    raw['device_memory'] = MeasureDeviceMemory(stack, ms, args.memory_steps)
    tables.append(DeviceMemoryTable(stack, raw['device_memory']))
  if 'time' in what:
    cpu_before = CpuTimes()
    raw['time'] = MeasureTimes(stack, TimeSetups(), args.warmup, args.steps)
    steal = Steal(cpu_before, CpuTimes())
    print(f'while timing: {steal}', flush=True)
    tables.append(TimeTable(stack, raw['time'], args.steps) +
                  f'\nWhile timing, {steal} (hypervisor, /proc/stat).')
    if args.lingvo_python:
      raw['lingvo'] = MeasureLingvo(args.lingvo_python, stack, args.warmup,
                                    args.lingvo_steps)
    tables.append(LingvoTable(raw['time'], raw.get('lingvo')))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(raw, f, indent=1)
  print(f'\nload average at end: {os.getloadavg()}; '
        f'{time.time() - start:.0f} s in all.\n')
  print('\n\n'.join(tables))


if __name__ == '__main__':
  main(sys.argv[1:])
