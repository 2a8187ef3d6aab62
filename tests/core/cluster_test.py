"""A pipeline whose partitions live on two tf.distribute.Server processes.

Two servers and a client run as subprocesses on 127.0.0.1 (connecting to a
cluster changes the whole process, so the test process stays out of it).
The client checks that each partition's variables live on its worker task
and that every gradient equals the local unpipelined reference.
"""

import os
import socket
import subprocess
import sys
import textwrap

from absl.testing import absltest

from lingvo_pipe.core import cluster

_SERVER = '''
import sys
from lingvo_pipe.core import cluster
server = cluster.StartServer(cluster.ParseClusterSpec(sys.argv[1]), 'worker',
                             int(sys.argv[2]))
print('ready', flush=True)
server.join()
'''

_CLIENT = '''
import sys
import tensorflow as tf
from lingvo_pipe.core import cluster, gpipe, layers
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
assert cluster.PlacePipelines(pipe_p, names) == 1
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


def _FreePort():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


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

  def testPlacePipelinesNeedsEnoughTasks(self):
    from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import layers  # pylint: disable=g-import-not-at-top
    p = gpipe.PipeliningLayer.Params().Set(
        cell_tpl=[layers.ProjectionLayer.Params()] * 3)
    with self.assertRaisesRegex(ValueError, '3 partitions but the cluster '
                                'has 2 tasks'):
      cluster.PlacePipelines(p, ['/job:worker/task:0', '/job:worker/task:1'])

  def testPipelineOnTwoServers(self):
    spec = f'worker=127.0.0.1:{_FreePort()},127.0.0.1:{_FreePort()}'
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=os.pathsep.join(
                   [os.getcwd(), os.environ.get('PYTHONPATH', '')]))
    servers = []
    try:
      for task in (0, 1):
        proc = subprocess.Popen(
            [sys.executable, '-c', textwrap.dedent(_SERVER), spec, str(task)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        servers.append(proc)
      for proc in servers:
        self.assertEqual(proc.stdout.readline().strip(), 'ready')
      client = subprocess.run(
          [sys.executable, '-c', textwrap.dedent(_CLIENT), spec], env=env,
          capture_output=True, text=True, timeout=240)
      self.assertEqual(client.returncode, 0, client.stderr[-2000:])
      self.assertIn("'/job:worker/replica:0/task:1/device:CPU:0'",
                    client.stdout)
      self.assertTrue(client.stdout.strip().endswith('ok'), client.stdout)
    finally:
      for proc in servers:
        proc.kill()
        proc.wait()


if __name__ == '__main__':
  absltest.main()
