"""Pipelines across machines: TensorFlow's own gRPC servers, no home-made RPC.

Each worker runs a `tf.distribute.Server` (`python -m lingvo_pipe.trainer
--job=server --cluster_spec=... --task_index=i`); the trainer connects to
the cluster, and partition k of every PipeliningLayer that names no devices
runs on worker task k:

  trainer (client) --gRPC--> worker task 0: partition 0 variables and ops
                   --gRPC--> worker task 1: partition 1 ...

TensorFlow's runtime moves the activations between tasks (Send/Recv).
With R data-parallel replicas, replica r's partition k runs on task
r * K + k (`base_model.PlacePipelines` sets each pipeline's devices).

Failures (measured on loopback, docs/DESIGN.md section 10): by default
TensorFlow waits without limit for a task that is not up, and for one
that stops answering. So `Connect` first waits, bounded, until every
task answers a gRPC handshake and names the ones that do not, and sets
GRPC_FAIL_FAST so that a task that goes away fails the call in
milliseconds instead of hanging; `Watchdog` probes every task during
training and ends the process if one stops answering. A server started
for another cluster spec would silently serve ours (the client's spec
replaces the server's): `StartServer` leaves a note of its spec on its
host, which `Connect` reads through the task itself and compares.

A worker needs at least two inter-op threads for the partitions to overlap:
with one (a server pinned to one core gets one by default) its executor
runs a partition's micro-batches back to back on that thread and the
sends of finished micro-batches wait until the last one is done, so the
workers take turns (docs/DESIGN.md section 13). `StartServer` sees to it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import devices
from lingvo_pipe.core import quiet
from lingvo_pipe.core import stage_function

# What TensorFlow reads for its default inter-op thread count.
_INTER_OP_ENV = 'TF_NUM_INTEROP_THREADS'
# gRPC: fail a call at once when its channel is down instead of waiting.
_FAIL_FAST_ENV = 'GRPC_FAIL_FAST'
_TASK_RE = re.compile(r'/job:(\w+)/replica:\d+/task:(\d+)')


class ClusterError(RuntimeError):
  """The cluster cannot run the model; one line says which task and why."""


def ParseClusterSpec(text: str) -> tf.train.ClusterSpec:
  """'worker=host:port,host:port;ps=host:port' -> ClusterSpec."""
  jobs = {}
  for part in text.split(';'):
    part = part.strip()
    if not part:
      continue
    name, sep, addresses = part.partition('=')
    hosts = [a.strip() for a in addresses.split(',') if a.strip()]
    if not sep or not name.strip() or not hosts:
      raise ValueError(
          f'Bad cluster spec part {part!r}; write job=host:port[,host:port]'
          "[;job2=...], e.g. 'worker=localhost:2222,localhost:2223'.")
    jobs[name.strip()] = hosts
  if not jobs:
    raise ValueError('The cluster spec is empty; write e.g. '
                     "'worker=localhost:2222,localhost:2223'.")
  return tf.train.ClusterSpec(jobs)


def StartServer(spec: tf.train.ClusterSpec, job: str,
                task_index: int) -> tf.distribute.Server:
  """Starts this process's server for task `task_index` of `job`."""
  if job not in spec.jobs or task_index >= spec.num_tasks(job):
    raise ValueError(
        f'Task {task_index} of job {job!r} is not in the cluster spec '
        f'{spec.as_dict()}; fix --task_index or --cluster_spec.')
  EnsureInterOpThreads()
  server = tf.distribute.Server(spec, job_name=job, task_index=task_index,
                                start=True)
  address = spec.task_address(job, task_index)
  with open(_NotePath(address), 'w', encoding='utf-8') as f:
    json.dump(_Note(spec, job, task_index), f)
  return server


