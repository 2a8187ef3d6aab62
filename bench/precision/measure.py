"""The children of run.py: a memory probe, and the timing client.

  python -m bench.precision.measure --probe --setup=pipe,2,8,never
      [--stack=JSON]
  python -m bench.precision.measure --cluster_spec=worker=127.0.0.1:P0,...
      --worker_pids=PID0,PID1 --setups='pipe,2,8,never;...'
      --stacks='JSON;JSON' [--warmup=2] [--rounds=10]

--probe: bench/memory's `table1.Probe` of bench/common's stack in one
set-up and dtype (the Stack's `dtype`), on K memory workers of its own;
prints table1's record.

Otherwise the client: connects to the given workers (run.py pins worker
i to core i), builds every set-up of every stack (one per dtype) with
partition k on task k, traces each one's training step
(`stack.TrainStepFunction`: one pass, every gradient, an SGD update on
each variable's device, the loss back), counts the bytes its stages hand
each other (`hand_offs.HandOffs` of the traced graph, per sending and
receiving task), warms it up, then times `rounds` rounds of one step of
each, interleaved (`stack.Rotations`). Prints one JSON line, label ->
record: times, worker_cpu (CPU seconds per step of each worker),
hand_offs ({'0->1': bytes, ...} per step), hand_off_dtypes (the dtypes
handed off), trace, first.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import time
from typing import Dict, List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import stack as stack_lib  # noqa: E402


def Label(stack: stack_lib.Stack, setup: stack_lib.Setup) -> str:
  return f'{stack.dtype} {setup.label}'


def HandOffBytes(graph, devices: List[str]) -> Dict[str, dict]:
  """{'i->j': bytes} the stages on task i send task j per step, and the
  sorted dtypes of what they send."""
  from lingvo_pipe.core import hand_offs  # pylint: disable=g-import-not-at-top
  index = {hand_offs.CanonicalDevice(d): i for i, d in enumerate(devices)}
  sizes: Dict[str, int] = collections.Counter()
  dtypes = set()
  for t, src, dst in hand_offs.HandOffs(graph, devices):
    sizes[f'{index[src]}->{index[dst]}'] += (t.shape.num_elements() *
                                             t.dtype.size)
    dtypes.add(t.dtype.name)
  return {'bytes': dict(sorted(sizes.items())), 'dtypes': sorted(dtypes)}


def _Probe(setup: stack_lib.Setup, stack: stack_lib.Stack) -> None:
  from bench.memory import table1  # pylint: disable=g-import-not-at-top
  table1.PrintProbe(table1.Probe(setup.k, lambda devices: (
      stack_lib.BuildModel(stack, setup, devices),
      stack_lib.Inputs(stack))))


def _Client(args: argparse.Namespace) -> None:
  from bench.scaling import throughput  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  pids = [int(p) for p in args.worker_pids.split(',')]
  devices = cluster.Connect(cluster.ParseClusterSpec(args.cluster_spec))
  ready, out, inputs = {}, {}, {}
  for text in args.stacks.split(';'):
    stack = stack_lib.Stack(**json.loads(text))
    for setup_text in args.setups.split(';'):
      setup = stack_lib.Setup.FromText(setup_text)
      label = Label(stack, setup)
      inputs[label] = stack_lib.Inputs(stack)
      layer = stack_lib.BuildModel(stack, setup, devices)
      ready[label] = stack_lib.Prepare(
          stack_lib.TrainStepFunction(layer, setup, devices[0]),
          inputs[label], args.warmup)
      out[label] = {
          'setup': setup.ToText(), 'stack': dataclasses.asdict(stack),
          'times': [], 'worker_cpu': [0.0] * len(pids),
          'trace': ready[label].trace, 'first': ready[label].first,
          'hand_offs': HandOffBytes(ready[label].concrete.graph,
                                    devices[:setup.k])}
  for label in stack_lib.Rotations(list(ready), args.rounds):
    record = out[label]
    before = [throughput.CpuSeconds(pid) for pid in pids]
    begin = time.perf_counter()
    ready[label].fn(inputs[label])[0].numpy()
    record['times'].append(time.perf_counter() - begin)
    record['worker_cpu'] = [
        total + (throughput.CpuSeconds(pid) - b) / args.rounds
        for total, pid, b in zip(record['worker_cpu'], pids, before)]
  print(json.dumps(out), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--probe', action='store_true')
  parser.add_argument('--setup', help='probe: pipe,K,M,recompute')
  parser.add_argument('--stack', default='{}', help='probe: Stack, JSON')
  parser.add_argument('--cluster_spec')
  parser.add_argument('--worker_pids')
  parser.add_argument('--setups', help="';'-separated pipe,K,M,recompute")
  parser.add_argument('--stacks', help="';'-separated Stack JSON")
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--rounds', type=int, default=10)
  args = parser.parse_args()
  if args.probe:
    _Probe(stack_lib.Setup.FromText(args.setup),
           stack_lib.Stack(**json.loads(args.stack)))
  else:
    _Client(args)


if __name__ == '__main__':
  main()
