"""Tests of ImageClassificationInput on mock cifar10 and the synthetic data."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.tasks.image import input_generator  # noqa: E402
from lingvo_pipe.tasks.image import synthetic_images  # noqa: E402

_NUM_MOCK = 16


def _Params(data_dir, **kwargs):
  p = input_generator.ImageClassificationInput.Params()
  p.Set(name='images', dataset_name='cifar10', data_dir=data_dir,
        batch_size=8, seed=3)
  return p.Set(**kwargs)


def _Batches(p):
  return [b for b in p.Instantiate().GetDataset()]


def _Stack(batches, key):
  return np.concatenate([b[key].numpy() for b in batches])


def _IsCropOrFlipOf(augmented, image, k):
  """Whether `augmented` is a window of `image` padded by k, maybe flipped."""
  h, w, _ = image.shape
  padded = np.pad(image, [(k, k), (k, k), (0, 0)])
  for dy in range(2 * k + 1):
    for dx in range(2 * k + 1):
      window = padded[dy:dy + h, dx:dx + w]
      if (np.array_equal(window, augmented) or
          np.array_equal(window[:, ::-1], augmented)):
        return True
  return False


class ImageClassificationInputTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.data_dir = self.create_tempdir().full_path
    self.enter_context(tfds.testing.mock_data(num_examples=_NUM_MOCK))

  def _Raw(self):
    """The mock cifar10 train split as read: (uint8 images, labels)."""
    dataset = tfds.load('cifar10', split='train', data_dir=self.data_dir,
                        download=False)
    examples = list(dataset.as_numpy_iterator())
    return (np.stack([e['image'] for e in examples]),
            np.array([e['label'] for e in examples]))

  def testShapesAndDtypes(self):
    batches = _Batches(_Params(self.data_dir))
    self.assertLen(batches, _NUM_MOCK // 8)
    for b in batches:
      self.assertEqual(sorted(b.keys()), ['image', 'label'])
      self.assertEqual(b.image.shape, [8, 32, 32, 3])
      self.assertEqual(b.image.dtype, tf.float32)
      self.assertEqual(b.label.shape, [8])
      self.assertEqual(b.label.dtype, tf.int32)

  def testNormalisation(self):
    raw_images, raw_labels = self._Raw()
    batches = _Batches(_Params(self.data_dir, normalization_mean=[0.5, 0.4,
                                                                 0.3],
                               normalization_std=0.25))
    want = (raw_images / 255.0 - np.array([0.5, 0.4, 0.3])) / 0.25
    self.assertAllClose(_Stack(batches, 'image'), want, atol=1e-5)
    self.assertAllEqual(_Stack(batches, 'label'), raw_labels)

  def testResize(self):
    batches = _Batches(_Params(self.data_dir, image_size=16))
    self.assertEqual(batches[0].image.shape, [8, 16, 16, 3])

  def testAugmentationIsCropAndFlipAndSeeded(self):
    p = _Params(self.data_dir, normalization_mean=0.0, normalization_std=1.0,
                random_crop_padding=4, random_flip=True)
    augmented = _Stack(_Batches(p), 'image')
    self.assertAllEqual(augmented, _Stack(_Batches(p), 'image'))
    other_seed = _Stack(_Batches(p.Copy().Set(seed=4)), 'image')
    self.assertNotAllEqual(augmented, other_seed)
    plain = _Stack(_Batches(p.Copy().Set(random_crop_padding=0,
                                         random_flip=False)), 'image')
    self.assertNotAllEqual(augmented, plain)
    changed = 0
    for a, x in zip(augmented, plain):
      self.assertTrue(_IsCropOrFlipOf(a, x, 4))
      changed += not np.array_equal(a, x)
    self.assertGreater(changed, _NUM_MOCK // 2)

  def testNumClassesMismatchIsAnError(self):
    with self.assertRaisesRegex(ValueError, r'p.num_classes is 100 but .*'
                                r'has 10 classes; set p.num_classes = 10'):
      _Params(self.data_dir, num_classes=100).Instantiate().GetDataset()

  def testMissingFeatureIsAnError(self):
    with self.assertRaisesRegex(ValueError, "no feature 'img'"):
      _Params(self.data_dir, image_key='img').Instantiate().GetDataset()

  @parameterized.parameters(
      (dict(image_size=0), 'p.image_size is 0'),
      (dict(random_crop_padding=-1), 'p.random_crop_padding is -1'),
      (dict(normalization_std=[0.2, 0.0, 0.2]), 'p.normalization_std'),
      (dict(crop='inception'), "p.crop is 'inception'; use one of"),
      (dict(random_area=(0.5, 1.5)), 'p.random_area'),
      (dict(random_aspect=(1.0, 0.5)), 'p.random_aspect'),
      (dict(crop_fraction=0.0), 'p.crop_fraction is 0.0'),
  )
  def testBadParams(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      _Params(self.data_dir, **kwargs).Instantiate()


class SyntheticImagesInputTest(tf.test.TestCase):

  def testReadsTheSyntheticBuilder(self):
    data_dir = self.create_tempdir().full_path
    p = _Params(data_dir, dataset_name=synthetic_images.NAME + '/tiny',
                split='test', batch_size=25, normalization_mean=0.0,
                normalization_std=1.0)
    inp = p.Instantiate()
    batches = list(inp.GetDataset())
    self.assertEqual(inp.NumExamples(), 100)
    self.assertLen(batches, 4)
    raw = tfds.load(p.dataset_name, split='test', data_dir=data_dir,
                    download=False, batch_size=-1)
    self.assertAllClose(_Stack(batches, 'image'),
                        raw['image'].numpy() / 255.0, atol=1e-6)
    self.assertAllEqual(_Stack(batches, 'label'), raw['label'].numpy())


class ImageNetInputTest(tf.test.TestCase):
  """imagenet2012 (mocked: images of random sizes) as the paper trains."""

  def setUp(self):
    super().setUp()
    self.data_dir = self.create_tempdir().full_path
    self.enter_context(tfds.testing.mock_data(num_examples=6))

  def _Batch(self, split, **kwargs):
    p = input_generator.ImageNetParams(split, image_size=24, batch_size=6)
    p.Set(data_dir=self.data_dir, **kwargs)
    return next(iter(p.Instantiate().GetDataset()))

  def testEvalIsTheCentralCropResized(self):
    raw = list(tfds.load('imagenet2012', split='validation',
                         data_dir=self.data_dir).as_numpy_iterator())
    batch = self._Batch('validation', seed=1)
    mean = np.array(input_generator.IMAGENET_MEAN, np.float32)
    std = np.array(input_generator.IMAGENET_STD, np.float32)
    self.assertGreater(len({e['image'].shape for e in raw}), 1)
    for example, got in zip(raw, batch.image.numpy()):
      image = example['image'].astype(np.float32) / 255.0
      h, w, _ = image.shape
      side = max(1, int(round(0.875 * min(h, w))))
      top, left = (h - side) // 2, (w - side) // 2
      want = tf.image.resize(image[top:top + side, left:left + side],
                             [24, 24]).numpy()
      self.assertAllClose((want - mean) / std, got, atol=1e-5, rtol=0)

  def testEvalIsDeterministic(self):
    a = self._Batch('validation', seed=1)
    b = self._Batch('validation', seed=2)
    self.assertAllEqual(a.image, b.image)
    self.assertAllEqual(a.label, b.label)

  def testTrainingCropsAreSeededAndVary(self):
    a = self._Batch('train', seed=1, shuffle_buffer_size=0)
    b = self._Batch('train', seed=1, shuffle_buffer_size=0)
    c = self._Batch('train', seed=2, shuffle_buffer_size=0)
    self.assertEqual([6, 24, 24, 3], a.image.shape.as_list())
    self.assertAllEqual(a.image, b.image)
    self.assertAllEqual(a.label, c.label)
    self.assertNotAllClose(a.image, c.image)

  def testRandomWindowHasTheAreaAndAspectAsked(self):
    """Windows of a coordinate image: contiguous, in range, per seed."""
    gen = input_generator.ImageNetParams('train').Set(
        data_dir=self.data_dir).Instantiate()
    h, w = 60, 80
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
    image = tf.constant(np.stack([ys, xs, 0 * ys], -1), tf.float32)
    shapes = set()
    for i in range(20):
      window = gen._RandomWindow(image, tf.constant([i, 7])).numpy()
      again = gen._RandomWindow(image, tf.constant([i, 7])).numpy()
      self.assertAllEqual(window, again)
      wh, ww, _ = window.shape
      top, left = window[0, 0, :2].astype(int)
      self.assertAllEqual(window[..., 0], ys[top:top + wh, left:left + ww])
      self.assertAllEqual(window[..., 1], xs[top:top + wh, left:left + ww])
      if (wh, ww) != (h, w):  # else: nothing fitted, the whole image
        self.assertBetween(wh * ww / (h * w), 0.08 - 0.01, 1.0)
        self.assertBetween(ww / wh, 3 / 4 - 0.05, 4 / 3 + 0.05)
      shapes.add((wh, ww))
    self.assertGreater(len(shapes), 5)


if __name__ == '__main__':
  absltest.main()