def Serve(spec: tf.train.ClusterSpec, job: str, task_index: int,
          own_files: Sequence[str] = (), grace_secs: float = 0.0) -> None:
  """Starts the server, then serves until SIGTERM or SIGINT (Ctrl-C).

  SIGINT, or SIGTERM with no `grace_secs`: it deletes its note (and
  `own_files`, files that a caller keeps for this server on its host, e.g.
  the memory report of lingvo_pipe.tools.memory_worker) and ends by that
  signal (exit status 128 + signal, as if it had not been caught). A
  server blocked in `join()` would never see Ctrl-C and would leave its
  note behind.

  SIGTERM with `grace_secs` (what a scheduler sends some time before it
  kills the process): it writes its stopping note (StoppingNote) and
  serves on while a trainer holds it (Hold, within CLAIM_SECS: its
  watchdog reads the note every 2 s) for `grace_secs` at most, or until
  that trainer has written its checkpoint and released it (Release); then
  it ends as above. No trainer holding it: it ends after CLAIM_SECS. A
  second SIGTERM or a SIGINT ends it at once.
  """
  address = spec.task_address(job, task_index)
  stopping, held, released = (ServerFilePath(address, s)
                              for s in (_STOPPING, _HELD, _RELEASED))
  paths = [_NotePath(address), stopping, held, released] + list(own_files)
  deadline = [None, None]  # the grace's end, the claim's end

  def Stop(signum, unused_frame):
    if signum == signal.SIGTERM and grace_secs > 0 and deadline[0] is None:
      now = time.monotonic()
      deadline[:] = [now + grace_secs, now + min(grace_secs, CLAIM_SECS)]
      with open(stopping, 'w', encoding='utf-8') as f:
        json.dump({'grace_secs': grace_secs}, f)
      return
    for path in paths:
      _Remove(path)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)

  # Before StartServer writes the note: a signal between the two left the
  # note behind (Python's own SIGINT handler knows nothing of it).
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, Stop)
  for path in paths[1:4]:  # a stopped server's notes, were it SIGKILLed
    _Remove(path)
  StartServer(spec, job, task_index)
  # Short sleeps: the kernel may hand a signal to any of TF's threads, and
  # then Python runs the handler only when the main thread next wakes (seen:
  # SIGUSR1 unanswered for the whole of a one-hour sleep, 1 in 6 times).
  while True:
    time.sleep(0.2)
    now = time.monotonic()
    if deadline[0] is not None and (
        now > deadline[0] or os.path.exists(released) or
        (now > deadline[1] and not os.path.exists(held))):
      Stop(signal.SIGTERM, None)


def _Remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def ServerFilePath(address: str, suffix: str) -> str:
  """/tmp/lingvo_pipe_worker_<port><suffix>: a file the server at
  host:port keeps on its own host (its note; a tool's, e.g. a memory
  report)."""
  port = address.rsplit(':', 1)[-1]
  return os.path.join(tempfile.gettempdir(),
                      f'lingvo_pipe_worker_{port}{suffix}')


def _NotePath(address: str) -> str:
  """Where a server notes its cluster spec, on its own host."""
  return ServerFilePath(address, '.json')


def _Note(spec: tf.train.ClusterSpec, job: str, task: int) -> dict:
  return {'cluster': spec.as_dict(), 'job': job, 'task': task}


# A server told to stop (SIGTERM, Serve's grace) notes it on its host; the
# trainer reads the note through the task itself, as _CheckSameCluster
# reads its spec, and writes the release there once its checkpoint is out.
_STOPPING, _HELD, _RELEASED = '.stopping', '.held', '.released'
# How long a stopping server waits for a trainer to hold it: 2.5 watchdog
# intervals.
CLAIM_SECS = 5.0


def StoppingNote(device: str, address: str) -> Optional[dict]:
  """The stopping note of the server at `address` ({"grace_secs": s}),
  read on its `device`; None while it is not stopping."""
  # No op that fails while it is not there: the error of a remote op would
  # surface in whichever thread next waits on the eager executor (seen: the
  # training loop's next batch, NotFoundError).
  path = ServerFilePath(address, _STOPPING)
  with tf.device(device):
    if not tf.io.matching_files(path).numpy().size:
      return None
    text = tf.io.read_file(path).numpy()
  return json.loads(text)


def Hold(device: str, address: str) -> None:
  """Keeps a stopping server for its grace: a trainer needs it."""
  with tf.device(device):
    tf.io.write_file(ServerFilePath(address, _HELD), '')


def Release(device: str, address: str) -> None:
  """Lets a stopping server end now: the trainer needs it no more."""
  with tf.device(device):
    tf.io.write_file(ServerFilePath(address, _RELEASED), '')


def EnsureInterOpThreads(minimum: int = 2) -> int:
  """Gives this process's TF servers at least `minimum` inter-op threads.

  A worker's executors take their thread count from the client's config,
  where 0 (the default) means the worker's own default: its number of
  cores, so 1 for a server pinned to one core. This sets that default
  (TF_NUM_INTEROP_THREADS, read when the server starts) to `minimum` when
  the process may use fewer cores and the user has not set it. Returns
  the count the server will use by default.
  """
  if os.environ.get(_INTER_OP_ENV):
    return int(os.environ[_INTER_OP_ENV])
  cores = devices.NumCores()
  if cores < minimum:
    os.environ[_INTER_OP_ENV] = str(minimum)
    return minimum
  return cores


