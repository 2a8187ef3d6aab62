"""Data parallelism across pipeline replicas on four logical CPUs.

R replicas x K partitions x M micro-batches must train as one replica with
the whole batch and R x M micro-batches (the same micro-batch size, so
BatchNorm normalises the same rows): loss and every variable's gradient
within 1e-12 in float64, dropout on; BatchNorm's moving averages those of
the whole batch. The same on real servers: replicas_cluster_test.py.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import replicas  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import replica_task  # noqa: E402

_TOL = 1e-12


def _Cpus(n):
  return [f'/device:CPU:{i}' for i in range(n)]


def _Task(partitions, micro, num_replicas, **kwargs):
  p = replica_task.TaskParams(partitions, micro, num_replicas,
                              devices=_Cpus(partitions * num_replicas),
                              **kwargs)
  task = p.Instantiate()
  task.CreateTrainState()
  return task


class ReplicasTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((2, 1), (1, 2), (2, 2), (4, 1))
  def testGradientsEqualOneReplicaWithTheWholeBatch(self, num_replicas,
                                                    partitions):
    batch = replica_task.Batch()
    micro = 2
    loss, grads = replica_task.Gradients(
        _Task(partitions, micro, num_replicas), batch)
    ref_loss, ref_grads = replica_task.Gradients(
        _Task(1, micro * num_replicas, 1), batch)
    self.assertLen(grads, 16)  # 4 blocks: w, b, gamma, beta
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  def testEachReplicaTakesItsOwnSlice(self):
    """The loss is not that of one slice (as if each replica saw it)."""
    batch = replica_task.Batch()
    loss, _ = replica_task.Gradients(_Task(1, 2, 2), batch)
    for i in (0, 1):
      half = tf.nest.map_structure(lambda t, i=i: t[i * 4:(i + 1) * 4],
                                   batch)
      half_loss, _ = replica_task.Gradients(_Task(1, 2, 1), half)
      self.assertGreater(abs(half_loss - loss), 1e-6)

  def testTrainStepMatchesOneReplicaWithBatchNormStatistics(self):
    batch = replica_task.Batch()
    tasks = [_Task(2, 2, 2), _Task(1, 4, 1)]
    outs = []
    for task in tasks:
      step = tf.function(task.TrainStep, autograph=False)
      outs.append([step(batch) for _ in range(2)])
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

  def testReplicaOpsRunOnTheReplicasDevices(self):
    task = _Task(2, 2, 2)
    graph = tf.function(task.Gradients, autograph=False).get_concrete_function(
        replica_task.Batch()).graph
    calls = {}
    for op in graph.get_operations():
      if op.type.endswith('PartitionedCall') and '/fwd_' in op.name:
        calls.setdefault(op.name.split('/')[0], set()).add(
            tf.DeviceSpec.from_string(op.device).device_index)
    self.assertEqual(calls, {'replica_0': {0, 1}, 'replica_1': {2, 3}})
    for var in task.vars.Flatten():  # one copy, on replica 0's devices
      self.assertIn(tf.DeviceSpec.from_string(var.device).device_index,
                    (0, 1))

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
    p = replica_task.TaskParams(1, 1, 3)
    p.train.num_replicas = 0
    with self.assertRaisesRegex(ValueError, 'num_replicas=0 must be an '
                                'integer >= 1'):
      p.Instantiate()

  def testNumDevicesNeededCountsReplicas(self):
    p = replica_task.TaskParams(2, 2, 3)
    self.assertEqual(base_model.NumDevicesNeeded(p), 6)
    self.assertEqual(base_model.NumReplicas(p), 3)

  def testCombineMetricsWeighsByWeight(self):
    out = replicas.CombineMetrics([
        {'loss': (tf.constant(1.0), tf.constant(1.0))},
        {'loss': (tf.constant(4.0), tf.constant(3.0))}])
    self.assertAllClose(out.loss, (13.0 / 4.0, 4.0))


if __name__ == '__main__':
  absltest.main()
