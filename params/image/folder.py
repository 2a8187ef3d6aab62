"""Image classifiers on your own images: a folder given with --data_dir.

  python -m lingvo_pipe.trainer --model=image.folder.ResNetFolder \\
      --data_dir=/path/to/images --logdir=/tmp/lingvo_pipe/my_images

The folder holds one sub-folder per split and one per class in each
(TFDS's ImageFolder, read in place; tasks/image/folder_input.py):

  /path/to/images/train/<class>/*.jpg|*.jpeg|*.png
  /path/to/images/test/<class>/...

Dev evaluates the test split. The classes are counted from the folder
before the model is built (the trainer calls FillFromData), so NUM_CLASSES
below is only a placeholder; the folder is checked first too (missing
folders, empty classes, files that are not whole JPEG or PNG images),
each problem one line. Preprocessing is ImageNet's at IMAGE_SIZE:
training crops a random window of 8-100% of the area (aspect 3/4-4/3)
and flips; evaluation takes the central 87.5% square; both resize to
IMAGE_SIZE and normalise by ImageNet's channel statistics. To change a
size, subclass in your own module (params/image/classifier_base.py):

  class Larger(folder.ResNetTinyFolder):
    IMAGE_SIZE = 64
"""

from __future__ import annotations

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.image import folder_input
from lingvo_pipe.tasks.image import input_generator
from params.image import classifier_base
from params.image import synthetic

# ImageNet's preprocessing, as input_generator.ImageNetParams sets it.
_TRAIN = input_generator.ImageNetParams('train')
_EVAL = input_generator.ImageNetParams('test')


class _Folder:
  """The data: ImageFolderInput on --data_dir, ImageNet's preprocessing."""

  DATASET = folder_input.NAME
  TRAIN_SPLIT = 'train'
  EVAL_SPLIT = 'test'
  NUM_CLASSES = 2  # a placeholder: FillFromData counts the class folders
  # What is checked of every image before training (folder_input.CHECKS):
  # 'whole' (each is a whole JPEG or PNG file) or 'signature' (each starts
  # as one).
  CHECK_IMAGES = 'whole'
  TRAIN_CROP = _TRAIN.crop
  EVAL_CROP = _EVAL.crop
  RANDOM_FLIP = _TRAIN.random_flip
  NORMALIZATION_MEAN = _TRAIN.normalization_mean
  NORMALIZATION_STD = _TRAIN.normalization_std
  EVAL_BATCH_SIZE = 16

  def _Input(self, split: str, batch_size: int,
             train: bool) -> hyperparams.Params:
    """classifier_base's input params, read by ImageFolderInput."""
    base = super()._Input(split, batch_size, train)
    p = folder_input.ImageFolderInput.Params()
    p.Set(**{k: v for k, v in base.IterParams() if k != 'cls'})
    return p.Set(check_images=self.CHECK_IMAGES)


class _FullSize(_Folder):
  """ImageNet's image size; a recipe for a few thousand images."""

  IMAGE_SIZE = _TRAIN.image_size
  SHUFFLE_BUFFER_SIZE = 2000
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 32
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  BN_DECAY = 0.9
  LABEL_SMOOTHING = 0.1
  LEARNING_RATE = 1e-3
  MAX_STEPS = 10000
  EVAL_INTERVAL_STEPS = 500
  EVAL_STEPS = 20


@model_registry.RegisterSingleTaskModel
class ResNetFolder(_FullSize, classifier_base.ResNetImageNetBase):
  """ResNet-50 v1.5 at 224x224, K=2 partitions, M=4 micro-batches of 16.

  23.5M parameters (at 2 classes). Adam, learning rate 1e-3, label
  smoothing 0.1, 10k steps of batch 64.
  """

  DEPTH = 50


@model_registry.RegisterSingleTaskModel
class AmoebaNetDFolder(_FullSize, classifier_base.AmoebaNetBase):
  """AmoebaNet-D (6, 64) at 224x224, ImageNet stem, K=2, M=4 of 16.

  The reference's ImageNet network at a small (L, D), 2.6M parameters
  (at 2 classes), without the auxiliary head; drop-path falls to keep 0.7
  over the run. The recipe is ResNetFolder's.
  """

  STEM = 'imagenet'
  NUM_CELLS = 6
  FILTERS = 64
  DROP_PATH_KEEP_PROB = 0.7


@model_registry.RegisterSingleTaskModel
class ResNetTinyFolder(_Folder, synthetic.ResNetTinyGPipe):
  """image.synthetic.ResNetTinyGPipe on your images: ResNet-8 at 32x32,
  K=2, M=4 micro-batches of 8, 200 steps; a first try on a CPU."""


@model_registry.RegisterSingleTaskModel
class AmoebaNetTinyFolder(_Folder, synthetic.AmoebaNetTinyGPipe):
  """image.synthetic.AmoebaNetTinyGPipe on your images: AmoebaNet-D (3, 8)
  at 32x32, K=2, M=4 micro-batches of 8, 100 steps."""
