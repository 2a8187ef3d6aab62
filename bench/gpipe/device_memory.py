"""Peak memory of each partition's device: one TF server process per device.

  python -m bench.gpipe.device_memory --setup=pipe,2,8,always \
      --stack='{"batch": 32}'

prints one JSON line (MiB). `memory.py` measures the whole process, so
with two logical CPUs it adds up both devices: when two backward tasks
run at once (B(1, m) beside B(0, m+1)) their activations add up, which an
accelerator's memory never sees. Here each partition lives on its own
`tf.distribute.Server` (`lingvo_pipe.trainer --job=server`, a subprocess
on 127.0.0.1, the same settings as memory.py: oneDNN off, 128 KiB mmap
threshold), and this process is the client that traces and runs the step
(its inputs, loss and returned gradients stay here). Per server:

  base        RSS after tracing and one warm-up step
  activation  peak RSS during the next `steps` steps - base (the
              server's high-water mark, reset through its
              /proc/PID/clear_refs after the warm-up)
"""

import json
import os
import subprocess
import sys
import time
from typing import List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import proc  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _StartServers(spec: str, num: int) -> List[subprocess.Popen]:
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072',
             TF_ENABLE_ONEDNN_OPTS='0', TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=os.pathsep.join(
                 [REPO, os.environ.get('PYTHONPATH', '')]))
  servers = [subprocess.Popen(
      [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
       f'--cluster_spec={spec}', f'--task_index={task}'],
      env=env, cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL, text=True) for task in range(num)]
  for server in servers:
    line = server.stdout.readline()
    if not line.startswith('Serving'):
      for other in servers:
        other.kill()
        other.wait()
      raise RuntimeError(f'A server did not start (said {line!r}).')
  time.sleep(1.0)  # 'Serving' is printed just before the server starts
  return servers


def Measure(stack: stack_lib.Stack, setup: stack_lib.Setup,
            steps: int) -> dict:
  """Per server: base and activation MiB (module docstring)."""
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  spec = ','.join(f'127.0.0.1:{proc.FreePort()}' for _ in range(setup.k))
  servers = _StartServers(f'worker={spec}', setup.k)
  try:
    devices = cluster.Connect(cluster.ParseClusterSpec(f'worker={spec}'))
    layer = stack_lib.BuildModel(stack, setup, devices)
    inputs = stack_lib.Inputs(stack)
    step = stack_lib.StepFunction(layer, setup, devices[0])
    step(inputs)[0].numpy()  # traces, optimises, runs once
    base, peak = proc.PeakDuring(
        [server.pid for server in servers],
        lambda: [step(inputs)[0].numpy() for _ in range(steps)])
  finally:
    for server in servers:
      server.kill()
      server.wait()
  mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
  return {'setup': setup.ToText(), 'base': [mib(b) for b in base],
          'activation': [mib(p - b) for p, b in zip(peak, base)]}


def main() -> None:
  stack, setup, steps = stack_lib.ChildArgs(__doc__.split('\n')[0], 1)
  if setup.kind != 'pipe':
    raise SystemExit(f'--setup={setup.ToText()}: only pipe setups have '
                     'one device per partition; write pipe,K,M,recompute.')
  print(json.dumps(Measure(stack, setup, steps)))
  sys.stdout.flush()


if __name__ == '__main__':
  main()
