"""Data parallelism across mirrored pipeline replicas on four logical CPUs.

R replicas x K partitions, each replica running M / R micro-batches, must
train as one replica with the whole batch and M micro-batches (the same
micro-batch size, so BatchNorm normalises the same rows): loss and every
variable's gradient within 1e-12 in float64, dropout on, through FProp and
in one pass, for every schedule, and the same against the layers with no
pipeline at all and the loss written out (R = 1 and 2); BatchNorm's moving
averages those of the whole batch; every replica's copy of the pipeline's
variables bitwise equal to replica 0's after each step and after a restore.
The same on real servers: replicas_cluster_test.py.
"""

import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import checkpointer  # noqa: E402
from lingvo_pipe.core import optimizer  # noqa: E402
from lingvo_pipe.core import replicas  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import replica_task  # noqa: E402

_TOL = 1e-12


def _Cpus(n):
  return [f'/device:CPU:{i}' for i in range(n)]


def _Task(partitions, micro, num_replicas, adam=False, **kwargs):
  p = replica_task.TaskParams(partitions, micro, num_replicas,
                              devices=_Cpus(partitions * num_replicas),
                              **kwargs)
  if adam:
    p.train.optimizer = optimizer.Adam.Params()
    p.train.learning_rate = 0.05
  task = p.Instantiate()
  task.CreateTrainState()
  return task


class ReplicasTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      (2, 1, 'gpipe', False, 'always'), (2, 2, 'gpipe', False, 'always'),
      (4, 1, 'gpipe', False, 'always'), (2, 1, 'gpipe', True, 'always'),
      (2, 2, '1f1b', True, 'always'), (2, 2, 'gpipe', True, 'never'),
      (4, 1, '1f1b', True, 'except_last'))
  def testGradientsEqualOneReplicaWithTheWholeBatch(
      self, num_replicas, partitions, schedule, one_pass, recompute):
    batch = replica_task.Batch()
    micro = 4
    loss, grads = replica_task.Gradients(
        _Task(partitions, micro, num_replicas, schedule=schedule,
              one_pass=one_pass, recompute=recompute), batch)
    ref_loss, ref_grads = replica_task.Gradients(_Task(1, micro, 1), batch)
    self.assertLen(grads, 16)  # 4 blocks: w, b, gamma, beta
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  @parameterized.parameters(
      (1, 2, 'gpipe', False), (2, 1, 'gpipe', False), (1, 2, '1f1b', True),
      (2, 2, '1f1b', True), (2, 2, 'gpipe', True))
  def testGradientsEqualAPlainModel(self, num_replicas, partitions,
                                    schedule, one_pass):
    """Against the same layers with no pipeline and the loss written out
    (replica_task.PlainGradients), not against another pipeline."""
    batch = replica_task.Batch(keys=True)
    micro = 4
    task = _Task(partitions, micro, num_replicas, schedule=schedule,
                 one_pass=one_pass)
    loss, grads = replica_task.Gradients(task, batch)
    ref_loss, ref_grads = replica_task.PlainGradients(task, batch, micro)
    self.assertLen(grads, 16)
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  def testEachReplicaTakesItsOwnSlice(self):
    """The loss is not that of one slice (as if each replica saw it)."""
    batch = replica_task.Batch()
    loss, _ = replica_task.Gradients(_Task(1, 2, 2), batch)
    for i in (0, 1):
      half = tf.nest.map_structure(lambda t, i=i: t[i * 4:(i + 1) * 4],
                                   batch)
      half_loss, _ = replica_task.Gradients(_Task(1, 1, 1), half)
      self.assertGreater(abs(half_loss - loss), 1e-6)

  @parameterized.parameters(False, True)
  def testTrainStepsMatchOneReplicaAndKeepTheCopiesEqual(self, one_pass):
    batch = replica_task.Batch()
    tasks = [_Task(2, 4, 2, adam=True, one_pass=one_pass),
             _Task(1, 4, 1, adam=True, one_pass=one_pass)]
    outs = []
    for task in tasks:
      step = tf.function(task.TrainStep, autograph=False)
      outs.append([step(batch) for _ in range(3)])
      mirrors = task.train_state.mirrors
      if mirrors is not None:  # bitwise, after every step's update
        self.assertEqual(mirrors.Unequal(), [])
    for a, b in zip(*outs):
      self.assertAllClose(a.loss, b.loss, atol=_TOL, rtol=0)
      self.assertAllClose(a.grad_norm, b.grad_norm, atol=_TOL, rtol=0)
      self.assertEqual(int(a.global_step), int(b.global_step))
    values = [replica_task.Values(t) for t in tasks]
    self.assertLess(replica_task.Worst(*values), _TOL)
    moving = [k for k in values[0] if 'moving_mean' in k]
    self.assertLen(moving, 4)
    for name in moving:  # the statistics moved: not the initial zeros
      self.assertGreater(np.max(np.abs(values[0][name])), 1e-3)

  def testBatchNormAveragesSeeTheWholeBatch(self):
    """Moving mean = decay * 0 + (1 - decay) * mean of the whole batch."""
    batch = replica_task.Batch()
    task = _Task(1, 2, 2, num_blocks=1, keep_prob=1.0)
    tf.function(task.TrainStep, autograph=False)(batch)
    # The block's BatchNorm sees tanh(x w + b) with the weights before the
    # step: recompute it from the initial values of a twin task.
    twin = _Task(1, 1, 1, num_blocks=1, keep_prob=1.0)
    proj = twin.pipe.cells[0].b0.proj
    rows = proj.FProp(proj.theta, batch.x).numpy()
    moving = task.VariablesByPath()['task/pipe/b0/bn/moving_mean']
    self.assertAllClose(moving.numpy(), 0.5 * rows.mean(axis=0),
                        atol=_TOL, rtol=0)

  @parameterized.parameters(False, True)
  def testEachReplicaRunsOnItsDevicesWithItsCopies(self, one_pass):
    task = _Task(2, 4, 2, one_pass=one_pass)
    graph = tf.function(task.Gradients, autograph=False).get_concrete_function(
        replica_task.Batch()).graph
    calls, collectives, placed_sums = {}, set(), set()
    for op in graph.get_operations():
      index = tf.DeviceSpec.from_string(op.device or '/device:CPU:0')
      if op.type.endswith('PartitionedCall') and '/fwd_' in op.name:
        calls.setdefault(op.name.split('/')[0][:len('replica_0')], set()).add(
            index.device_index)
      if op.type == 'CollectiveReduce':
        collectives.add(index.device_index)
      if op.type == 'AddV2' and '/all_reduce/' in op.name:
        placed_sums.add(index.device_index)
    self.assertEqual(calls, {'replica_0': {0, 1}, 'replica_1': {2, 3}})
    # Each stage's sums on each replica's device: by placed ops in one
    # pass (chunk r summed on replica r's device), else by the collective.
    self.assertEqual(placed_sums if one_pass else collectives, {0, 1, 2, 3})
    self.assertEqual(collectives if one_pass else placed_sums, set())
    for var in task.vars.Flatten():  # the checkpoint's: replica 0's
      self.assertIn(tf.DeviceSpec.from_string(var.device).device_index,
                    (0, 1))
    copies = task.train_state.mirrors.CopiesByPath(1)
    self.assertLen(copies, 16)
    for path, copy in copies.items():
      want = 2 if path.split('/')[2] in ('b0', 'b1') else 3  # K=2 cells
      self.assertEqual(tf.DeviceSpec.from_string(copy.device).device_index,
                       want, path)

  def testRestoreSetsEveryCopy(self):
    batch = replica_task.Batch()
    trained = _Task(2, 4, 2, adam=True)
    step = tf.function(trained.TrainStep, autograph=False)
    for _ in range(2):
      step(batch)
    folder = tempfile.mkdtemp(dir=self.get_temp_dir())
    checkpointer.Checkpointer(folder, trained.VariablesToCheckpoint()).Save(2)
    fresh = _Task(2, 4, 2, adam=True)
    ckpt = checkpointer.Checkpointer(folder, fresh.VariablesToCheckpoint())
    self.assertTrue(os.path.basename(ckpt.RestoreLatest() or ''))
    # The checkpoint holds replica 0's variables only ...
    self.assertLen(fresh.train_state.mirrors.Unequal(), 16)
    fresh.SyncMirrors()  # ... and every copy is set from them
    self.assertEqual(fresh.train_state.mirrors.Unequal(), [])
    for path, copy in fresh.train_state.mirrors.CopiesByPath(1).items():
      self.assertEqual(copy.numpy().tobytes(),
                       trained.VariablesByPath()[path].numpy().tobytes())
    slots = fresh.train_state.optimizer.SlotVariables()
    for name, var in fresh.train_state.mirror_optimizers[0].SlotVariables(
    ).items():
      self.assertEqual(var.numpy().tobytes(), slots[name].numpy().tobytes())
    # Both go on exactly as the run that was not interrupted.
    out = tf.function(fresh.TrainStep, autograph=False)(batch)
    self.assertEqual(float(out.loss), float(step(batch).loss))
    self.assertEqual(fresh.train_state.mirrors.Unequal(), [])

  def testErrors(self):
    task = _Task(1, 2, 2)
    with self.assertRaisesRegex(ValueError, 'here: batch size 6 does not '
                                'split into num_replicas=4 equal slices'):
      replicas.SplitBatch(NestedMap(x=tf.zeros([6, 2])), 4, 'here')
    with self.assertRaisesRegex(ValueError, 'batch size 7 does not split'):
      tf.function(task.Gradients, autograph=False)(
          replica_task.Batch(size=7))
    with self.assertRaisesRegex(ValueError, r'replica 2 needs devices 2..2 '
                                r'\(K=1 per replica\) but 2 are known'):
      task.pipe.ReplicaDevices(2)
    odd = _Task(1, 3, 2)
    with self.assertRaisesRegex(
        ValueError, r"'task/pipe': num_micro_batches=3 does not split over "
        r'num_replicas=2 \(each replica runs M / R of them\); use a '
        'multiple of 2'):
      tf.function(odd.Gradients, autograph=False)(replica_task.Batch())
    p = replica_task.TaskParams(1, 1, 3)
    p.train.num_replicas = 0
    with self.assertRaisesRegex(ValueError, 'num_replicas=0 must be an '
                                'integer >= 1'):
      p.Instantiate()
    unstarted = replica_task.TaskParams(1, 2, 2, devices=_Cpus(2)).Instantiate()
    with self.assertRaisesRegex(RuntimeError, 'call CreateTrainState'):
      tf.function(unstarted.Gradients, autograph=False)(replica_task.Batch())
    # In one pass a replica's gradient waits for every replica's trace.
    alone = _Task(1, 2, 2, one_pass=True)

    @tf.function(autograph=False)
    def OneReplicaOfTwo(batch):
      alone.SetReplica(0, 2)
      try:
        plan = alone.OnePassTraining(alone.theta, batch)
        with tf.GradientTape() as tape:
          metrics = plan.network.FPropWithLoss(
              plan.theta, plan.inputs, plan.head, plan.head_theta,
              plan.head_batch, plan.loss_weight)
        return tape.gradient(metrics.loss[0], alone.vars.Flatten())
      finally:
        alone.SetReplica(0, 1)
    with self.assertRaisesRegex(RuntimeError, "'task/pipe': stage 0's "
                                'all-reduce is read before every replica '
                                'was traced'):
      OneReplicaOfTwo(NestedMap(replica_task.Batch(size=4),
                                example_keys=tf.range(4, dtype=tf.int64)))

  def testNumDevicesNeededCountsReplicas(self):
    p = replica_task.TaskParams(2, 2, 3)
    self.assertEqual(base_model.NumDevicesNeeded(p), 6)
    self.assertEqual(base_model.NumReplicas(p), 3)

  def testCombineMetricsWeighsByWeightOrSums(self):
    per = [{'loss': (tf.constant(1.0), tf.constant(1.0))},
           {'loss': (tf.constant(4.0), tf.constant(3.0))}]
    self.assertAllClose(replicas.CombineMetrics(per).loss, (13.0 / 4.0, 4.0))
    self.assertAllClose(replicas.CombineMetrics(per, summed=['loss']).loss,
                        (5.0, 4.0))


if __name__ == '__main__':
  absltest.main()
