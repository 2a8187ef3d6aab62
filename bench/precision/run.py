"""float32 against bfloat16: step time, activation memory, hand-off bytes.

  .venv/bin/python -m bench.precision.run [--k=2] [--m=8]
      [--modes=never,always] [--rounds=10] [--warmup=2] [--repeats=3]
      [--what=all|time|memory] [--json_out=FILE]

bench/common's Transformer stack (8 encoder layers, d=256, ff=1024, 4
heads, seq 64, batch 32), pipelined over K worker processes (partition k
on task k) with M micro-batches, GPipe, for each recompute mode of
--modes; once with the layers in float32 and once with fprop_dtype
bfloat16 (float32 variables; bfloat16 compute and hand-offs; the loss,
layer norms' statistics and softmax cross-entropy in float32;
docs/DESIGN.md section 32). One training step is the trainer's: one pass
(`FPropWithLoss`), every gradient, an update of each variable on its
device (SGD when timed, Adam in the memory probe).

time: K `tf.distribute.Server` workers on 127.0.0.1, worker i pinned to
core i (`local_workers.LocalWorkers`), one client (measure.py) that
builds every configuration, warms each up (--warmup), then times --rounds
rounds of one step of each, interleaved. Median seconds per step and the
workers' CPU seconds per step. It also counts, in each traced step, the
bytes the partitions hand each other (`hand_offs.HandOffs`: every
tensor one stage function's call sends a call on another task, once per
receiving task), from task 0 to 1 (activations) and back (gradients),
and lists their dtypes.

memory: table1's probe (bench/memory/table1.py), one fresh client and
K memory workers per configuration, --repeats times (the probe with the
median worst partition counts), at the stack's batch (32) and at twice
it. Per partition: the allocator's peak during a step above its bytes
before it (table1's activation column: activations, the
re-computation's working set, and the gradients and Adam's temporaries,
float32 in both), and how much more that is at twice the batch: the
activations proper, what grows with the batch. Also the parameters with
Adam's slots.

Targets (issue 33, reported, not asserted): bytes between partitions
exactly half; activation memory at most 0.6x float32's.
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
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402
from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before bench.common.stack imports it

from bench.common import stack as stack_lib  # noqa: E402

DTYPES = ('float32', 'bfloat16')
BYTES_TARGET = 0.5  # bfloat16 / float32, exactly
MEMORY_TARGET = 0.6  # bfloat16 / float32 activation memory, at most


def _Setups(args: argparse.Namespace) -> List[stack_lib.Setup]:
  return [stack_lib.Setup('pipe', args.k, args.m, mode)
          for mode in args.modes.split(',')]


def _Stack(dtype: str, batch: int = stack_lib.Stack.batch
           ) -> stack_lib.Stack:
  return stack_lib.Stack(dtype=dtype, batch=batch)


def _Child(flags: List[str], timeout: float) -> dict:
  """Runs measure.py with `flags`; its last stdout line, parsed."""
  with tempfile.TemporaryFile('w+') as err:
    child = subprocess.run(
        [sys.executable, '-m', 'bench.precision.measure'] + flags,
        stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
        text=True, timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    if child.returncode:
      err.seek(0)
      raise SystemExit(f'measure.py {" ".join(flags[:2])} failed:\n'
                       f'{err.read()[-3000:]}')
  return json.loads(child.stdout.strip().splitlines()[-1])


def MeasureTime(args: argparse.Namespace) -> Dict[str, dict]:
  """measure.py's client record, on K fresh pinned workers."""
  stacks = ';'.join(json.dumps(dataclasses.asdict(_Stack(d)))
                    for d in DTYPES)
  with tempfile.TemporaryDirectory(prefix='precision_') as logs, \
      local_workers.LocalWorkers(args.k, logs) as workers:
    return _Child([f'--cluster_spec={workers.spec}',
                   '--worker_pids=' + ','.join(map(str, workers.pids)),
                   f'--stacks={stacks}',
                   '--setups=' + ';'.join(s.ToText() for s in _Setups(args)),
                   f'--warmup={args.warmup}', f'--rounds={args.rounds}'],
                  args.timeout)


