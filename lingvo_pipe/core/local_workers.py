"""Worker servers on this machine, for `--run_locally=processes`.

`LocalWorkers(n, log_dir)` starts n TensorFlow worker servers on 127.0.0.1
(`python -m lingvo_pipe.trainer --job=server`, a free port each), waits
until every port takes connections and stops them all on the way out,
however the way out goes:

  trainer (this process, the client)
    |  fork -> prctl(PR_SET_PDEATHSIG, SIGKILL), setsid
    |       -> exec taskset -c 0 -> exec python -m lingvo_pipe.trainer
    +-- worker task 0   127.0.0.1:P0   core 0   <log_dir>/worker0.log
    +-- worker task 1   127.0.0.1:P1   core 1   <log_dir>/worker1.log
    ...
    task i runs on cores[i % len(cores)] (round-robin; default: the cores
    this process may use)

One core per task: a partition runs alone on its core, so partitions
overlap only where the pipeline schedule lets them (a pinned server still
gets two inter-op threads, see `cluster.EnsureInterOpThreads`). Without
`taskset` on PATH the servers run unpinned, with one warning.

How the servers end:
  with-block exits, exception, Ctrl-C   __exit__ -> Stop(): SIGTERM (SIGINT
                                        with a grace period), SIGKILL
                                        after 5 s, reap.
  interpreter exits without __exit__    atexit -> Stop().
  this process is killed (SIGKILL, OOM) Linux sends each server SIGKILL: the
                                        parent-death signal, set in the
                                        child before exec. It survives the
                                        exec of taskset and of python (it is
                                        cleared only by set-uid execs).
Each server runs in its own session, so a terminal's Ctrl-C reaches this
process alone and the servers stop in order, through __exit__. On other
systems than Linux there is no parent-death signal: a killed trainer
leaves its servers running.

The parent-death signal fires when the THREAD that started the servers
ends, not only the process: call Start() (or enter the with-block) from a
thread that outlives the servers, such as the main thread.

This module imports no TensorFlow: the trainer connects to `spec` itself.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from absl import logging

# The directory holding the lingvo_pipe package; on the servers' PYTHONPATH.
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP_GRACE_SECS = 5.0  # between the stop signal and SIGKILL
_POLL_SECS = 0.1


class WorkersFailed(RuntimeError):
  """A worker server exited, or did not serve in time; one line names it."""


class LocalWorkers:
  """`num_tasks` worker servers on 127.0.0.1; a context manager.

    with LocalWorkers(2, '/tmp/run1/workers') as workers:
      names = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
      ...

  Args:
    num_tasks: how many worker tasks (servers) to start.
    log_dir: each server writes stdout and stderr to
      `<log_dir>/worker<i>.log`; created if missing.
    cores: task i runs on cores[i % len(cores)]; default: every core this
      process may use, in order.
    start_timeout: seconds for all servers to take connections.
    env: variables to set in the servers' environment, on top of this
      process's (e.g. allocator settings for a memory benchmark).
    grace_secs: each server's grace period on SIGTERM (the trainer's
      --worker_grace_secs; 0: none). With one, Stop() sends SIGINT, which
      ends a server at once; without, SIGTERM.
  """

  def __init__(self, num_tasks: int, log_dir: str,
               cores: Optional[List[int]] = None,
               start_timeout: float = 120.0,
               env: Optional[Dict[str, str]] = None,
               grace_secs: float = 0.0):
    if num_tasks < 1:
      raise ValueError(f'LocalWorkers needs num_tasks >= 1, got {num_tasks}.')
    if start_timeout <= 0:
      raise ValueError(f'start_timeout must be positive, got {start_timeout}.')
    allowed = _AllowedCores()
    if cores is not None:
      bad = sorted(set(cores) - set(allowed))
      if not cores or bad:
        raise ValueError(
            f'cores={cores!r}: {"empty" if not cores else bad} is not among '
            f'the cores this process may use, {allowed}; pass some of '
            'those, or None for all.')
    self._num_tasks = num_tasks
    self._log_dir = os.path.abspath(log_dir)
    self._cores = list(cores) if cores is not None else allowed
    self._timeout = start_timeout
    self._env = dict(env or {})
    self._grace_secs = grace_secs
    self._stop_signal = signal.SIGINT if grace_secs > 0 else signal.SIGTERM
    self._ports: List[int] = []
    self._procs: List[subprocess.Popen] = []
    self._running = False
    self._warned_unpinned = False

  @property
  def spec(self) -> str:
    """Cluster spec text, 'worker=127.0.0.1:P0,...'; '' before Start()."""
    return 'worker=' + ','.join(self.addresses) if self._ports else ''

  @property
  def addresses(self) -> List[str]:
    """'127.0.0.1:port' of each task."""
    return [f'127.0.0.1:{port}' for port in self._ports]

  @property
  def pids(self) -> List[int]:
    """Process id of each task's server (taskset execs into it)."""
    return [proc.pid for proc in self._procs]

  @property
  def log_paths(self) -> List[str]:
    return [os.path.join(self._log_dir, f'worker{task}.log')
            for task in range(self._num_tasks)]

  def Start(self) -> 'LocalWorkers':
    """Starts the servers on fresh ports and waits until all serve.

    Raises WorkersFailed (having stopped every server) if one exits first or
    they do not all serve within start_timeout.
    """
    if self._running:
      raise RuntimeError('These LocalWorkers are running; Stop() them before '
                         'starting them again.')
    os.makedirs(self._log_dir, exist_ok=True)
    self._ports = self._PickPorts()
    self._procs = []
    self._running = True
    atexit.register(self.Stop)
    try:
      for task in range(self._num_tasks):
        self._procs.append(self._Launch(task, 'w'))
      self._WaitServing(range(self._num_tasks))
    except BaseException:
      self.Stop()
      raise
    return self

  def Stop(self) -> None:
    """Stops and reaps every server: SIGTERM (SIGINT where they have a
    grace period), then SIGKILL. Idempotent."""
    atexit.unregister(self.Stop)
    self._running = False
    Terminate(self._procs, self._stop_signal)

  def Dead(self) -> List[Tuple[int, str, int]]:
    """(task, address, returncode) of each server that has exited.

    A negative returncode is the signal that ended it (-9: SIGKILL).
    """
    return [(task, self.addresses[task], proc.returncode)
            for task, proc in enumerate(self._procs)
            if proc.poll() is not None]

  def Restart(self, task: int) -> None:
    """Stops task `task` if it runs, starts it again on its port, waits.

    Its log file is appended to. If it does not serve again, it is stopped
    and WorkersFailed raised; the other tasks keep running.
    """
    if not self._running:
      raise RuntimeError('Start() the LocalWorkers before Restart(task).')
    if not 0 <= task < self._num_tasks:
      raise ValueError(f'Restart({task}): the tasks are 0 to '
                       f'{self._num_tasks - 1}.')
    Terminate([self._procs[task]], self._stop_signal)
    self._procs[task] = self._Launch(task, 'a')
    try:
      self._WaitServing([task])
    except BaseException:
      Terminate([self._procs[task]], self._stop_signal)
      raise

  def __enter__(self) -> 'LocalWorkers':
    return self.Start()

  def __exit__(self, *unused_exc_info) -> None:
    self.Stop()

  def _PickPorts(self) -> List[int]:
    """A port per task (tests override this and _ServerCommand, and
    lingvo_pipe.tools.memory_worker's MemoryWorkers _ServerCommand)."""
    return FreePorts(self._num_tasks)

  def _ServerCommand(self, task: int) -> List[str]:
    """The server of task `task`, without the pinning."""
    return [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
            f'--cluster_spec={self.spec}', f'--task_index={task}',
            f'--worker_grace_secs={self._grace_secs:g}']

  def _Launch(self, task: int, log_mode: str) -> subprocess.Popen:
    """Starts the server of `task`, pinned if taskset is there."""
    command = self._ServerCommand(task)
    taskset = shutil.which('taskset')
    if taskset:
      core = self._cores[task % len(self._cores)]
      command = [taskset, '-c', str(core)] + command
    elif not self._warned_unpinned:
      self._warned_unpinned = True
      logging.warning('taskset is not on PATH: the local worker servers run '
                      'unpinned, sharing all cores (install util-linux to '
                      'pin one core per task).')
    path = [_REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(
        os.pathsep) if p]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=os.pathsep.join(path), **self._env)
    with open(self.log_paths[task], log_mode, encoding='utf-8') as log:
      return subprocess.Popen(
          command, env=env, cwd=_REPO, stdin=subprocess.DEVNULL, stdout=log,
          stderr=subprocess.STDOUT, start_new_session=True,
          preexec_fn=DieWithParent())

  def _WaitServing(self, tasks: Iterable[int]) -> None:
    """Until each of `tasks` takes connections; else WorkersFailed."""
    waiting = list(tasks)
    deadline = time.monotonic() + self._timeout
    while True:
      for task in list(waiting):
        code = self._procs[task].poll()
        if code is not None:
          raise self._Failure(task, f'{_Exited(code)} before serving')
        if _PortOpen(self._ports[task]):
          waiting.remove(task)
      if not waiting:
        return
      if time.monotonic() > deadline:
        raise self._Failure(
            waiting[0], f'did not serve within {self._timeout:g} s (raise '
            'start_timeout if the machine is just slow)')
      time.sleep(_POLL_SECS)

  def _Failure(self, task: int, what: str) -> WorkersFailed:
    log = self.log_paths[task]
    return WorkersFailed(f'Worker task {task} ({self.addresses[task]}) {what}; '
                         f'see {log}: {_LastLine(log)}')


