"""CIFAR-10 image models with GPipe: AmoebaNet-D and ResNet.

They read the 'cifar10' TFDS dataset, which must be prepared in the data
directory (`tfds build cifar10 --data_dir=DIR` on a machine with internet
access, then `--data_dir=DIR`). Training uses the usual CIFAR augmentation
(4-pixel padded random crops, random flips).
"""

from __future__ import annotations

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import model_registry
from lingvo_pipe.core import optimizer
from params.image import classifier_base

_CIFAR10_TRAIN_EXAMPLES = 50000


class _Cifar10:
  """Data, augmentation and SGD with momentum, shared by the models."""

  DATASET = 'cifar10'
  NUM_CLASSES = 10
  IMAGE_SIZE = 32
  RANDOM_CROP_PADDING = 4
  RANDOM_FLIP = True
  EVAL_BATCH_SIZE = 80  # a multiple of M
  EVAL_STEPS = 125  # the whole test split
  EVAL_INTERVAL_STEPS = 2000

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Momentum.Params().Set(momentum=0.9, use_nesterov=True)


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_GPipe(_Cifar10, classifier_base.AmoebaNetBase):  # noqa: N801
  """AmoebaNet-D (18, 256) on CIFAR-10, K=4 partitions, M=16.

  (L, D) = (18, 256) is the AmoebaNet-D of GPipe's throughput experiments
  (Huang et al. 2019, Table 2); Table 1's sizes run from (18, 208) to
  (72, 512). The published cells with the reference's CIFAR stem (a
  stride-1 3x3 conv, no stem cells): three stacks of 6 normal cells, D =
  256 filters in the first; 117.5M parameters, split by flops into 4
  partitions of 4.6M, 15.4M, 39.7M and 57.8M. (The paper's CIFAR results
  fine-tune its ImageNet model instead; see image.cifar100.)
  Batch 256 in 16 micro-batches of 16 (bubble (K-1)/(M+K-1) = 16%);
  Nesterov momentum, learning rate 0.1 with cosine decay over ~400 epochs,
  decoupled weight decay 5e-4, dropout 0.5 before the logits, label
  smoothing 0.1. Our choices, not the paper's exact recipe.
  """

  NUM_CELLS = 18
  FILTERS = 256
  KEEP_PROB = 0.5
  LABEL_SMOOTHING = 0.1
  BATCH_SIZE = 256
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 16
  LEARNING_RATE = 0.1
  WEIGHT_DECAY = 5e-4
  MAX_STEPS = 400 * _CIFAR10_TRAIN_EXAMPLES // 256

  def LearningRateSchedule(self) -> hyperparams.Params:
    return lr_schedule.Cosine.Params().Set(
        total_steps=self.MAX_STEPS, warmup_steps=min(1000,
                                                     self.MAX_STEPS - 1))


@model_registry.RegisterSingleTaskModel
class ResNet_GPipe(_Cifar10, classifier_base.ResNetBase):  # noqa: N801
  """ResNet-110 on CIFAR-10 (He et al. 2016, section 4.2), K=4, M=8.

  Three stacks of 18 basic blocks, widths 16, 32, 64. The paper's recipe:
  batch 128, momentum 0.9, weight decay 1e-4, learning rate 0.1 (0.01 for
  the first 400 steps), divided by 10 at 32k and 48k steps, 64k steps.
  Batch 128 in 8 micro-batches of 16.
  """

  NUM_BLOCKS = (18, 18, 18)
  WIDTHS = (16, 32, 64)
  BATCH_SIZE = 128
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 8
  LEARNING_RATE = 0.1
  WEIGHT_DECAY = 1e-4
  MAX_STEPS = 64000

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Momentum.Params().Set(momentum=0.9)

  def LearningRateSchedule(self) -> hyperparams.Params:
    bounds = [400, 32000, 48000]
    bounds = [b for b in bounds if b < self.MAX_STEPS]
    return lr_schedule.Piecewise.Params().Set(
        boundaries=bounds, values=[0.1, 1.0, 0.1, 0.01][:len(bounds) + 1])
