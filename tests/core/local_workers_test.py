"""LocalWorkers: real servers start pinned and serve; every way out stops them.

Connecting to a cluster changes the whole process, so the client, and the
parents whose deaths are tested, are subprocesses; this process starts
servers and reads /proc only. Fake servers (a few lines of Python that
listen, fail or hang) test the failure paths in a fraction of a second.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import local_workers

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(local_workers.__file__))))


def _NotePath(address):
  """Where a server started by the trainer notes its spec (cluster.py)."""
  return os.path.join(tempfile.gettempdir(),
                      f'lingvo_pipe_worker_{address.rsplit(":", 1)[1]}.json')


# Runs one op on each task; prints the task's device and where y lives.
_CLIENT = '''
import sys
import tensorflow as tf
from lingvo_pipe.core import cluster
for task, name in enumerate(cluster.Connect(
    cluster.ParseClusterSpec(sys.argv[1]))):
  with tf.device(name):
    y = tf.constant(float(task)) + 10.0
  print('ran', name, y.device, float(y), flush=True)
'''

# Starts two real servers, prints their pids, waits for a line on stdin,
# then raises (argv[2] == 'exception'); a signal may come first.
_PARENT = '''
import sys
from lingvo_pipe.core import local_workers
with local_workers.LocalWorkers(2, sys.argv[1]) as workers:
  print('pids', *workers.pids, flush=True)
  sys.stdin.readline()
  if sys.argv[2] == 'exception':
    raise ValueError('boom')
'''

# Starts one fake server and exits without Stop(): atexit must stop it.
_ATEXIT_PARENT = '''
import sys
from lingvo_pipe.core import local_workers
class Fake(local_workers.LocalWorkers):
  def _ServerCommand(self, task):
    return [sys.executable, '-c', sys.argv[2],
            self.addresses[task].rsplit(':', 1)[1]]
workers = Fake(1, sys.argv[1]).Start()
print('pids', *workers.pids, flush=True)
'''

# Fake servers, run as `python -c CODE port`.
_FAKE = {
    # Listens on its port; says so in its log when SIGTERM stops it.
    'serve': textwrap.dedent('''
        import signal, socket, sys, time
        def Term(*unused):
          print('got SIGTERM', flush=True)
          sys.exit(0)
        signal.signal(signal.SIGTERM, Term)
        s = socket.socket()
        s.bind(('127.0.0.1', int(sys.argv[1])))
        s.listen()
        time.sleep(600)
        '''),
    'fail': ('import sys; print("error: no flag --frobnicate", flush=True); '
             'print(flush=True); sys.exit(3)'),
    'hang': 'import time; print("still loading", flush=True); time.sleep(600)',
}


class _FakeWorkers(local_workers.LocalWorkers):
  """Task i runs the fake server kinds[i]."""

  def __init__(self, kinds, log_dir, **kwargs):
    super().__init__(len(kinds), log_dir, **kwargs)
    self._kinds = kinds

  def _ServerCommand(self, task):
    return [sys.executable, '-c', _FAKE[self._kinds[task]],
            self.addresses[task].rsplit(':', 1)[1]]


class _OnPorts(local_workers.LocalWorkers):
  """Real servers on the given ports."""

  def __init__(self, ports, log_dir, **kwargs):
    super().__init__(len(ports), log_dir, **kwargs)
    self._given_ports = ports

  def _PickPorts(self):
    return list(self._given_ports)


def _Status(pid, field):
  """A field of /proc/<pid>/status, or None if there is no such process."""
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return line.split(':', 1)[1].strip()
  except FileNotFoundError:
    return None
  raise AssertionError(f'/proc/{pid}/status has no {field}')


def _Running(pid):
  state = _Status(pid, 'State')
  return state is not None and not state.startswith(('Z', 'X'))


def _Gone(pid, zombie_ok=False):
  """No such process; with zombie_ok, also a dead one nobody reaped yet.

  A server whose parent was SIGKILLed is reaped by init, which in a
  container may never do it; it is dead all the same.
  """
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  return zombie_ok and not _Running(pid)


def _WaitGone(pids, zombie_ok=False, timeout=10.0):
  """The pids still there after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while True:
    left = [pid for pid in pids if not _Gone(pid, zombie_ok)]
    if not left or time.monotonic() > deadline:
      return left
    time.sleep(0.1)


