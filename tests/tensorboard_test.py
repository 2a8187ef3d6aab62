"""A trainer run's logdir as TensorBoard reads it, with TensorBoard's own
event reader (the one its Python loader uses, with its data-class
migration): every scalar, the params and balance texts and the measured
timeline's image.

tensorboard is a test-only requirement (requirements-test.txt); the
library never imports it.
"""

import os
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from tests import trainer_testlib

_STEPS = ('task.train.max_steps : 6\n'
          'task.train.summary_interval_steps : 2\n'
          'task.train.save_interval_steps : 6\n'
          'task.train.eval_interval_steps : 3\n'
          'task.train.eval_steps : 2')


def _Load(directory):
  acc = plugin_event_accumulator.EventAccumulator(
      directory, size_guidance={plugin_event_accumulator.TENSORS: 0})
  return acc.Reload()


def _Values(acc, tag):
  """[(step, numpy value)] of `tag`."""
  return [(e.step, tensor_util.make_ndarray(e.tensor_proto))
          for e in acc.Tensors(tag)]


class TensorBoardTest(trainer_testlib.TrainerTestBase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    test = cls('testEveryScalarAsWritten')
    # A fresh logdir: TEST_TMPDIR outlives the run, and a second run in
    # the same logdir would resume there.
    cls._logdir = tempfile.mkdtemp(dir=cls._root)
    cls._trace = os.path.join(cls._logdir, 'trace')
    result = test._Run(cls._logdir, f'--pipeline_trace={cls._trace}',
                       f'--model_params_override={_STEPS}')
    if result.returncode:
      raise AssertionError(result.stderr[-3000:])
    cls._train = _Load(os.path.join(cls._logdir, 'train'))

  def _Plugin(self, acc, plugin, data_class):
    """{tag: [(step, value)]} of the plugin's tags, each of `data_class`."""
    tags = acc.PluginTagToContent(plugin)
    for tag in tags:
      self.assertEqual(acc.SummaryMetadata(tag).data_class, data_class, tag)
    return {tag: _Values(acc, tag) for tag in tags}

  def testEveryScalarAsWritten(self):
    for run, steps in (('train', [2, 4, 6]), ('eval_dev', [3, 6])):
      scalars = self._Plugin(_Load(os.path.join(self._logdir, run)),
                             'scalars', summary_pb2.DATA_CLASS_SCALAR)
      # The same tags, steps and values as the events hold (the test
      # library's reader of the raw records).
      raw = trainer_testlib.Scalars(os.path.join(self._logdir, run))
      self.assertEqual(
          {t: [(s, float(v)) for s, v in vs] for t, vs in scalars.items()},
          raw)
      names = {'loss', 'learning_rate', 'grad_norm', 'examples_per_sec'}
      self.assertContainsSubset(names if run == 'train' else {'loss'},
                                set(scalars))
      for tag, values in scalars.items():
        self.assertEqual([s for s, _ in values], steps, (run, tag))
        for _, value in values:
          self.assertEqual(value.shape, ())
          self.assertTrue(np.isfinite(value), (run, tag))

  def testParamsAndBalanceAsText(self):
    texts = self._Plugin(self._train, 'text', summary_pb2.DATA_CLASS_TENSOR)
    self.assertEqual(sorted(texts), ['balance/task/network', 'params.txt'])
    [(step, params)] = texts['params.txt']
    self.assertEqual(step, 0)
    # A Markdown code block: the file's lines, each indented 4 spaces.
    with open(os.path.join(self._logdir, 'params.txt')) as f:
      self.assertEqual(params.item().decode(), '\n'.join(
          '    ' + line for line in f.read().rstrip('\n').split('\n')))
    [(step, balance)] = texts['balance/task/network']
    self.assertEqual(step, 0)
    balance = balance.item().decode()
    self.assertIn("    PipeliningLayer 'task/network': K=2 partitions, M=4 "
                  'micro-batches, schedule=gpipe', balance)
    self.assertRegex(balance, r'partition 0: .* \(160 parameters\)')
    self.assertRegex(balance, r'partition 1: .* \(132 parameters\)')

  def testTheMeasuredTimelineAsAPng(self):
    images = self._Plugin(self._train, 'images',
                          summary_pb2.DATA_CLASS_BLOB_SEQUENCE)
    self.assertEqual(list(images), ['pipeline_trace'])
    [(step, value)] = images['pipeline_trace']
    self.assertEqual(step, 0)
    width, height, png = value
    picture = tf.io.decode_png(png).numpy()
    self.assertEqual(picture.shape, (int(height), int(width), 3))
    with open(self._trace + '.svg') as f:
      svg = f.read()
    self.assertIn(f'width="{int(width)}" height="{int(height)}"', svg)
    # Blue forwards and orange backwards.
    colours = {tuple(c) for c in picture.reshape(-1, 3)}
    self.assertContainsSubset({(0x4a, 0x90, 0xd9), (0xe8, 0x91, 0x3a)},
                              colours)


if __name__ == '__main__':
  absltest.main()
