"""lingvo_pipe_synthetic_images: a learnable 10-class image dataset, offline.

A TFDS builder that makes its images from a fixed seed, with no downloads,
shaped like cifar10: {'image': uint8 [32, 32, 3], 'label': ClassLabel(10)}.

Each class has a template: a sum of three colour plane waves of low
frequency (at most 2 cycles across the image), scaled to unit variance. An
example of class c is template c circularly shifted by up to 4 pixels each
way, with random contrast, a random colour cast and pixel noise as strong as
the template. Balanced classes (example i has label i % 10).

How hard it is (measured on 'default'): the nearest class mean on raw
pixels gets ~80% of the test split right (chance: 10%). A net of two 3x3
convolutions (16 and 32 channels), max pooling and a dense layer, trained
by Adam (1e-3) on ImageClassificationInput batches of 32 with
random_crop_padding=2, gets 37% after 50 steps, 91% after 150 and 98%
after 250.

Configs: 'default' (train 5000, test 1000; a few seconds to generate) and
'tiny' (train 200, test 100; for tests). Prepare into a directory with

  tfds.builder('lingvo_pipe_synthetic_images', data_dir=D)
      .download_and_prepare()

(after importing this module), or let BaseInputGenerator do it on first use.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Tuple

import numpy as np
import tensorflow_datasets as tfds

NAME = 'lingvo_pipe_synthetic_images'
NUM_CLASSES = 10
IMAGE_SIZE = 32
_SEED = 1234
_NUM_WAVES = 3
_MAX_FREQUENCY = 2
_MAX_SHIFT = 4
_NOISE = 1.0
_SPLIT_IDS = {'train': 0, 'test': 1}


def ClassTemplates(seed: int = _SEED) -> np.ndarray:
  """float64 [NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE, 3], unit std each."""
  rng = np.random.default_rng([seed, 0])
  yy, xx = np.meshgrid(np.arange(IMAGE_SIZE), np.arange(IMAGE_SIZE),
                       indexing='ij')
  templates = np.zeros([NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE, 3])
  for c in range(NUM_CLASSES):
    for _ in range(_NUM_WAVES):
      fy, fx = rng.integers(-_MAX_FREQUENCY, _MAX_FREQUENCY + 1, size=2)
      if fy == 0 and fx == 0:
        fx = 1
      phase = rng.uniform(0, 2 * np.pi)
      wave = np.cos(2 * np.pi * (fy * yy + fx * xx) / IMAGE_SIZE + phase)
      templates[c] += wave[..., None] * rng.normal(size=3)
  return templates / templates.std(axis=(1, 2, 3), keepdims=True)


def MakeExample(templates: np.ndarray, label: int,
                rng: np.random.Generator) -> np.ndarray:
  """One uint8 [IMAGE_SIZE, IMAGE_SIZE, 3] image of class `label`."""
  shift = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, size=2)
  x = np.roll(templates[label], tuple(shift), axis=(0, 1))
  x = x * rng.uniform(0.6, 1.4) + rng.normal(0, 0.3, size=3)
  x = x + _NOISE * rng.normal(size=x.shape)
  return np.clip(128 + 40 * x, 0, 255).astype(np.uint8)


def GenerateSplit(split: str, num_examples: int,
                  seed: int = _SEED) -> Iterator[Tuple[int, dict]]:
  """Yields (key, {'image', 'label'}); example i depends on (seed, split, i)."""
  templates = ClassTemplates(seed)
  for i in range(num_examples):
    rng = np.random.default_rng([seed, 1, _SPLIT_IDS[split], i])
    label = i % NUM_CLASSES
    yield i, {'image': MakeExample(templates, label, rng), 'label': label}


@dataclasses.dataclass(eq=False)
class SyntheticImagesConfig(tfds.core.BuilderConfig):
  """Split sizes of a config."""
  num_train_examples: int = 5000
  num_test_examples: int = 1000


class SyntheticImages(tfds.core.GeneratorBasedBuilder):
  """TFDS builder of lingvo_pipe_synthetic_images (module docstring)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First version.'}
  BUILDER_CONFIGS = [
      SyntheticImagesConfig(name='default', description='5000 train, 1000 '
                            'test.'),
      SyntheticImagesConfig(name='tiny', description='200 train, 100 test.',
                            num_train_examples=200, num_test_examples=100),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='Synthetic 10-class 32x32 colour images made from a '
        'fixed seed: shifted, noisy per-class wave templates.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3)),
            'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }),
        supervised_keys=('image', 'label'))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download.
    return {
        'train': GenerateSplit('train', self.builder_config.num_train_examples),
        'test': GenerateSplit('test', self.builder_config.num_test_examples),
    }

  def _generate_examples(self):  # Unused: _split_generators yields them.
    raise NotImplementedError
