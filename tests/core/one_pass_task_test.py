"""BaseTask's one-pass training: every schedule trains as FProp does.

A task with a layer before the pipeline (a projection) and one after it
whose variable the loss head reads, so the gradient crosses both ends of
the pipeline in one pass. For each schedule, R and K (each replica
running M / R micro-batches, its own copy of the pipeline): the loss and every
variable's gradient equal those of the same task trained through FProp
(GPipe's order, whole-batch loss) within 1e-12 in float64, dropout and
BatchNorm on, and the same against pre, the blocks and post with no
pipeline at all and the loss written out (R = 1 and 2); TrainStep gives
the same variables after two steps.
"""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import replica_task  # noqa: E402

_TOL = 1e-12
DIM = replica_task.DIM


class OnePassTask(replica_task.ReplicaTask):
  """pre (projection) -> pipe -> post (a scale the head reads) -> loss."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.one_pass = True
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('pre', layers.ProjectionLayer.Params().Set(
        input_dim=DIM, output_dim=DIM))
    self.CreateChild('post', layers.ProjectionLayer.Params().Set(
        input_dim=DIM, output_dim=DIM))

  def _PipeInputs(self, theta, batch):
    return NestedMap(x=self.pre.FProp(theta.pre, batch.x),
                     example_keys=batch.example_keys)

  def _Predictions(self, theta, out):
    return NestedMap(y=self.post.FProp(theta.post, out.x))

  def ComputePredictions(self, theta, input_batch):
    out = self.pipe.FProp(theta.pipe, self._PipeInputs(theta, input_batch))
    return self._Predictions(theta, out)

  def OnePassTraining(self, theta, input_batch):
    if not self.params.one_pass:
      return None

    def Head(head_theta, out, batch):
      predictions = self._Predictions(head_theta, out)
      return self.ComputeLoss(head_theta, predictions, batch)[0]

    return base_model.OnePass(
        network=self.pipe, theta=theta.pipe,
        inputs=self._PipeInputs(theta, input_batch), head=Head,
        head_theta=NestedMap(post=theta.post),
        head_batch=NestedMap(y=input_batch.y),
        loss_weight=tf.cast(tf.shape(input_batch.y)[0], tf.float64))


def _Task(k, m, replicas=1, schedule='gpipe', v=1, one_pass=True,
          split_backward=False):
  p = replica_task.TaskParams(k * v, m, replicas, batch_norm=True)
  p.cls = OnePassTask
  p = OnePassTask.Params().Set(**{k_: v_ for k_, v_ in p.IterParams()
                                  if k_ != 'cls'})
  p.one_pass = one_pass
  p.pipe.schedule = schedule
  p.pipe.num_virtual_stages = v
  if split_backward:
    p.pipe.recompute = 'never'
    p.pipe.split_backward = True
  p.pipe.devices = [f'/device:CPU:{i}' for i in range(k * replicas)]
  task = p.Instantiate()
  task.CreateTrainState()
  return task


class OnePassTaskTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      ('gpipe', 2, 1, 1), ('1f1b', 2, 1, 1), ('1f1b', 4, 1, 1),
      ('interleaved_1f1b', 2, 2, 1), ('1f1b', 2, 1, 2),
      ('interleaved_1f1b', 1, 2, 2), ('gpipe', 1, 2, 2))
  def testGradientsEqualFProp(self, schedule, k, v, replicas):
    batch = replica_task.Batch()
    loss, grads = replica_task.Gradients(
        _Task(k, 2 * replicas, replicas, schedule, v), batch)
    ref_loss, ref_grads = replica_task.Gradients(
        _Task(1, 2 * replicas, one_pass=False), batch)
    self.assertLen(grads, 4 * 4 + 4)  # blocks, and pre's and post's w, b
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  @parameterized.parameters(('1f1b', 2, 1, 1), ('1f1b', 2, 1, 2),
                            ('interleaved_1f1b', 1, 2, 2))
  def testGradientsEqualAPlainModel(self, schedule, k, v, replicas):
    """Against pre, the blocks and post with no pipeline and the loss
    written out (replica_task.PlainGradients), not through FProp."""
    batch = replica_task.Batch(keys=True)
    task = _Task(k, 2 * replicas, replicas, schedule, v)
    loss, grads = replica_task.Gradients(task, batch)
    ref_loss, ref_grads = replica_task.PlainGradients(
        task, batch, 2 * replicas, pre_post=True)
    self.assertLen(grads, 4 * 4 + 4)
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  @parameterized.parameters(('1f1b', 2, 1, 2), ('gpipe', 1, 2, 2))
  def testSplitBackwardsWithReplicasEqualFProp(self, schedule, k, v,
                                               replicas):
    """Each B then its W, each stage's all-reduce after its last W."""
    batch = replica_task.Batch()
    task = _Task(k, 2 * replicas, replicas, schedule, v, split_backward=True)
    self.assertTrue(task.pipe.Table(2).split_backward)
    loss, grads = replica_task.Gradients(task, batch)
    ref_loss, ref_grads = replica_task.Gradients(
        _Task(1, 2 * replicas, one_pass=False), batch)
    self.assertLen(grads, 4 * 4 + 4)
    self.assertAllClose(loss, ref_loss, atol=_TOL, rtol=0)
    self.assertLess(replica_task.Worst(grads, ref_grads), _TOL)

  def testTrainStepMatchesFPropWithBatchNormStatistics(self):
    batch = replica_task.Batch()
    tasks = [_Task(2, 4, schedule='1f1b'), _Task(2, 4, one_pass=False)]
    outs = []
    for task in tasks:
      step = tf.function(task.TrainStep, autograph=False)
      outs.append([step(batch) for _ in range(2)])
    for a, b in zip(*outs):
      self.assertAllClose(a.loss, b.loss, atol=_TOL, rtol=0)
      self.assertAllClose(a.grad_norm, b.grad_norm, atol=_TOL, rtol=0)
    values = [replica_task.Values(t) for t in tasks]
    self.assertLess(replica_task.Worst(*values), _TOL)
    self.assertLen([n for n in values[0] if 'moving_mean' in n], 4)

  def testOneOfTheOrdersFPropCannotRunNeedsOnePassTraining(self):
    task = _Task(2, 2, schedule='1f1b', one_pass=False)
    with self.assertRaisesRegex(ValueError, "pipeline 'task/pipe' has "
                                "schedule '1f1b', which trains in one pass; "
                                'define OnePassTraining'):
      tf.function(task.Gradients, autograph=False)(replica_task.Batch())

  def testTheHeadMustReadItsVariablesThroughHeadTheta(self):
    task = _Task(2, 2, schedule='1f1b')
    pipe = task.pipe
    scale = tf.Variable(2.0, dtype=tf.float64)

    def Head(head_theta, out, batch):
      del head_theta
      loss = tf.reduce_mean(tf.square(out.x * scale - batch.y))
      return {'loss': (loss, tf.constant(4.0, tf.float64))}

    def Step(batch):
      with tf.GradientTape() as tape:
        metrics = pipe.FPropWithLoss(
            pipe.theta, NestedMap(x=batch.x, example_keys=tf.zeros(
                [8], tf.int64)), Head, NestedMap(), NestedMap(y=batch.y),
            tf.constant(8.0, tf.float64))
      return tape.gradient(metrics.loss[0], [scale] + pipe.vars.Flatten())

    with self.assertRaisesRegex(ValueError, 'the loss head reads variables '
                                r"\[.*\] directly; pass them in its "
                                'head_theta'):
      tf.function(Step, autograph=False)(replica_task.Batch())


if __name__ == '__main__':
  absltest.main()
