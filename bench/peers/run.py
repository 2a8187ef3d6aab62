"""Ours against PyTorch's own pipelining: the same stack on the same cores.

  .venv/bin/python -m bench.peers.run [--rounds=10] [--warmup=2]
      [--repeats=2] [--ms=4,8,32] [--modes=never,always]
      [--torch_python=PYTHON] [--json_out=FILE]
  .venv/bin/python -m bench.peers.run --tables_from=FILE

What runs, in one run on the two cores (one core a process, never two
timed processes at once):
- ours: bench/common's stack (8 Transformer encoder layers, d=256) on two
  `tf.distribute.Server` workers pinned one core each, the trainer's step
  (bench/scaling's throughput client, configurations timed in turn): K=1
  M=1, and K=2 at each M of --ms with GPipe, 1F1B and 1F1B ahead; with
  recompute 'never' also 1F1B with split backwards, ZB-H1 and ZB-V
  (V=2).
- torch: the same layers and weights in PyTorch (bench/peers/torch_pipe.py,
  exported from ours, the same batch) with torch.distributed.pipelining's
  ScheduleGPipe and Schedule1F1B over gloo, one process per rank pinned
  to its core, one thread each, and SGD on each rank; K=1: one process
  on core 0. Recompute 'always' is torch.utils.checkpoint around each
  layer.
- one core (bench/peers/one_core.py, pinned to core 0, after the
  repeats): the whole batch's step against the same layers on M
  micro-batches in a plain loop, our K=1 pipeline, and summing the M
  gradients alone, for each M of --ms above 1: what micro-batching costs
  with these kernels before any hand-off.

--repeats: torch's configurations, then ours, then torch's again and so
on, each time --rounds timed steps a configuration; a row's median is
over all of them, and each target also gives its ratio in every repeat
(on a shared VM a ratio moved by up to 10% between runs half an hour
apart, so a row is trusted only where its repeats agree).

Checked: torch's first loss and gradient norm (every configuration) equal
those of our layers on the same weights and batch (one GradientTape, no
pipeline) within 1e-4 relative; our pipelines equal that model exactly
(the test suite). Reported: median seconds per step, each of ours against
torch's same schedule at the same K and M, each worker's CPU seconds a
step, and the targets: every one of our GPipe and 1F1B rows at most
torch's same row at K=2 M=8 and M=32, our fastest K=2 M=8 at least 10%
faster than torch's fastest there, and K=1 no slower than torch's.

PyTorch is a benchmark-only dependency (requirements-bench.txt, its CPU
build); without it this prints one line and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.common import stack as stack_lib  # noqa: E402
from bench.peers import one_core  # noqa: E402
from bench.scaling import pipeline as scaling  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402

Setup = stack_lib.Setup
RELATIVE_TOLERANCE = 1e-4  # torch's first loss and gradient norm
FASTEST_MARGIN = 0.10  # our fastest at K=2 M=8 over torch's fastest
TORCH_SCHEDULES = ('gpipe', '1f1b')


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m bench.peers.run', description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--repeats', type=int, default=2,
                      help='Alternate torch and ours this many times.')
  parser.add_argument('--ms', default='4,8,32')
  parser.add_argument('--modes', default='never,always')
  parser.add_argument('--torch_python', default=sys.executable,
                      help='the Python whose torch to run (default: this)')
  parser.add_argument('--timeout', type=float, default=1800.0)
  parser.add_argument('--json_out', default='')
  parser.add_argument('--tables_from', default='',
                      help="A --json_out file: print its tables, run "
                      'nothing.')
  return parser.parse_args(argv)


def TorchVersion(python: str) -> Optional[str]:
  """torch's version under `python`; None if it has no torch."""
  out = subprocess.run([python, '-c', 'import torch; print(torch.__version__)'],
                       capture_output=True, text=True, check=False)
  return out.stdout.strip() if out.returncode == 0 else None


# ---- the same weights and batch ---------------------------------------------

_NAMES = {  # torch_pipe's name -> ours below model/layer<i>/
    'atten_ln/scale': 'self_atten/ln/scale',
    'atten_ln/bias': 'self_atten/ln/bias',
    **{f'{n}/w': f'self_atten/atten/w_{n}'
       for n in ('query', 'key', 'value', 'post')},
    **{f'{n}/b': f'self_atten/atten/b_{n}'
       for n in ('query', 'key', 'value', 'post')},
    'ffn_ln/scale': 'ffn/ln/scale', 'ffn_ln/bias': 'ffn/ln/bias',
    'ff1/w': 'ffn/w1', 'ff1/b': 'ffn/b1', 'ff2/w': 'ffn/w2', 'ff2/b': 'ffn/b2'}