def _AllowedCores() -> List[int]:
  if hasattr(os, 'sched_getaffinity'):
    return sorted(os.sched_getaffinity(0))
  return list(range(os.cpu_count() or 1))


def FreePorts(num: int) -> List[int]:
  """`num` distinct TCP ports of 127.0.0.1 that were free a moment ago."""
  sockets = []
  try:
    for _ in range(num):
      sock = socket.socket()
      sockets.append(sock)
      sock.bind(('127.0.0.1', 0))
    return [sock.getsockname()[1] for sock in sockets]
  finally:
    for sock in sockets:
      sock.close()


def _PortOpen(port: int) -> bool:
  with socket.socket() as sock:
    sock.settimeout(0.5)
    return sock.connect_ex(('127.0.0.1', port)) == 0


def DieWithParent() -> Optional[Callable[[], None]]:
  """A preexec_fn: the kernel SIGKILLs the child when this process dies.

  Linux only (None elsewhere). libc's prctl is looked up here, in the
  parent, so the forked child only calls it. If the parent died between
  the fork and the prctl, the child exits at once.
  """
  if not sys.platform.startswith('linux'):
    return None
  prctl = ctypes.CDLL(None, use_errno=True).prctl
  prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
  prctl.restype = ctypes.c_int
  parent = os.getpid()

  def _InChild() -> None:
    if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')
    if os.getppid() != parent:
      os._exit(1)

  return _InChild


