"""Memory workers: a server's allocator read from the client on SIGUSR1.

The servers are real `python -m lingvo_pipe.tools.memory_worker`
processes on 127.0.0.1 (MemoryWorkers); the client that connects to one
runs as a subprocess (connecting to a cluster changes the whole process).
"""

import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

from lingvo_pipe.core import local_workers
from lingvo_pipe.tools import memory_worker

# The client owns one worker whose CPU allocator keeps statistics; prints
# what MemoryWorkers.ReadMemory reports around a kept 4 MiB variable and a
# step with 16 MiB temporaries, both on the worker.
_MEMORY_CLIENT = """
import json, sys
import tensorflow as tf
from lingvo_pipe.core import cluster
from lingvo_pipe.tools import memory_worker
with memory_worker.MemoryWorkers(
    1, sys.argv[1], env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}) as workers:
  names = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
  reads = {'start': workers.ReadMemory()[0]['CPU:0']}
  with tf.device(names[0]):
    v = tf.Variable(tf.zeros([2**20]))
  reads['variable'] = workers.ReadMemory()[0]['CPU:0']
  @tf.function(autograph=False)
  def Step():
    with tf.device(names[0]):
      x = tf.random.stateless_normal([2**22], [1, 2]) + v[0]
      return tf.reduce_sum(x * x)
  Step().numpy()
  reads['warm'] = workers.ReadMemory()[0]['CPU:0']
  Step().numpy()
  reads['step'] = workers.ReadMemory()[0]['CPU:0']
  reads['idle'] = workers.ReadMemory()[0]['CPU:0']
  print(json.dumps(reads), flush=True)
"""

# A traced step on the worker: a (1 MiB, from the seed the client sends,
# so that nothing is folded into a constant) and a @ a (1 MiB) are alive
# together; prints TraceStep's peaks and the read that follows.
_TRACE_CLIENT = """
import json, sys
import tensorflow as tf
from lingvo_pipe.core import cluster
from lingvo_pipe.tools import memory_worker
with memory_worker.MemoryWorkers(
    1, sys.argv[1], env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}) as workers:
  names = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
  @tf.function(autograph=False)
  def Step(seed):
    with tf.device(names[0]):
      a = tf.random.stateless_normal([512, 512], seed)
      return tf.reduce_sum(tf.matmul(a, a))
  seed = tf.constant([1, 2])
  Step(seed).numpy()
  traced = workers.TraceStep(lambda: Step(seed).numpy())
  after = workers.ReadMemory()[0]['CPU:0']
  print(json.dumps({'traced': traced[0], 'after': after}), flush=True)
"""


class MemoryWorkerTest(absltest.TestCase):

  def _Workers(self, env):
    workers = memory_worker.MemoryWorkers(
        1, self.create_tempdir().full_path, env=env)
    self.addCleanup(workers.Stop)
    return workers.Start()

  def _RunClient(self, source):
    """Runs a client program (it starts its own workers); its last line,
    parsed as JSON."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=os.pathsep.join(
                   [os.getcwd(), os.environ.get('PYTHONPATH', '')]))
    env.pop('TF_NUM_INTEROP_THREADS', None)
    client = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(source),
         self.create_tempdir().full_path],
        env=env, capture_output=True, text=True, timeout=240)
    self.assertEqual(client.returncode, 0, client.stderr[-2000:])
    return json.loads(client.stdout.strip().splitlines()[-1])

  def testReadMemoryReportsTheWorkersAllocator(self):
    """Bytes held on the worker, not in the client: a variable stays in
    `current`, a step's temporaries show in its `peak` only, and each read
    starts a new peak."""
    reads = self._RunClient(_MEMORY_CLIENT)
    mib = 2**20
    # The 4 MiB variable, give or take the runtime's own small tensors
    # (a 256-byte one held at the first read was freed by the second in
    # one run): far below any size the variable's bytes could be confused
    # with.
    held = reads['variable']['current'] - reads['start']['current']
    self.assertBetween(held, 4 * mib - 4096, 4 * mib + 4096)
    step = reads['step']
    # x and x * x are 16 MiB each; at least one is alive at the peak.
    self.assertGreaterEqual(step['peak'] - reads['warm']['current'], 16 * mib)
    self.assertLess(step['current'] - reads['warm']['current'], mib)
    # No step since the last read: its peak is gone (a few small tensors
    # of the runtime's own come and go).
    self.assertLess(reads['idle']['peak'] - reads['idle']['current'], mib)

  def testTraceStepCountsTheTensorsAndTheChunks(self):
    """The tensors at the peak are a and a @ a (2 MiB, give or take the
    runtime's scalars: one made before the trace and freed in it counts
    less); the allocator's chunks hold at least that; and, as a read
    does, the trace's report starts a new peak."""
    out = self._RunClient(_TRACE_CLIENT)
    (name, peak), = out['traced'].items()
    self.assertIn('cpu', name)
    mib = 2**20
    self.assertBetween(peak['tensors_at_peak'], 2 * mib - 1024,
                       2 * mib + 1024)
    self.assertBetween(peak['tensor_peak'] - peak['tensors_at_peak'], 0,
                       1024)
    self.assertGreaterEqual(peak['in_use'], peak['tensors_at_peak'])
    # TraceStep's last report started a new peak: nothing ran since.
    self.assertLess(out['after']['peak'] - out['after']['current'], mib)

  def testReadMemoryWithoutStatisticsSaysWhatToSet(self):
    # TensorFlow's default CPU allocator keeps no statistics. Where it
    # turns oneDNN on (CPUs with AVX-512), oneDNN's allocator does: turn
    # it off, so the server runs the allocator this path is for.
    workers = self._Workers(
        {'TF_ENABLE_ONEDNN_OPTS': '0', 'TF_CPU_ALLOCATOR_USE_BFC': ''})
    with self.assertRaisesRegex(local_workers.WorkersFailed,
                                "env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}"):
      workers.ReadMemory()

  def testAReportThatCannotBeWrittenLeavesTheServerRunning(self):
    workers = self._Workers({'TF_CPU_ALLOCATOR_USE_BFC': 'true'})
    path = memory_worker.ReportPath(workers.addresses[0])
    os.mkdir(path)  # the report cannot replace a directory
    self.addCleanup(os.rmdir, path)
    with self.assertRaisesRegex(local_workers.WorkersFailed,
                                'wrote no memory report'):
      workers.ReadMemory(timeout=2)
    self.assertEqual(workers.Dead(), [])
    with open(workers.log_paths[0], encoding='utf-8') as f:
      self.assertIn(f'memory report {path} not written', f.read())

  def testStoppedServerLeavesNoFiles(self):
    """SIGTERM removes the report with the server's note (cluster.Serve)."""
    workers = self._Workers({'TF_CPU_ALLOCATOR_USE_BFC': 'true'})
    workers.ReadMemory()
    report = memory_worker.ReportPath(workers.addresses[0])
    self.assertTrue(os.path.exists(report))
    workers.Stop()
    self.assertFalse(os.path.exists(report))

  def testReadMemoryBeforeStartSaysSo(self):
    workers = memory_worker.MemoryWorkers(1, self.create_tempdir().full_path)
    with self.assertRaisesRegex(RuntimeError, r'Start\(\) the MemoryWorkers'):
      workers.ReadMemory()
    with self.assertRaisesRegex(RuntimeError, r'Start\(\) the MemoryWorkers'):
      workers.TraceStep(lambda: None)


if __name__ == '__main__':
  absltest.main()