def Export(stack: stack_lib.Stack, path: str) -> Dict[str, float]:
  """Writes our stack's initial weights and batch to `path` (.npz) and
  returns our loss and global gradient norm on them: the plain layers,
  one GradientTape (float64 sums for the norm)."""
  with tf.device('/device:CPU:0'):
    model = stack_lib.BuildModel(stack, Setup('plain'), ['/device:CPU:0'])
    inputs = stack_lib.Inputs(stack)
    variables = model.VariablesByPath()
    with tf.GradientTape() as tape:
      out = model.FProp(model.theta, inputs)
      loss = tf.reduce_mean(tf.square(out.vec))
    grads = tape.gradient(loss, list(variables.values()))
  arrays = {'batch': inputs.vec.numpy(), 'meta': json.dumps({
      'model_dim': stack.model_dim, 'hidden_dim': stack.hidden_dim,
      'num_heads': stack.num_heads, 'num_layers': stack.num_layers})}
  for i in range(stack.num_layers):
    for theirs, ours in _NAMES.items():
      arrays[f'layer{i}/{theirs}'] = variables[
          f'model/layer{i}/{ours}'].numpy()
  np.savez(path, **arrays)
  norm = np.sqrt(sum(float(np.sum(np.square(g.numpy().astype(np.float64))))
                     for g in grads))
  return {'loss': float(loss), 'grad_norm': float(norm)}


# ---- the two sides ----------------------------------------------------------


def OurSetups(mode: str, ms: Sequence[int]) -> List[Setup]:
  setups = [Setup('pipe', 1, 1, mode)]
  for m in ms:
    setups += [Setup('pipe', 2, m, mode, s) for s in TORCH_SCHEDULES]
    setups.append(Setup('pipe', 2, m, mode, '1f1b_ahead'))
    if mode == 'never':
      setups += [Setup('pipe', 2, m, mode, '1f1b', 1, True),
                 Setup('pipe', 2, m, mode, 'zb_h1'),
                 Setup('pipe', 2, m, mode, 'zb_v', 2)]
  return setups


def RunOurs(stack: stack_lib.Stack, modes: Sequence[str], ms: Sequence[int],
            args: argparse.Namespace) -> Dict[str, dict]:
  """label -> bench/scaling throughput's record, fresh workers per mode."""
  out = {}
  with tempfile.TemporaryDirectory(prefix='peers_servers_') as logs:
    workers = local_workers.LocalWorkers(2, logs)
    for mode in modes:
      results = scaling._OneClient(  # pylint: disable=protected-access
          workers, stack, OurSetups(mode, ms), args)
      for label, r in results.items():
        if 'error' not in r:
          print(f'  ours {label}: {statistics.median(r["times"]):.3f} '
                f's/step', flush=True)
      out.update(results)
  return out


def RunTorch(weights: str, k: int, m: int, schedule: str, recompute: str,
             args: argparse.Namespace) -> dict:
  """torch_pipe's record of one configuration (K processes pinned one
  core each), or {'error'}."""
  port = local_workers.FreePorts(1)[0]
  cores = sorted(os.sched_getaffinity(0))
  procs = []
  taskset = shutil.which('taskset')  # else unpinned, as LocalWorkers
  for rank in range(k):
    pin = [taskset, '-c', str(cores[rank % len(cores)])] if taskset else []
    command = pin + [
        args.torch_python, '-m', 'bench.peers.torch_pipe',
        f'--weights={weights}', f'--config={k},{m},{schedule},{recompute}',
        f'--rank={rank}', f'--port={port}', f'--rounds={args.rounds}',
        f'--warmup={args.warmup}']
    procs.append(subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1')))
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=args.timeout))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  if any(p.returncode for p in procs):
    return {'error': ' / '.join(err.strip().splitlines()[-1]
                                for (_, err), p in zip(outs, procs)
                                if p.returncode and err.strip())}
  return json.loads(outs[0][0].strip().splitlines()[-1])


def TorchLabel(k: int, m: int, schedule: str, recompute: str) -> str:
  return f'torch K={k} M={m} {recompute} {schedule}'


def RunAllTorch(weights: str, modes: Sequence[str], ms: Sequence[int],
                args: argparse.Namespace) -> Dict[str, dict]:
  out = {}
  for mode in modes:
    configs = [(1, 1, 'gpipe')] + [(2, m, s) for m in ms
                                   for s in TORCH_SCHEDULES]
    for k, m, s in configs:
      label = TorchLabel(k, m, s, mode)
      r = out[label] = dict(RunTorch(weights, k, m, s, mode, args),
                            k=k, m=m, schedule=s, recompute=mode)
      print(f'  {label}: ' + (r['error'] if 'error' in r else
                              f'{statistics.median(r["times"]):.3f} s/step'),
            flush=True)
  return out


