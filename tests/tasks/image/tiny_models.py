"""Tiny versions of the registered image models, and a one-step test.

A tiny version is a subclass of the registered class with small sizes (the
way users change sizes, see params/image/classifier_base.py), still split
into K=2 partitions and M=2 micro-batches; everything else (optimizer,
schedule, inputs, pipeline) is the registered model's. AmoebaNets also get
cells of one combination each and no auxiliary head (8x8 images are too
small for it), to keep tracing short (their real cells and the head are
checked in amoebanet_test and model_test). Inputs read
`tfds.testing.mock_data`: random images of the dataset's shapes, so this
checks the wiring, not the learning (training_test does).

The test files (tiny_*_test.py) call devices.SplitCpu(4) before importing
this module.
"""

from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import base_model
from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.image import amoebanet

TINY = dict(
    NUM_BLOCKS=(1, 1), WIDTHS=(4, 8), BASE_WIDTH=4,  # ResNets
    NUM_CELLS=3, FILTERS=4, STEM_FILTERS=4, AUX_HEAD=False,  # AmoebaNets
    NORMAL_CELL=amoebanet.CellSpec(
        ((('separable_3x3_2', 0), ('none', 1)),), (0, 2)),
    REDUCTION_CELL=amoebanet.CellSpec(
        ((('max_pool_2x2', 0), ('1x7_7x1', 1)),), (2,)),
    IMAGE_SIZE=8, BATCH_SIZE=4, EVAL_BATCH_SIZE=4, NUM_PARTITIONS=2,
    NUM_MICRO_BATCHES=2, MAX_STEPS=10, SHUFFLE_BUFFER_SIZE=4)


def Tiny(key: str, data_dir: str) -> Any:
  """An instance of the registered class with TINY's sizes and data_dir."""
  cls = model_registry.GetClass(key)
  attrs = {k: v for k, v in TINY.items() if hasattr(cls, k)}
  attrs['DATA_DIR'] = data_dir
  return type(f'Tiny{cls.__name__}', (cls,), attrs)()


def TinyParamsText(key: str) -> str:
  """The text of a tiny version's task, train and dev params."""
  tiny = Tiny(key, '/data')
  return '\n'.join(p.ToText() for p in
                   (tiny.Task().Set(name='task'), tiny.Train(), tiny.Dev()))


class OneStepTestMixin:
  """testOneTrainStep(key) for a tf.test.TestCase."""

  def CheckSameTinyVersion(self, key: str, tested: str) -> None:
    """Asserts `key`'s tiny version is `tested`'s, param for param.

    Registered classes that differ only in what TINY replaces (sizes, K,
    M, cells) build the same tiny model; its one-step test covers both.
    """
    self.assertEqual(TinyParamsText(tested), TinyParamsText(key))

  def CheckOneTrainStep(self, key: str, fprop_dtype: Any = None) -> None:
    """One step of `key`'s tiny version (in `fprop_dtype` if given: its
    variables stay float32, its loss too)."""
    tiny = Tiny(key, self.create_tempdir().full_path)
    task_p = tiny.Task().Set(name='task')
    if fprop_dtype is not None:
      task_p.fprop_dtype = fprop_dtype
    self.assertEqual(2, base_model.NumDevicesNeeded(task_p))
    task = task_p.Instantiate()
    if fprop_dtype is not None:
      self.assertEqual({tf.float32}, {v.dtype for v in task.vars.Flatten()})
      for cell in task.network.cells:
        self.assertEqual(fprop_dtype, cell.fprop_dtype, cell.path)
      self.assertEqual(fprop_dtype, task.network.hand_off_dtype)
    with tfds.testing.mock_data(num_examples=8):
      train_batch = next(iter(tiny.Train().Instantiate().GetDataset()))
      dev_batch = next(iter(tiny.Dev().Instantiate().GetDataset()))
    self.assertEqual([4, 8, 8, 3], train_batch.image.shape.as_list())
    task.CreateTrainState()
    before = {k: v.numpy() for k, v in task.VariablesByPath().items()}
    out = tf.function(task.TrainStep, autograph=False)(train_batch)
    self.assertTrue(out.is_finite.numpy())
    self.assertTrue(np.isfinite(out.loss.numpy()))
    self.assertEqual(tf.float32, out.loss.dtype)
    self.assertEqual(1, out.global_step.numpy())
    changed = {k for k, v in task.VariablesByPath().items()
               if not np.array_equal(before[k], v.numpy())}
    # Both partitions learnt, and BatchNorm statistics moved.
    self.assertTrue(any('/stem/' in k for k in changed))
    for cell in task.network.cells:
      paths = {v.name.split(':')[0] for v in cell.vars.Flatten()}
      self.assertTrue(any(k.endswith('/w') for k in paths & changed),
                      cell.path)
    self.assertTrue(any(k.endswith('/moving_mean') for k in changed))
    metrics = tf.function(task.EvalStep, autograph=False)(dev_batch)
    self.assertEqual(['accuracy', 'loss', 'top5_accuracy'], sorted(metrics))
    self.assertTrue(np.isfinite(metrics.loss[0].numpy()))
    decoded = task.DecodeStep(dev_batch)
    self.assertEqual([4], decoded.predicted.shape.as_list())
