"""The throughput client of pipeline.py: every configuration, interleaved.

  python -m bench.scaling.throughput --cluster_spec=worker=127.0.0.1:P0,...
      --worker_pids=PID0,PID1 --setups='pipe,1,1,never;pipe,2,8,never;...'
      [--stack=JSON] [--warmup=2] [--rounds=10]

Connects (`cluster.Connect`, one device per task), builds the stack of
bench/common/stack.py once per configuration as a PipeliningLayer with
partition k on task k, traces each training step and runs `warmup` steps
of it (the first call is one). The step is the trainer's: an SGD update
of each variable on its device, only the loss back
(`stack.TrainStepFunction`); once all are ready, one more untimed step of
each. Then `rounds` rounds: each round runs one
step of every configuration, starting one further along the list each
round (`stack.Rotations`), so a change of machine load hits all of them
alike. A step ends when its loss is back in this process. Prints one
JSON line, label -> record:

  times       wall-clock seconds of each timed step
  worker_cpu  CPU seconds per timed step of each worker process (utime +
              stime from /proc/PID/stat around each step, summed / steps)
  client_cpu  the same for this process
  trace       seconds to trace (get_concrete_function)
  first       seconds of the first call (graph optimisation, one step)
  bubble, ideal_bubble
              with --bubbles: the measured idle share of one traced step
              (step_trace) and the ideal of the order that ran

Connecting to a cluster changes the process's eager context for good, so
pipeline.py starts one client per recompute mode, on fresh workers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import stack as stack_lib  # noqa: E402
from lingvo_pipe.core import cluster  # noqa: E402
from lingvo_pipe.core import step_trace  # noqa: E402


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
  parser.add_argument('--setups', required=True,
                      help="';'-separated pipe,K,M,recompute.")
  parser.add_argument('--stack', default='{}', help='Stack fields, JSON.')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--bubbles', action='store_true',
                      help='Also measure each configuration\'s bubble '
                      '(step_trace: one traced step after warm-up).')
  return parser.parse_args()


def Measure(spec: str, pids: List[int], stack: stack_lib.Stack,
            setups: List[stack_lib.Setup], warmup: int,
            rounds: int, bubbles: bool = False) -> Dict[str, dict]:
  """The JSON record of the module docstring."""
  devices = cluster.Connect(cluster.ParseClusterSpec(spec))
  inputs = stack_lib.Inputs(stack)
  ready, out = {}, {}
  for setup in setups:
    layer = stack_lib.BuildModel(stack, setup, devices)
    ready[setup.label] = stack_lib.Prepare(
        stack_lib.TrainStepFunction(layer, setup, devices[0]), inputs,
        warmup)
    out[setup.label] = {
        'setup': setup.ToText(), 'devices': devices[:setup.k], 'times': [],
        'worker_cpu': [0.0] * len(pids), 'client_cpu': 0.0,
        'trace': ready[setup.label].trace, 'first': ready[setup.label].first}
    if bubbles:
      traced = step_trace.Measure(ready[setup.label].fn.python_function,
                                  inputs, warmup=1)
      out[setup.label]['bubble'] = traced.Bubble('model')
      out[setup.label]['ideal_bubble'] = traced.IdealBubble('model')
  # One untimed step of each after all are built: the first step after
  # the others' set-up ran up to 3x its median (one-off work on the
  # workers), which the per-step CPU means would carry.
  for label in ready:
    ready[label].fn(inputs)[0].numpy()
  for label in stack_lib.Rotations(list(ready), rounds):
    record = out[label]
    cpu_before = [CpuSeconds(pid) for pid in pids]
    client_before = time.process_time()
    begin = time.perf_counter()
    ready[label].fn(inputs)[0].numpy()
    record['times'].append(time.perf_counter() - begin)
    record['client_cpu'] += (time.process_time() - client_before) / rounds
    record['worker_cpu'] = [
        total + (CpuSeconds(pid) - before) / rounds
        for total, pid, before in zip(record['worker_cpu'], pids, cpu_before)]
  return out


def main() -> None:
  args = _Args()
  setups = [stack_lib.Setup.FromText(t) for t in args.setups.split(';')]
  for setup in setups:
    if setup.kind != 'pipe':
      raise SystemExit(f'--setups: {setup.ToText()}: write pipe,K,M,'
                       'recompute.')
  pids = [int(p) for p in args.worker_pids.split(',')]
  stack = stack_lib.Stack(**json.loads(args.stack))
  print(json.dumps(Measure(args.cluster_spec, pids, stack, setups,
                           args.warmup, args.rounds, args.bubbles)),
        flush=True)


if __name__ == '__main__':
  main()
