"""One throughput measurement of run.py: a client of the pinned workers.

  python bench/scaling/throughput.py --cluster_spec=worker=127.0.0.1:P0,...
      --worker_pids=PID0,PID1 --setup=pipe,K,M,recompute [--stack=JSON]
      [--warmup=2] [--steps=10]

Connects (`cluster.Connect`, one device per task), builds the stack of
bench/gpipe/stack.py as a PipeliningLayer with partition k on task k,
traces the training step, runs `warmup` steps (the first call is one),
then `steps` timed steps, one at a time (a step ends when its loss is
back in this process). Prints one JSON line:

  times       wall-clock seconds of each timed step
  worker_cpu  CPU seconds per timed step of each worker process (utime +
              stime from /proc/PID/stat over all timed steps / steps)
  client_cpu  the same for this process
  trace       seconds to trace (get_concrete_function)
  first       seconds of the first call (graph optimisation, one step)

A fresh process per configuration: connecting to a cluster changes the
process's eager context for good.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'gpipe'))

from lingvo_pipe.core import cluster  # noqa: E402

import stack as stack_lib  # noqa: E402  (bench/gpipe)


def CpuSeconds(pid: int) -> float:
  """User + system CPU seconds of a process so far, from /proc/PID/stat."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rpartition(')')[2].split()
  # After 'pid (comm)': state is field 0, utime 11, stime 12.
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _Args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--cluster_spec', required=True)
  parser.add_argument('--worker_pids', required=True,
                      help='Comma-separated process ids of the workers.')
  parser.add_argument('--setup', required=True, help='pipe,K,M,recompute')
  parser.add_argument('--stack', default='{}', help='Stack fields, JSON.')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--steps', type=int, default=10)
  return parser.parse_args()


def Measure(spec: str, pids: List[int], stack: stack_lib.Stack,
            setup: stack_lib.Setup, warmup: int, steps: int) -> dict:
  """The JSON record of the module docstring."""
  devices = cluster.Connect(cluster.ParseClusterSpec(spec))
  layer = stack_lib.BuildModel(stack, setup, devices)
  inputs = stack_lib.Inputs(stack)
  step = stack_lib.StepFunction(layer, setup, devices[0])
  start = time.perf_counter()
  step.get_concrete_function(inputs)
  traced = time.perf_counter()
  step(inputs)[0].numpy()
  first = time.perf_counter()
  for _ in range(warmup - 1):
    step(inputs)[0].numpy()
  cpu_before = [CpuSeconds(pid) for pid in pids]
  client_before = time.process_time()
  times = []
  for _ in range(steps):
    begin = time.perf_counter()
    step(inputs)[0].numpy()
    times.append(time.perf_counter() - begin)
  client_cpu = (time.process_time() - client_before) / steps
  worker_cpu = [(CpuSeconds(pid) - b) / steps
                for pid, b in zip(pids, cpu_before)]
  return {'setup': setup.ToText(), 'devices': devices, 'times': times,
          'worker_cpu': worker_cpu, 'client_cpu': client_cpu,
          'trace': traced - start, 'first': first - traced}


def main() -> None:
  args = _Args()
  setup = stack_lib.Setup.FromText(args.setup)
  if setup.kind != 'pipe':
    raise SystemExit(f'--setup={args.setup}: write pipe,K,M,recompute.')
  pids = [int(p) for p in args.worker_pids.split(',')]
  stack = stack_lib.Stack(**json.loads(args.stack))
  print(json.dumps(Measure(args.cluster_spec, pids, stack, setup,
                           args.warmup, args.steps)), flush=True)


if __name__ == '__main__':
  main()
