"""TF worker servers on 127.0.0.1, each pinned to its own core.

Worker i is started as bench/gpipe/device_memory.py starts its servers
(`python -m lingvo_pipe.trainer --job=server --cluster_spec=...
--task_index=i`, a free port each), under `taskset -c i`: one core per
worker, so two partitions overlap only if the pipeline lets them. With one
core a server gets the framework's minimum of two inter-op threads
(`cluster.StartServer`). Each server writes to its own log file, quoted
when it fails to start.

Needs bench/gpipe on sys.path (run.py puts it there).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import List, Optional

import device_memory  # bench/gpipe
import proc  # bench/gpipe

REPO = device_memory.REPO


def _PortOpen(port: int) -> bool:
  with socket.socket() as s:
    s.settimeout(0.5)
    return s.connect_ex(('127.0.0.1', port)) == 0


def _Tail(path: str, chars: int = 2000) -> str:
  with open(path, errors='replace') as f:
    return f.read()[-chars:]


class Workers:
  """`num` pinned worker servers; a context manager that always stops them.

  `Start` (again) starts a fresh set on new ports; `spec` is the cluster
  spec text for `cluster.ParseClusterSpec`, `pids` the process ids (taskset
  execs the server, so they are the servers' own).
  """

  def __init__(self, num: int, log_dir: str, start_timeout: float = 180.0,
               cores: Optional[List[int]] = None):
    self._num = num
    # Task i runs on cores[i % len(cores)] (default: this process's cores).
    self._cores = cores or sorted(os.sched_getaffinity(0))
    self._log_dir = log_dir
    self._timeout = start_timeout
    self._procs: List[subprocess.Popen] = []
    self._logs: List[str] = []
    self.spec = ''
    self.starts = 0

  @property
  def pids(self) -> List[int]:
    return [p.pid for p in self._procs]

  def Start(self) -> None:
    """Stops any running servers, then starts `num` and waits for them."""
    self.Stop()
    self.starts += 1
    cores = self._cores
    ports = [proc.FreePort() for _ in range(self._num)]
    self.spec = 'worker=' + ','.join(f'127.0.0.1:{p}' for p in ports)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=os.pathsep.join(
                   [REPO, os.environ.get('PYTHONPATH', '')]))
    for task in range(self._num):
      log = os.path.join(self._log_dir,
                         f'server{task}_start{self.starts}.log')
      self._logs.append(log)
      with open(log, 'w') as out:
        self._procs.append(subprocess.Popen(
            ['taskset', '-c', str(cores[task % len(cores)]), sys.executable,
             '-m', 'lingvo_pipe.trainer', '--job=server',
             f'--cluster_spec={self.spec}', f'--task_index={task}'],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL))
    try:
      for task, port in enumerate(ports):
        self._WaitServing(task, port)
    except BaseException:
      self.Stop()
      raise

  def _WaitServing(self, task: int, port: int) -> None:
    """Until the log says 'Serving' and the port takes connections."""
    deadline = time.monotonic() + self._timeout
    while time.monotonic() < deadline:
      if self._procs[task].poll() is not None:
        raise RuntimeError(f'Server {task} exited with code '
                           f'{self._procs[task].returncode}; its log:\n'
                           f'{_Tail(self._logs[task])}')
      if 'Serving' in _Tail(self._logs[task]) and _PortOpen(port):
        return
      time.sleep(0.2)
    raise RuntimeError(f'Server {task} did not serve on port {port} within '
                       f'{self._timeout:.0f} s; its log:\n'
                       f'{_Tail(self._logs[task])}')

  def Stop(self) -> None:
    for p in self._procs:
      if p.poll() is None:
        p.kill()
      p.wait()
    self._procs, self._logs = [], []

  def __enter__(self) -> 'Workers':
    self.Start()
    return self

  def __exit__(self, *unused_exc) -> Optional[bool]:
    self.Stop()
    return None
