"""ImageClassificationInput: batches of normalised images and int labels.

  p = ImageClassificationInput.Params().Set(
      dataset_name='cifar10', split='train', batch_size=128, repeat=True,
      shuffle_buffer_size=10000, seed=1, random_crop_padding=4,
      random_flip=True)

Each batch is NestedMap(image=float32 [batch, image_size, image_size, c],
label=int32 [batch]). Per example:

  image = uint8 -> float32 / 255, then by `crop`:
    'resize'          resized to image_size x image_size if it differs
    'random_resized'  training (Inception-style): a random window of
                      random_area of the image's area and random_aspect
                      width/height, resized to image_size
    'center'          evaluation: the central crop_fraction of the
                      shorter side, a square, resized to image_size
  image = (image - normalization_mean) / normalization_std
  if random_crop_padding: pad with zeros (the mean colour), crop back
  if random_flip: left-right flip with probability 1/2

Augmentation uses stateless ops seeded per example (see base_input_generator),
so the same params give the same batches; 'center' uses no randomness.
ImageNet as the paper trains it: `ImageNetParams(split, image_size)`.

Importing this module registers lingvo_pipe_synthetic_images with TFDS.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Union

import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import synthetic_images  # noqa: F401 registers


class ImageClassificationInput(base_input_generator.BaseInputGenerator):
  """Images and labels of a TFDS image classification dataset."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = 'cifar10'
    p.Define('image_size', 32,
             'Height and width of the output images; others are resized.')
    p.Define('num_classes', 10,
             'Number of classes; must match the dataset\'s ClassLabel.')
    p.Define('image_key', 'image', 'Feature holding the uint8 image.')
    p.Define('label_key', 'label', 'Feature holding the int label.')
    p.Define('normalization_mean', 0.5,
             'Subtracted from the [0, 1] image: a float, or one per channel.')
    p.Define('normalization_std', 0.25,
             'Divides the centred image: a float, or one per channel.')
    p.Define('random_crop_padding', 0,
             'Training augmentation: pad each side by this many pixels and '
             'crop a random image_size window; 0 disables it.')
    p.Define('random_flip', False,
             'Training augmentation: flip left-right with probability 1/2.')
    p.Define('crop', 'resize', f'One of {CROPS} (module docstring).')
    p.Define('random_area', (0.08, 1.0),
             "crop='random_resized': range of the window's area, as a "
             "fraction of the image's.")
    p.Define('random_aspect', (3 / 4, 4 / 3),
             "crop='random_resized': range of the window's width / height.")
    p.Define('crop_fraction', 0.875,
             "crop='center': the crop's side over the shorter side.")
    return p

  def _CheckParams(self) -> None:
    super()._CheckParams()
    p = self.params
    if not isinstance(p.image_size, int) or p.image_size < 1:
      self._Fail(f'p.image_size is {p.image_size!r}; set a positive int.')
    if not isinstance(p.random_crop_padding, int) or (
        p.random_crop_padding < 0):
      self._Fail(f'p.random_crop_padding is {p.random_crop_padding!r}; set '
                 'an int >= 0.')
    if p.crop not in CROPS:
      self._Fail(f'p.crop is {p.crop!r}; use one of {CROPS}.')
    lo, hi = p.random_area
    if not 0 < lo <= hi <= 1:
      self._Fail(f'p.random_area is {p.random_area!r}; set (low, high) '
                 'with 0 < low <= high <= 1.')
    lo, hi = p.random_aspect
    if not 0 < lo <= hi:
      self._Fail(f'p.random_aspect is {p.random_aspect!r}; set (low, '
                 'high) with 0 < low <= high.')
    if not 0 < p.crop_fraction <= 1:
      self._Fail(f'p.crop_fraction is {p.crop_fraction!r}; set a value in '
                 '(0, 1].')
    if any(s <= 0 for s in _AsList(p.normalization_std)):
      self._Fail(f'p.normalization_std is {p.normalization_std!r}; set '
                 'positive values.')

  def _CheckFeatures(self, features: Any) -> None:
    p = self.params
    self._RequireFeatures(features, 'image_key', 'label_key')
    label = features[p.label_key]
    if isinstance(label, tfds.features.ClassLabel) and (
        label.num_classes != p.num_classes):
      self._Fail(f'p.num_classes is {p.num_classes} but dataset '
                 f'{p.dataset_name!r} has {label.num_classes} classes; set '
                 f'p.num_classes = {label.num_classes}.')

  def Preprocess(self, example: Dict[str, Any], seed: tf.Tensor) -> NestedMap:
    p = self.params
    crop_seed, flip_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 2))
    image = tf.cast(example[p.image_key], tf.float32) / 255.0
    # Crops of a window (tf.slice by a tensor) lose the static channels.
    size, channels = [p.image_size, p.image_size], image.shape[-1]
    if p.crop == 'random_resized':
      image = self._RandomWindow(
          image, tf.random.experimental.stateless_split(crop_seed, 1)[0])
    elif p.crop == 'center':
      image = self._CenterSquare(image)
    if image.shape[:2] != size:
      image = tf.image.resize(image, size)
    mean = tf.constant(_AsList(p.normalization_mean), tf.float32)
    std = tf.constant(_AsList(p.normalization_std), tf.float32)
    image = (image - mean) / std
    if p.random_crop_padding:
      k = p.random_crop_padding
      padded = tf.pad(image, [[k, k], [k, k], [0, 0]])
      image = tf.image.stateless_random_crop(
          padded, tf.shape(image), seed=crop_seed)
    if p.random_flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    image = tf.ensure_shape(image, size + [channels])
    label = tf.cast(example[p.label_key], tf.int32)
    return NestedMap(image=image, label=label)


  def _RandomWindow(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """A window of random area and aspect (the whole image if none fits)."""
    p = self.params
    begin, window, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=list(p.random_aspect),
        area_range=list(p.random_area), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return tf.slice(image, begin, window)

  def _CenterSquare(self, image: tf.Tensor) -> tf.Tensor:
    """The central square of crop_fraction x the shorter side."""
    shape = tf.shape(image)
    side = tf.cast(tf.round(self.params.crop_fraction * tf.cast(
        tf.minimum(shape[0], shape[1]), tf.float32)), tf.int32)
    side = tf.maximum(side, 1)
    top = (shape[0] - side) // 2
    left = (shape[1] - side) // 2
    return tf.slice(image, [top, left, 0], [side, side, -1])


CROPS = ('resize', 'random_resized', 'center')

# Per-channel mean and standard deviation of ImageNet's training images
# (RGB, [0, 1] scale), as ResNet and AmoebaNet training normalise them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def ImageNetParams(split: str, image_size: int = 224,
                   batch_size: int = 256) -> hyperparams.Params:
  """imagenet2012 as the paper trains on it.

  'train': random-resized crop and flip; any other split: central crop of
  87.5% (224 of 256). Both normalise each channel by ImageNet's mean and
  standard deviation. The data must be prepared in TFDS's data_dir
  (ImageNet is not downloadable: see the TFDS catalog's manual steps).
  """
  training = split == 'train'
  return ImageClassificationInput.Params().Set(
      name=f'imagenet_{split}', dataset_name='imagenet2012', split=split,
      batch_size=batch_size, image_size=image_size, num_classes=1000,
      normalization_mean=IMAGENET_MEAN, normalization_std=IMAGENET_STD,
      crop='random_resized' if training else 'center',
      random_flip=training, repeat=training,
      shuffle_buffer_size=10000 if training else 0)


def _AsList(value: Union[float, Sequence[float]]) -> list:
  """[value] for a number, else the items of the (maybe frozen) list."""
  return [value] if isinstance(value, (int, float)) else list(value)
