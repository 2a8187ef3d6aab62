"""ImageNet (ILSVRC-2012) models with GPipe: AmoebaNet-D/-B and ResNet-50.

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

  MAX_STEPS = 90 * _IMAGENET_TRAIN_EXAMPLES // 256

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Momentum.Params().Set(momentum=0.9, use_nesterov=True)

  def LearningRateSchedule(self) -> hyperparams.Params:
    """Cosine decay over MAX_STEPS after 5 epochs (at batch 256) of warm-up."""
    return lr_schedule.Cosine.Params().Set(
        total_steps=self.MAX_STEPS,
        warmup_steps=min(5 * _IMAGENET_TRAIN_EXAMPLES // 256,
                         self.MAX_STEPS - 1))


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


class _AmoebaNetImageNet(_ImageNet, classifier_base.AmoebaNetBase):
  """AmoebaNet on ImageNet: the reference's network, our recipe.

  The network as tensorflow/tpu's reference builds it for ImageNet
  (amoebanet.py): stride-2 stem and two stem reduction cells, drop-path
  falling to keep 0.7 over the run, dropout 0.5 before the logits, the
  auxiliary head (weight 0.4), label smoothing 0.1, 1000 classes (the
  reference has 1001, with a background class). The optimisation is ours
  (Nesterov momentum, cosine decay with 5 epochs of warm-up, 90 epochs,
  batch 256); the reference uses RMSProp with exponential decay.
  """

  STEM = 'imagenet'
  KEEP_PROB = 0.5
  DROP_PATH_KEEP_PROB = 0.7
  AUX_HEAD = True
  LABEL_SMOOTHING = 0.1
  BATCH_SIZE = 256
  LEARNING_RATE = 0.1
  WEIGHT_DECAY = 4e-5


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_208(_AmoebaNetImageNet):  # noqa: N801
  """AmoebaNet-D (18, 208), 81.8M parameters: GPipe's Table 1 naive-1.

  No pipeline (K=1, M=1) and no re-computation: the largest AmoebaNet-D
  the paper fits on one 8 GB accelerator without GPipe.
  """

  NUM_CELLS = 18
  FILTERS = 208
  NUM_PARTITIONS = 1
  NUM_MICRO_BATCHES = 1
  RECOMPUTE = 'never'


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_544_GPipe(_AmoebaNetImageNet):  # noqa: N801
  """AmoebaNet-D (18, 544), 541.0M parameters, K=4, M=32.

  Table 1 trains it on 2 accelerators (pipeline-2); K=4 and M=32 (the
  throughput experiments' M) give a bubble (K-1)/(M+K-1) of 9%.
  """

  NUM_CELLS = 18
  FILTERS = 544
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_36_544_GPipe(_AmoebaNetImageNet):  # noqa: N801
  """AmoebaNet-D (36, 544), 1.054B parameters, K=8, M=32.

  Table 1 trains it on 4 accelerators (pipeline-4); K=8, M=32: bubble 18%.
  """

  NUM_CELLS = 36
  FILTERS = 544
  NUM_PARTITIONS = 8
  NUM_MICRO_BATCHES = 32


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512_GPipe(_AmoebaNetImageNet):  # noqa: N801
  """AmoebaNet-B (18, 512) at 480x480, K=4, M=32: the paper's ImageNet model.

  557.3M parameters (559.1M with the auxiliary head at 480x480); the
  paper reports 84.4% top-1 with it. K and M are our choice.
  """

  CELLS = 'B'
  NUM_CELLS = 18
  FILTERS = 512
  IMAGE_SIZE = 480
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 32
