"""Tests of the lingvo_pipe_synthetic_images TFDS builder (offline).

The 'tiny' config (200 train, 100 test) is prepared once per class.
"""

import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.tasks.image import synthetic_images  # noqa: E402

_TINY = synthetic_images.NAME + '/tiny'


def _Load(data_dir, split):
  """(images uint8 [n, 32, 32, 3], labels [n]) of a split, in file order."""
  dataset = tfds.load(_TINY, split=split, data_dir=data_dir, download=False,
                      batch_size=-1)
  return dataset['image'].numpy(), dataset['label'].numpy()


def _NearestMeanAccuracy(train, test):
  """Accuracy on `test` of the nearest class mean of `train` (raw pixels)."""
  (x, y), (x_test, y_test) = train, test
  x = x.reshape(len(x), -1).astype(np.float64)
  x_test = x_test.reshape(len(x_test), -1).astype(np.float64)
  means = np.stack([x[y == c].mean(0)
                    for c in range(synthetic_images.NUM_CLASSES)])
  distances = ((x_test[:, None] - means[None]) ** 2).sum(-1)
  return (distances.argmin(1) == y_test).mean()


class SyntheticImagesTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()
    cls.builder = tfds.builder(_TINY, data_dir=cls.data_dir)
    cls.builder.download_and_prepare()
    cls.train = _Load(cls.data_dir, 'train')
    cls.test = _Load(cls.data_dir, 'test')

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def testSplitsShapesAndDtypes(self):
    splits = self.builder.info.splits
    self.assertEqual(sorted(splits.keys()), ['test', 'train'])
    self.assertEqual(splits['train'].num_examples, 200)
    self.assertEqual(splits['test'].num_examples, 100)
    features = self.builder.info.features
    self.assertEqual(features['image'].shape, (32, 32, 3))
    self.assertEqual(features['label'].num_classes, 10)
    images, labels = self.train
    self.assertEqual(images.shape, (200, 32, 32, 3))
    self.assertEqual(images.dtype, np.uint8)
    self.assertEqual(np.bincount(labels).tolist(), [20] * 10)

  def testDefaultConfigSizes(self):
    config = tfds.builder(synthetic_images.NAME,
                          data_dir=self.data_dir).builder_config
    self.assertEqual(config.name, 'default')
    self.assertEqual((config.num_train_examples, config.num_test_examples),
                     (5000, 1000))

  def testDeterministic(self):
    other_dir = self.create_tempdir().full_path
    tfds.builder(_TINY, data_dir=other_dir).download_and_prepare()
    for split, (images, labels) in (('train', self.train),
                                    ('test', self.test)):
      other_images, other_labels = _Load(other_dir, split)
      self.assertAllEqual(images, other_images)
      self.assertAllEqual(labels, other_labels)

  def testSplitsDiffer(self):
    first = dict(synthetic_images.GenerateSplit('train', 1))[0]
    again = dict(synthetic_images.GenerateSplit('train', 1))[0]
    test = dict(synthetic_images.GenerateSplit('test', 1))[0]
    self.assertAllEqual(first['image'], again['image'])
    self.assertNotAllEqual(first['image'], test['image'])

  def testUsesTheWholePixelRange(self):
    images, _ = self.train
    self.assertLess(images.min(), 20)
    self.assertGreater(images.max(), 235)
    self.assertBetween(images.mean(), 110, 146)

  def testClassMeansDifferClearly(self):
    images, labels = self.train
    means = np.stack([images[labels == c].mean(0) for c in range(10)])
    spread = np.sqrt(((means[:, None] - means[None]) ** 2).mean(
        axis=(2, 3, 4)))
    off_diagonal = spread[~np.eye(10, dtype=bool)]
    # Pixel values are 0-255; noise alone has std 40 per pixel.
    self.assertGreater(off_diagonal.min(), 15.0)

  def testLearnable(self):
    # Chance is 10%; even a nearest-mean classifier fitted on 20 images per
    # class does far better (~80% on the default config).
    self.assertGreater(_NearestMeanAccuracy(self.train, self.test), 0.5)


if __name__ == '__main__':
  absltest.main()