def MeasureMemory(args: argparse.Namespace) -> Dict[str, dict]:
  """label -> {batch: table1's probe record of the median worst
  partition}, at the stack's batch and at twice it."""
  from bench.precision import measure  # pylint: disable=g-import-not-at-top
  out: Dict[str, dict] = {}
  batch = stack_lib.Stack.batch
  for setup in _Setups(args):
    for dtype in DTYPES:
      label = measure.Label(_Stack(dtype), setup)
      out[label] = {}
      for b in (batch, 2 * batch):
        flags = ['--probe', f'--setup={setup.ToText()}',
                 f'--stack={json.dumps(dataclasses.asdict(_Stack(dtype, b)))}']
        runs = sorted((_Child(flags, args.timeout)
                       for _ in range(args.repeats)),
                      key=lambda r: max(r['activation_mib']))
        rec = out[label][b] = dict(runs[(len(runs) - 1) // 2])
        rec['worst_of_runs'] = [max(r['activation_mib']) for r in runs]
        print(f'  {label} batch {b}: step MiB ' +
              _Mib(rec['activation_mib']) + ' (worst of each probe: ' +
              _Mib(rec['worst_of_runs']) + ')', flush=True)
  return out


def _Mib(values: Sequence[float]) -> str:
  return ', '.join(f'{v:.1f}' for v in values)


def _Memory(mem: Optional[dict]) -> Tuple[List[float], List[float]]:
  """(step MiB at the stack's batch, MiB more at twice it) per partition;
  empty lists if not measured."""
  if not mem:
    return [], []
  one, two = (mem[b]['activation_mib'] for b in sorted(mem))
  return one, [b - a for a, b in zip(one, two)]


def Table(args: argparse.Namespace, times: Dict[str, dict],
          memory: Dict[str, dict]) -> str:
  """One row per (recompute mode, dtype); then bfloat16 / float32."""
  b = stack_lib.Stack.batch
  lines = ['| recompute | dtype | median s/step | worker CPU s/step | '
           f'step MiB per partition, batch {b} | activations MiB per '
           f'{b} examples (batch {2 * b} - batch {b}) | parameters + Adam '
           'MiB per partition | bytes 0->1 per step | bytes 1->0 per step '
           '| dtypes handed off |', '|' + '---|' * 10]
  ratios = []
  for setup in _Setups(args):
    rows = {}
    for dtype in DTYPES:
      label = f'{dtype} {setup.label}'
      t, mem = times.get(label), memory.get(label)
      rows[dtype] = (t, _Memory(mem))
      med = statistics.median(t['times']) if t else None
      hand = t['hand_offs'] if t else {'bytes': {}, 'dtypes': []}
      step, grown = rows[dtype][1]
      lines.append(
          f'| {setup.recompute} | {dtype} | '
          f'{"-" if med is None else f"{med:.3f}"} | '
          f'{", ".join(f"{c:.3f}" for c in t["worker_cpu"]) if t else "-"} | '
          f'{_Mib(step) or "-"} | {_Mib(grown) or "-"} | '
          f'{_Mib(mem[b]["param_mib"]) if mem else "-"} | '
          f'{hand["bytes"].get("0->1", "-")} | '
          f'{hand["bytes"].get("1->0", "-")} | '
          f'{", ".join(hand["dtypes"])} |')
    ratios += _Ratios(setup, rows)
  return '\n'.join(lines + [''] + ratios)


def _Ratios(setup: stack_lib.Setup, rows: Dict[str, tuple]) -> List[str]:
  (t32, m32), (t16, m16) = rows['float32'], rows['bfloat16']
  out = []
  if t32 and t16:
    b32, b16 = t32['hand_offs']['bytes'], t16['hand_offs']['bytes']
    total32, total16 = sum(b32.values()), sum(b16.values())
    ratio = total16 / total32
    out.append(f'- {setup.recompute}: bytes between partitions bfloat16 / '
               f'float32 = {total16} / {total32} = {ratio:.4f} (target '
               f'exactly {BYTES_TARGET}: '
               f'{"ok" if ratio == BYTES_TARGET else "MISS"})')
    paired = [b / a for a, b in zip(t32['times'], t16['times'])]
    out.append(f'- {setup.recompute}: step time bfloat16 / float32, per '
               f'round: median {statistics.median(paired):.2f} (from '
               f'{min(paired):.2f} to {max(paired):.2f})')
  for what, i in (('activations (batch-proportional)', 1),
                  ('the whole step above its start', 0)):
    if m32[i] and m16[i]:
      per = [b / a for a, b in zip(m32[i], m16[i])]
      worst = max(m16[i]) / max(m32[i])
      out.append(f'- {setup.recompute}: {what}, bfloat16 / float32 per '
                 f'partition {", ".join(f"{r:.2f}" for r in per)}, worst '
                 f'partition {worst:.2f} (target at most {MEMORY_TARGET}: '
                 f'{"ok" if worst <= MEMORY_TARGET else "MISS"})')
  return out


def Machine() -> str:
  """'<CPU model>, bfloat16: avx512_bf16' (the flags this CPU has for
  bfloat16 arithmetic, or 'none'), from /proc/cpuinfo."""
  model, flags = '?', set()
  with open('/proc/cpuinfo') as f:
    for line in f:
      key, _, value = line.partition(':')
      if key.strip() == 'model name':
        model = value.strip()
      elif key.strip() == 'flags':
        flags = set(value.split())
  native = [f for f in ('avx512_bf16', 'amx_bf16') if f in flags]
  return f'{model}, bfloat16: {" ".join(native) or "none"}'


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--what', default='all',
                      choices=('all', 'time', 'memory'))
  parser.add_argument('--k', type=int, default=2, help='partitions K')
  parser.add_argument('--m', type=int, default=8, help='micro-batches M')
  parser.add_argument('--modes', default='never,always',
                      help='recompute modes')
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--repeats', type=int, default=3,
                      help='memory probes per configuration')
  parser.add_argument('--timeout', type=float, default=1800,
                      help='seconds per child process')
  parser.add_argument('--json_out', default='')
  args = parser.parse_args(argv)
  if args.k < 2 or args.m < 1 or args.rounds < 1 or args.repeats < 1:
    parser.error('--k must be at least 2; --m, --rounds and --repeats at '
                 'least 1.')
  return args


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  model = _Stack('float32').Describe()
  print(f'{cli.Header(Machine())}\nModel: {model} and the same in '
        f'bfloat16; K={args.k}, M={args.m}, GPipe.', flush=True)
  times = MeasureTime(args) if args.what in ('all', 'time') else {}
  memory = MeasureMemory(args) if args.what in ('all', 'memory') else {}
  print('\n' + Table(args, times, memory), flush=True)
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'args': vars(args), 'time': times, 'memory': memory}, f)


if __name__ == '__main__':
  main(sys.argv[1:])
