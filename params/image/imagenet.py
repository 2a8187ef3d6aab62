"""ImageNet (ILSVRC-2012) models with GPipe: AmoebaNet-D and ResNet-50.

They read TFDS 'imagenet2012', which TFDS cannot download: place the
ILSVRC-2012 archives in TFDS's manual directory and build it (`tfds build
imagenet2012 --data_dir=DIR --manual_dir=...`), then train with
`--data_dir=DIR`. Training crops a random window of 8-100% of the image's
area, aspect 3/4-4/3, resized to IMAGE_SIZE, and flips; evaluation resizes
the central 87.5% square; both normalise by ImageNet's per-channel mean
and standard deviation (input_generator.ImageNetParams).
"""

from __future__ import annotations

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import model_registry
from lingvo_pipe.core import optimizer
from lingvo_pipe.tasks.image import input_generator
from params.image import classifier_base

_IMAGENET_TRAIN_EXAMPLES = 1281167


class _ImageNet:
  """Data and augmentation shared by the ImageNet models."""

  DATASET = 'imagenet2012'
  EVAL_SPLIT = 'validation'
  NUM_CLASSES = 1000
  IMAGE_SIZE = 224
  TRAIN_CROP = 'random_resized'
  EVAL_CROP = 'center'
  RANDOM_FLIP = True
  NORMALIZATION_MEAN = input_generator.IMAGENET_MEAN
  NORMALIZATION_STD = input_generator.IMAGENET_STD
  EVAL_STEPS = 50000 // 256  # the validation split at EVAL_BATCH_SIZE
  EVAL_BATCH_SIZE = 256
  EVAL_INTERVAL_STEPS = 5000
  BN_DECAY = 0.9

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Momentum.Params().Set(momentum=0.9, use_nesterov=True)


@model_registry.RegisterSingleTaskModel
class ResNet50_GPipe(_ImageNet, classifier_base.ResNetImageNetBase):  # noqa: N801
  """ResNet-50 v1.5 (25.6M parameters), K=2 partitions, M=8.

  The usual recipe (Goyal et al. 2017): batch 256, momentum 0.9, learning
  rate 0.1 with 5 epochs of warm-up and cosine decay over 90 epochs,
  weight decay 1e-4, label smoothing 0.1. Batch 256 in 8 micro-batches of
  32 (bubble (K-1)/(M+K-1) = 11%).
  """

  DEPTH = 50
  BATCH_SIZE = 256
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 8
  LEARNING_RATE = 0.1
  WEIGHT_DECAY = 1e-4
  LABEL_SMOOTHING = 0.1
  MAX_STEPS = 90 * _IMAGENET_TRAIN_EXAMPLES // 256

  def LearningRateSchedule(self) -> hyperparams.Params:
    return lr_schedule.Cosine.Params().Set(
        total_steps=self.MAX_STEPS,
        warmup_steps=min(5 * _IMAGENET_TRAIN_EXAMPLES // 256,
                         self.MAX_STEPS - 1))
