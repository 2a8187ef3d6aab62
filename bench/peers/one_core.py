"""What a micro-batch costs on one core, before any hand-off.

  taskset -c 0 .venv/bin/python -m bench.peers.one_core [--ms=8,32]
      [--rounds=10]

bench/common's stack in this process (one intra-op and two inter-op
threads, as on a pinned worker), each step returning the loss and every
gradient, in interleaved rounds (stack.Rotations):
- `batch`: the whole batch at once (K=1 M=1);
- `loop M`: the same layers on M micro-batches in one graph, one tape
  (what any micro-batching costs with these kernels: M smaller kernels
  per op, and autodiff summing the M gradients);
- `pipe M`: our PipeliningLayer with K=1 (its stage calls and its own
  running gradient sums);
- `sum M`: summing M gradients of the stack's variables alone (one
  tf.add_n per variable, the inputs made beforehand).

Prints one JSON line: label -> seconds of each timed step. bench/peers/
run.py runs it pinned to core 0 and compares each with `batch`: the
share of K=1's CPU a pipeline's worker can hope for at that M.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()

import tensorflow as tf  # noqa: E402

from bench.common import stack as stack_lib  # noqa: E402
from lingvo_pipe.core import stage_function  # noqa: E402

_DEVICE = '/device:CPU:0'


def _Steps(stack: stack_lib.Stack, ms: Sequence[int]
           ) -> Dict[str, Callable[[], tf.Tensor]]:
  """label -> a call running one step; its result's first tensor."""
  inputs = stack_lib.Inputs(stack)
  steps: Dict[str, Callable[[], tf.Tensor]] = {}
  setups = [('batch', stack_lib.Setup('plain', 1, 1, 'never'))]
  for m in ms:
    setups += [(f'loop {m}', stack_lib.Setup('loop', 1, m, 'never')),
               (f'pipe {m}', stack_lib.Setup('pipe', 1, m, 'never'))]
  shapes = None
  for label, setup in setups:
    layer = stack_lib.BuildModel(stack, setup, [_DEVICE])
    fn = stack_lib.StepFunction(layer, setup, _DEVICE)
    steps[label] = lambda fn=fn: fn(inputs)[0]
    shapes = shapes or [v.shape for v in layer.vars.Flatten()]
  for m in ms:
    grads = [[tf.random.normal(s) for s in shapes] for _ in range(m)]
    add_n = tf.function(
        lambda g: [tf.add_n(list(x)) for x in zip(*g)], autograph=False)
    steps[f'sum {m}'] = lambda f=add_n, g=grads: f(g)[0]
  return steps


def Measure(stack: stack_lib.Stack, ms: Sequence[int], warmup: int,
            rounds: int) -> Dict[str, List[float]]:
  steps = _Steps(stack, ms)
  for step in steps.values():
    for _ in range(warmup):
      step().numpy()
  times: Dict[str, List[float]] = {label: [] for label in steps}
  for label in stack_lib.Rotations(list(steps), rounds):
    start = time.perf_counter()
    steps[label]().numpy()
    times[label].append(time.perf_counter() - start)
  return times


def Run(ms: Sequence[int], rounds: int, timeout: float
        ) -> Optional[Dict[str, list]]:
  """This module in a child pinned to core 0 (when taskset is there); None
  (and one line saying why) if it fails, so that a caller keeps what it
  measured before."""
  command = [sys.executable, '-m', 'bench.peers.one_core',
             '--ms=' + ','.join(map(str, ms)), f'--rounds={rounds}']
  if shutil.which('taskset'):
    command = ['taskset', '-c', '0'] + command
  try:
    out = subprocess.run(command, capture_output=True, text=True,
                         check=True, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])
  except subprocess.TimeoutExpired:
    print(f'one core: took over {timeout:.0f} s (--timeout); left out',
          flush=True)
  except subprocess.CalledProcessError as e:
    last = (e.stderr.strip().splitlines() or ['(no output)'])[-1]
    print(f'one core: exited with {e.returncode} ({last}); left out',
          flush=True)
  return None


def Table(times: Dict[str, List[float]]) -> List[str]:
  """The table of each M: the loop's, the pipeline's and the gradient
  sums' medians, each also as a multiple of the whole batch's."""
  med = {label: statistics.median(t) for label, t in times.items()}
  rows = ['### One core, before any hand-off (one_core.py)', '',
          '| M | one batch s | plain loop s (x batch) | our pipeline K=1 s '
          '(x batch) | summing M gradients s (x batch) |',
          '|---|---|---|---|---|']
  batch = med['batch']
  for m in sorted(int(label.split()[1]) for label in med
                  if label.startswith('loop ')):
    cells = [f'{med[f"{kind} {m}"]:.3f} ({med[f"{kind} {m}"] / batch:.3f})'
             for kind in ('loop', 'pipe', 'sum')]
    rows.append(f'| {m} | {batch:.3f} | ' + ' | '.join(cells) + ' |')
  return rows + ['']


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m bench.peers.one_core',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--ms', default='8,32')
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  args = parser.parse_args()
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(2)
  stage_function.ShareCallBodies()
  ms = [int(m) for m in args.ms.split(',')]
  print(json.dumps(Measure(stack_lib.Stack(), ms, args.warmup,
                           args.rounds)))


if __name__ == '__main__':
  main()
