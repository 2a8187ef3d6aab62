"""Replicas x partitions on four tf.distribute.Server processes (127.0.0.1).

For (R, K) in (2, 1), (1, 2), (2, 2), a client places replica r's
partition k on worker task r * K + k and checks against one replica with
the whole batch and R x M micro-batches on its own CPU (float64, dropout
and BatchNorm on): loss and every gradient within 1e-12, then one
training step each and every variable (BatchNorm's moving averages
included) within 1e-12. Servers and client are subprocesses: connecting
to a cluster changes the whole process.
"""

import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

from lingvo_pipe.core import local_workers

_CLIENT = '''
import json, sys
import tensorflow as tf
from lingvo_pipe.core import base_model, cluster
from tests.core import replica_task
names = cluster.Connect(cluster.ParseClusterSpec(sys.argv[1]))
local = '/device:CPU:0'  # the client's own CPU, as the runtime lists it
batch = replica_task.Batch()
report = {}
refs = {}  # (loss, gradients, values after one step) by micro-batches
for replicas, partitions in ((2, 1), (1, 2), (2, 2)):
  micro = 2
  p = replica_task.TaskParams(partitions, micro, replicas)
  base_model.PlacePipelines(p, names)
  task = p.Instantiate()
  task.CreateTrainState()
  loss, grads = replica_task.Gradients(task, batch)
  tf.function(task.TrainStep, autograph=False)(batch)
  if micro * replicas not in refs:  # 2x1 and 2x2 share theirs
    with tf.device(local):
      ref = replica_task.TaskParams(1, micro * replicas, 1,
                                    devices=[local]).Instantiate()
      ref.CreateTrainState()
    ref_loss, ref_grads = replica_task.Gradients(ref, batch)
    tf.function(ref.TrainStep, autograph=False)(batch)
    refs[micro * replicas] = (ref_loss, ref_grads, replica_task.Values(ref))
  ref_loss, ref_grads, ref_values = refs[micro * replicas]
  report[f'{replicas}x{partitions}'] = dict(
      loss=abs(loss - ref_loss), grads=replica_task.Worst(grads, ref_grads),
      num_grads=len(grads),
      values=replica_task.Worst(replica_task.Values(task), ref_values),
      devices=[task.pipe.ReplicaDevices(r) for r in range(replicas)],
      var_tasks=sorted({tf.DeviceSpec.from_string(v.device).task
                        for v in task.vars.Flatten()}))
print('report', json.dumps(report), flush=True)
'''


class ReplicasClusterTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self._env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
                     PYTHONPATH=os.pathsep.join(
                         [os.getcwd(), os.environ.get('PYTHONPATH', '')]))
    self._env.pop('TF_NUM_INTEROP_THREADS', None)

  def testReplicasTimesPartitionsEqualOneReplica(self):
    workers = local_workers.LocalWorkers(4, self.create_tempdir().full_path)
    self.addCleanup(workers.Stop)
    spec = workers.Start().spec
    client = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(_CLIENT), spec],
        env=self._env, capture_output=True, text=True, timeout=400)
    self.assertEqual(client.returncode, 0, client.stderr[-3000:])
    report = json.loads(client.stdout.split('report', 1)[1])
    self.assertEqual(sorted(report), ['1x2', '2x1', '2x2'])
    for name, got in report.items():
      replicas, partitions = map(int, name.split('x'))
      self.assertEqual(got['num_grads'], 16, name)
      self.assertLess(got['loss'], 1e-12, name)
      self.assertLess(got['grads'], 1e-12, name)
      self.assertLess(got['values'], 1e-12, name)
      self.assertEqual(got['var_tasks'], list(range(partitions)), name)
      for r, devices in enumerate(got['devices']):
        self.assertEqual(
            devices, [f'/job:worker/replica:0/task:{r * partitions + k}'
                      '/device:CPU:0' for k in range(partitions)], name)


if __name__ == '__main__':
  absltest.main()