def Probe(address: str, timeout: float = 2.0) -> Optional[str]:
  """None if a gRPC server answers at host:port, else why not (a phrase).

  A TCP connection alone is not enough: a frozen process's port still
  accepts one, but no gRPC handshake follows.
  """
  import grpc  # pylint: disable=g-import-not-at-top  (TensorFlow's own dep)
  host, _, port = address.rpartition(':')
  try:
    socket.create_connection((host, int(port)), timeout=timeout).close()
  except OSError as err:
    return f'no connection: {err.strerror or err}'
  channel = grpc.insecure_channel(address)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout)
  except grpc.FutureTimeoutError:
    return f'no gRPC answer within {timeout:.0f} s'
  finally:
    channel.close()
  return None


def WaitForTasks(spec: tf.train.ClusterSpec, job: str,
                 timeout_secs: float) -> None:
  """Returns once every task of `job` answers; ClusterError at the deadline."""
  deadline = time.monotonic() + timeout_secs
  pending = {t: spec.task_address(job, t) for t in range(spec.num_tasks(job))}
  while True:
    why = {}
    for task, address in list(pending.items()):
      left = max(0.1, deadline - time.monotonic())
      why[task] = Probe(address, min(2.0, left))
      if why[task] is None:
        del pending[task]
    if not pending:
      return
    if time.monotonic() >= deadline:
      first = min(pending)
      more = (f' (and {len(pending) - 1} more task(s): '
              f'{sorted(pending)[1:]})' if len(pending) > 1 else '')
      raise ClusterError(
          f'Worker task {first} at {pending[first]} is unreachable after '
          f'{timeout_secs:.0f} s ({why[first]}){more}; start its server '
          f'(python -m lingvo_pipe.trainer --job=server --cluster_spec=... '
          f'--task_index={first}) or fix --cluster_spec.')
    time.sleep(0.5)


def Connect(spec: tf.train.ClusterSpec, job: str = 'worker',
            timeout_secs: Optional[float] = None) -> List[str]:
  """Connects this client; returns one device per task of `job`.

  The device of a task is its first GPU if it has one, else its first CPU.
  With `timeout_secs`, first waits that long at most for every task to
  answer (ClusterError naming the first that does not). Either way a
  task that goes away later fails the call that needs it at once
  (GRPC_FAIL_FAST), and a server started for another cluster spec is a
  ClusterError.
  """
  if job not in spec.jobs:
    raise ValueError(f'The cluster spec {spec.as_dict()} has no job {job!r}.')
  os.environ.setdefault(_FAIL_FAST_ENV, 'true')
  if timeout_secs is not None:
    WaitForTasks(spec, job, timeout_secs)
  stage_function.ShareCallBodies()  # before connecting: workers get it too
  tf.config.experimental_connect_to_cluster(spec)
  remote = [tf.DeviceSpec.from_string(d.name)
            for d in tf.config.list_logical_devices()]
  found = []
  for task in range(spec.num_tasks(job)):
    mine = [d for d in remote if d.job == job and d.task == task]
    for kind in ('GPU', 'CPU'):
      hits = sorted((d for d in mine if d.device_type == kind),
                    key=lambda d: d.device_index)
      if hits:
        found.append(hits[0].to_string())
        break
    else:
      raise RuntimeError(
          f'Task {task} of job {job!r} shows no devices; is its server '
          'running?')
  _CheckSameCluster(spec, job, found)
  return found


def _CheckSameCluster(spec: tf.train.ClusterSpec, job: str,
                      devices_of_tasks: List[str]) -> None:
  """ClusterError if a task's server noted another spec or task index.

  The note is read by the task itself (tf.io.read_file placed on it), so
  on its own host; a server without a note (not started by StartServer)
  is not checked.
  """
  for task, device in enumerate(devices_of_tasks):
    address = spec.task_address(job, task)
    try:
      with tf.device(device):
        text = tf.io.read_file(_NotePath(address)).numpy()
    except tf.errors.NotFoundError:
      continue
    note = json.loads(text)
    if note != _Note(spec, job, task):
      raise ClusterError(
          f'Worker task {task} at {address} serves another cluster (started '
          f"as task {note['task']} of {note['cluster']}, not task {task} of "
          f'{spec.as_dict()}); restart it with this --cluster_spec and '
          f'--task_index={task}, or fix --cluster_spec.')


