"""Checkpointer: save, restore, fall back, and survive SIGKILL mid-save."""

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
import tensorflow as tf

from lingvo_pipe.core import checkpointer


class CheckpointerTest(tf.test.TestCase):

  def _Vars(self):
    return {'model/w': tf.Variable([1.0, 2.0]),
            'global_step': tf.Variable(0, dtype=tf.int64)}

  def testSaveRestoreAndKeep(self):
    directory = self.create_tempdir().full_path
    v = self._Vars()
    ckpt = checkpointer.Checkpointer(directory, v, max_to_keep=2)
    for step in (10, 20, 30):
      v['global_step'].assign(step)
      v['model/w'].assign([step, -step])
      ckpt.Save(step)
    self.assertEqual([checkpointer.StepOf(p) for p in ckpt.Paths()], [30, 20])
    w = self._Vars()
    path = checkpointer.Checkpointer(directory, w).RestoreLatest()
    self.assertEqual(checkpointer.StepOf(path), 30)
    self.assertAllEqual(w['model/w'], [30.0, -30.0])
    self.assertEqual(int(w['global_step']), 30)

  def _Input(self, python_map=False):
    """A shuffled, prefetched stream of batches."""
    ds = tf.data.Dataset.range(1000).shuffle(64, seed=3).batch(4)
    if python_map:
      ds = ds.map(tf.autograph.experimental.do_not_convert(
          lambda x: tf.py_function(lambda y: y + 1, [x], tf.int64)))
    return ds.prefetch(2)

  def _Next(self, iterator, n):
    return [next(iterator).numpy().tolist() for _ in range(n)]

  def testInputPositionIsSavedAndRestored(self):
    directory = self.create_tempdir().full_path
    saver = checkpointer.Checkpointer(directory, self._Vars(),
                                      dataset=self._Input())
    self._Next(saver.iterator, 7)
    saver.Save(7)
    want = self._Next(saver.iterator, 20)
    ckpt = checkpointer.Checkpointer(directory, self._Vars(),
                                     dataset=self._Input())
    self.assertIsNotNone(ckpt.RestoreLatest())
    self.assertTrue(ckpt.restored_input)
    self.assertEqual(self._Next(ckpt.iterator, 20), want)
    # Readers without an iterator (evaluation) read the same checkpoint.
    checkpointer.Checkpointer(directory, self._Vars()).RestoreLatest()

  def testCheckpointWithoutPositionLeavesTheInputAtItsStart(self):
    directory = self.create_tempdir().full_path
    v = self._Vars()
    v['model/w'].assign([5.0, 6.0])
    checkpointer.Checkpointer(directory, v).Save(3)
    w = self._Vars()
    ckpt = checkpointer.Checkpointer(directory, w, dataset=self._Input())
    self.assertIsNotNone(ckpt.RestoreLatest())
    self.assertFalse(ckpt.restored_input)
    self.assertAllEqual(w['model/w'], [5.0, 6.0])
    self.assertEqual(self._Next(ckpt.iterator, 3),
                     self._Next(iter(self._Input()), 3))

  def testPositionOfAnotherPipelineLeavesTheInputAtItsStart(self):
    directory = self.create_tempdir().full_path
    v = self._Vars()
    saver = checkpointer.Checkpointer(directory, v, dataset=self._Input())
    self._Next(saver.iterator, 2)
    v['model/w'].assign([3.0, 4.0])
    saver.Save(2)
    w = self._Vars()
    other = tf.data.Dataset.range(10).map(
        tf.autograph.experimental.do_not_convert(lambda x: x * 2)).batch(2)
    ckpt = checkpointer.Checkpointer(directory, w, dataset=other)
    with self.assertLogs(level='WARNING') as logs:
      self.assertIsNotNone(ckpt.RestoreLatest())
    self.assertIn('cannot be restored', logs.output[0])
    self.assertFalse(ckpt.restored_input)
    self.assertAllEqual(w['model/w'], [3.0, 4.0])
    self.assertEqual(self._Next(ckpt.iterator, 2), [[0, 2], [4, 6]])
    ckpt.Save(3)  # the new iterator's position is saved
    reader = checkpointer.Checkpointer(directory, self._Vars(), dataset=other)
    self.assertTrue(reader.RestoreLatest().endswith('ckpt-3'))
    self.assertTrue(reader.restored_input)
    self.assertEqual(self._Next(reader.iterator, 1), [[8, 10]])

  def testInputThatCannotBeSavedFallsBackToTheVariables(self):
    directory = self.create_tempdir().full_path
    v = self._Vars()
    ckpt = checkpointer.Checkpointer(directory, v,
                                     dataset=self._Input(python_map=True))
    self._Next(ckpt.iterator, 2)
    with self.assertLogs(level='WARNING') as logs:
      ckpt.Save(2)
    self.assertIn('The train input cannot be checkpointed', logs.output[0])
    v['model/w'].assign([7.0, 8.0])
    with self.assertNoLogs(level='WARNING'):
      ckpt.Save(4)  # the variables, without a second warning
    self.assertEqual([checkpointer.StepOf(p) for p in ckpt.Paths()], [4, 2])
    w = self._Vars()
    reader = checkpointer.Checkpointer(directory, w,
                                       dataset=self._Input(True))
    reader.RestoreLatest()
    self.assertFalse(reader.restored_input)
    self.assertAllEqual(w['model/w'], [7.0, 8.0])

  def testNoCheckpointRestoresNothing(self):
    v = self._Vars()
    ckpt = checkpointer.Checkpointer(self.create_tempdir().full_path, v)
    self.assertIsNone(ckpt.RestoreLatest())
    self.assertAllEqual(v['model/w'], [1.0, 2.0])

  def testDamagedNewestFallsBackToOlder(self):
    directory = self.create_tempdir().full_path
    v = self._Vars()
    ckpt = checkpointer.Checkpointer(directory, v)
    v['global_step'].assign(1)
    ckpt.Save(1)
    v['global_step'].assign(2)
    newest = ckpt.Save(2)
    for name in tf.io.gfile.glob(newest + '.data-*'):
      with open(name, 'wb') as f:
        f.write(b'garbage')
    w = self._Vars()
    path = checkpointer.Checkpointer(directory, w).RestoreLatest()
    self.assertEqual(checkpointer.StepOf(path), 1)
    self.assertEqual(int(w['global_step']), 1)

  def testCheckpointsOfAnotherModelAreAnErrorNotAFreshStart(self):
    directory = self.create_tempdir().full_path
    checkpointer.Checkpointer(directory, self._Vars()).Save(5)
    other = {'model/w': tf.Variable([1.0, 2.0, 3.0]),
             'global_step': tf.Variable(0, dtype=tf.int64)}
    with self.assertRaisesRegex(RuntimeError, 'No checkpoint in .* can be '
                                r'restored \(ckpt-5: '):
      checkpointer.Checkpointer(directory, other).RestoreLatest()

  def testSigkillDuringSavesNeverLeavesAnUnreadableLatest(self):
    """SIGKILL at random moments of a loop of saves, again until kills
    have landed during a save (_CutShort: a save's files left behind)
    _MID_SAVE_KILLS times, at most _KILL_SECONDS. After every kill, every
    checkpoint the directory lists restores with its own step's values,
    and RestoreLatest takes the newest of them."""
    script = textwrap.dedent('''
        import sys
        import tensorflow as tf
        from lingvo_pipe.core import checkpointer
        v = {'model/w': tf.Variable(tf.zeros([256, 1024])),
             'global_step': tf.Variable(0, dtype=tf.int64)}
        ckpt = checkpointer.Checkpointer(sys.argv[1], v, max_to_keep=3)
        print('ready', flush=True)
        step = 0
        while True:
          step += 1
          v['global_step'].assign(step)
          v['model/w'].assign(tf.fill([256, 1024], float(step)))
          ckpt.Save(step)
        ''')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    rng = random.Random(0)
    cut_short, kills = [], 0
    deadline = time.monotonic() + _KILL_SECONDS
    while len(cut_short) < _MID_SAVE_KILLS and time.monotonic() < deadline:
      directory = self.create_tempdir().full_path
      proc = subprocess.Popen([sys.executable, '-c', script, directory],
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
      self.assertEqual(proc.stdout.readline().strip(), b'ready')
      time.sleep(rng.uniform(0.05, 0.5))
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      kills += 1
      w = {'model/w': tf.Variable(tf.zeros([256, 1024])),
           'global_step': tf.Variable(0, dtype=tf.int64)}
      ckpt = checkpointer.Checkpointer(directory, w)
      listed = ckpt.Paths()
      left = _CutShort(directory, listed)
      if left:
        cut_short.append(left)
      for path in listed:
        ckpt.Restore(path)
        step = checkpointer.StepOf(path)
        self.assertEqual(int(w['global_step']), step, path)
        self.assertAllEqual(w['model/w'], tf.fill([256, 1024], float(step)))
      latest = ckpt.RestoreLatest()
      self.assertEqual(latest, listed[0] if listed else None)
    self.assertLen(cut_short, _MID_SAVE_KILLS,
                   f'{len(cut_short)} of {kills} kills in {_KILL_SECONDS} s '
                   f'landed during a save; {_MID_SAVE_KILLS} needed')


# Kills that must land during a save, and the time they may take.
_MID_SAVE_KILLS, _KILL_SECONDS = 2, 120


def _CutShort(directory, listed):
  """Names in `directory` a save killed before it finished leaves: TF's
  temporary files (a checkpoint's '_temp' shards, the state file's '.tmp'
  copy) or the files of a checkpoint newer than every one `listed`."""
  newest = max(map(checkpointer.StepOf, listed), default=0)
  left = []
  for name in sorted(os.listdir(directory)):
    match = re.match(r'ckpt-(\d+)[._]', name)
    if ('_temp' in name or '.tmp' in name or
        (match and int(match.group(1)) > newest)):
      left.append(name)
  return left


def _Bits(x):
  """Numpy value of `x`, compared bitwise (with its dtype) by tobytes."""
  value = x.numpy() if hasattr(x, 'numpy') else x
  return value.dtype, value.shape, value.tobytes()


class PartitionIndexedCheckpointTest(tf.test.TestCase):
  """Checkpoints whose variable paths hold the partition ('.../cell_1/')."""

  # Before the pipeline's cells left their index out of variable paths:
  # {old name: new name}. 'task/head/cell_0/w' is a cell that keeps it.
  _RENAMES = {
      'task/network/cell_0/stem/w': 'task/network/stem/w',
      'task/network/cell_0/stem/w/m': 'task/network/stem/w/m',
      'task/network/cell_0/stem/w/ema': 'task/network/stem/w/ema',
      'task/network/cell_1/logits/b': 'task/network/logits/b',
      'task/network/cell_1/bn/moving_mean': 'task/network/bn/moving_mean',
      'task/head/cell_0/w': 'task/head/cell_0/w',
      'global_step': 'global_step',
  }

  def _Old(self):
    """{old name: value}: random float bits, a float64, the step."""
    shapes = {'w': [3, 4], 'm': [3, 4], 'ema': [3, 4], 'b': [4],
              'moving_mean': [4]}
    values = {}
    for i, name in enumerate(self._RENAMES):
      last = name.split('/')[-1]
      dtype = tf.float64 if last == 'moving_mean' else tf.float32
      values[name] = tf.random.stateless_normal(
          shapes.get(last, [2]), [7, i], dtype=dtype)
    values['global_step'] = tf.constant(20, tf.int64)
    return values

  def _New(self, old):
    """The model after the change: its names, zeros of the old shapes."""
    return {self._RENAMES[n]: tf.Variable(tf.zeros_like(v))
            for n, v in old.items()}

  def _Input(self):
    return tf.data.Dataset.range(100).shuffle(16, seed=1).batch(2)

  def testRestoresEveryValueBitwiseAndTheInputPosition(self):
    directory = self.create_tempdir().full_path
    old = self._Old()
    saver = checkpointer.Checkpointer(
        directory, {n: tf.Variable(v) for n, v in old.items()},
        dataset=self._Input())
    next(saver.iterator)
    saver.Save(20)
    want = [next(saver.iterator).numpy().tolist() for _ in range(3)]
    new = self._New(old)
    ckpt = checkpointer.Checkpointer(directory, new, dataset=self._Input())
    with self.assertLogs(level='WARNING') as logs:
      self.assertTrue(ckpt.RestoreLatest().endswith('ckpt-20'))
    self.assertTrue(ckpt.restored_input)
    self.assertEqual([next(ckpt.iterator).numpy().tolist()
                      for _ in range(3)], want)
    for name, value in old.items():
      self.assertEqual(_Bits(new[self._RENAMES[name]]), _Bits(value), name)
    mapped = [line for line in logs.output if 'partition indices' in line]
    self.assertLen(mapped, 1)
    self.assertIn('(cell_<k>); mapped 5 of them', mapped[0])
    ckpt.Save(21)  # with this model's names
    reader = checkpointer.Checkpointer(directory, self._New(old))
    self.assertTrue(reader.RestoreLatest().endswith('ckpt-21'))

  def testAVariableFoundNeitherWayNamesItAndWhatToDo(self):
    directory = self.create_tempdir().full_path
    old = self._Old()
    path = checkpointer.Checkpointer(
        directory, {n: tf.Variable(v) for n, v in old.items()}).Save(20)
    new = self._New(old)
    new['task/network/stem/b'] = tf.Variable(tf.zeros([4]))
    with self.assertRaises(ValueError) as err:
      checkpointer.Checkpointer(directory, new).Restore(path)
    self.assertEqual(
        str(err.exception),
        f'Checkpoint {path} has no task/network/stem/b, with or without a '
        'partition index (cell_<k>); resume with the model that wrote it, '
        'or start a new --logdir from it with '
        'task.train.init_from_checkpoint_rules.')
    self.assertAllEqual(new['global_step'], 0)  # nothing restored

  def testMatchesOnlyUniqueNamesTheModelLacks(self):
    saved = ['n/cell_0/x/w', 'n/cell_1/y/w', 'n/cell_0/z', 'n/cell_1/z',
             'h/cell_0/w', 'o/cell_1/i/cell_0/w', 'g']
    wanted = ['n/x/w', 'n/y/w', 'n/z', 'h/cell_0/w', 'h/w', 'o/cell_1/i/w',
              'g']
    self.assertEqual(checkpointer.PartitionIndexMatches(saved, wanted), {
        'n/x/w': 'n/cell_0/x/w',
        'n/y/w': 'n/cell_1/y/w',
        'o/cell_1/i/w': 'o/cell_1/i/cell_0/w',
    })  # 'n/z' two ways; 'h/w' from a name the model has itself


class InitFromCheckpointRulesTest(tf.test.TestCase):
  """Transfer learning: variables taken from another run's checkpoint."""

  def _Pretrained(self):
    directory = self.create_tempdir().full_path
    v = {'task/body.v1/w': tf.constant([[1.0, 2.0], [3.0, 4.0]]),
         'task/body.v1/b': tf.constant([0.5, -0.5]),
         'task/head/w': tf.constant([[1.0], [2.0]]),
         'task/extra': tf.constant(7.0)}
    ckpt = checkpointer.Checkpointer(
        directory, {k: tf.Variable(x) for k, x in v.items()})
    return ckpt.Save(10), v

  def _Model(self):
    return {'net/body.v1/w': tf.Variable(tf.zeros([2, 2])),
            'net/body.v1/b': tf.Variable(tf.zeros([2])),
            'net/head/w': tf.Variable(tf.zeros([2, 3])),  # other classes
            'net/other': tf.Variable(tf.zeros([])),
            'net/ignored/w': tf.Variable(tf.zeros([2, 2]))}

  def testLoadsByRuleAndKeepsTheRest(self):
    path, values = self._Pretrained()
    model = self._Model()
    report = checkpointer.InitFromCheckpointRules(
        model, {path: ([('net/(body.*)', 'task/%s'),
                        ('net/(head/w)', 'task/%s'),
                        ('net/other', 'task/missing')], ['.*ignored.*'])})
    self.assertAllEqual(model['net/body.v1/w'], values['task/body.v1/w'])
    self.assertAllEqual(model['net/body.v1/b'], values['task/body.v1/b'])
    for name in ('net/head/w', 'net/other', 'net/ignored/w'):
      self.assertAllEqual(model[name], tf.zeros_like(model[name]), name)
    self.assertEqual(
        report, f'Initialised 2 of 5 variables from {path}; kept their '
        'initial values: net/head/w (shape [2, 3] vs [2, 1]), net/other '
        '(task/missing not in the checkpoint), net/ignored/w (no rule).')

  def testBadRulesSayWhatToSet(self):
    path, _ = self._Pretrained()
    model = self._Model()
    for rules in ({path: [('(.*)', '%s')]}, [path], {path: ([('(', '%s')],
                                                            [])}):
      with self.assertRaisesRegex(ValueError, 'init_from_checkpoint_rules'):
        checkpointer.InitFromCheckpointRules(model, rules)
    with self.assertRaisesRegex(ValueError, 'does not take the groups'):
      checkpointer.InitFromCheckpointRules(
          model, {path: ([('net/(.*)', '%s/%s')], [])})

  def testFindsNamesOfACheckpointWithPartitionIndices(self):
    directory = self.create_tempdir().full_path
    w = tf.constant([[1.5, -2.25]])
    path = checkpointer.Checkpointer(directory, {
        'task/network/cell_1/head/w': tf.Variable(w)}).Save(1)
    model = {'task/network/head/w': tf.Variable(tf.zeros([1, 2]))}
    report = checkpointer.InitFromCheckpointRules(
        model, {path: ([('(.*)', '%s')], [])})
    self.assertAllEqual(model['task/network/head/w'], w)
    self.assertStartsWith(report, 'Initialised 1 of 1 variables')

  def testAnUnreadableCheckpointIsAnError(self):
    missing = os.path.join(self.create_tempdir().full_path, 'ckpt-1')
    with self.assertRaisesRegex(ValueError, 'cannot read checkpoint'):
      checkpointer.InitFromCheckpointRules(
          self._Model(), {missing: ([('(.*)', '%s')], [])})


if __name__ == '__main__':
  absltest.main()
