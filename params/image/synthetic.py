"""Image models that train offline, on lingvo_pipe_synthetic_images.

  python -m lingvo_pipe.trainer --model=image.synthetic.ResNetTinyGPipe \\
      --logdir=/tmp/resnet_tiny

The data is generated locally on first use (synthetic_images.py: 10
classes of 32x32 images; 5000 train, 1000 test). Both models are split
into K=2 partitions balanced by flops, M=4 micro-batches of 8, and learn
it within minutes on 2 CPU cores (measured numbers in each class; on a
machine with a load average of 6-9, so expect faster).
"""

from __future__ import annotations

from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.image import synthetic_images
from params.image import classifier_base


class _SyntheticData:
  """Data and schedule shared by the synthetic models."""

  DATASET = synthetic_images.NAME
  NUM_CLASSES = synthetic_images.NUM_CLASSES
  IMAGE_SIZE = synthetic_images.IMAGE_SIZE
  SHUFFLE_BUFFER_SIZE = 5000
  BATCH_SIZE = 32
  EVAL_BATCH_SIZE = 100
  EVAL_STEPS = 10  # the whole test split
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  MAX_STEPS = 200
  EVAL_INTERVAL_STEPS = 100
  BN_DECAY = 0.9  # moving averages settle within a short run


@model_registry.RegisterSingleTaskModel
class ResNetTinyGPipe(_SyntheticData, classifier_base.ResNetBase):
  """ResNet-8 (one basic block per stage, widths 16, 32, 64), K=2, M=4.

  Adam, learning rate 2e-3; 200 steps of batch 32. Measured with the
  trainer (test split, 1000 examples): accuracy 99.7% at step 100, 100% at
  step 200; 65 s in all with the data already prepared (1 min 52 s at a
  load average of 8-9), of which ~20 s start-up and tracing.
  """

  NUM_BLOCKS = (1, 1, 1)
  WIDTHS = (16, 32, 64)
  LEARNING_RATE = 2e-3


@model_registry.RegisterSingleTaskModel
class AmoebaNetTinyGPipe(_SyntheticData, classifier_base.AmoebaNetBase):
  """AmoebaNet-D (L, D) = (3, 8): one normal cell per stack, K=2, M=4.

  The published cells and CIFAR stem, 28k parameters. Adam, learning rate
  2e-3; 100 steps of batch 32. Measured with the trainer: test accuracy
  93.2% at step 50, 99.2% at step 100; 43 s in all (59 s of CPU).
  """

  NUM_CELLS = 3
  FILTERS = 8
  LEARNING_RATE = 2e-3
  MAX_STEPS = 100
  EVAL_INTERVAL_STEPS = 50
