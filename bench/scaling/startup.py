"""One start-up measurement of pipeline.py: K logical CPUs in this process.

  python -m bench.scaling.startup --setup=pipe,K,M,recompute
      [--stack=JSON] [--steps=3]

`devices.SplitCpu(K)` before any TF op, then the stack of
bench/common/stack.py as a PipeliningLayer on CPU:0..K-1 and its training
step (`stack.StepFunction`). Prints one JSON line:

  build       seconds to build the layer (variables created)
  trace       seconds of step.get_concrete_function(inputs)
  first       seconds of the first call after tracing (graph optimisation,
              kernel creation, one step)
  first_step  trace + first: time to the first finished step
  step        median seconds of the next `steps` steps
  ops         graph size: ops of the traced outer graph + node_defs of
              every function in its library
  outer_ops, functions
              the two parts: outer graph ops, library function count
  peak_rss    peak RSS of this process in MiB (ru_maxrss)
  peak_hwm    the same from /proc/self/status VmHWM, which (unlike
              ru_maxrss) never reports the parent's RSS before exec

One process per configuration, so peak RSS does not mix.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import proc  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402
from lingvo_pipe.core import devices  # noqa: E402


def Measure(stack: stack_lib.Stack, setup: stack_lib.Setup,
            steps: int) -> dict:
  """The JSON record of the module docstring."""
  devs = devices.SplitCpu(setup.k)  # before any TF op
  start = time.perf_counter()
  layer = stack_lib.BuildModel(stack, setup, devs)
  built = time.perf_counter()
  inputs = stack_lib.Inputs(stack)
  step = stack_lib.StepFunction(layer, setup, devs[0])
  ready = stack_lib.Prepare(step, inputs, warmup=1)
  times = []
  for _ in range(steps):
    begin = time.perf_counter()
    step(inputs)[0].numpy()
    times.append(time.perf_counter() - begin)
  library = ready.concrete.graph.as_graph_def().library.function
  outer = len(ready.concrete.graph.get_operations())
  return {'setup': setup.ToText(), 'build': built - start,
          'trace': ready.trace, 'first': ready.first,
          'first_step': ready.trace + ready.first,
          'step': statistics.median(times) if times else None,
          'ops': outer + sum(len(f.node_def) for f in library),
          'outer_ops': outer, 'functions': len(library),
          'peak_rss': resource.getrusage(
              resource.RUSAGE_SELF).ru_maxrss / 1024,
          'peak_hwm': proc.StatusKiB('VmHWM') / 1024}


def main() -> None:
  stack, setup, steps = stack_lib.ChildArgs(__doc__.split('\n')[0], 3)
  if setup.kind != 'pipe':
    raise SystemExit(f'--setup={setup.ToText()}: write pipe,K,M,recompute.')
  print(json.dumps(Measure(stack, setup, steps)), flush=True)


if __name__ == '__main__':
  main()