def Merge(into: Dict[str, dict], repeat: Dict[str, dict]) -> None:
  """Adds one repeat's records: times joined, worker CPU averaged over
  the repeats, each repeat's median kept in 'repeats'."""
  for label, r in repeat.items():
    if 'error' in r:
      into.setdefault(label, r)
      continue
    r = dict(r, repeats=[statistics.median(r['times'])])
    old = into.get(label)
    if old is None or 'error' in old:
      into[label] = r
      continue
    n = len(old['repeats'])
    old['worker_cpu'] = [(a * n + b) / (n + 1) for a, b in
                         zip(old['worker_cpu'], r['worker_cpu'])]
    old['times'] = old['times'] + r['times']
    old['repeats'] = old['repeats'] + r['repeats']


def _Repeats(ours: dict, theirs: dict) -> str:
  """' (repeats: 1.02, 0.98)': each repeat's ratio, when there are
  several."""
  pairs = list(zip(ours.get('repeats', []), theirs.get('repeats', [])))
  if len(pairs) < 2:
    return ''
  return ' (repeats: ' + ', '.join(f'{a / b:.3f}' for a, b in pairs) + ')'


# ---- the table ---------------------------------------------------------------


def _Ours(ours: Dict[str, dict], mode: str
          ) -> Dict[Tuple[int, int, str, int, bool], Tuple[float, dict]]:
  """(K, M, schedule, V, split) -> (median, record) of ours in `mode`."""
  found = {}
  for r in ours.values():
    s = Setup.FromText(r['setup'])
    if s.recompute == mode and 'error' not in r:
      found[(s.k, s.m, s.schedule, s.v, s.split)] = (
          statistics.median(r['times']), r)
  return found


def Table(mode: str, ours: Dict[str, dict], theirs: Dict[str, dict],
          reference: Dict[str, float]) -> List[str]:
  mine = _Ours(ours, mode)
  how = 'checkpoint around each layer' if mode == 'always' else 'none'
  rows = [f"### Recompute '{mode}' (torch: {how})", '',
          '| K | M | schedule | torch s/step | ours s/step | ours / torch '
          '| worker CPU s/step, ours | torch |',
          '|---|---|---|---|---|---|---|---|']
  lines = []
  for r in theirs.values():
    if r['recompute'] != mode:
      continue
    k, m, s = r['k'], r['m'], r['schedule']
    t = statistics.median(r['times']) if 'error' not in r else None
    o = mine.get((k, m, 'gpipe' if k == 1 else s, 1, False))
    ratio = f'{o[0] / t:.3f}' if t and o else '-'
    rows.append(
        f'| {k} | {m} | {s if k > 1 else "(one process)"} | '
        f'{f"{t:.3f}" if t else r.get("error", "-")} | '
        f'{f"{o[0]:.3f}" if o else "-"} | {ratio} | '
        f'{", ".join(f"{c:.3f}" for c in o[1]["worker_cpu"]) if o else "-"} | '
        f'{", ".join(f"{c:.3f}" for c in r.get("worker_cpu", []))} |')
    if 'error' not in r:
      for what in ('loss', 'grad_norm'):
        rel = abs(r[what] - reference[what]) / abs(reference[what])
        if rel > RELATIVE_TOLERANCE:
          lines.append(f'- torch K={k} M={m} {s}: first {what} {r[what]:.6g} '
                       f'against ours {reference[what]:.6g} (relative '
                       f'{rel:.1e} > {RELATIVE_TOLERANCE}: MISMATCH)')
  others = sorted((key, v) for key, v in mine.items()
                  if key[2] not in TORCH_SCHEDULES or key[4])
  for (k, m, s, v, split), (t, _) in others:
    rows.append(f'| {k} | {m} | ours only: {s}{", split" * split}'
                f'{f" V={v}" if v > 1 else ""} | - | {t:.3f} | - | - | - |')
  if not lines:
    lines.append(f'- torch\'s first loss and gradient norm equal ours '
                 f'({reference["loss"]:.6g}, {reference["grad_norm"]:.6g}) '
                 f'within {RELATIVE_TOLERANCE} relative in every row')
  return rows + [''] + lines + Targets(mode, mine, theirs)


