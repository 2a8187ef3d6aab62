"""The trainer binary, run as a user runs it, on a model in a user's file.

The model lives in a module written to a temporary directory (outside the
package) and is found with --model=<module>.<Class>. Each test starts the
real binary in a subprocess: train and evaluate, resume after SIGKILL, stop
on a non-finite loss, and reject an unknown model.
"""

import glob
import json
import os
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import trainer_testlib

_Scalars = trainer_testlib.Scalars


def _CheckpointValues(logdir, step):
  """{name: value} of every variable in the trainer's ckpt-`step`."""
  reader = tf.train.load_checkpoint(os.path.join(logdir, 'train',
                                                 f'ckpt-{step}'))
  names = sorted(n for n in reader.get_variable_to_shape_map()
                 if n.endswith('.ATTRIBUTES/VARIABLE_VALUE'))
  return {n: reader.get_tensor(n) for n in names}


class TrainerTest(trainer_testlib.TrainerTestBase):

  def testTrainsEvaluatesAndWritesEverything(self):
    logdir = self.create_tempdir().full_path
    # As a user starts it: no TF_CPP_MIN_LOG_LEVEL.
    trace = os.path.join(logdir, 'trace')
    result = self._Run(logdir, f'--pipeline_trace={trace}',
                       env={'TF_CPP_MIN_LOG_LEVEL': ''})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertEqual(result.stderr, '')  # a quiet console
    self.assertIn(f'Model params: {logdir}/params.txt', result.stdout)
    # Tiny: projections 4 -> 32 (partition 0) and 32 -> 4 (partition 1).
    first, second = 4 * 32 + 32, 32 * 4 + 4
    self.assertIn(f'Model: {first + second:,} trainable parameters '
                  f'({4 * (first + second) / 1024:.2f} KiB).', result.stdout)
    self.assertRegex(result.stdout, rf'partition 0: .* \({first} parameters\)')
    self.assertRegex(result.stdout,
                     rf'partition 1: .* \({second} parameters\)')
    self.assertRegex(result.stdout, r'task/network: K=2 M=4, .* measured '
                     r'bubble \d+\.\d%')
    self.assertIn(f'Measured timeline: {trace}.svg (picture), {trace}.json',
                  result.stdout)
    with open(trace + '.json') as f:
      spans = [e for e in json.load(f)['traceEvents'] if e['ph'] == 'X'
               and e['cat'] in ('forward', 'backward')]
    self.assertEqual(sorted((e['name'], e['args']['partition']) for e in spans),
                     sorted((f'{p}{m}', k) for p in 'FB' for k in range(2)
                            for m in range(4)))
    self.assertTrue(os.path.exists(trace + '.svg'))
    self.assertIn('eval dev at step 30: loss', result.stdout)
    self.assertIn('eval dev at step 60: loss', result.stdout)
    self.assertRegex(result.stdout, r'step 60/60  loss [0-9.e-]+  .*ETA')
    with open(os.path.join(logdir, 'params.txt')) as f:
      params_text = f.read()
    self.assertIn('task.train.max_steps : 60', params_text)
    self.assertIn('task.network.num_micro_batches : 4', params_text)
    train = _Scalars(os.path.join(logdir, 'train'))
    for tag in ('loss', 'learning_rate', 'grad_norm', 'examples_per_sec'):
      self.assertIn(tag, train)
    losses = [v for _, v in sorted(train['loss'])]
    self.assertLess(losses[-1], 0.5 * losses[0])
    dev = _Scalars(os.path.join(logdir, 'eval_dev'))
    self.assertEqual([s for s, _ in dev['loss']], [30, 60])
    self.assertLess(dev['loss'][1][1], dev['loss'][0][1])
    with open(os.path.join(logdir, 'pipeline_task.network.svg')) as f:
      self.assertIn('K=2 partitions, M=4 micro-batches', f.read())
    names = sorted(os.path.basename(p) for p in glob.glob(
        os.path.join(logdir, 'train', 'ckpt-*.index')))
    self.assertEqual(names, ['ckpt-20.index', 'ckpt-40.index',
                             'ckpt-60.index'])


  def _Backbone(self, logdir, step):
    """Partition 0's variables (not their optimizer slots) at `step`."""
    return {n: v for n, v in _CheckpointValues(logdir, step).items()
            if n.split('/')[0].endswith('cell_0.Sw') or
            n.split('/')[0].endswith('cell_0.Sb')}

  def testFineTunesFromAnotherRunsCheckpoint(self):
    """init_from_checkpoint_rules: backbone loaded, head new, never on resume.

    Pretrain Tiny (4 outputs), then fine-tune it with 3 outputs: the
    classifier (partition 1) has another shape and keeps its initial
    values. At learning rate 0 the fine-tuned backbone stays what was
    loaded; a resumed fine-tuning run restores its own checkpoint.
    """
    pretrained = self.create_tempdir().full_path
    self.assertEqual(self._Run(
        pretrained, '--model_params_override=task.train.max_steps : 20'
    ).returncode, 0)
    source = os.path.join(pretrained, 'train', 'ckpt-20')
    rules = f"{{'{source}': ([('(.*)', '%s')], [])}}"

    def FineTune(logdir, steps, lr):
      override = '\n'.join([
          'task.network.cell_tpl[1].output_dim : 3', 'task.outputs : 3',
          f'task.train.max_steps : {steps}',
          f'task.train.learning_rate : {lr}',
          f'task.train.init_from_checkpoint_rules : {rules}'])
      result = self._Run(logdir, f'--model_params_override={override}')
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      return result.stdout

    frozen = self.create_tempdir().full_path
    out = FineTune(frozen, 20, 0.0)
    self.assertIn(
        f'Initialised 2 of 4 variables from {source}; kept their initial '
        'values: task/network/cell_1/b (shape [3] vs [4]), '
        'task/network/cell_1/w (shape [32, 3] vs [32, 4]).', out)
    backbone = self._Backbone(pretrained, 20)
    self.assertLen(backbone, 2)
    for name, value in self._Backbone(frozen, 20).items():
      self.assertTrue(np.array_equal(value, backbone[name]), name)
    head = _CheckpointValues(frozen, 20)
    self.assertEqual(
        [v.shape for n, v in head.items() if n.startswith(
            'task.Snetwork.Scell_1.Sw/')], [(32, 3)])

    tuned = self.create_tempdir().full_path
    FineTune(tuned, 20, 0.02)
    moved = self._Backbone(tuned, 20)
    self.assertFalse(any(np.array_equal(v, backbone[n])
                         for n, v in moved.items()))
    out = FineTune(tuned, 40, 0.0)  # resumed: its own checkpoint, no rules
    self.assertIn('Resumed from', out)
    self.assertNotIn('Initialised', out)
    for name, value in self._Backbone(tuned, 40).items():
      self.assertTrue(np.array_equal(value, moved[name]), name)

  def testResumesAfterSigkill(self):
    logdir = self.create_tempdir().full_path
    # More steps than it can run before the kill: on a fast machine 400
    # ran out between two polls, and the 5 checkpoints kept had already
    # dropped ckpt-40 (it failed so once).
    override = ('--model_params_override=task.train.max_steps : 1000000\n'
                'task.train.eval_interval_steps : 0')
    proc = subprocess.Popen(self._Command(logdir, override), env=self._Env(),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    state = os.path.join(logdir, 'train', 'checkpoint')
    deadline = time.time() + 240

    def Saved():
      return [int(path.rsplit('-', 1)[-1].split('.')[0]) for path in
              glob.glob(os.path.join(logdir, 'train', 'ckpt-*.index'))]

    while not any(step >= 40 for step in Saved()):
      self.assertIsNone(proc.poll(), 'the trainer exited before step 40')
      self.assertLess(time.time(), deadline)
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    self.assertTrue(os.path.exists(state))
    latest = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    killed_at = int(latest.rsplit('-', 1)[-1])
    self.assertGreaterEqual(killed_at, 40)
    first_run = glob.glob(os.path.join(logdir, 'train', 'events.*'))
    end = killed_at + 40
    result = self._Run(logdir, '--model_params_override='
                       f'task.train.max_steps : {end}')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn(f'Resumed from {latest} at step {killed_at}; input '
                  'position restored.', result.stdout)
    # The second run starts right after the checkpoint: no step is lost
    # and none is trained twice.
    resumed = _Scalars(os.path.join(logdir, 'train'), skip=first_run)
    self.assertEqual([s for s, _ in resumed['loss']],
                     list(range(killed_at + 10, end + 1, 10)))
    final = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    self.assertTrue(final.endswith(f'ckpt-{end}'))

  def testResumedRunEqualsAnUninterruptedOne(self):
    # A shuffled input: the resumed run must continue the same stream
    # (shuffle buffer included), not start the data over.
    common = ('task.train.eval_interval_steps : 0\n'
              'train_input.shuffle_buffer_size : 256\n')
    whole, split = (self.create_tempdir().full_path for _ in range(2))
    runs = [(whole, 60), (split, 20), (split, 60)]
    for logdir, steps in runs:
      result = self._Run(logdir, '--model_params_override=' + common +
                         f'task.train.max_steps : {steps}',
                         env={'TF_DETERMINISTIC_OPS': '1'})
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('Resumed from', result.stdout)
    self.assertIn('input position restored', result.stdout)
    values = [_CheckpointValues(logdir, 60) for logdir in (whole, split)]
    self.assertEqual(sorted(values[0]), sorted(values[1]))
    self.assertIn('global_step/.ATTRIBUTES/VARIABLE_VALUE', values[0])
    self.assertGreater(len(values[0]), 4)  # weights, biases, slots
    for name, value in values[0].items():
      self.assertTrue((value == values[1][name]).all(), name)

  def testCheckpointOfTwoReplicasResumesWithOne(self):
    """Checkpoints hold replica 0's copy: R=2 (M / 2 micro-batches each)
    trains as R=1 and resumes as R=1."""
    common = ('--model_params_override=task.train.eval_interval_steps : 0\n'
              'task.train.max_steps : ')
    two, one = (self.create_tempdir().full_path for _ in range(2))
    result = self._Run(two, common + '20', '--num_replicas=2')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('R=2 replicas x K=2 partitions, M=2 micro-batches',
                  result.stdout)
    self.assertIn('partition 1: /device:CPU:1 | /device:CPU:3', result.stdout)
    result = self._Run(one, common + '20')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    values = [_CheckpointValues(logdir, 20) for logdir in (two, one)]
    self.assertEqual(sorted(values[0]), sorted(values[1]))
    for name, value in values[0].items():  # float32 sums in another order
      np.testing.assert_allclose(value, values[1][name], atol=1e-5,
                                 err_msg=name)
    result = self._Run(two, common + '40')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('at step 20; input position restored.', result.stdout)
    self.assertIn("'task/network': K=2 partitions", result.stdout)
    self.assertTrue(tf.train.latest_checkpoint(
        os.path.join(two, 'train')).endswith('ckpt-40'))

  def testReplicasMustSplitTheBatch(self):
    result = self._Run(self.create_tempdir().full_path, '--num_replicas=3')
    self.assertEqual(result.returncode, 1)
    self.assertEqual(result.stderr.strip().splitlines()[-1],
                     'error: The train batch size 16 does not split over 3 '
                     'replicas; set train_input.batch_size to a multiple of '
                     '3 or change --num_replicas.')

  def testWithoutInputPositionTheResumedInputStartsOver(self):
    logdir = self.create_tempdir().full_path
    off = ('--model_params_override=task.train.eval_interval_steps : 0\n'
           'task.train.checkpoint_input : False\n')
    for steps in (20, 40):
      result = self._Run(logdir, off + f'task.train.max_steps : {steps}')
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('at step 20; no input position restored, so the input '
                  'starts over.', result.stdout)
    names = tf.train.load_checkpoint(os.path.join(
        logdir, 'train', 'ckpt-40')).get_variable_to_shape_map()
    self.assertFalse([n for n in names
                      if n.startswith('train_input_position/')])

  def testStopsOnNonFiniteLossAndKeepsTheLastGoodCheckpoint(self):
    logdir = self.create_tempdir().full_path
    # Example 16 * 25 is NaN: step 25 (the 26th batch) sees it.
    result = self._Run(logdir, '--model_params_override='
                       'train_input.nan_at : 400')
    self.assertEqual(result.returncode, 1)
    ckpt = os.path.join(logdir, 'train', 'ckpt-20')
    self.assertIn('error: Training stopped at step 25: loss nan',
                  result.stderr)
    self.assertIn(f'the last good checkpoint is {ckpt}.', result.stderr)
    self.assertEqual(
        tf.train.latest_checkpoint(os.path.join(logdir, 'train')), ckpt)
    reader = tf.train.load_checkpoint(ckpt)
    for name in reader.get_variable_to_shape_map():
      if not name.endswith('.ATTRIBUTES/VARIABLE_VALUE'):
        continue  # the input position (a variant), the object graph
      value = reader.get_tensor(name)
      if getattr(value, 'dtype', None) is not None and (
          value.dtype.kind == 'f'):
        self.assertTrue(tf.reduce_all(tf.math.is_finite(value)), name)

  def testEvalerAndDecoderFollowTheCheckpoints(self):
    logdir = self.create_tempdir().full_path
    override = '--model_params_override=task.train.max_steps : 40'
    trained = self._Run(logdir, override)
    self.assertEqual(trained.returncode, 0, trained.stderr[-3000:])
    for job, line, directory in (
        ('evaler_dev', 'eval dev at step {}: loss', 'eval_dev'),
        ('decoder_test', 'decode test at step {}: mean_abs_error',
         'decode_test')):
      before = glob.glob(os.path.join(logdir, directory, 'events.*'))
      result = self._Run(logdir, override, f'--job={job}',
                         '--follower_timeout_secs=5')
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      # It starts at the newest checkpoint and stops at max_steps.
      self.assertIn(line.format(40), result.stdout)
      self.assertNotIn(line.format(20), result.stdout)
      scalars = _Scalars(os.path.join(logdir, directory), skip=before)
      self.assertLen(scalars, 1)
      self.assertEqual([s for s, _ in list(scalars.values())[0]], [40])

  def testVocabularyGoesToTheLogdir(self):
    from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import model_registry  # pylint: disable=g-import-not-at-top
    p = model_registry.GetParams('mt.synthetic.TransformerTinyGPipe')
    p.test_input.vocab_file = '/given/vocab.txt'
    trainer.VocabularyInLogdir(p, '/run')
    self.assertEqual('/run/vocab.txt', p.task.vocab_file)
    self.assertEqual('/run/vocab.txt', p.train_input.vocab_file)
    self.assertEqual('/run/vocab.txt', p.dev_input.vocab_file)
    self.assertEqual('/given/vocab.txt', p.test_input.vocab_file)  # kept

  def testEveryRegisteredModelsInputsFitItsPipelines(self):
    from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import model_registry  # pylint: disable=g-import-not-at-top
    names = [n for n in model_registry.ModelNames()  # the built-in ones
             if model_registry.GetClass(n).__module__.startswith('params.')]
    self.assertGreater(len(names), 10)
    pipelined = 0
    for name in names:
      p = trainer.LoadParams(name)  # raises TrainingStopped if not
      pipelined += bool(base_model.PipelineParams(p.task))
    self.assertGreater(pipelined, 5)

  def testEveryLengthBucketsBatchIsChecked(self):
    from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
    p = trainer.LoadParams('mt.synthetic.TransformerTinyGPipe').Copy()
    p.train_input.bucket_upper_bound = [6, 10, 14]
    p.train_input.bucket_batch_limit = [64, 40, 28]
    trainer.CheckBatches(p)  # M=4 splits each
    p.train_input.bucket_batch_limit = [64, 40, 30]
    with self.assertRaisesRegex(
        trainer.TrainingStopped,
        r'^bucket 2 \(pairs up to 14 tokens\): train_input.bucket_batch_'
        r'limit\[2\]=30 does not fit the pipeline task.stack: batch size 30 '
        r'does not split into num_micro_batches=4 equal parts; .* \(set '
        r'task.stack.num_micro_batches or train_input.bucket_batch_limit '
        r'\(input_generator.TokensPerBatch makes multiples\)\).$'):
      trainer.CheckBatches(p)
    p.train_input.bucket_batch_limit = [64, 40, 28]
    p.task.train.num_replicas = 4
    p.task.stack.num_micro_batches = 8
    p.train_input.bucket_batch_limit = [64, 40, 30]
    with self.assertRaisesRegex(
        trainer.TrainingStopped,
        r'^bucket 2 \(pairs up to 14 tokens\): train_input.bucket_batch_'
        r'limit\[2\]=30 does not split over 4 replicas; set'):
      trainer.CheckBatches(p)

  def testUnknownModelSaysWhatExists(self):
    result = self._Run(self.create_tempdir().full_path,
                       model='lp_user_models.Tinny')
    self.assertEqual(result.returncode, 1)
    self.assertRegex(result.stderr.strip().splitlines()[-1],
                     r"^error: Unknown model 'lp_user_models\.Tinny'; did "
                     r"you mean 'lp_user_models\.Tiny'(, '[\w.]+')*\?$")
    self.assertNotIn('Traceback', result.stderr)

  def testAnErrorInTheUsersModelShowsWhereItHappened(self):
    result = self._Run(self.create_tempdir().full_path,
                       model='lp_user_models.BrokenTask')
    self.assertEqual(result.returncode, 1)
    self.assertIn('Traceback', result.stderr)
    self.assertRegex(result.stderr, r'lp_user_models\.py", line \d+, in Task')
    self.assertEqual(result.stderr.strip().splitlines()[-1],
                     "KeyError: 'no_such_key'")
    self.assertNotIn('Unknown model', result.stderr)

  def testEveryInputsBatchIsCheckedBeforeTheFirstStep(self):
    logdir = self.create_tempdir().full_path
    for override, line in [
        ('dev_input.batch_size : 10',
         'error: dev_input.batch_size=10 does not fit the pipeline '
         'task.network: batch size 10 does not split into '
         'num_micro_batches=4 equal parts; use a divisor of 10 (set '
         'task.network.num_micro_batches or dev_input.batch_size).'),
        ('test_input.batch_size : 2',
         'error: test_input.batch_size=2 does not fit the pipeline '
         'task.network: num_micro_batches=4 is larger than the batch size '
         '2; use at most 2 (set task.network.num_micro_batches or '
         'test_input.batch_size).'),
        ('task.network.micro_batch_size : 3',
         'error: train_input.batch_size=16 does not fit the pipeline '
         'task.network: batch size 16 is not a multiple of '
         'micro_batch_size=3; change one of them (set '
         'task.network.micro_batch_size or train_input.batch_size).')]:
      result = self._Run(logdir, f'--model_params_override={override}')
      self.assertEqual(result.returncode, 1, result.stderr[-3000:])
      self.assertEqual(result.stderr.strip().splitlines()[-1], line)
      self.assertNotIn('step 1', result.stdout)
      self.assertFalse(os.path.exists(os.path.join(logdir, 'train')))
    # Per replica: 16 over 2 replicas is 8 a replica, M / 2 micro-batches.
    result = self._Run(logdir, '--num_replicas=2',
                       '--model_params_override=task.network.'
                       'num_micro_batches : 6')
    self.assertEqual(result.returncode, 1, result.stderr[-3000:])
    self.assertEqual(result.stderr.strip().splitlines()[-1],
                     'error: train_input.batch_size=16 (8 per replica) does '
                     'not fit the pipeline task.network: batch size 8 does '
                     'not split into 3 micro-batches (num_micro_batches=6 '
                     'over 2 replicas) equal parts; use a divisor of 8 times '
                     '2 (set task.network.num_micro_batches or '
                     'train_input.batch_size).')


if __name__ == '__main__':
  absltest.main()

