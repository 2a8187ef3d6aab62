"""Tests of ImageClassifier: metrics, decoding, and GPipe exactness.

The exactness tests run the same network (same initial weights) as a
2-partition pipeline and as one plain SequentialLayer, in float64, and
compare the loss and every variable's gradient. BatchNorm normalises each
micro-batch with its own statistics, so the reference runs the plain
network on the same micro-batches (and the whole batch when M = 1).
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.image import amoebanet  # noqa: E402
from lingvo_pipe.tasks.image import model  # noqa: E402
from lingvo_pipe.tasks.image import resnet  # noqa: E402

_BATCH = 4
_CLASSES = 6
_SIZE = 8


def _Batch(batch=_BATCH, seed=0):
  image = tf.random.stateless_normal([batch, _SIZE, _SIZE, 3], [seed, 1])
  label = tf.random.stateless_uniform([batch], [seed, 2], maxval=_CLASSES,
                                      dtype=tf.int32)
  return NestedMap(image=image, label=label)


def _PoolNetwork():
  """Pool, then project to the classes: the smallest image network."""
  return layers.SequentialLayer.Params().Set(sub=[
      resnet.GlobalAveragePoolLayer.Params().Set(name='pool'),
      layers.ProjectionLayer.Params().Set(name='proj', input_dim=3,
                                          output_dim=_CLASSES)])


def _Classifier(network, **kwargs):
  p = model.ImageClassifier.Params().Set(
      name='classifier', network=network, num_classes=_CLASSES)
  return p.Set(**kwargs).Instantiate()


def _NpLogSoftmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class MetricsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(0.0, 0.2)
  def testLossAndAccuracies(self, smoothing):
    task = _Classifier(_PoolNetwork(), label_smoothing=smoothing)
    logits = np.array([[5., 4, 3, 2, 1, 0],    # label 0: top1, top5
                       [5., 4, 3, 2, 1, 0],    # label 4: top5 only
                       [5., 4, 3, 2, 1, 0],    # label 5: neither
                       [0., 1, 0, 0, 0, 0]])   # label 1: top1
    labels = np.array([0, 4, 5, 1])
    batch = NestedMap(label=tf.constant(labels))
    metrics, per_example = task.ComputeLoss(
        task.theta, NestedMap(logits=tf.constant(logits)), batch)
    target = np.eye(_CLASSES)[labels] * (1 - smoothing) + smoothing / _CLASSES
    xent = -(target * _NpLogSoftmax(logits)).sum(-1)
    self.assertAllClose(xent, per_example.loss)
    self.assertAllClose((xent.mean(), 4.0), metrics['loss'])
    self.assertAllClose((0.5, 4.0), metrics['accuracy'])
    self.assertAllClose((0.75, 4.0), metrics['top5_accuracy'])
    self.assertAllEqual([True, False, False, True], per_example.correct)

  def testNoTop5WithFiveClassesOrFewer(self):
    p = _PoolNetwork()
    p.sub[1].output_dim = 5
    task = _Classifier(p, num_classes=5)
    metrics, _ = task.FProp(task.theta, _Batch())
    self.assertEqual(['accuracy', 'loss'], sorted(metrics))
    self.assertEqual(['accuracy'], sorted(task.CreateDecoderMetrics()))

  def testDecodeAndDecoderMetrics(self):
    task = _Classifier(_PoolNetwork())
    metrics = task.CreateDecoderMetrics()
    corrects = []
    for seed, size in ((0, 4), (1, 2)):
      batch = _Batch(size, seed)
      out = task.Decode(task.theta, batch)
      logits = task.ComputePredictions(task.theta, batch).logits.numpy()
      self.assertAllEqual(logits.argmax(-1), out.predicted)
      self.assertAllEqual(batch.label, out.label)
      self.assertAllEqual(out.predicted == out.label, out.correct)
      top5 = np.argsort(-logits, -1)[:, :5]
      self.assertAllEqual((top5 == batch.label.numpy()[:, None]).any(-1),
                          out.top5_correct)
      task.PostProcessDecodeOut(out.Transform(lambda t: t.numpy()), metrics)
      corrects.append(out.correct.numpy())
    # Weighted by examples over both batches, not a mean of batch means.
    self.assertAllClose(np.concatenate(corrects).mean(),
                        metrics['accuracy'].value)
    self.assertEqual(6, metrics['accuracy'].total_weight)

  def testNetworkInput(self):
    # 'image_and_keys' hands the network NestedMap(image, example_keys).
    net = layers.SequentialLayer.Params().Set(sub=[
        amoebanet.AmoebaStem.Params().Set(name='stem', filters=2),
        amoebanet.AmoebaHead.Params().Set(
            name='head', input_dim=2, num_classes=_CLASSES, keep_prob=0.5)])
    task = _Classifier(net, network_input='image_and_keys')
    batch = _Batch()
    with self.assertRaisesRegex(ValueError, 'needs example_keys'):
      task.FProp(task.theta, batch)
    batch.example_keys = dropout.ExampleKeys(0, _BATCH)
    metrics, _ = task.FProp(task.theta, batch)
    self.assertTrue(np.isfinite(metrics['loss'][0].numpy()))

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'set p.network'):
      _Classifier(None)
    with self.assertRaisesRegex(ValueError, "network_input='keys'"):
      _Classifier(_PoolNetwork(), network_input='keys')
    with self.assertRaisesRegex(ValueError, 'expected logits of shape '
                                r'\[4, 7\] \(num_classes=7\)'):
      task = _Classifier(_PoolNetwork(), num_classes=7)
      task.FProp(task.theta, _Batch())


def _ResNetLayers():
  return resnet.ResNet((1, 1), (3, 4), _CLASSES)


def _AmoebaLayers():
  """Stem, normal cell, aux head, reduction cell, normal cell, head.

  Smaller than the smallest AmoebaNet (3 normal and 2 reduction cells), to
  keep the trace short, but it has both of AmoebaNet-D's cells, a cell
  without prev, one whose prev is 1x1-projected and one whose prev is
  reduced, the auxiliary head, drop-path (mid burn-in at step 5) and
  dropout.
  """
  cell = amoebanet.AmoebaCell.Params().Set(
      filters=4, drop_path_keep_prob=0.6, drop_path_burn_in_steps=8)
  return [
      amoebanet.AmoebaStem.Params().Set(name='stem', filters=3),
      cell.Copy().Set(name='normal0', prev_dim=0, cur_dim=3),
      amoebanet.AmoebaAuxHead.Params().Set(
          name='aux_head', input_dim=16, input_size=(6, 6),
          num_classes=_CLASSES, scaling=0.05),
      cell.Copy().Set(name='reduction', stride=2, prev_dim=3, cur_dim=16,
                      spec=amoebanet.ops.AMOEBANET_D_REDUCTION),
      cell.Copy().Set(name='normal1', prev_dim=16, cur_dim=12,
                      reduce_prev=True),
      amoebanet.AmoebaHead.Params().Set(
          name='head', input_dim=16, num_classes=_CLASSES, keep_prob=0.7)]


_NETWORKS = {
    'ResNet': (_ResNetLayers, 'image'),
    'AmoebaNet': (_AmoebaLayers, 'image_and_keys'),
}


def _PipelinedTask(name, num_micro_batches):
  make, network_input = _NETWORKS[name]
  b = _BATCH // num_micro_batches
  shapes = tf.TensorShape([b, _SIZE, _SIZE, 3])
  if network_input != 'image':
    shapes = NestedMap(image=shapes, example_keys=tf.TensorShape([b]),
                       example_steps=tf.TensorShape([b]))
  network = model.GPipeNetworkParams(make(), 2, num_micro_batches, shapes)
  return _Classifier(network, network_input=network_input,
                     dtype=tf.float64, label_smoothing=0.1)


def _ReferenceTask(name):
  make, network_input = _NETWORKS[name]
  network = layers.SequentialLayer.Params().Set(sub=make())
  return _Classifier(network, network_input=network_input,
                     dtype=tf.float64, label_smoothing=0.1)


def _VarsByLayerPath(task):
  """{path without the pipeline's cell_k: variable}."""
  out = {}
  for path, var in task.VariablesByPath().items():
    parts = [p for p in path.split('/') if not p.startswith('cell_')]
    out['/'.join(parts)] = var
  return out


def _Grads(task, loss_fn, batch):
  variables = [v for _, v in sorted(_VarsByLayerPath(task).items())
               if v.trainable]

  @tf.function(autograph=False)
  def Step(batch):
    with tf.GradientTape() as tape:
      loss = loss_fn(batch)
    return loss, tape.gradient(loss, variables)

  loss, grads = Step(batch)
  names = [n for n, v in sorted(_VarsByLayerPath(task).items())
           if v.trainable]
  return loss, dict(zip(names, grads))


class PipelineExactnessTest(tf.test.TestCase, parameterized.TestCase):

  # AmoebaNet traces slowly (many small ops): only M = 2 for it.
  @parameterized.named_parameters(
      ('ResNetM1', 'ResNet', 1),
      ('ResNetM2', 'ResNet', 2),
      ('AmoebaNetM2', 'AmoebaNet', 2),
  )
  def testEveryGradientMatchesUnpipelined(self, network, m):
    pipe = _PipelinedTask(network, m)
    ref = _ReferenceTask(network)
    self.assertEqual(2, pipe.NumDevicesNeeded())
    pipe_vars, ref_vars = _VarsByLayerPath(pipe), _VarsByLayerPath(ref)
    self.assertEqual(sorted(ref_vars), sorted(pipe_vars))
    self.assertLen({v.device for v in pipe_vars.values()}, 2)
    for name, var in ref_vars.items():  # same seed paths, same weights
      self.assertAllEqual(var, pipe_vars[name], msg=name)
    batch = _Batch()
    batch.image = tf.cast(batch.image, tf.float64)
    batch.example_keys = dropout.ExampleKeys(5, _BATCH)
    for task in (pipe, ref):  # drop-path keeps 1 - 5/8 * 0.4 = 0.75
      task.CreateTrainState().global_step.assign(5)

    def PipeLoss(batch):
      return pipe.FProp(pipe.theta, batch)[0]['loss'][0]

    def RefLoss(batch):
      parts = [NestedMap(image=x, example_keys=k) for x, k in zip(
          tf.split(batch.image, m), tf.split(batch.example_keys, m))]
      per_part = [ref.ComputePredictions(ref.theta, part) for part in parts]
      predictions = tf.nest.map_structure(lambda *t: tf.concat(t, 0),
                                          *per_part)
      metrics, _ = ref.ComputeLoss(ref.theta, predictions, batch)
      return metrics['loss'][0]

    pipe_loss, pipe_grads = _Grads(pipe, PipeLoss, batch)
    ref_loss, ref_grads = _Grads(ref, RefLoss, batch)
    self.assertAllClose(ref_loss, pipe_loss, atol=1e-10, rtol=0)
    self.assertEqual(sorted(ref_grads), sorted(pipe_grads))
    for name, grad in ref_grads.items():
      self.assertIsNotNone(grad, msg=name)
      self.assertGreater(np.abs(grad.numpy()).max(), 0, msg=name)
      self.assertAllClose(grad, pipe_grads[name], atol=1e-10, rtol=0,
                          msg=name)


  @parameterized.named_parameters(('gpipe', 'gpipe'), ('1f1b', '1f1b'))
  def testOnePassTrainingMatchesUnpipelined(self, schedule):
    """The training step's one pass against the unpipelined classifier."""
    m = 2
    make, _ = _NETWORKS['ResNet']
    shapes = tf.TensorShape([_BATCH // m, _SIZE, _SIZE, 3])
    network = model.GPipeNetworkParams(make(), 2, m, shapes)
    network.schedule = schedule
    pipe = _Classifier(network, dtype=tf.float64, label_smoothing=0.1)
    ref = _ReferenceTask('ResNet')
    batch = _Batch()
    batch.image = tf.cast(batch.image, tf.float64)
    batch.example_keys = dropout.ExampleKeys(5, _BATCH)
    metrics, grads = tf.function(pipe.Gradients, autograph=False)(batch)
    grads = {'/'.join(p for p in n.split('/') if not p.startswith('cell_')):
             g for n, g in grads.items()}

    def RefLoss(batch):
      parts = [NestedMap(image=x, label=y) for x, y in zip(
          tf.split(batch.image, m), tf.split(batch.label, m))]
      per_part = [ref.ComputePredictions(ref.theta, part) for part in parts]
      predictions = tf.nest.map_structure(lambda *t: tf.concat(t, 0),
                                          *per_part)
      return ref.ComputeLoss(ref.theta, predictions, batch)[0]['loss'][0]

    ref_loss, ref_grads = _Grads(ref, RefLoss, batch)
    self.assertAllClose(ref_loss, metrics.loss[0], atol=1e-10, rtol=0)
    self.assertEqual(sorted(ref_grads), sorted(grads))
    for name, grad in ref_grads.items():
      self.assertAllClose(grad, grads[name], atol=1e-10, rtol=0, msg=name)

if __name__ == '__main__':
  absltest.main()
