"""ImageClassificationInput: batches of normalised images and int labels.

  p = ImageClassificationInput.Params().Set(
      dataset_name='cifar10', split='train', batch_size=128, repeat=True,
      shuffle_buffer_size=10000, seed=1, random_crop_padding=4,
      random_flip=True)

Each batch is NestedMap(image=float32 [batch, image_size, image_size, c],
label=int32 [batch]). Per example:

  image = uint8 -> float32 / 255, resized to image_size if it differs
  image = (image - normalization_mean) / normalization_std
  if random_crop_padding: pad with zeros (the mean colour), crop back
  if random_flip: left-right flip with probability 1/2

Augmentation uses stateless ops seeded per example (see base_input_generator),
so the same params give the same batches.

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
    image = tf.cast(example[p.image_key], tf.float32) / 255.0
    size = [p.image_size, p.image_size]
    if image.shape[:2] != size:
      image = tf.image.resize(image, size)
    mean = tf.constant(_AsList(p.normalization_mean), tf.float32)
    std = tf.constant(_AsList(p.normalization_std), tf.float32)
    image = (image - mean) / std
    crop_seed, flip_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 2))
    if p.random_crop_padding:
      k = p.random_crop_padding
      padded = tf.pad(image, [[k, k], [k, k], [0, 0]])
      image = tf.image.stateless_random_crop(
          padded, tf.shape(image), seed=crop_seed)
    if p.random_flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    image = tf.ensure_shape(image, size + [image.shape[-1]])
    label = tf.cast(example[p.label_key], tf.int32)
    return NestedMap(image=image, label=label)


def _AsList(value: Union[float, Sequence[float]]) -> list:
  """[value] for a number, else the items of the (maybe frozen) list."""
  return [value] if isinstance(value, (int, float)) else list(value)
