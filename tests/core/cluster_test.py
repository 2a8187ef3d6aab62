"""A pipeline whose partitions live on two tf.distribute.Server processes.

Two servers and a client run as subprocesses on 127.0.0.1 (connecting to a
cluster changes the whole process, so the test process stays out of it).
The client checks that each partition's variables live on its worker task
and that every gradient equals the local unpipelined reference.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent import futures

from absl.testing import absltest
import grpc
import tensorflow as tf

from lingvo_pipe.core import cluster
from lingvo_pipe.core import devices
from lingvo_pipe.core import local_workers

# Reads a server's stopping note before and after SIGTERM, then releases
# it (what the trainer's watchdog does).
_RELEASE_CLIENT = '''
import os, signal, sys, time
from lingvo_pipe.core import cluster
spec = cluster.ParseClusterSpec(sys.argv[1])
device = cluster.Connect(spec)[0]
address = spec.task_address('worker', 0)
print(cluster.StoppingNote(device, address))
os.kill(int(sys.argv[2]), signal.SIGTERM)
while cluster.StoppingNote(device, address) is None:
  time.sleep(0.05)
print(cluster.StoppingNote(device, address))
cluster.Hold(device, address)
time.sleep(cluster.CLAIM_SECS + 1)
print('held')
cluster.Release(device, address)
'''

_CLIENT = '''
import sys
import tensorflow as tf
from lingvo_pipe.core import base_model, cluster, gpipe, layers
spec = cluster.ParseClusterSpec(sys.argv[1])
names = cluster.Connect(spec)
print('devices', names)
def Blocks():
  return [layers.ProjectionLayer.Params().Set(
      name=f'l{i}', input_dim=3, output_dim=3, activation='TANH',
      dtype=tf.float64) for i in range(4)]
cells = [layers.SequentialLayer.Params().Set(sub=Blocks()[:2]),
         layers.SequentialLayer.Params().Set(sub=Blocks()[2:])]
pipe_p = gpipe.PipeliningLayer.Params().Set(
    name='m', cell_tpl=cells, num_micro_batches=2, dtype=tf.float64)
assert base_model.PlacePipelines(pipe_p, names) == 1
pipe = pipe_p.Instantiate()
for k, cell in enumerate(pipe.cells):
  for v in cell.vars.Flatten():
    assert tf.DeviceSpec.from_string(v.device).task == k, v.device
    assert tf.DeviceSpec.from_string(v.device).job == 'worker', v.device
with tf.device('/job:localhost/replica:0/task:0/device:CPU:0'):
  ref = layers.SequentialLayer.Params().Set(
      name='m', sub=Blocks(), dtype=tf.float64).Instantiate()
x = tf.random.stateless_normal([4, 3], [1, 2], dtype=tf.float64)
def Grads(layer):
  @tf.function(autograph=False)
  def Step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer.FPropDefaultTheta(x) ** 2)
    return loss, tape.gradient(loss, layer.vars.Flatten())
  return Step()
loss, grads = Grads(pipe)
ref_loss, ref_grads = Grads(ref)
worst = max(float(tf.reduce_max(tf.abs(a - b)))
            for a, b in zip(grads, ref_grads))
print('loss', float(loss), float(ref_loss), 'worst', worst, flush=True)
assert abs(float(loss) - float(ref_loss)) < 1e-12
assert worst < 1e-12
print('ok', flush=True)
'''


# Forward of a 2-partition pipeline (20 x tanh(x @ w), 512 wide, per
# partition; 8 micro-batches) with both partitions on task 0 ('pipe1') and
# on tasks 0 and 1 ('pipe2'); as a control, the same two cells run as two
# independent computations, no data between them ('ind1', 'ind2'). Rounds
# interleave the four, so a neighbour that takes a core for a while slows
# all of them alike. Each attempt prints 'attempt <pipe1/pipe2> <ind1/ind2>'
# (medians of per-round ratios); the client stops after the first attempt
# whose control shows two free cores and whose pipeline gains enough
# (argv: min control ratio, min fraction of the control's gain), or after
# three attempts.
_OVERLAP_CLIENT = """
import statistics, sys, time
import tensorflow as tf
from lingvo_pipe.core import cluster, gpipe, layers
names = cluster.Connect(cluster.ParseClusterSpec(sys.argv[1]))
min_control, min_fraction = float(sys.argv[2]), float(sys.argv[3])
def Cell(k):
  return layers.SequentialLayer.Params().Set(sub=[
      layers.ProjectionLayer.Params().Set(
          name=f'p{k}_{i}', input_dim=512, output_dim=512,
          activation='TANH') for i in range(20)])
x = tf.random.stateless_normal([512, 512], [1, 2])
one, two = [names[0], names[0]], names[:2]
steps = {}
for label, where in (('pipe1', one), ('pipe2', two)):
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', cell_tpl=[Cell(0), Cell(1)], num_micro_batches=8,
      devices=where).Instantiate()
  steps[label] = tf.function(pipe.FPropDefaultTheta, autograph=False)
