"""Tests of BaseTask's training machinery on a tiny regression task.

Exactness checks use SGD in float64, where one step is easy to write in
numpy: y = x @ w + b, loss = mean_b 0.5 * |y - target|^2, so
dw = x^T (y - target) / B and db = sum_b (y - target) / B.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import lr_schedule  # noqa: E402
from lingvo_pipe.core import normalization  # noqa: E402
from lingvo_pipe.core import optimizer  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

_BATCH, _IN, _OUT = 8, 3, 2
_TOL = dict(atol=1e-12, rtol=1e-12)


class RegressionTask(base_model.BaseTask):
  """y = proj(dropout(bn(x))); loss = mean_b 0.5 * |y - batch.y|^2.

  The input batch is NestedMap(x [b, in], y [b, out]); bn is optional.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Dropout keep probability of the input.')
    p.Define('batch_norm', False, 'Whether to normalise the input first.')
    p.dtype = tf.float64
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.batch_norm:
      self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(
          dim=_IN, decay=0.5))
    self.CreateChild('drop', dropout.DropoutLayer.Params().Set(
        keep_prob=p.keep_prob))
    self.CreateChild('proj', layers.ProjectionLayer.Params().Set(
        input_dim=_IN, output_dim=_OUT))

  def ComputePredictions(self, theta, input_batch):
    x = input_batch.x
    if self.params.batch_norm:
      x = self.bn.FProp(theta.bn, x)
    x = self.drop.FProp(theta.drop, x, input_batch.example_keys)
    return NestedMap(y=self.proj.FProp(theta.proj, x))

  def ComputeLoss(self, theta, predictions, input_batch):
    err = predictions.y - input_batch.y
    per_example = 0.5 * tf.reduce_sum(tf.square(err), axis=-1)
    n = tf.cast(tf.shape(err)[0], err.dtype)
    metrics = {'loss': (tf.reduce_mean(per_example), n),
               'abs_err': (tf.reduce_mean(tf.abs(err)), n)}
    return metrics, NestedMap(loss=per_example)


def _Task(opt=None, lr=0.1, **kwargs):
  p = RegressionTask.Params()
  p.train.optimizer = opt or optimizer.SGD.Params()
  p.train.learning_rate = lr
  for key, value in kwargs.items():
    if key in p.train:
      p.train.Set(**{key: value})
    else:
      p.Set(**{key: value})
  return p.Instantiate()


def _Batch(seed=0, nan=False):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(_BATCH, _IN))
  if nan:
    x[1, 2] = np.nan
  w = np.array([[1.0, -2.0], [0.5, 0.0], [-1.0, 3.0]])
  y = x @ w + 0.1 * rng.normal(size=(_BATCH, _OUT))
  return NestedMap(x=tf.constant(x), y=tf.constant(y))


def _NpGrads(x, y, w, b):
  r = x @ w + b - y
  return x.T @ r / len(x), r.sum(0) / len(x)


def _Values(variables):
  return {k: v.numpy() for k, v in variables.items()}


