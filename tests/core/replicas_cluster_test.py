"""Mirrored replicas x partitions on four tf.distribute.Server processes.

For (R, K) in (2, 1), (1, 2), (2, 2) through FProp, and (2, 2) with 1F1B
in one pass, a client places replica r's partition k (and its copy of
that partition's variables) on worker task r * K + k, each replica
running M / R micro-batches, and checks against one replica with the
whole batch and M micro-batches on its own CPU (float64, dropout and
BatchNorm on), and against the same layers with no pipeline and the loss
written out (replica_task.PlainGradients): loss and every gradient
within 1e-12, then three training steps each and every variable
(BatchNorm's moving averages included) within 1e-12, every copy bitwise
equal to replica 0's. The gradients of
the copies are summed by TF's collective ops over gRPC. Servers and
client are subprocesses: connecting to a cluster changes the whole
process.
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
batch = replica_task.Batch(keys=True)
report = {}
refs = {}  # (loss, gradients, values after one step) by micro-batches
for replicas, partitions, schedule in ((2, 1, 'gpipe'), (1, 2, 'gpipe'),
                                       (2, 2, 'gpipe'), (2, 2, '1f1b')):
  micro = 4  # M over every replica: M / R each
  one_pass = schedule != 'gpipe'
  p = replica_task.TaskParams(partitions, micro, replicas, schedule=schedule,
                              one_pass=one_pass)
  base_model.PlacePipelines(p, names)
  task = p.Instantiate()
  task.CreateTrainState()
  loss, grads = replica_task.Gradients(task, batch)
  with tf.device(local):  # no pipeline, the loss written out
    plain_loss, plain_grads = replica_task.PlainGradients(task, batch, micro)
  step = tf.function(task.TrainStep, autograph=False)
  for _ in range(3):
    step(batch)
  if one_pass not in refs:
    with tf.device(local):
      ref = replica_task.TaskParams(1, micro, 1, devices=[local],
                                    one_pass=one_pass).Instantiate()
      ref.CreateTrainState()
    ref_loss, ref_grads = replica_task.Gradients(ref, batch)
    ref_step = tf.function(ref.TrainStep, autograph=False)
    for _ in range(3):
      ref_step(batch)
    refs[one_pass] = (ref_loss, ref_grads, replica_task.Values(ref))
  ref_loss, ref_grads, ref_values = refs[one_pass]
  mirrors = task.train_state.mirrors
  report[f'{replicas}x{partitions}x{schedule}'] = dict(
      unequal=mirrors.Unequal() if mirrors else [],
      copy_tasks=sorted({tf.DeviceSpec.from_string(v.device).task
                         for v in (mirrors.CopiesByPath(1).values()
                                   if mirrors else [])}),
      loss=abs(loss - ref_loss), grads=replica_task.Worst(grads, ref_grads),
      num_grads=len(grads), plain_loss=abs(loss - plain_loss),
      plain_grads=replica_task.Worst(grads, plain_grads),
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
    self.assertEqual(sorted(report), ['1x2xgpipe', '2x1xgpipe', '2x2x1f1b',
                                      '2x2xgpipe'])
    for name, got in report.items():
      replicas, partitions = map(int, name.split('x')[:2])
      self.assertEqual(got['unequal'], [], name)
      self.assertEqual(got['copy_tasks'],
                       list(range(partitions, 2 * partitions))
                       if replicas == 2 else [], name)
      self.assertEqual(got['num_grads'], 16, name)
      self.assertLess(got['loss'], 1e-12, name)
      self.assertLess(got['grads'], 1e-12, name)
      self.assertLess(got['plain_loss'], 1e-12, name)
      self.assertLess(got['plain_grads'], 1e-12, name)
      self.assertLess(got['values'], 1e-12, name)
      self.assertEqual(got['var_tasks'], list(range(partitions)), name)
      for r, devices in enumerate(got['devices']):
        self.assertEqual(
            devices, [f'/job:worker/replica:0/task:{r * partitions + k}'
                      '/device:CPU:0' for k in range(partitions)], name)


if __name__ == '__main__':
  absltest.main()