def FailedTask(err: BaseException, spec: tf.train.ClusterSpec,
               job: str = 'worker') -> Optional[Tuple[int, str]]:
  """(task, address) of the worker a runtime error came from, or None.

  The task an UnavailableError or AbortedError names, else the first task
  that does not answer now, whatever the error's type: a worker that died
  mid-step shows as Unavailable, Aborted or Cancelled (a collective cancels
  its receives when a peer goes), depending on which op saw it first.
  """
  if not isinstance(err, tf.errors.OpError):
    return None
  if isinstance(err, (tf.errors.UnavailableError, tf.errors.AbortedError)):
    for name, task in _TASK_RE.findall(str(err)):
      if name == job and int(task) < spec.num_tasks(job):
        return int(task), spec.task_address(job, int(task))
  for task in range(spec.num_tasks(job)):
    address = spec.task_address(job, task)
    if Probe(address, 1.0) is not None:
      return task, address
  return None


class Watchdog:
  """Ends this process if a worker stops answering during training.

  A worker killed outright fails the running call at once (GRPC_FAIL_FAST),
  but a frozen one (a hung host, a partition) leaves it waiting forever.
  A daemon thread probes every task each `interval` s; after `failures`
  failed probes in a row of one task it records it in `dead`, gives the
  main thread `grace` s to stop on its own (the trainer's error then names
  the task), and otherwise prints `message(task, address, why)` (unless
  '') and exits the process with `status` (checkpoints already written
  stay).
  """

  def __init__(self, spec: tf.train.ClusterSpec, message: Any,
               job: str = 'worker', interval: float = 2.0,
               failures: int = 3, grace: float = 10.0, status: int = 1,
               devices: Optional[Sequence[str]] = None,
               on_stopping: Any = None):
    self._addresses = [spec.task_address(job, t)
                       for t in range(spec.num_tasks(job))]
    # With `devices` (one per task), each probe also reads the task's
    # stopping note (Serve's grace) and calls on_stopping(task, address,
    # note) once per task that has one; `stopping` keeps the notes.
    self._devices, self._on_stopping = devices, on_stopping
    self.stopping: Dict[int, dict] = {}
    self._message, self._status = message, status
    self._interval, self._failures, self._grace = interval, failures, grace
    self._stop = threading.Event()
    self.dead: Optional[Tuple[int, str, str]] = None
    self._thread = threading.Thread(target=self._Run, daemon=True,
                                    name='lingvo_pipe_watchdog')

  def Start(self) -> 'Watchdog':
    self._thread.start()
    return self

  def Stop(self) -> None:
    self._stop.set()

  def _Run(self) -> None:
    misses = [0] * len(self._addresses)
    while not self._stop.wait(self._interval):
      for task, address in enumerate(self._addresses):
        why = Probe(address, self._interval)
        misses[task] = 0 if why is None else misses[task] + 1
        if why is None and self._devices and task not in self.stopping:
          self._ReadStopping(task, address, notify=True)
        if misses[task] >= self._failures:
          self.dead = (task, address, why)
          if self._stop.wait(self._grace):
            return
          line = self._message(task, address, why)
          if line:
            quiet.WriteToConsole(line + '\n')
          os._exit(self._status)  # pylint: disable=protected-access

  def _ReadStopping(self, task: int, address: str, notify: bool) -> None:
    """Holds task `task` if it is stopping; then on_stopping if `notify`."""
    try:
      note = StoppingNote(self._devices[task], address)
    except (tf.errors.OpError, ValueError):
      return  # gone or going: the probes and the step say so
    if note is not None:
      try:
        Hold(self._devices[task], address)
      except tf.errors.OpError:
        return
      self.stopping[task] = note
      if notify and self._on_stopping:
        self._on_stopping(task, address, note)

  def ReleaseStopping(self) -> None:
    """Lets every stopping task end now (its grace is no longer needed),
    also those told to stop since the last probe (a scheduler stopping the
    whole job signals every task at once)."""
    for task, address in enumerate(self._addresses):
      if task not in self.stopping and self._devices:
        self._ReadStopping(task, address, notify=False)
    for task in list(self.stopping):
      try:
        Release(self._devices[task], self._addresses[task])
      except tf.errors.OpError:
        pass  # already gone