class BaseTaskTest(tf.test.TestCase, parameterized.TestCase):

  def _TrainFn(self, task):
    task.CreateTrainState()
    return tf.function(task.TrainStep, autograph=False)

  @parameterized.named_parameters(
      ('SGD', optimizer.SGD.Params(), 0.1),
      ('Momentum', optimizer.Momentum.Params(), 0.05),
      ('Nesterov', optimizer.Momentum.Params().Set(use_nesterov=True), 0.05),
      ('Adam', optimizer.Adam.Params(), 0.1),
      ('RMSProp', optimizer.RMSProp.Params(), 0.05),
      ('RMSPropMomentum', optimizer.RMSProp.Params().Set(momentum=0.5), 0.02),
      ('Adafactor', optimizer.Adafactor.Params().Set(beta1=0.5), 0.1),
  )
  def testEachOptimizerReducesTheLoss(self, opt, lr):
    task = _Task(opt, lr)
    step = self._TrainFn(task)
    batch = _Batch()
    losses = [step(batch).loss.numpy() for _ in range(20)]
    self.assertLess(losses[-1], 0.3 * losses[0])
    self.assertEqual(20, task.train_state.global_step.numpy())

  def testOutputs(self):
    task = _Task(lr_schedule=lr_schedule.Piecewise.Params().Set(
        boundaries=[1], values=[1.0, 0.5]))
    step = self._TrainFn(task)
    first, second = step(_Batch()), step(_Batch())
    self.assertCountEqual(
        ['loss', 'abs_err', 'learning_rate', 'grad_norm', 'is_finite',
         'global_step'], first.keys())
    self.assertEqual(tf.float32, first.learning_rate.dtype)
    self.assertAllClose([0.1, 0.05],
                        [first.learning_rate, second.learning_rate])
    self.assertEqual([1, 2], [first.global_step, second.global_step])
    self.assertTrue(first.is_finite)

  def testSgdStepWithClippingMatchesNumpy(self):
    task = _Task(lr=0.5, clip_gradient_norm_to_value=0.05)
    step = self._TrainFn(task)
    batch = _Batch()
    w, b = task.proj.vars.w.numpy(), task.proj.vars.b.numpy()
    dw, db = _NpGrads(batch.x.numpy(), batch.y.numpy(), w, b)
    norm = np.sqrt(np.sum(dw**2) + np.sum(db**2))
    self.assertGreater(norm, 0.05)  # so it clips
    out = step(batch)
    self.assertAllClose(norm, out.grad_norm, **_TOL)
    scale = 0.05 / norm
    self.assertAllClose(w - 0.5 * scale * dw, task.proj.vars.w, **_TOL)
    self.assertAllClose(b - 0.5 * scale * db, task.proj.vars.b, **_TOL)

  def testClippingAboveTheNormChangesNothing(self):
    task = _Task(lr=0.5, clip_gradient_norm_to_value=1e6)
    w = task.proj.vars.w.numpy()
    batch = _Batch()
    dw, _ = _NpGrads(batch.x.numpy(), batch.y.numpy(), w,
                     task.proj.vars.b.numpy())
    self._TrainFn(task)(batch)
    self.assertAllClose(w - 0.5 * dw, task.proj.vars.w, **_TOL)

  def testSgdWeightDecayAndEmaMatchNumpy(self):
    task = _Task(lr=0.5, weight_decay=0.1, ema_decay=0.9,
                 lr_schedule=lr_schedule.Piecewise.Params().Set(
                     boundaries=[1], values=[1.0, 0.5]))
    step = self._TrainFn(task)
    ema = task.train_state.ema.shadows
    self.assertCountEqual(['task/proj/w', 'task/proj/b'], ema)
    w, b = task.proj.vars.w.numpy(), task.proj.vars.b.numpy()
    ema_w, ema_b = w, b
    for i, lr in enumerate((0.5, 0.25)):
      batch = _Batch(seed=i)
      dw, db = _NpGrads(batch.x.numpy(), batch.y.numpy(), w, b)
      w = w - lr * dw - lr * 0.1 * w
      b = b - lr * db - lr * 0.1 * b
      ema_w = 0.9 * ema_w + 0.1 * w
      ema_b = 0.9 * ema_b + 0.1 * b
      step(batch)
      self.assertAllClose(w, task.proj.vars.w, **_TOL)
      self.assertAllClose(b, task.proj.vars.b, **_TOL)
      self.assertAllClose(ema_w, ema['task/proj/w'], **_TOL)
      self.assertAllClose(ema_b, ema['task/proj/b'], **_TOL)
    # Eval reads the EMA weights by default.
    x, y = _Batch(seed=5).x.numpy(), _Batch(seed=5).y.numpy()
    want = 0.5 * np.mean(np.sum((x @ ema_w + ema_b - y)**2, -1))
    got = task.EvalStep(_Batch(seed=5))
    self.assertAllClose(want, got.loss[0], **_TOL)
    self.assertAllClose(8, got.loss[1])
    raw = task.EvalStep(_Batch(seed=5), use_ema=False).loss[0]
    self.assertAllClose(0.5 * np.mean(np.sum((x @ w + b - y)**2, -1)), raw,
                        **_TOL)

  def testNonFiniteLossChangesNothing(self):
    task = _Task(optimizer.Adam.Params(), ema_decay=0.9, batch_norm=True)
    step = self._TrainFn(task)
    self.assertTrue(step(_Batch()).is_finite)
    before = _Values(task.VariablesToCheckpoint())
    out = step(_Batch(nan=True))
    self.assertFalse(out.is_finite)
    self.assertTrue(np.isnan(out.loss))
    self.assertEqual(1, out.global_step)
    after = _Values(task.VariablesToCheckpoint())
    self.assertCountEqual(before, after)
    for name in before:
      self.assertAllEqual(before[name], after[name], msg=name)
    # The bad batch's statistics are dropped, and training goes on.
    for acc in task.accumulators.Flatten():
      self.assertAllEqual(np.zeros(acc.shape), acc.numpy())
    out = step(_Batch())
    self.assertTrue(out.is_finite)
    self.assertEqual(2, out.global_step)
    self.assertTrue(np.all(np.isfinite(task.bn.vars.moving_mean.numpy())))

  def testBatchNormStatisticsAreUpdated(self):
    task = _Task(batch_norm=True)
    batch = _Batch()
    self._TrainFn(task)(batch)
    x = batch.x.numpy()
    self.assertAllClose(0.5 * x.mean(0), task.bn.vars.moving_mean, **_TOL)
    self.assertAllClose(0.5 + 0.5 * x.var(0), task.bn.vars.moving_variance,
                        **_TOL)

  def testDropoutInTrainingOnlyWithExampleKeysOfTheStep(self):
    task = _Task(lr=0.0, keep_prob=0.5)
    step = self._TrainFn(task)
    batch = _Batch()
    eval_step = tf.function(task.EvalStep, autograph=False)
    w, b = task.proj.vars.w.numpy(), task.proj.vars.b.numpy()
    x, y = batch.x.numpy(), batch.y.numpy()
    no_dropout = 0.5 * np.mean(np.sum((x @ w + b - y)**2, -1))
    self.assertAllClose(no_dropout, eval_step(batch).loss[0], **_TOL)
    for i in range(2):
      keep = task.drop.FProp(NestedMap(), tf.ones_like(batch.x),
                             dropout.ExampleKeys(i, _BATCH)).numpy()
      self.assertTrue(np.any(keep == 0))
      want = 0.5 * np.mean(np.sum((x * keep @ w + b - y)**2, -1))
      self.assertAllClose(want, step(batch).loss, **_TOL)
    # Tracing the steps did not change the layers' mode flags.
    self.assertTrue(all(layer.training for layer in task.Layers()))
    task.SetTraining(False)
    self.assertAllClose(no_dropout, eval_step(batch).loss[0], **_TOL)
    self.assertFalse(any(layer.training for layer in task.Layers()))

  def testVariablesToCheckpoint(self):
    task = _Task(optimizer.Adam.Params(), ema_decay=0.5, batch_norm=True)
    self.assertCountEqual(
        ['task/proj/w', 'task/proj/b', 'task/bn/beta', 'task/bn/gamma',
         'task/bn/moving_mean', 'task/bn/moving_variance'],
        task.VariablesToCheckpoint())
    state = task.CreateTrainState()
    self.assertIs(state, task.CreateTrainState())
    names = task.VariablesToCheckpoint()
    trainable = ['task/proj/w', 'task/proj/b', 'task/bn/beta',
                 'task/bn/gamma']
    self.assertCountEqual(
        ['task/bn/moving_mean', 'task/bn/moving_variance', 'global_step',
         'optimizer/step'] + trainable + [f'{t}/{s}' for t in trainable
                                          for s in ('m', 'v', 'ema')],
        names)
    self.assertIs(state.global_step, names['global_step'])
    self.assertEqual(tf.int64, state.global_step.dtype)
    self.assertIs(state.optimizer.slots['task/proj/w']['m'],
                  names['task/proj/w/m'])

  def testNumDevicesNeededFromParams(self):
    def Pipeline(k):
      cell = layers.ProjectionLayer.Params().Set(input_dim=2, output_dim=2)
      return gpipe.PipeliningLayer.Params().Set(cell_tpl=[cell] * k)

    p = RegressionTask.Params()
    self.assertEqual(1, base_model.NumDevicesNeeded(p))
    holder = base_model.BaseTask.Params()
    holder.Define('encoder', Pipeline(3), 'A 3-cell pipeline.')
    self.assertEqual(3, base_model.NumDevicesNeeded(holder))
    self.assertEqual(3, base_model.BaseTask.NumDevicesNeededFromParams(
        holder))
    holder.Define('stacks', [Pipeline(2), {'deep': [Pipeline(4)]}],
                  'Pipelines in a list and a dict.')
    self.assertEqual(4, base_model.NumDevicesNeeded(holder))
    self.assertEqual(4, base_model.NumDevicesNeeded(holder.Copy().Freeze()))
    self.assertEqual(2, base_model.NumDevicesNeeded([Pipeline(2)]))

  def testPlacePipelines(self):
    def Pipeline(k):
      cell = layers.ProjectionLayer.Params().Set(input_dim=2, output_dim=2)
      return gpipe.PipeliningLayer.Params().Set(cell_tpl=[cell] * k)

    holder = base_model.BaseTask.Params()
    holder.Define('encoder', Pipeline(3), 'A 3-cell pipeline.')
    holder.Define('stacks', [Pipeline(2), {'deep': [Pipeline(1)]}],
                  'Pipelines in a list and a dict.')
    holder.stacks[0].devices = ['/job:other/task:0', '/job:other/task:1']
    names = [f'/job:worker/task:{i}' for i in range(6)]
    self.assertEqual(
        [('task.encoder', holder.encoder), ('task.stacks[0]', holder.stacks[0]),
         ("task.stacks[1]['deep'][0]", holder.stacks[1]['deep'][0])],
        base_model.PipelineParams(holder))
    self.assertEqual(2, base_model.PlacePipelines(holder, names))
    self.assertEqual(names[:3], holder.encoder.devices)
    self.assertEqual(names[:1], holder.stacks[1]['deep'][0].devices)
    self.assertEqual(['/job:other/task:0', '/job:other/task:1'],
                     holder.stacks[0].devices)  # it named its own

    p = Pipeline(3)
    with self.assertRaisesRegex(ValueError, r'3 partitions x 1 replica\(s\) '
                                '= 3 tasks but the cluster has 2;'):
      base_model.PlacePipelines(p, names[:2])
    with self.assertRaisesRegex(ValueError, r'x 3 replica\(s\) = 9 tasks'):
      base_model.PlacePipelines(p, names, replicas=3)
    self.assertEqual(base_model.PlacePipelines(p, names, replicas=2), 1)
    self.assertEqual(p.devices, names)
    # Interleaved: 4 stages, V=2 per device, so K=2 devices per replica.
    p = Pipeline(4).Set(schedule='interleaved_1f1b', num_virtual_stages=2)
    self.assertEqual(base_model.PlacePipelines(p, names, replicas=3), 1)
    self.assertEqual(p.devices, names)
    self.assertEqual(2, base_model.NumDevicesNeeded(p))  # the same K

  def testPipelinedTaskTrainsWithStateOnEachPartition(self):
    task = _PipelinedTask.Params().Instantiate()
    self.assertEqual(2, task.NumDevicesNeeded())
    state = task.CreateTrainState()
    cells = task.pipe.cells
    self.assertNotEqual(cells[0].vars.w.device, cells[1].vars.w.device)
    for cell in cells:
      path = cell.vars.w.name.split(':')[0]
      for slot in state.optimizer.slots[path].values():
        self.assertEqual(cell.vars.w.device, slot.device)
      self.assertEqual(cell.vars.w.device, state.ema.shadows[path].device)
    step = tf.function(task.TrainStep, autograph=False)
    losses = [step(_Batch()).loss.numpy() for _ in range(3)]
    self.assertLess(losses[-1], losses[0])
    # Inside the skip-if-not-finite cond, every slot, weight and EMA update
    # is on its partition's device (the step counters are not per-var).
    graph_def = step.get_concrete_function(_Batch()).graph.as_graph_def()
    by_device = {}
    for fn in graph_def.library.function:
      for node in fn.node_def:
        if node.op in ('AssignVariableOp', 'AssignSubVariableOp') and (
            '/step' not in node.name):
          by_device.setdefault(node.device, []).append(node.name)
    # Per partition: w and b, each with m, v, the weight and the EMA.
    self.assertEqual({cells[0].vars.w.device: 8, cells[1].vars.w.device: 8},
                     {d: len(names) for d, names in by_device.items()})

  def testCheckpointNamesDoNotDependOnTheSplit(self):
    """Cells of uniquely named layers: no cell index in any saved name.

    Slots and EMA shadows are named after their variable's path and sit
    on its device, whichever partition holds it.
    """
    proj = layers.ProjectionLayer.Params
    subs = [proj().Set(name='a', input_dim=_IN, output_dim=4),
            proj().Set(name='b', input_dim=4, output_dim=4),
            proj().Set(name='c', input_dim=4, output_dim=_OUT)]
    weights = [f'task/pipe/{n}/{v}' for n in 'abc' for v in 'wb']
    want = ['global_step', 'optimizer/step'] + weights + [
        f'{w}/{s}' for w in weights for s in ('m', 'v', 'ema')]
    for split in ([3], [1, 2], [1, 1, 1]):
      ends = np.cumsum([0] + split)
      p = _PipelinedTask.Params()
      p.pipe.cell_tpl = [layers.SequentialLayer.Params().Set(sub=subs[i:j])
                         for i, j in zip(ends[:-1], ends[1:])]
      task = p.Instantiate()
      state = task.CreateTrainState()
      names = task.VariablesToCheckpoint()
      self.assertCountEqual(want, names, split)
      for cell in task.pipe.cells:
        device = cell.vars.Flatten()[0].device
        for layer in cell.children:
          for v in 'wb':
            path = f'task/pipe/{layer}/{v}'
            self.assertEqual(device, names[path].device, path)
            self.assertIs(state.optimizer.slots[path]['m'], names[f'{path}/m'])
            self.assertIs(state.ema.shadows[path], names[f'{path}/ema'])
            for s in ('m', 'v', 'ema'):
              self.assertEqual(device, names[f'{path}/{s}'].device, (path, s))
      self.assertLen({c.vars.Flatten()[0].device for c in task.pipe.cells},
                     len(split))

  def testErrors(self):
    task = _Task()
    with self.assertRaisesRegex(RuntimeError, r'call CreateTrainState\(\)'):
      task.TrainStep(_Batch())
    with self.assertRaisesRegex(ValueError, 'ema_decay=1.0 must be in'):
      _Task(ema_decay=1.0)
    with self.assertRaisesRegex(ValueError, 'weight_decay=-1 must be'):
      _Task(weight_decay=-1)
    with self.assertRaisesRegex(NotImplementedError, 'has no Decode'):
      task.DecodeStep(_Batch())
    self.assertEqual({}, task.CreateDecoderMetrics())

    bad = _BadTask.Params().Instantiate()
    bad.CreateTrainState()
    with self.assertRaisesRegex(ValueError, "metrics with a 'loss' entry"):
      bad.EvalStep(NestedMap(x=tf.ones([2, 1])))
    bad_names = _BadTask.Params().Set(metric_name='grad_norm').Instantiate()
    bad_names.CreateTrainState()
    with self.assertRaisesRegex(ValueError, r"\['grad_norm'\] are reserved"):
      bad_names.TrainStep(NestedMap(x=tf.ones([2, 1])))

  def testAverageMetric(self):
    metric = base_model.AverageMetric()
    self.assertEqual(0.0, metric.value)
    metric.Update(1.0, 3.0)
    metric.Update(5.0)
    self.assertEqual(2.0, metric.value)