for label, where in (('ind1', one), ('ind2', two)):
  cells = []
  for k in range(2):
    with tf.device(where[k]):
      cells.append(Cell(k).Set(name=f'{label}_{k}').Instantiate())
  def Independent(x, cells=cells, where=where):
    outs = []
    for cell, device in zip(cells, where):
      with tf.device(device):
        outs.append(cell.FPropDefaultTheta(x))
    return outs
  steps[label] = tf.function(Independent, autograph=False)
def Seconds(step):
  start = time.perf_counter()
  tf.nest.map_structure(lambda t: t.numpy(), step(x))
  return time.perf_counter() - start
for step in steps.values():
  Seconds(step)
for _ in range(3):
  times = {label: [] for label in steps}
  for _ in range(5):
    for label, step in steps.items():
      times[label].append(Seconds(step))
  pipe = statistics.median(
      a / b for a, b in zip(times['pipe1'], times['pipe2']))
  control = statistics.median(
      a / b for a, b in zip(times['ind1'], times['ind2']))
  print('attempt', pipe, control, flush=True)
  if control >= min_control and pipe - 1 >= min_fraction * (control - 1):
    break
"""

class ClusterTest(absltest.TestCase):

  def testParseClusterSpec(self):
    spec = cluster.ParseClusterSpec(
        'worker=localhost:1,localhost:2; ps=localhost:3')
    self.assertEqual(spec.as_dict(), {'worker': ['localhost:1', 'localhost:2'],
                                      'ps': ['localhost:3']})
    with self.assertRaisesRegex(ValueError, 'write job=host:port'):
      cluster.ParseClusterSpec('worker')
    with self.assertRaisesRegex(ValueError, 'is empty'):
      cluster.ParseClusterSpec(' ; ')

  def testStartServerChecksTheTask(self):
    spec = cluster.ParseClusterSpec('worker=localhost:1')
    with self.assertRaisesRegex(ValueError, 'Task 3 of job .worker. is not'):
      cluster.StartServer(spec, 'worker', 3)

  def testFailedTaskNamesTheTaskThatDoesNotAnswer(self):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    live = f'127.0.0.1:{server.add_insecure_port("127.0.0.1:0")}'
    server.start()
    self.addCleanup(server.stop, None)
    dead = f'127.0.0.1:{local_workers.FreePorts(1)[0]}'
    spec = cluster.ParseClusterSpec(f'worker={live},{dead}')
    everyone = cluster.ParseClusterSpec(f'worker={live}')
    # A collective whose peer died cancels its receives, naming no task.
    for err in (tf.errors.CancelledError(None, None, 'RecvFromRemoteAsync '
                                         'is cancelled.'),
                tf.errors.UnavailableError(None, None, 'Socket closed')):
      self.assertEqual(cluster.FailedTask(err, spec), (1, dead))
      self.assertIsNone(cluster.FailedTask(err, everyone))
    named = tf.errors.AbortedError(
        None, None, 'from /job:worker/replica:0/task:0: Connection reset')
    self.assertEqual(cluster.FailedTask(named, spec), (0, live))
    wrong = tf.errors.InvalidArgumentError(None, None, 'shapes differ')
    self.assertIsNone(cluster.FailedTask(wrong, everyone))
    self.assertIsNone(cluster.FailedTask(ValueError('no op'), spec))

  def _StartServers(self):
    """Two servers, task i pinned to core i (LocalWorkers); stopped later."""
    workers = local_workers.LocalWorkers(2, self.create_tempdir().full_path)
    self.addCleanup(workers.Stop)
    return workers.Start().spec

  def setUp(self):
    super().setUp()
    self._env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
                     PYTHONPATH=os.pathsep.join(
                         [os.getcwd(), os.environ.get('PYTHONPATH', '')]))
    self._env.pop('TF_NUM_INTEROP_THREADS', None)

  def _Client(self, source, spec, *args):
    client = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(source), spec, *args],
        env=self._env,
        capture_output=True, text=True, timeout=240)
    self.assertEqual(client.returncode, 0, client.stderr[-2000:])
    return client.stdout

  def _GracefulServer(self, grace):
    """A trainer server (--job=server) with `grace` s, alone; its note."""
    port = local_workers.FreePorts(1)[0]
    spec = f'worker=127.0.0.1:{port}'
    server = subprocess.Popen(
        [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
         f'--cluster_spec={spec}', f'--worker_grace_secs={grace}'],
        env=self._env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    self.addCleanup(lambda: server.poll() is None and server.kill())
    cluster.WaitForTasks(cluster.ParseClusterSpec(spec), 'worker', 120)
    return server, f'127.0.0.1:{port}'

  def testSigtermGivesAServerItsGracePeriod(self):
    """It notes that it is stopping, serves on, and ends 128 + SIGTERM when
    the grace is over; a second SIGTERM ends it at once."""
    server, address = self._GracefulServer(3)
    stopping = cluster.ServerFilePath(address, '.stopping')
    server.send_signal(signal.SIGTERM)
    start = time.monotonic()
    while not os.path.exists(stopping):
      self.assertLess(time.monotonic() - start, 10)
      time.sleep(0.05)
    self.assertIsNone(cluster.Probe(address))  # still serving
    self.assertEqual(server.wait(timeout=30), -signal.SIGTERM)
    self.assertGreater(time.monotonic() - start, 2.5)
    self.assertFalse(os.path.exists(stopping))
    server, address = self._GracefulServer(60)
    server.send_signal(signal.SIGTERM)
    while not os.path.exists(cluster.ServerFilePath(address, '.stopping')):
      time.sleep(0.05)
    server.send_signal(signal.SIGTERM)
    self.assertEqual(server.wait(timeout=10), -signal.SIGTERM)

  def testAServerNoTrainerHoldsEndsAfterTheClaim(self):
    """SIGTERM to an idle server with a long grace: it ends once no
    trainer has held it within CLAIM_SECS, not after the whole grace."""
    server, _ = self._GracefulServer(60)
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    self.assertEqual(server.wait(timeout=30), -signal.SIGTERM)
    self.assertBetween(time.monotonic() - start, cluster.CLAIM_SECS - 0.5,
                       cluster.CLAIM_SECS + 5)

  def testAHeldServerServesUntilReleased(self):
    """The trainer reads the note through the task, holds the server past
    the claim's end, and releases it: it ends at once."""
    server, address = self._GracefulServer(60)
    out = self._Client(_RELEASE_CLIENT, f'worker={address}', str(server.pid))
    self.assertEqual(out.splitlines()[:3],
                     ['None', "{'grace_secs': 60.0}", 'held'])
    self.assertEqual(server.wait(timeout=10), -signal.SIGTERM)
    self.assertFalse(os.path.exists(cluster.ServerFilePath(address,
                                                           '.released')))

  def testPipelineOnTwoServers(self):
    spec = self._StartServers()
    out = self._Client(_CLIENT, spec)
    self.assertIn("'/job:worker/replica:0/task:1/device:CPU:0'", out)
    self.assertTrue(out.strip().endswith('ok'), out)

  def testServerOnOneCoreGetsTwoInterOpThreads(self):
    """Pinned to one core, a server would get one inter-op thread."""
    code = ('import os; from lingvo_pipe.core import cluster; '
            'print(cluster.EnsureInterOpThreads(), '
            'os.environ["TF_NUM_INTEROP_THREADS"])')
    out = subprocess.run(
        ['taskset', '-c', '0', sys.executable, '-c', code], env=self._env,
        capture_output=True, text=True, timeout=120, check=True).stdout
    self.assertEqual(out.split(), ['2', '2'])

  def testPartitionsOverlapOnPinnedServers(self):
    """Two servers, one core each: partition 1 works while 0 does.

    Measured here: two tasks ran the pipeline forward 1.52x and 1.74x
    faster than one task (ideal 16/9 = 1.78x) while the control gained
    1.95x and 1.94x. With the bug of docs/DESIGN.md section 13 (servers
    with one inter-op thread, the partitions take turns): 0.90-1.06x beside
    a control of 1.80-1.89x. The test asks the pipeline for 0.35 of the
    control's gain (1.33x beside 1.94x). With a busy loop on core 1 the
    control fell to 0.93-1.29x and the pipeline to 1.04x (CI once read
    1.05x): nobody can tell overlap from turn-taking on a core that is not
    free, so after three attempts with a control under 1.5x the test skips.
    """
    if devices.NumCores() < 2:
      self.skipTest('needs 2 cores')
    spec = self._StartServers()
    min_control, min_fraction = 1.5, 0.35
    out = self._Client(_OVERLAP_CLIENT, spec, str(min_control),
                       str(min_fraction))
    attempts = [tuple(map(float, line.split()[1:]))
                for line in out.splitlines() if line.startswith('attempt')]
    self.assertTrue(attempts, out)
    tested = [(pipe, control) for pipe, control in attempts
              if control >= min_control]
    if not tested:
      self.skipTest('timing skipped under load: core 1 was not free: two '
                    'independent computations on '
                    'two tasks ran only ' + ', '.join(
                        f'{c:.2f}x' for _, c in attempts) + ' faster than '
                    f'on one (needs {min_control}x to test overlap)')
    self.assertTrue(
        any(pipe - 1 >= min_fraction * (control - 1)
            for pipe, control in tested),
        'two tasks ran the pipeline only (pipeline, control) = ' + ', '.join(
            f'({p:.2f}x, {c:.2f}x)' for p, c in tested) + ' faster than one '
        f'task, under {min_fraction} of the control\'s gain: the partitions '
        'took turns')


if __name__ == '__main__':
  absltest.main()
