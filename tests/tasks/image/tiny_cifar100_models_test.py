"""Tiny versions of the CIFAR-100 models train one step (tiny_models)."""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

try:
  from tests.tasks.image import tiny_models  # noqa: E402
except ImportError:  # run as a script: python tests/tasks/image/<this file>
  import tiny_models  # noqa: E402


class TinyCifar100ModelsTest(tiny_models.OneStepTestMixin,
                             tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('image.cifar100.AmoebaNetD_GPipe',
                            'image.cifar100.ResNet50_FineTune')
  def testOneTrainStep(self, key):
    self.CheckOneTrainStep(key)


if __name__ == '__main__':
  absltest.main()