def _PortOpen(address):
  host, port = address.rsplit(':', 1)
  with socket.socket() as s:
    s.settimeout(1.0)
    return s.connect_ex((host, int(port))) == 0


def _Read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _Kill(proc):
  if proc.poll() is None:
    proc.kill()
  proc.wait()


class LocalWorkersTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self._log_dir = self.create_tempdir().full_path
    self._env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
                     PYTHONPATH=os.pathsep.join(
                         [_REPO, os.environ.get('PYTHONPATH', '')]))
    self._cores = sorted(os.sched_getaffinity(0))

  def _PinnedTo(self, task):
    """The cores task's server may run on: its own (task mod the cores
    this process may use) where taskset is on PATH, else all of those."""
    if shutil.which('taskset'):
      return {self._cores[task % len(self._cores)]}
    return set(self._cores)

  def _Workers(self, cls, *args, **kwargs):
    workers = cls(*args, **kwargs)
    self.addCleanup(workers.Stop)
    return workers

  def testStartPinsServesAndStops(self):
    workers = self._Workers(local_workers.LocalWorkers, 2, self._log_dir)
    workers.Start()
    self.assertRegex(workers.spec,
                     r'^worker=127\.0\.0\.1:\d+,127\.0\.0\.1:\d+$')
    self.assertEqual(workers.spec, 'worker=' + ','.join(workers.addresses))
    self.assertLen(set(workers.addresses), 2)
    pids = workers.pids
    for task, pid in enumerate(pids):
      self.assertTrue(_PortOpen(workers.addresses[task]))
      self.assertTrue(_Running(pid))
      self.assertEqual(os.getsid(pid), pid)  # its own session
      log = os.path.join(self._log_dir, f'worker{task}.log')
      self.assertEqual(workers.log_paths[task], log)
      self.assertIn(f'Serving worker task {task}', _Read(log))
      self.assertEqual(os.sched_getaffinity(pid), self._PinnedTo(task))
    client = subprocess.run(
        [sys.executable, '-c', _CLIENT, workers.spec], env=self._env,
        capture_output=True, text=True, timeout=120)
    self.assertEqual(client.returncode, 0, client.stderr[-2000:])
    ran = [line.split()[1:] for line in client.stdout.splitlines()
           if line.startswith('ran ')]
    self.assertEqual(ran, [[f'/job:worker/replica:0/task:{t}/device:CPU:0'] * 2
                           + [f'{10.0 + t}'] for t in (0, 1)])
    self.assertEqual(workers.Dead(), [])
    notes = [_NotePath(a) for a in workers.addresses]
    for task, note in enumerate(notes):
      with open(note, encoding='utf-8') as f:
        self.assertEqual(json.load(f)['task'], task)
    workers.Stop()
    self.assertEqual(_WaitGone(pids, timeout=0), [])
    self.assertFalse(any(os.path.exists(n) for n in notes))
    self.assertFalse(any(_PortOpen(a) for a in workers.addresses))
    workers.Stop()  # idempotent
    self.assertEqual([code for _, _, code in workers.Dead()],
                     [-signal.SIGTERM] * 2)

  def testDeadNamesAKilledServerAndRestartServesAgain(self):
    workers = self._Workers(local_workers.LocalWorkers, 2, self._log_dir)
    workers.Start()
    old_pid, address = workers.pids[1], workers.addresses[1]
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not workers.Dead() and time.monotonic() < deadline:
      time.sleep(0.05)
    self.assertEqual(workers.Dead(), [(1, address, -signal.SIGKILL)])
    workers.Restart(1)
    self.assertEqual(workers.Dead(), [])
    self.assertNotEqual(workers.pids[1], old_pid)
    self.assertEqual(workers.addresses[1], address)
    self.assertTrue(_PortOpen(address))
    self.assertEqual(_Read(workers.log_paths[1]).count(
        'Serving worker task 1'), 2)  # appended to
    self.assertEqual(os.sched_getaffinity(workers.pids[1]),
                     self._PinnedTo(1))

  @parameterized.parameters('exception', 'sigint', 'sigkill')
  def testServersDieWithTheirParent(self, how):
    parent = subprocess.Popen(
        [sys.executable, '-c', _PARENT, self._log_dir, how], env=self._env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    self.addCleanup(_Kill, parent)
    line = parent.stdout.readline().split()
    self.assertEqual(line[:1], ['pids'], parent.stderr.read()
                     if not line else line)
    pids = [int(pid) for pid in line[1:]]
    self.assertLen(pids, 2)
    self.assertTrue(all(_Running(pid) for pid in pids))
    if how == 'exception':
      parent.stdin.write('\n')
      parent.stdin.flush()
    elif how == 'sigint':  # as a terminal's Ctrl-C: to the process group
      os.killpg(parent.pid, signal.SIGINT)
    else:
      parent.kill()
    _, err = parent.communicate(timeout=30)
    expected = {'exception': (1, 'ValueError: boom'),
                'sigint': (-signal.SIGINT, 'KeyboardInterrupt'),
                'sigkill': (-signal.SIGKILL, '')}[how]
    self.assertEqual(parent.returncode, expected[0], err[-2000:])
    self.assertIn(expected[1], err)
    # Stopped and reaped by the parent, or killed by the kernel (SIGKILL).
    self.assertEqual(_WaitGone(pids, zombie_ok=how == 'sigkill'), [])

  def testAtExitStopsServersNotStopped(self):
    parent = subprocess.run(
        [sys.executable, '-c', _ATEXIT_PARENT, self._log_dir, _FAKE['serve']],
        env=self._env, capture_output=True, text=True, timeout=60)
    self.assertEqual(parent.returncode, 0, parent.stderr[-2000:])
    pid = int(parent.stdout.split()[1])
    self.assertTrue(_Gone(pid))
    # SIGTERM from Stop(), not the SIGKILL of the parent-death signal.
    self.assertIn('got SIGTERM',
                  _Read(os.path.join(self._log_dir, 'worker0.log')))

  def testEarlyExitNamesTheTaskAndStopsTheOthers(self):
    workers = self._Workers(_FakeWorkers, ['hang', 'fail'], self._log_dir)
    with self.assertRaises(local_workers.WorkersFailed) as caught:
      workers.Start()
    message = str(caught.exception)
    self.assertIsInstance(caught.exception, RuntimeError)
    self.assertRegex(
        message, r'^Worker task 1 \(127\.0\.0\.1:\d+\) exited with code 3 '
        r'before serving; see (.*)/worker1\.log: error: no flag --frobnicate$')
    self.assertIn(workers.addresses[1], message)
    self.assertIn(workers.log_paths[1], message)
    self.assertNotIn('\n', message)
    self.assertTrue(all(_Gone(pid) for pid in workers.pids))
    self.assertEqual([task for task, _, _ in workers.Dead()], [0, 1])

  def testTimeoutNamesTheTask(self):
    workers = self._Workers(_FakeWorkers, ['serve', 'hang'], self._log_dir,
                            start_timeout=1.0)
    start = time.monotonic()
    with self.assertRaises(local_workers.WorkersFailed) as caught:
      workers.Start()
    self.assertBetween(time.monotonic() - start, 1.0, 10.0)
    self.assertRegex(
        str(caught.exception), r'^Worker task 1 \(127\.0\.0\.1:\d+\) did not '
        r'serve within 1 s \(raise start_timeout .*\); see .*/worker1\.log: '
        r'still loading$')
    self.assertTrue(all(_Gone(pid) for pid in workers.pids))
    self.assertIn('got SIGTERM', _Read(workers.log_paths[0]))

  def testCtrlCStopsAServerStartedByHand(self):
    port = local_workers.FreePorts(1)[0]
    server = subprocess.Popen(
        [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
         f'--cluster_spec=worker=127.0.0.1:{port}', '--task_index=0'],
        env=self._env, cwd=_REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    self.addCleanup(server.wait)
    self.addCleanup(server.kill)
    note = _NotePath(f'127.0.0.1:{port}')
    deadline = time.monotonic() + 60
    while not os.path.exists(note):
      self.assertIsNone(server.poll())
      self.assertLess(time.monotonic(), deadline)
      time.sleep(0.1)
    server.send_signal(signal.SIGINT)
    self.assertEqual(server.wait(timeout=30), -signal.SIGINT)
    self.assertFalse(os.path.exists(note))

  def testRealServerOnATakenPort(self):
    with socket.socket() as taken:
      taken.bind(('127.0.0.1', 0))
      port = taken.getsockname()[1]
      workers = self._Workers(_OnPorts, [port], self._log_dir)
      with self.assertRaises(local_workers.WorkersFailed) as caught:
        workers.Start()
    self.assertRegex(
        str(caught.exception), rf'^Worker task 0 \(127\.0\.0\.1:{port}\) '
        r'exited with code 1 before serving; see .*/worker0\.log: '
        r'.*Could not start gRPC server')

  def testRoundRobinOverTheGivenCores(self):
    if not shutil.which('taskset'):
      self.skipTest('needs taskset')
    core = self._cores[-1]
    workers = self._Workers(_FakeWorkers, ['serve'] * 3, self._log_dir,
                            cores=[core])
    workers.Start()
    self.assertEqual([_Status(pid, 'Cpus_allowed_list')
                      for pid in workers.pids], [str(core)] * 3)

  def testWithoutTasksetWarnsOnceAndRunsUnpinned(self):
    empty = self.create_tempdir().full_path
    workers = self._Workers(_FakeWorkers, ['serve'] * 2, self._log_dir)
    with mock.patch.dict(os.environ, {'PATH': empty}):
      with self.assertLogs('absl', 'WARNING') as logs:
        workers.Start()
    self.assertLen([r for r in logs.output if 'taskset' in r], 1)
    mine = _Status('self', 'Cpus_allowed_list')
    self.assertEqual([_Status(pid, 'Cpus_allowed_list')
                      for pid in workers.pids], [mine] * 2)

  def testServersGetTheGivenEnvironment(self):
    workers = self._Workers(_FakeWorkers, ['serve'], self._log_dir,
                            env={'LP_WORKER_TEST': 'given'})
    workers.Start()
    with open(f'/proc/{workers.pids[0]}/environ', 'rb') as f:
      environ = f.read().split(b'\0')
    self.assertIn(b'LP_WORKER_TEST=given', environ)
    self.assertNotIn('LP_WORKER_TEST', os.environ)

  def testChecksItsArguments(self):
    with self.assertRaisesRegex(ValueError, 'num_tasks >= 1, got 0'):
      local_workers.LocalWorkers(0, self._log_dir)
    with self.assertRaisesRegex(ValueError,
                                r'\[100000\] is not among the cores'):
      local_workers.LocalWorkers(2, self._log_dir, cores=[100000])
    with self.assertRaisesRegex(ValueError, 'empty is not among the cores'):
      local_workers.LocalWorkers(2, self._log_dir, cores=[])
    with self.assertRaisesRegex(ValueError, 'start_timeout must be positive'):
      local_workers.LocalWorkers(2, self._log_dir, start_timeout=0)
    workers = self._Workers(_FakeWorkers, ['serve'], self._log_dir)
    with self.assertRaisesRegex(RuntimeError, r'Start\(\) the LocalWorkers'):
      workers.Restart(0)
    workers.Start()
    with self.assertRaisesRegex(RuntimeError, 'Stop'):
      workers.Start()
    with self.assertRaisesRegex(ValueError, 'tasks are 0 to 0'):
      workers.Restart(1)


if __name__ == '__main__':
  absltest.main()