class _PipelinedTask(base_model.BaseTask):
  """y = pipe(x): two projections, one per partition, two micro-batches."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.dtype = tf.float64
    p.train.optimizer = optimizer.Adam.Params()
    p.train.learning_rate = 0.05
    p.train.ema_decay = 0.9
    cells = [layers.ProjectionLayer.Params().Set(input_dim=_IN, output_dim=4),
             layers.ProjectionLayer.Params().Set(input_dim=4,
                                                 output_dim=_OUT)]
    p.Define('pipe', gpipe.PipeliningLayer.Params().Set(
        cell_tpl=cells, num_micro_batches=2), 'The pipeline.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('pipe', self.params.pipe)

  def ComputePredictions(self, theta, input_batch):
    return NestedMap(y=self.pipe.FProp(theta.pipe, input_batch.x))

  def ComputeLoss(self, theta, predictions, input_batch):
    return RegressionTask.ComputeLoss(self, theta, predictions, input_batch)


class _BadTask(base_model.BaseTask):
  """Returns metrics without 'loss', or with a reserved name."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('metric_name', 'mse', 'Name of the only metric.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('proj', layers.ProjectionLayer.Params().Set(
        input_dim=1, output_dim=1))

  def ComputePredictions(self, theta, input_batch):
    return NestedMap(y=self.proj.FProp(theta.proj, input_batch.x))

  def ComputeLoss(self, theta, predictions, input_batch):
    value = tf.reduce_mean(predictions.y)
    metrics = {self.params.metric_name: (value, 1.0)}
    if self.params.metric_name != 'mse':
      metrics['loss'] = (value, 1.0)
    return metrics, NestedMap()


if __name__ == '__main__':
  absltest.main()
