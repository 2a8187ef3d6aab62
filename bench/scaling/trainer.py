"""The README's main model trained on pinned local workers: 2 cores vs 1.

  .venv/bin/python -m bench.scaling.run trainer [--steps=60] [--skip=10]
      [--rounds=2] [--model=image.synthetic.ResNetTinyGPipe]

The trainer (`python -m lingvo_pipe.trainer --model=... --cluster_spec=...`,
unpinned) drives two `tf.distribute.Server` workers on 127.0.0.1, partition
k on task k, in two placements that differ only in cores:

  two cores  task i pinned to core i (`taskset -c i`)
  one core   both tasks pinned to core 0

Same program, same gRPC hops, same inter-op threads; only whether the
partitions can run at the same time changes. Each run trains --steps
steps from scratch (summaries every step, no checkpoint or evaluation
before the end), and a step's time is the batch size over the trainer's own
`examples_per_sec` summary (wall time between two finished steps). The
first --skip steps are left out (tracing, warm-up). Runs alternate between
the placements for --rounds rounds, a fresh trainer and fresh workers each
run. Prints each run's median and the median over rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))  # the checkout
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

import tensorflow as tf  # noqa: E402
from tensorflow.core.util import event_pb2  # noqa: E402

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402


PLACEMENTS = {'two cores': [0, 1], 'one core': [0, 0]}


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='image.synthetic.ResNetTinyGPipe')
  parser.add_argument('--steps', type=int, default=60)
  parser.add_argument('--skip', type=int, default=10)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--timeout', type=float, default=900)
  parser.add_argument('--json_out', default=None)
  args = parser.parse_args(argv)
  if args.skip >= args.steps:
    parser.error(f'--skip={args.skip} leaves no step of --steps='
                 f'{args.steps}; lower --skip.')
  return args


def _StepSeconds(logdir: str) -> Dict[int, float]:
  """step -> seconds, from the train summaries' examples_per_sec."""
  rates = {}
  for path in glob.glob(os.path.join(logdir, 'train', 'events.*')):
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag == 'examples_per_sec':
          rates[event.step] = float(tf.make_ndarray(value.tensor))
  return rates


def _BatchSize(model: str) -> int:
  return model_registry.GetParams(model).train_input.batch_size


def RunOnce(args: argparse.Namespace, cores: List[int], log_dir: str,
            batch: int) -> List[float]:
  """Seconds of each step after --skip, one trainer run on fresh workers."""
  overrides = '\n'.join([
      f'task.train.max_steps : {args.steps}',
      'task.train.summary_interval_steps : 1',
      f'task.train.save_interval_steps : {10 * args.steps}',
      'task.train.eval_interval_steps : 0',
      'task.train.eval_steps : 1'])
  with local_workers.LocalWorkers(2, log_dir, cores=cores) as workers, \
      tempfile.TemporaryDirectory(prefix='trainer_bench_') as logdir:
    log = os.path.join(log_dir, 'trainer.log')
    with open(log, 'w') as out:
      done = subprocess.run(
          [sys.executable, '-m', 'lingvo_pipe.trainer',
           f'--model={args.model}', f'--logdir={logdir}',
           f'--cluster_spec={workers.spec}',
           f'--model_params_override={overrides}'],
          cwd=_REPO, timeout=args.timeout, stdin=subprocess.DEVNULL,
          stdout=out, stderr=subprocess.STDOUT,
          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    if done.returncode:
      with open(log, errors='replace') as f:
        raise RuntimeError(f'The trainer exited with {done.returncode}; the '
                           f'end of its output:\n{f.read()[-3000:]}')
    rates = _StepSeconds(logdir)
  steps = sorted(s for s in rates if s > args.skip)
  if len(steps) < args.steps - args.skip:
    raise RuntimeError(f'Found summaries of {len(steps)} steps after step '
                       f'{args.skip}; expected {args.steps - args.skip}.')
  return [batch / rates[s] for s in steps]


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  print(f'command: {cli.Text()}\ndate: '
        f'{time.strftime("%Y-%m-%d %H:%M:%S %Z")}; nproc: '
        f'{len(os.sched_getaffinity(0))}; load average at start: '
        f'{os.getloadavg()}', flush=True)
  batch = _BatchSize(args.model)
  runs: Dict[str, List[List[float]]] = {name: [] for name in PLACEMENTS}
  with tempfile.TemporaryDirectory(prefix='trainer_bench_servers_') as logs:
    for r in range(args.rounds):
      names = list(PLACEMENTS)[r % 2:] + list(PLACEMENTS)[:r % 2]
      for name in names:
        start = time.time()
        times = RunOnce(args, PLACEMENTS[name], logs, batch)
        runs[name].append(times)
        print(f'  round {r + 1}, {name}: median {statistics.median(times):.4f}'
              f' s/step over {len(times)} steps; run {time.time() - start:.0f}'
              ' s', flush=True)
  medians = {name: statistics.median(t for run in v for t in run)
             for name, v in runs.items()}
  print(f'\nload average at end: {os.getloadavg()}\n\n'
        f'{args.model}, batch {batch}, steps {args.skip + 1}-{args.steps} '
        f'of each run, {args.rounds} runs per placement:\n\n'
        '| workers | median s/step | examples/s |\n|---|---|---|')
  for name, med in medians.items():
    print(f'| {name} | {med:.4f} | {batch / med:.1f} |')
  print(f'\nspeed-up, two cores over one: '
        f'{medians["one core"] / medians["two cores"]:.2f}x')
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'model': args.model, 'batch': batch, 'runs': runs}, f)


if __name__ == '__main__':
  main(sys.argv[1:])
