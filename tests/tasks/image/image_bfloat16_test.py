"""Image models train in bfloat16 (task.fprop_dtype) as in float32.

ResNetTinyGPipe (K=2, M=4) on the 'tiny' synthetic images (200 train, 100
test), trained for _STEPS steps from the same initial weights and batches
in float32 and in bfloat16: both learn (test accuracy > 0.8 from chance),
and bfloat16's test accuracy is float32's within _ACCURACY_NOISE, twice
float32's own standard deviation over seeds. Measured with this recipe,
seeds 1-5 (initial weights and batch order), test accuracy after 20 / 40
steps: float32 0.69-0.80 / 0.92-1.00 (standard deviation 0.029 at 40);
bfloat16 minus float32 of the same seed -0.02 to +0.02 / -0.01 to 0.

The tiny AmoebaNet-D of tiny_models (K=2) trains one step, evaluates and
decodes in bfloat16; AmoebaNet-B's and -D's published cells (every op,
the ImageNet stem, drop-path, dropout, the auxiliary head) run forward
and backward in bfloat16 eagerly, with float32 gradients.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.image import amoebanet  # noqa: E402
from lingvo_pipe.tasks.image import synthetic_images  # noqa: E402

try:
  from tests.tasks.image import tiny_models  # noqa: E402
except ImportError:  # run as a script: python tests/tasks/image/<this file>
  import tiny_models  # noqa: E402

_STEPS = 40
_ACCURACY_NOISE = 0.06  # 2 x 0.029 (module docstring)


def _TrainedAccuracy(dtype, data_dir):
  """Test accuracy (before, after) _STEPS steps of ResNetTinyGPipe."""
  p = model_registry.GetParams('image.synthetic.ResNetTinyGPipe')
  for input_p in (p.train_input, p.dev_input):
    input_p.Set(dataset_name=f'{synthetic_images.NAME}/tiny',
                data_dir=data_dir)
  task = p.task.Set(fprop_dtype=dtype).Instantiate()
  task.CreateTrainState()
  train_step = tf.function(task.TrainStep, autograph=False)
  eval_step = tf.function(task.EvalStep, autograph=False)
  dev_batch, = list(p.dev_input.Instantiate().GetDataset())
  before = float(eval_step(dev_batch).accuracy[0])
  for batch in p.train_input.Instantiate().GetDataset().take(_STEPS):
    out = train_step(batch)
    assert bool(out.is_finite) and out.loss.dtype == tf.float32
  return before, float(eval_step(dev_batch).accuracy[0])


class ImageBfloat16Test(tf.test.TestCase, parameterized.TestCase):

  def testResNetTinyLearnsAsInFloat32(self):
    data_dir = self.create_tempdir().full_path
    _, want = _TrainedAccuracy(None, data_dir)
    before, got = _TrainedAccuracy(tf.bfloat16, data_dir)
    self.assertLess(before, 0.3)  # chance is 0.1
    self.assertGreater(want, 0.8)
    self.assertGreater(got, 0.8)
    self.assertLessEqual(abs(got - want), _ACCURACY_NOISE)

  def testTinyAmoebaNetTrainsEvaluatesAndDecodes(self):
    tiny = tiny_models.Tiny('image.synthetic.AmoebaNetTinyGPipe',
                            self.create_tempdir().full_path)
    task = tiny.Task().Set(name='task', fprop_dtype=tf.bfloat16).Instantiate()
    self.assertEqual(tf.bfloat16, task.network.hand_off_dtype)
    task.CreateTrainState()
    with tfds.testing.mock_data(num_examples=8):
      batch = next(iter(tiny.Train().Instantiate().GetDataset()))
    out = tf.function(task.TrainStep, autograph=False)(batch)
    self.assertTrue(bool(out.is_finite))
    self.assertEqual(tf.float32, out.loss.dtype)
    for var in task.VariablesToCheckpoint().values():
      if var.dtype != tf.int64:
        self.assertEqual(tf.float32, var.dtype, var.name)
    metrics = tf.function(task.EvalStep, autograph=False)(batch)
    self.assertTrue(np.isfinite(metrics.loss[0].numpy()))
    self.assertEqual([4], task.DecodeStep(batch).predicted.shape.as_list())

  @parameterized.parameters(amoebanet.AmoebaNetB, amoebanet.AmoebaNetD)
  def testPublishedCellsRunInBfloat16(self, network):
    layer_ps = network(3, 8, 10, stem='imagenet', stem_filters=8,
                       keep_prob=0.5, drop_path_keep_prob=0.7,
                       aux_head=True, image_size=96)
    net = layers.SequentialLayer.Params().Set(
        name='net', sub=layer_ps, fprop_dtype=tf.bfloat16).Instantiate()
    batch = 2
    image = tf.cast(tf.random.stateless_normal([batch, 96, 96, 3], [1, 2]),
                    tf.bfloat16)
    keys = dropout.ExampleKeys(tf.constant(3, tf.int64), batch)
    inputs = NestedMap(image=image, example_keys=keys,
                       example_steps=tf.fill([batch], tf.constant(
                           3, tf.int64)))
    variables = [v for v in net.vars.Flatten() if v.trainable]
    with tf.GradientTape() as tape:
      out = net.FPropDefaultTheta(inputs)
      loss = sum(layers.SoftmaxCrossEntropy(
          out[name], class_ids=tf.range(batch)).avg_loss
                 for name in ('logits', 'aux_logits'))
    self.assertEqual(tf.bfloat16, out.logits.dtype)
    self.assertEqual(tf.bfloat16, out.aux_logits.dtype)
    self.assertEqual(tf.float32, loss.dtype)
    grads = tape.gradient(loss, variables)
    for var, grad in zip(variables, grads):
      self.assertEqual(tf.float32, grad.dtype, var.name)
      self.assertTrue(np.all(np.isfinite(grad.numpy())), var.name)


if __name__ == '__main__':
  absltest.main()
