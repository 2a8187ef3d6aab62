"""Base params classes of image classifiers trained with GPipe (unregistered).

A registered model subclasses `ResNetBase` or `AmoebaNetBase` and sets
class attributes (Lingvo's habit): sizes, dataset, pipeline and training.
To change a size, subclass it in your own module and train that
(`--model=my_models.Smaller`):

  class Smaller(cifar10.AmoebaNetD_GPipe):
    NUM_CELLS = 6
    FILTERS = 64

Everything else (batch size, M, learning rate, steps, data_dir) can also be
overridden on the returned params (`--model_params_override`), except the
network's sizes and its number of partitions K, which are baked into the
partitioned layer list.
"""

from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import optimizer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import amoebanet
from lingvo_pipe.tasks.image import input_generator
from lingvo_pipe.tasks.image import model
from lingvo_pipe.tasks.image import resnet


class ImageClassifierBase:
  """Inputs, task and pipeline of an ImageClassifier; Network() per model."""

  # Data.
  DATASET = 'cifar10'
  DATA_DIR: Optional[str] = None
  TRAIN_SPLIT = 'train'
  EVAL_SPLIT = 'test'
  NUM_CLASSES = 10
  IMAGE_SIZE = 32
  NUM_CHANNELS = 3
  RANDOM_CROP_PADDING = 0
  RANDOM_FLIP = False
  # input_generator's crop for training and evaluation ('resize' keeps the
  # image whole; ImageNet: 'random_resized' and 'center').
  TRAIN_CROP = 'resize'
  EVAL_CROP = 'resize'
  NORMALIZATION_MEAN: Any = 0.5
  NORMALIZATION_STD: Any = 0.25
  SHUFFLE_BUFFER_SIZE = 10000
  INPUT_SEED = 1
  # Pipeline.
  BATCH_SIZE = 128
  EVAL_BATCH_SIZE = 100
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  RECOMPUTE = 'always'
  # The order of the actions in training (schedules/registry.py's Names(),
  # or a table's .csv file), and V, the stages per device (K x V cells:
  # 2 or more for 'interleaved_1f1b', 2 for 'zb_v').
  SCHEDULE = 'gpipe'
  NUM_VIRTUAL_STAGES = 1
  # The network's input is the images, which need no gradient: the
  # pipeline's first partition leaves it out (the planner reads this).
  PIPELINE_INPUT_GRADIENT = False
  # Moving-average decay of every BatchNorm: 0.9 suits short runs.
  BN_DECAY = 0.99
  # Training.
  NETWORK_INPUT = 'image'
  LABEL_SMOOTHING = 0.0
  AUX_LOSS_WEIGHT = 0.4  # of auxiliary logits, if the network has them
  LEARNING_RATE = 1e-3
  MAX_STEPS = 1000
  WEIGHT_DECAY = 0.0
  CLIP_GRADIENT_NORM = 0.0
  EVAL_INTERVAL_STEPS = 1000
  EVAL_STEPS = 10
  # Transfer learning: task.train.init_from_checkpoint_rules.
  INIT_FROM_CHECKPOINT_RULES: Any = {}

  def Network(self) -> List[hyperparams.Params]:
    """The network as a flat list of uniquely named layer params."""
    raise NotImplementedError(f'{type(self).__name__} must define Network().')

  def Optimizer(self) -> hyperparams.Params:
    return optimizer.Adam.Params()

  def LearningRateSchedule(self) -> hyperparams.Params:
    return lr_schedule.Constant.Params()

  def _Input(self, split: str, batch_size: int,
             train: bool) -> hyperparams.Params:
    return input_generator.ImageClassificationInput.Params().Set(
        name=f'{split}_input', dataset_name=self.DATASET, split=split,
        data_dir=self.DATA_DIR, batch_size=batch_size,
        image_size=self.IMAGE_SIZE, num_classes=self.NUM_CLASSES,
        repeat=train, shuffle_buffer_size=self.SHUFFLE_BUFFER_SIZE if train
        else 0, seed=self.INPUT_SEED,
        random_crop_padding=self.RANDOM_CROP_PADDING if train else 0,
        random_flip=self.RANDOM_FLIP and train,
        crop=self.TRAIN_CROP if train else self.EVAL_CROP,
        normalization_mean=self.NORMALIZATION_MEAN,
        normalization_std=self.NORMALIZATION_STD)

  def Train(self) -> hyperparams.Params:
    return self._Input(self.TRAIN_SPLIT, self.BATCH_SIZE, train=True)

  def Dev(self) -> hyperparams.Params:
    return self._Input(self.EVAL_SPLIT, self.EVAL_BATCH_SIZE, train=False)

  def MicroBatchInputShapes(self) -> Any:
    """Shapes of the network input for one training micro-batch."""
    m = self.NUM_MICRO_BATCHES
    for key in ('BATCH_SIZE', 'EVAL_BATCH_SIZE'):
      if getattr(self, key) % m:
        raise ValueError(
            f'{type(self).__name__}: {key}={getattr(self, key)} does not '
            f'split into NUM_MICRO_BATCHES={m}; use a multiple of {m}.')
    b = self.BATCH_SIZE // m
    image = tf.TensorShape([b, self.IMAGE_SIZE, self.IMAGE_SIZE,
                            self.NUM_CHANNELS])
    if self.NETWORK_INPUT == 'image':
      return image
    return NestedMap(image=image, example_keys=tf.TensorShape([b]),
                     example_steps=tf.TensorShape([b]))

  def Task(self) -> hyperparams.Params:
    p = model.ImageClassifier.Params()
    p.network = model.GPipeNetworkParams(
        self.Network(), self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES,
        self.MicroBatchInputShapes(), recompute=self.RECOMPUTE,
        schedule=self.SCHEDULE, num_virtual_stages=self.NUM_VIRTUAL_STAGES)
    p.network_input = self.NETWORK_INPUT
    p.num_classes = self.NUM_CLASSES
    p.label_smoothing = self.LABEL_SMOOTHING
    p.aux_loss_weight = self.AUX_LOSS_WEIGHT
    tp = p.train
    tp.optimizer = self.Optimizer()
    tp.learning_rate = self.LEARNING_RATE
    tp.lr_schedule = self.LearningRateSchedule()
    tp.weight_decay = self.WEIGHT_DECAY
    tp.clip_gradient_norm_to_value = self.CLIP_GRADIENT_NORM
    tp.max_steps = self.MAX_STEPS
    tp.eval_interval_steps = self.EVAL_INTERVAL_STEPS
    tp.save_interval_steps = self.EVAL_INTERVAL_STEPS
    tp.summary_interval_steps = min(100, self.EVAL_INTERVAL_STEPS)
    tp.eval_steps = self.EVAL_STEPS
    tp.init_from_checkpoint_rules = dict(self.INIT_FROM_CHECKPOINT_RULES)
    return p


