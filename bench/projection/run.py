"""A projection's weight gradient: TF's einsum gradient against ours.

  .venv/bin/python -m bench.projection.run [--rounds=7]

A step is y = x @ w1 @ w2 over the last axis of x ('...i,io->...o'), loss
= mean(y ** 2), and the gradients of w1 and w2, as one tf.function, in
three ways:

  einsum         tf.einsum and TF's own gradient (a broadcast operand:
                 it builds the [rows, i, o] outer products, then sums)
  MatmulLastDim  lingvo_pipe.core.kernels.MatmulLastDim (reshape and
                 matmul, with its own gradient: one flat matmul each)
  matmul         x reshaped to [rows, i] and tf.matmul (the floor)

Per case: the allocator's peak during a step above what it held before
(TF_CPU_ALLOCATOR_USE_BFC=true, set here before TensorFlow starts) and the
median step time over `rounds` interleaved rounds, after two warm-up
steps. One process, one core's worth of threads as TF chooses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

tf = quiet.ImportTensorFlow()

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import kernels  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402

MIB = 2**20
# (x shape, i = o): a classifier head's rows, a micro-batch of sequences.
CASES = [([32, 512], 512), ([4, 64, 512], 512), ([32, 64, 256], 256)]


def _Ways():
  def Einsum(x, w):
    return tf.einsum('...i,io->...o', x, w)

  def Matmul(x, w):
    flat = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), w)
    return tf.reshape(flat, x.shape[:-1] + [w.shape[-1]])

  return {'einsum': Einsum, 'MatmulLastDim': kernels.MatmulLastDim,
          'matmul': Matmul}


def _Step(fn, d):
  w1 = tf.Variable(tf.random.stateless_normal([d, d], [1, 2]) / d**0.5)
  w2 = tf.Variable(tf.random.stateless_normal([d, d], [3, 4]) / d**0.5)

  def Step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(fn(fn(x, w1), w2)))
    return loss, tape.gradient(loss, [w1, w2])

  return tf.function(Step, autograph=False)


def main() -> None:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()
  if args.rounds < 1:
    parser.error(f'--rounds={args.rounds}: give at least 1.')
  print(f'{time.strftime("%Y-%m-%d %H:%M")} UTC, nproc {os.cpu_count()}, '
        f'load {os.getloadavg()[0]:.2f}, TensorFlow {tf.__version__}\n')
  print('| x | i = o | way | step peak above before | step (median) |')
  print('|---|---|---|---|---|')
  for shape, d in CASES:
    x = tf.random.stateless_normal(shape, [5, 6])
    steps = {name: _Step(fn, d) for name, fn in _Ways().items()}
    peaks = {}
    for name, step in steps.items():
      for _ in range(2):
        step(x)[0].numpy()
      peaks[name] = layer_profile.PeakBytes(step, (x,), 'CPU:0', num_runs=1)
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
      for name, step in steps.items():
        start = time.perf_counter()
        step(x)[0].numpy()
        times[name].append(time.perf_counter() - start)
    for name in steps:
      print(f'| {shape} | {d} | {name} | {peaks[name] / MIB:.1f} MiB | '
            f'{statistics.median(times[name]) * 1e3:.1f} ms |', flush=True)


if __name__ == '__main__':
  main()
