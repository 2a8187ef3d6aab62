"""CIFAR-100 models: trained from scratch, or fine-tuned from ImageNet.

GPipe's CIFAR results (Huang et al. 2019, Table 4) come from fine-tuning
the ImageNet model. `ResNet50_FineTune` does that with our ImageNet
ResNet-50: its variables start from an image.imagenet.ResNet50_GPipe
checkpoint (task.train.init_from_checkpoint_rules), all but the 1000-way
classifier, which is new (100 classes); images are resized to 224.
Point it at your checkpoint:

  python -m lingvo_pipe.trainer --model=image.cifar100.ResNet50_FineTune \\
      --logdir=/tmp/finetune --model_params_override="\\
      task.train.init_from_checkpoint_rules : {'/imagenet/train/ckpt-450000': \\
      ([('(.*)', '%s')], ['.*/logits/.*'])}"

'cifar100' must be prepared in the data directory as for CIFAR-10.
"""

from __future__ import annotations

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import model_registry
from lingvo_pipe.core import optimizer
from params.image import cifar10
from params.image import imagenet

_CIFAR100_TRAIN_EXAMPLES = 50000

# Where ResNet50_FineTune looks for its ImageNet checkpoint unless told.
PRETRAINED_CHECKPOINT = '/path/to/imagenet_resnet50/train/ckpt-N'


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_GPipe(cifar10.AmoebaNetD_GPipe):  # noqa: N801
  """The CIFAR-10 AmoebaNet-D and recipe, on CIFAR-100 (100 classes)."""

  DATASET = 'cifar100'
  NUM_CLASSES = 100


@model_registry.RegisterSingleTaskModel
class ResNet50_FineTune(imagenet.ResNet50_GPipe):  # noqa: N801
  """ResNet-50 from ImageNet, fine-tuned on CIFAR-100 at 224x224, K=2, M=8.

  Every variable but the classifier ('logits') from PRETRAINED_CHECKPOINT
  (override task.train.init_from_checkpoint_rules; module docstring).
  Nesterov momentum 0.9, batch 256, learning rate 0.01 with cosine decay
  over 20k steps, no weight decay: our choices, not the paper's recipe.
  """

  DATASET = 'cifar100'
  EVAL_SPLIT = 'test'
  NUM_CLASSES = 100
  TRAIN_CROP = 'random_resized'
  EVAL_CROP = 'resize'
  EVAL_BATCH_SIZE = 200
  EVAL_STEPS = 50  # the whole test split
  EVAL_INTERVAL_STEPS = 1000
  LEARNING_RATE = 0.01
  WEIGHT_DECAY = 0.0
  MAX_STEPS = 20000
  INIT_FROM_CHECKPOINT_RULES = {
      PRETRAINED_CHECKPOINT: ([('(.*)', '%s')], ['.*/logits/.*'])}

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Momentum.Params().Set(momentum=0.9, use_nesterov=True)

  def LearningRateSchedule(self) -> hyperparams.Params:
    return lr_schedule.Cosine.Params().Set(total_steps=self.MAX_STEPS)
