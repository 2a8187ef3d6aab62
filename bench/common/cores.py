"""What two cores of this machine give with no TensorFlow at all.

  .venv/bin/python -m bench.scaling.run cores [--rounds=5]

One small numpy program, single-threaded, in two forms: `matmul` (384 x
384 float32 products, cache-resident, compute-bound) and `stream` (sums of
a 64 MiB array, memory-bound). Each round runs it pinned to core 0 alone,
then pinned to cores 0 and 1 at the same time; the efficiency is the time
alone over the mean time together (1.0: the second core costs the first
nothing). Medians over rounds. bench/scaling's replicas measurement
prints this beside its own table: it is the ceiling of any two-process
speed-up on the machine. bench/planner times the matmul on each core
alone (`Pinned`), to show a core that runs slower than the other.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

from bench.common import cli

KINDS = ('matmul', 'stream')
_ENV = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
            MKL_NUM_THREADS='1')


def _Work(kind: str) -> float:
  """Median seconds of 5 repetitions of the workload, after one warm-up."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if kind == 'matmul':
    a = np.random.default_rng(0).random((384, 384), dtype=np.float32)

    def Once():
      for _ in range(400):
        a @ a  # pylint: disable=pointless-statement
  else:
    a = np.random.default_rng(0).random(16 * 2**20, dtype=np.float32)

    def Once():
      for _ in range(20):
        a.sum()
  Once()
  times = []
  for _ in range(5):
    begin = time.perf_counter()
    Once()
    times.append(time.perf_counter() - begin)
  return statistics.median(times)


def Pinned(kind: str, cores: List[int]) -> List[float]:
  """Seconds of `kind` (`_Work`) in one process per core, run at once."""
  procs = [subprocess.Popen(
      ['taskset', '-c', str(core), sys.executable, '-m', 'bench.common.cores',
       '--work=' + kind], stdout=subprocess.PIPE, text=True, env=_ENV)
           for core in cores]
  outs = [p.communicate()[0] for p in procs]
  if any(p.returncode for p in procs):
    raise SystemExit(f'core probe {kind} on cores {cores} failed')
  return [float(out) for out in outs]


def Measure(rounds: int) -> Dict[str, dict]:
  """{kind: {'alone': [s], 'together': [[s, s]], 'efficiency': median}}."""
  out = {}
  for kind in KINDS:
    alone, together = [], []
    for _ in range(rounds):
      alone.append(Pinned(kind, [0])[0])
      together.append(Pinned(kind, [0, 1]))
    ratios = [a / statistics.mean(t) for a, t in zip(alone, together)]
    out[kind] = {'alone': alone, 'together': together,
                 'efficiency': statistics.median(ratios)}
  return out


def Table(res: Dict[str, dict]) -> str:
  lines = ['| numpy workload, one thread | median s alone (core 0) | median '
           's together (core 0, core 1) | two-core efficiency |',
           '|---|---|---|---|']
  for kind in KINDS:
    rec = res[kind]
    pair = ', '.join(f'{statistics.median(t[i] for t in rec["together"]):.3f}'
                     for i in (0, 1))
    lines.append(f'| {kind} | {statistics.median(rec["alone"]):.3f} | '
                 f'{pair} | {rec["efficiency"]:.2f} |')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--work', choices=KINDS, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.work:
    print(_Work(args.work))
    return
  print(Table(Measure(args.rounds)))


if __name__ == '__main__':
  main(sys.argv[1:])
