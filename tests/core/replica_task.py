"""A tiny pipelined regression task for the data-parallel tests.

y = pipe(x): `num_blocks` blocks of tanh(x w + b) -> [BatchNorm] ->
dropout (keyed by example), split evenly over K partitions; loss =
mean_b 0.5 * |y - target|^2. Block names are unique across partitions, so
initial values and dropout masks do not depend on K (gpipe module
docstring), and a gradient's name without its `cell_<k>/` part names the
same variable whatever K.
"""

import re

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import base_model
from lingvo_pipe.core import dropout
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core import optimizer
from lingvo_pipe.core.nested_map import NestedMap

DIM = 4


class Block(base_layer.BaseLayer):
  """NestedMap(x [b, DIM], example_keys [b]) -> the same, x through a block."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('batch_norm', False, 'BatchNorm after the projection.')
    p.Define('keep_prob', 1.0, 'Dropout keep probability.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('proj', layers.ProjectionLayer.Params().Set(
        input_dim=DIM, output_dim=DIM, activation='TANH'))
    if p.batch_norm:
      self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(
          dim=DIM, decay=0.5))
    self.CreateChild('drop', dropout.DropoutLayer.Params().Set(
        keep_prob=p.keep_prob))

  def FProp(self, theta, inputs):
    x = self.proj.FProp(theta.proj, inputs.x)
    if self.params.batch_norm:
      x = self.bn.FProp(theta.bn, x)
    x = self.drop.FProp(theta.drop, x, inputs.example_keys)
    return NestedMap(x=x, example_keys=inputs.example_keys)


class ReplicaTask(base_model.BaseTask):
  """The module docstring's task; `pipe` params hold K, M and devices."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.dtype = tf.float64
    p.train.optimizer = optimizer.SGD.Params()
    p.train.learning_rate = 0.5
    p.Define('pipe', None, 'PipeliningLayer params (see TaskParams).')
    p.Define('one_pass', False,
             'Train in one pass (OnePassTraining) instead of through FProp.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('pipe', self.params.pipe)

  def ComputePredictions(self, theta, input_batch):
    out = self.pipe.FProp(theta.pipe, NestedMap(
        x=input_batch.x, example_keys=input_batch.example_keys))
    return NestedMap(y=out.x)

  def OnePassTraining(self, theta, input_batch):
    if not self.params.one_pass:
      return None

    def Head(unused_head_theta, out, batch):
      return self.ComputeLoss(None, NestedMap(y=out.x), batch)[0]

    return base_model.OnePass(
        network=self.pipe, theta=theta.pipe,
        inputs=NestedMap(x=input_batch.x,
                         example_keys=input_batch.example_keys),
        head=Head, head_theta=NestedMap(),
        head_batch=NestedMap(y=input_batch.y),
        loss_weight=tf.cast(tf.shape(input_batch.x)[0], tf.float64))

  def ComputeLoss(self, theta, predictions, input_batch):
    err = predictions.y - input_batch.y
    per_example = 0.5 * tf.reduce_sum(tf.square(err), axis=-1)
    n = tf.cast(tf.shape(err)[0], err.dtype)
    return {'loss': (tf.reduce_mean(per_example), n)}, NestedMap(
        loss=per_example)


def _Blocks(num_blocks, batch_norm, keep_prob):
  """Params of blocks b0 .. b<num_blocks - 1>."""
  return [Block.Params().Set(name=f'b{i}', batch_norm=batch_norm,
                             keep_prob=keep_prob) for i in range(num_blocks)]


def TaskParams(partitions, micro_batches, replicas=1, devices=None,
               batch_norm=True, keep_prob=0.7, num_blocks=4, schedule='gpipe',
               one_pass=False, recompute='always'):
  """ReplicaTask params: `num_blocks` blocks over `partitions` cells,
  `micro_batches` (M, over every replica) micro-batches."""
  blocks = _Blocks(num_blocks, batch_norm, keep_prob)
  per = num_blocks // partitions
  cells = [layers.SequentialLayer.Params().Set(sub=blocks[k * per:
                                                          (k + 1) * per])
           for k in range(partitions)]
  p = ReplicaTask.Params().Set(name='task')
  p.pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', cell_tpl=cells, num_micro_batches=micro_batches,
      devices=devices, schedule=schedule, recompute=recompute)
  p.train.num_replicas = replicas
  p.one_pass = one_pass
  return p