class ResNetBase(ImageClassifierBase):
  """A CIFAR-style ResNet (resnet.ResNet) with basic blocks."""

  NUM_BLOCKS = (3, 3, 3)
  WIDTHS = (16, 32, 64)

  def Network(self) -> List[hyperparams.Params]:
    return resnet.ResNet(self.NUM_BLOCKS, self.WIDTHS, self.NUM_CLASSES,
                         input_channels=self.NUM_CHANNELS,
                         bn_decay=self.BN_DECAY)


class AmoebaNetBase(ImageClassifierBase):
  """AmoebaNet (L, D) = (NUM_CELLS, FILTERS) (amoebanet.AmoebaNet).

  CELLS 'D' or 'B' picks the published genotypes; NORMAL_CELL and
  REDUCTION_CELL, if set, replace them. Drop-path's keep probability falls
  from 1 to DROP_PATH_KEEP_PROB over MAX_STEPS (the reference's schedule).
  """

  NETWORK_INPUT = 'image_and_keys'  # dropout and drop-path read the keys
  NUM_CELLS = 6
  FILTERS = 32
  CELLS = 'D'
  NORMAL_CELL: Optional[amoebanet.CellSpec] = None
  REDUCTION_CELL: Optional[amoebanet.CellSpec] = None
  STEM = 'cifar'
  STEM_FILTERS = 32
  KEEP_PROB = 1.0
  DROP_PATH_KEEP_PROB = 1.0
  AUX_HEAD = False

  def Network(self) -> List[hyperparams.Params]:
    cells = {'D': amoebanet.AmoebaNetD, 'B': amoebanet.AmoebaNetB}
    if self.CELLS not in cells:
      raise ValueError(f'{type(self).__name__}: CELLS={self.CELLS!r}; use '
                       f'one of {sorted(cells)}.')
    extra = {}
    if self.NORMAL_CELL is not None:
      extra['normal_cell'] = self.NORMAL_CELL
    if self.REDUCTION_CELL is not None:
      extra['reduction_cell'] = self.REDUCTION_CELL
    return cells[self.CELLS](
        self.NUM_CELLS, self.FILTERS, self.NUM_CLASSES, stem=self.STEM,
        input_channels=self.NUM_CHANNELS, stem_filters=self.STEM_FILTERS,
        keep_prob=self.KEEP_PROB,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB,
        drop_path_burn_in_steps=self.MAX_STEPS, aux_head=self.AUX_HEAD,
        image_size=self.IMAGE_SIZE, bn_decay=self.BN_DECAY, **extra)


class ResNetImageNetBase(ImageClassifierBase):
  """ResNet-DEPTH v1.5 with bottleneck blocks (resnet.ResNetImageNet)."""

  DEPTH = 50
  NUM_BLOCKS: Optional[Any] = None  # blocks per stage; None: by DEPTH
  BASE_WIDTH = 64

  def Network(self) -> List[hyperparams.Params]:
    return resnet.ResNetImageNet(self.DEPTH, self.NUM_CLASSES,
                                 input_channels=self.NUM_CHANNELS,
                                 bn_decay=self.BN_DECAY,
                                 num_blocks=self.NUM_BLOCKS,
                                 base_width=self.BASE_WIDTH)
