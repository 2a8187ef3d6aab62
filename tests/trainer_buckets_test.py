"""The trainer binary on length-bucketed translation batches: each bucket's
first step noted once (one trace serves all, or one per shape when asked),
long pairs counted, and a stopped run resumed on the next batch (the
bucketed input's position is in the checkpoint), bitwise whichever way its
steps were traced."""

import os
import re

from absl.testing import absltest

from tests import trainer_testlib

_MODEL = 'mt.synthetic.TransformerTinyGPipe'
# Synthetic pairs are 4 to 13 tokens long (</s> or <s> included): those
# of 13 are longer than the last bucket.
_COMMON = ('train_input.bucket_upper_bound : [8, 12]\n'
           'train_input.bucket_batch_limit : [48, 32]\n'
           'train_input.shuffle_buffer_size : 256\n'
           'task.train.eval_interval_steps : 0\n'
           'task.train.eval_steps : 1\n'
           'task.train.summary_interval_steps : 4\n'
           'task.train.max_steps : ')


class TrainerBucketsTest(trainer_testlib.TrainerTestBase):

  def _RunTo(self, logdir, steps, more=''):
    result = self._Run(logdir, f'--data_dir={self._data}',
                       f'--model_params_override={more}{_COMMON}{steps}',
                       env={'TF_DETERMINISTIC_OPS': '1'}, model=_MODEL)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    return result

  def setUp(self):
    super().setUp()
    self._data = os.path.join(self._root, 'data')

  def testEachBucketNotedOnceLongPairsCountedAndAStoppedRunResumes(self):
    whole, split = (self.create_tempdir().full_path for _ in range(2))
    # Its first half with each shape traced at its first step (the data
    # prepared, with TFDS's progress); the second with one trace.
    first = self._RunTo(split, 12,
                        'task.train.one_trace_for_buckets : False\n')
    notes = re.findall(r'\(first step of a batch of shape \((\d+, \d+)\): '
                       r'[0-9.]+ s(.*)\)', first.stdout)
    self.assertCountEqual(notes, [('48, 8', ', traced once'),
                                  ('32, 12', ', traced once')])
    result = self._RunTo(whole, 24)
    self.assertEqual(result.stderr, '')  # a quiet console
    # Each bucket's first step noted once; one trace serves both.
    for shape in ('(48, 8)', '(32, 12)'):
      self.assertEqual(result.stdout.count(
          f'(first step of a batch of shape {shape}: '), 1, result.stdout)
    notes = re.findall(r'step \d+/24  loss [0-9.]+  .*\(first step of a '
                       r'batch of shape \(\d+, \d+\): [0-9.]+ s(.*)\)',
                       result.stdout)
    self.assertEqual(notes, [', traced once for every bucket', ''],
                     result.stdout)
    dropped = [v for _, v in sorted(trainer_testlib.Scalars(
        os.path.join(whole, 'train'))['input/dropped_long'])]
    self.assertGreater(dropped[0], 0)
    self.assertEqual(dropped, sorted(dropped))
    self.assertGreater(dropped[-1], dropped[0])

    result = self._RunTo(split, 24)
    self.assertIn('Resumed from', result.stdout)
    self.assertIn('at step 12; input position restored.', result.stdout)
    # The same batches in the same order after the stop: bitwise the same
    # variables as the unstopped run (traced once or per shape alike).
    self.assertSameVariables(os.path.join(whole, 'train', 'ckpt-24'),
                             os.path.join(split, 'train', 'ckpt-24'))


if __name__ == '__main__':
  absltest.main()