def Batch(size=8, seed=0, keys=False):
  """x, y [size, DIM] float64; with `keys` also example_keys (the task
  then uses them rather than making its own)."""
  x = tf.random.stateless_normal([size, DIM], [seed, 1], dtype=tf.float64)
  y = tf.random.stateless_normal([size, DIM], [seed, 2], dtype=tf.float64)
  batch = NestedMap(x=x, y=y)
  if keys:
    batch.example_keys = dropout.ExampleKeys(
        tf.constant(seed + 3, tf.int64), size)
  return batch


class PlainModel(base_layer.BaseLayer):
  """The task's layers with no pipeline: `pipe`, the blocks in a plain
  SequentialLayer (seed paths as the task's: task/pipe/b<i>), and with
  `pre_post` a projection before it and one after it (one_pass_task_test's
  task)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.dtype = tf.float64
    p.Define('blocks', [], 'Block params, in order.')
    p.Define('pre_post', False, 'Projections before and after the blocks.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('pipe', layers.SequentialLayer.Params().Set(
        sub=list(p.blocks)))
    if p.pre_post:
      for name in ('pre', 'post'):
        self.CreateChild(name, layers.ProjectionLayer.Params().Set(
            input_dim=DIM, output_dim=DIM))


def PlainGradients(task, batch, micro_batches, num_blocks=4, keep_prob=0.7,
                   batch_norm=True, pre_post=False):
  """(loss, {Name(path): gradient}) of `task`'s model at its variables'
  values, computed with no PipeliningLayer and none of BaseTask's code:
  PlainModel, the batch's M micro-batches through the blocks one after
  another (BatchNorm normalises each, as in the pipeline; dropout keyed by
  batch.example_keys), the loss mean_b 0.5 |y - target|^2 written out, one
  tf.GradientTape. Every variable of the plain model takes the task's
  value of the same Name (an error if the task has none)."""
  blocks = _Blocks(num_blocks, batch_norm, keep_prob)
  model = PlainModel.Params().Set(name='task', blocks=blocks,
                                  pre_post=pre_post).Instantiate()
  values = Values(task)
  for path, var in model.VariablesByPath().items():
    if path not in values:
      raise AssertionError(f'the task has no variable {path}')
    var.assign(values[path])
  model.SetTraining(True)
  trainable = {p: v for p, v in model.VariablesByPath().items()
               if v.trainable}
  theta = model.theta
  with tf.GradientTape() as tape:
    x = batch.x
    if pre_post:
      x = model.pre.FProp(theta.pre, x)
    outs = [model.pipe.FProp(theta.pipe, NestedMap(x=xs, example_keys=ks)).x
            for xs, ks in zip(tf.split(x, micro_batches),
                              tf.split(batch.example_keys, micro_batches))]
    y = tf.concat(outs, 0)
    if pre_post:
      y = model.post.FProp(theta.post, y)
    loss = tf.reduce_mean(
        0.5 * tf.reduce_sum(tf.square(y - batch.y), axis=-1))
  grads = tape.gradient(loss, trainable)
  return float(loss), {p: g.numpy() for p, g in grads.items()}


def Name(path):
  """A variable's path without the partition: the same for every K."""
  return re.sub(r'/cell_\d+', '', path)


def Gradients(task, batch):
  """(loss, {Name(path): gradient}) as numpy, from task.Gradients."""
  loss_and_grads = tf.function(task.Gradients, autograph=False)(batch)
  metrics, grads = loss_and_grads
  return float(metrics.loss[0]), {Name(k): np.asarray(v)
                                  for k, v in grads.items()}


def Values(task):
  """{Name(path): value} of every variable (trainable or not)."""
  return {Name(k): v.numpy() for k, v in task.VariablesByPath().items()}


def Worst(a, b):
  """Largest absolute difference between two {name: array} of equal keys."""
  if sorted(a) != sorted(b):
    raise AssertionError(f'different variables: {sorted(a)} vs {sorted(b)}')
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
