"""Peak host memory of one configuration, in a process of its own.

  python -m bench.gpipe.memory --setup=pipe,2,8,always --stack='{"batch": 32}'

prints one JSON line (MiB). Run by run.py, one process per configuration,
with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_), so
every tensor buffer above that is its own mapping, returned to the system
when freed: resident memory then follows the live tensors instead of
whatever the allocator kept from earlier steps.

  built      RSS after building the model (variables), before tracing
  base       RSS after tracing and one warm-up step (graph, Grappler's
             rewrite, kernels and first-step caches all exist; the step's
             own tensors are freed again)
  step_peak  peak RSS during the next `steps` steps (the kernel's
             high-water mark, reset after the warm-up step through
             /proc/self/clear_refs)
  activation step_peak - base: what one step holds at its worst moment,
             i.e. activations kept for the backward, gradients and
             temporaries. This is the number that should fall with M.
  lifetime   peak over the whole process minus `built`: it also counts
             tracing and Grappler, which grow with M because the schedule
             is unrolled.

Peaks are read from VmHWM in /proc/self/status, the same high-water mark
as `resource.getrusage(RUSAGE_SELF).ru_maxrss` for this process's own
memory. ru_maxrss itself is not used: a child process starts with the
parent's ru_maxrss (Linux records the pre-exec RSS of the forked parent),
so under a parent that holds models it reports the parent's size.
"""

import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import devices  # noqa: E402

DEVICES = devices.SplitCpu(2)

from bench.common import proc  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402


def Measure(stack: stack_lib.Stack, setup: stack_lib.Setup,
            steps: int) -> dict:
  """Memory figures in MiB (module docstring)."""
  layer = stack_lib.BuildModel(stack, setup, DEVICES)
  inputs = stack_lib.Inputs(stack)
  step = stack_lib.StepFunction(layer, setup, DEVICES[0])
  built = proc.StatusKiB('VmRSS')
  step(inputs)[0].numpy()  # traces, optimises, runs once
  base = proc.StatusKiB('VmRSS')
  warm_peak = proc.StatusKiB('VmHWM')
  proc.ResetPeak()
  for _ in range(steps):
    step(inputs)[0].numpy()
  step_peak = proc.StatusKiB('VmHWM')
  mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
  return {'setup': setup.ToText(), 'built': mib(built), 'base': mib(base),
          'step_peak': mib(step_peak), 'activation': mib(step_peak - base),
          'lifetime': mib(max(warm_peak, step_peak) - built)}


def main() -> None:
  stack, setup, steps = stack_lib.ChildArgs(__doc__.split('\n')[0], 3)
  print(json.dumps(Measure(stack, setup, steps)))
  sys.stdout.flush()


if __name__ == '__main__':
  main()
