"""One timing process of run.py: every setup under one thread setting.

  python -m bench.gpipe.timing --threads=shared|tf --setups='plain,1,1,;...'
      [--stack=JSON] [--warmup=2]

--threads=shared: `devices.SplitCpu(2)`, the framework's default (each op
gets cores / 2 intra-op threads); --threads=tf: `devices.SplitCpu(2,
share_cores=False)`, TensorFlow's default thread pools. The two settings
need two processes, since threads are fixed when TensorFlow starts.

Builds, traces and warms up every setup, printing one JSON line each
({label, trace, first} in seconds), then the line 'ready'. Then it reads
setup labels from stdin, one per line, runs one step of that setup and
prints {wall, cpu}: wall-clock and process CPU seconds (all threads). An
empty line or the end of stdin ends it. run.py interleaves the steps of
two such processes, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import stack as stack_lib  # noqa: E402
from lingvo_pipe.core import devices  # noqa: E402


def _Say(obj) -> None:
  print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--threads', choices=('shared', 'tf'), required=True)
  parser.add_argument('--setups', required=True,
                      help="';'-separated kind,K,M,recompute.")
  parser.add_argument('--stack', default='{}', help='Stack fields, JSON.')
  parser.add_argument('--warmup', type=int, default=2)
  args = parser.parse_args()
  devs = devices.SplitCpu(2, share_cores=args.threads == 'shared')
  stack = stack_lib.Stack(**json.loads(args.stack))
  inputs = stack_lib.Inputs(stack)
  fns = {}
  for text in args.setups.split(';'):
    setup = stack_lib.Setup.FromText(text)
    layer = stack_lib.BuildModel(stack, setup, devs)
    ready = stack_lib.Prepare(stack_lib.StepFunction(layer, setup, devs[0]),
                              inputs, args.warmup)
    fns[setup.label] = ready.fn
    _Say({'label': setup.label, 'trace': ready.trace, 'first': ready.first})
  _Say('ready')
  for line in sys.stdin:
    label = line.strip()
    if not label:
      break
    start, cpu = time.perf_counter(), time.process_time()
    fns[label](inputs)[0].numpy()
    _Say({'wall': time.perf_counter() - start,
          'cpu': time.process_time() - cpu})


if __name__ == '__main__':
  main()