def Targets(mode: str, mine: dict, theirs: Dict[str, dict]) -> List[str]:
  rec = {(r['k'], r['m'], r['schedule']): r for r in theirs.values()
         if r['recompute'] == mode and 'error' not in r}
  med = {key: statistics.median(r['times']) for key, r in rec.items()}
  lines = []
  for m in (8, 32):
    for s in TORCH_SCHEDULES:
      if (2, m, s) in med and (2, m, s, 1, False) in mine:
        r = mine[(2, m, s, 1, False)][0] / med[(2, m, s)]
        each = _Repeats(mine[(2, m, s, 1, False)][1], rec[(2, m, s)])
        lines.append(f'- {s} K=2 M={m}: ours {r:.3f}x torch\'s{each} '
                     f'(target <= 1: {"ok" if r <= 1 else "MISS"})')
  for m in (8, 32):
    ahead = mine.get((2, m, '1f1b_ahead', 1, False))
    if ahead and (2, m, '1f1b') in med:
      r = ahead[0] / med[(2, m, '1f1b')]
      each = _Repeats(ahead[1], rec[(2, m, '1f1b')])
      lines.append(f'- 1f1b_ahead K=2 M={m} (1F1B, one more micro-batch in '
                   f'flight): ours {r:.3f}x torch\'s 1f1b{each}')
  theirs8 = [t for (k, m, _), t in med.items() if k == 2 and m == 8]
  ours8 = {key: t for key, (t, _) in mine.items()
           if key[0] == 2 and key[1] == 8}
  if theirs8 and ours8:
    best = min(ours8, key=ours8.get)
    gain = min(theirs8) / ours8[best] - 1.0
    fastest = min((r for key, r in rec.items() if key[:2] == (2, 8)),
                  key=lambda r: statistics.median(r['times']))
    pairs = list(zip(fastest.get('repeats', []),
                     mine[best][1].get('repeats', [])))
    each = (' (repeats: ' + ', '.join(f'{a / b - 1:+.1%}' for a, b in pairs)
            + ')' if len(pairs) > 1 else '')
    lines.append(f'- fastest K=2 M=8: ours ({best[2]}{", split" * best[4]}'
                 f' V={best[3]}) {ours8[best]:.3f} s against torch\'s '
                 f'{min(theirs8):.3f} s: {gain:+.1%}{each} (target >= '
                 f'+{FASTEST_MARGIN:.0%}: '
                 f'{"ok" if gain >= FASTEST_MARGIN else "MISS"})')
  one = mine.get((1, 1, 'gpipe', 1, False))
  if one and (1, 1, 'gpipe') in med:
    r = one[0] / med[(1, 1, 'gpipe')]
    each = _Repeats(one[1], rec[(1, 1, 'gpipe')])
    lines.append(f'- K=1 M=1: ours {r:.3f}x torch\'s{each} (target <= 1: '
                 f'{"ok" if r <= 1 else "MISS"})')
    for m in (8, 32):
      key = (2, m, '1f1b', 1, False)
      if key in mine:
        share = one[1]['worker_cpu'][0] / 2
        cpu = max(mine[key][1]['worker_cpu'])
        lines.append(f'- ours K=2 M={m} 1F1B: worker CPU {cpu:.3f} s a step, '
                     f'{cpu / share:.2f}x its share of K=1 ({share:.3f} s)')
  return lines


def main(argv: Sequence[str]) -> None:
  scaling.Stoppable(_Main, argv)


def _Main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.tables_from:
    with open(args.tables_from) as f:
      raw = json.load(f)
    print(raw['header'], flush=True)
    _PrintTables(raw['ours'], raw['torch'], raw['reference'],
                 raw.get('one_core'))
    return
  version = TorchVersion(args.torch_python)
  if version is None:
    sys.exit(f'bench/peers needs PyTorch under {args.torch_python}: pip '
             'install -r requirements-bench.txt (its CPU build), or pass '
             '--torch_python; nothing measured.')
  header = scaling._Header() + f'; torch {version}'  # pylint: disable=protected-access
  print(header, flush=True)
  stack = stack_lib.Stack()
  modes = args.modes.split(',')
  ms = [int(m) for m in args.ms.split(',')]
  theirs, ours = {}, {}
  with tempfile.TemporaryDirectory(prefix='peers_') as where:
    weights = os.path.join(where, 'stack.npz')
    reference = Export(stack, weights)
    for repeat in range(args.repeats):
      print(f'repeat {repeat + 1} of {args.repeats}', flush=True)
      Merge(theirs, RunAllTorch(weights, modes, ms, args))
      Merge(ours, RunOurs(stack, modes, ms, args))
  print('one core: the micro-batches before any hand-off', flush=True)
  single = one_core.Run([m for m in ms if m > 1], args.rounds, args.timeout)
  raw = {'header': header, 'reference': reference, 'torch': theirs,
         'ours': ours, 'one_core': single}
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(raw, f)
  _PrintTables(ours, theirs, reference, single)


def _PrintTables(ours: Dict[str, dict], theirs: Dict[str, dict],
                 reference: Dict[str, float],
                 single: Optional[Dict[str, list]]) -> None:
  modes = [m for m in ('never', 'always')
           if any(r.get('recompute') == m for r in theirs.values())]
  print('\n' + '\n'.join(sum((Table(mode, ours, theirs, reference) + ['']
                              for mode in modes),
                             [f'{stack_lib.Stack().Describe()}', ''])),
        flush=True)
  if single:
    print('\n'.join(one_core.Table(single)), flush=True)


if __name__ == '__main__':
  main(sys.argv[1:])