def Terminate(procs: List[subprocess.Popen],
              first: int = signal.SIGTERM) -> None:
  """`first` to each live one's process group, SIGKILL after 5 s; reaps."""
  live = [proc for proc in procs if proc.poll() is None]
  for proc in live:
    _SignalGroup(proc, first)
  deadline = time.monotonic() + _STOP_GRACE_SECS
  try:
    for proc in live:
      try:
        proc.wait(max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
  finally:
    for proc in procs:
      if proc.poll() is None:
        _SignalGroup(proc, signal.SIGKILL)
      proc.wait()


def _SignalGroup(proc: subprocess.Popen, sig: int) -> None:
  """Signals the process group the server leads (its own session).

  Only called while `proc` is unreaped, so its pid cannot be reused. If
  there is no such group (the server moved itself to another), signals the
  server alone.
  """
  try:
    os.killpg(proc.pid, sig)
  except ProcessLookupError:
    proc.send_signal(sig)


def _Exited(code: int) -> str:
  if code < 0:
    try:
      return f'was killed by {signal.Signals(-code).name}'
    except ValueError:
      return f'was killed by signal {-code}'
  return f'exited with code {code}'


def _LastLine(path: str) -> str:
  """The last non-empty line of the file (of its last 8 KiB), shortened."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 8192))
      text = f.read().decode('utf-8', errors='replace')
  except OSError as err:
    return f'(cannot read the log: {err.strerror})'
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if not lines:
    return '(the log is empty)'
  return lines[-1] if len(lines[-1]) <= 300 else lines[-1][:297] + '...'
