"""Tiny versions of the ImageNet models train one step (tiny_models)."""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

try:
  from tests.tasks.image import tiny_models  # noqa: E402
except ImportError:  # run as a script: python tests/tasks/image/<this file>
  import tiny_models  # noqa: E402


class TinyImageNetModelsTest(tiny_models.OneStepTestMixin,
                             tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('image.imagenet.AmoebaNetD_18_208',
                            'image.imagenet.AmoebaNetD_18_544_GPipe',
                            'image.imagenet.ResNet50_GPipe')
  def testOneTrainStep(self, key):
    self.CheckOneTrainStep(key)

  def testResNet50TrainsOneStepInBfloat16(self):
    # Its bottleneck blocks are the one image architecture that
    # image_bfloat16_test does not train.
    self.CheckOneTrainStep('image.imagenet.ResNet50_GPipe', tf.bfloat16)

  # Tiny, these are AmoebaNetD_18_544_GPipe (genotype, sizes, K and M are
  # TINY's): testOneTrainStep covers them, without tracing the same model
  # twice more (25 s each).
  @parameterized.parameters('image.imagenet.AmoebaNetB_18_512_GPipe',
                            'image.imagenet.AmoebaNetD_36_544_GPipe')
  def testTinyVersionIsOneTested(self, key):
    self.CheckSameTinyVersion(key, 'image.imagenet.AmoebaNetD_18_544_GPipe')


if __name__ == '__main__':
  absltest.main()
