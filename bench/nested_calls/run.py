"""Unrolled layers against one inner tf.function called per micro-batch.

  .venv/bin/python -m bench.nested_calls.run [--num_layers=4] [--m=8]
      [--rounds=12]

For docs/DESIGN.md section 2: would tracing a partition once and calling
it M times keep the graph, tracing and memory bounded? Runs, in one
subprocess per variant (RSS must not mix), a training step of the stack's
first `--num_layers` layers on `--m` micro-batches in a Python loop under
one tape (no pipeline), the layers called as

  inline     plain Python calls: M copies of every op in the graph
  nested     one inner tf.function (the runtime inlines its calls)
  noinline   the same with the `_noinline` attribute

One subprocess per variant prints graph ops, trace seconds, the seconds
of the first three calls (the first one optimises the graph) and RSS
growth from after building the layers to after those calls; then one
more subprocess builds all three and times them in `--rounds`
interleaved rounds, since step times from different processes are not
comparable on this machine.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.common import proc  # noqa: E402

VARIANTS = ('inline', 'nested', 'noinline')


def Build(variant: str, num_layers: int, m: int):
  """(step function, inputs) of one variant; nothing traced yet."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import layers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.nested_map import NestedMap  # pylint: disable=g-import-not-at-top
  stack = stack_lib.Stack(num_layers=num_layers)
  layer = layers.SequentialLayer.Params().Set(
      name='model', sub=stack_lib._LayerParams(stack)).Instantiate()  # pylint: disable=protected-access
  variables = layer.vars.Flatten()

  def Cell(theta, x):
    return layer.FProp(theta, x).vec

  attributes = {'_noinline': True} if variant == 'noinline' else None
  inner = tf.function(Cell, autograph=False,
                      experimental_attributes=attributes)
  call = Cell if variant == 'inline' else inner

  @tf.function(autograph=False)
  def Step(batch):
    with tf.GradientTape() as tape:
      outs = []
      for part in tf.split(batch.vec, m):
        x = NestedMap(vec=part, paddings=tf.zeros(tf.shape(part)[:2]))
        outs.append(call(layer.theta, x))
      loss = tf.reduce_mean(tf.square(tf.concat(outs, 0)))
    return loss, tape.gradient(loss, variables)

  return Step, stack_lib.Inputs(stack)


def MeasureBuild(variant: str, num_layers: int, m: int) -> str:
  """Graph ops, trace and first-call seconds, RSS growth (own process)."""
  step, inputs = Build(variant, num_layers, m)
  rss = proc.StatusKiB('VmRSS')
  start = time.perf_counter()
  graph = step.get_concrete_function(inputs).graph
  traced = time.perf_counter()
  for _ in range(3):
    step(inputs)[0].numpy()
  first = time.perf_counter()
  return (f'{variant:<9} {len(graph.get_operations()):>7} '
          f'{traced - start:>7.1f} {first - traced:>12.1f} '
          f'{(proc.StatusKiB("VmRSS") - rss) // 1024:>8}')


def MeasureSteps(num_layers: int, m: int, rounds: int) -> str:
  """Median step seconds of every variant, interleaved in one process."""
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  steps = {}
  for variant in VARIANTS:
    step, inputs = Build(variant, num_layers, m)
    step(inputs)[0].numpy()
    step(inputs)[0].numpy()
    steps[variant] = step
  times = {variant: [] for variant in VARIANTS}
  for variant in stack_lib.Rotations(VARIANTS, rounds):
    begin = time.perf_counter()
    steps[variant](inputs)[0].numpy()
    times[variant].append(time.perf_counter() - begin)
  return '  '.join(f'{v} {statistics.median(t):.3f} s'
                   for v, t in times.items())


def _Child(args: argparse.Namespace, what: str) -> str:
  child = subprocess.run(
      [sys.executable, '-m', 'bench.nested_calls.run', f'--child={what}',
       f'--num_layers={args.num_layers}', f'--m={args.m}',
       f'--rounds={args.rounds}'], capture_output=True, text=True)
  if child.returncode:
    raise RuntimeError(f'{what} failed:\n{child.stderr[-3000:]}')
  return child.stdout.strip().splitlines()[-1]


def main(argv) -> None:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--child', default=None,
                      help='Internal: one variant, or "steps".')
  parser.add_argument('--num_layers', type=int, default=4)
  parser.add_argument('--m', type=int, default=8)
  parser.add_argument('--rounds', type=int, default=12)
  args = parser.parse_args(argv)
  if args.child == 'steps':
    print(MeasureSteps(args.num_layers, args.m, args.rounds))
    return
  if args.child:
    print(MeasureBuild(args.child, args.num_layers, args.m))
    return
  print(f'{args.num_layers} layers of the bench stack, {args.m} '
        'micro-batches in a loop under one tape.')
  print(f'{"variant":<9} {"ops":>7} {"trace s":>7} {"3 steps s":>12} '
        f'{"RSS +MiB":>8}')
  for variant in VARIANTS:
    print(_Child(args, variant), flush=True)
  print(f'step, median of {args.rounds} interleaved rounds in one process: '
        + _Child(args, 'steps'))


if __name__ == '__main__':
  main(sys.argv[1:])
