"""The default image model learns the synthetic data in a few dozen steps.

Trains the registered image.synthetic.ResNetTinyGPipe (K=2 partitions,
M=4, its own learning rate) on the 'tiny' config of the synthetic dataset
(200 train, 100 test examples, generated into a temporary directory) and
checks the test accuracy goes from chance to well above it.
"""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.tasks.image import synthetic_images  # noqa: E402

_STEPS = 60


class TrainingTest(tf.test.TestCase):

  def testResNetTinyGPipeLearns(self):
    p = model_registry.GetParams('image.synthetic.ResNetTinyGPipe')
    data_dir = self.create_tempdir().full_path
    for input_p in (p.train_input, p.dev_input):
      input_p.Set(dataset_name=f'{synthetic_images.NAME}/tiny',
                  data_dir=data_dir)
    task = p.task.Instantiate()
    task.CreateTrainState()
    train_step = tf.function(task.TrainStep, autograph=False)
    eval_step = tf.function(task.EvalStep, autograph=False)
    dev_batches = list(p.dev_input.Instantiate().GetDataset())
    self.assertLen(dev_batches, 1)  # the whole test split, 100 examples

    def Evaluate():
      metrics = eval_step(dev_batches[0])
      return {k: float(v[0]) for k, v in metrics.items()}

    before = Evaluate()
    losses = []
    for batch in p.train_input.Instantiate().GetDataset().take(_STEPS):
      out = train_step(batch)
      self.assertTrue(out.is_finite.numpy())
      losses.append(float(out.loss))
    after = Evaluate()
    self.assertEqual(_STEPS, int(task.train_state.global_step.numpy()))
    self.assertLess(before['accuracy'], 0.3)  # chance is 0.1
    self.assertGreater(after['accuracy'], 0.8)
    self.assertLess(after['loss'], 0.5 * before['loss'])
    self.assertLess(np.mean(losses[-10:]), 0.5 * np.mean(losses[:10]))


if __name__ == '__main__':
  absltest.main()
