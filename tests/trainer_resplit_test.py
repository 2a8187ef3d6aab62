"""A checkpoint of the README's model resumes under another split.

Trains image.synthetic.ResNetTinyGPipe (K=2, balanced by flops) for 20
steps with the real binary, then resumes its logdir with K=4, K=1 and K=2
balanced by parameter count (subclasses in a user module, the way users
change K: params/image/classifier_base.py). Variable paths hold no
partition index, so every variable comes back bitwise: checked on the
trainer's own Runner in this process (its restore, no step), also under
1F1B, interleaved 1F1B (K=2 x V=2) and two replicas; the binary itself
resumes at K=4 and trains on from step 20. Trained with 1F1B instead of
GPipe, the model's losses match GPipe's step by step (the same objective;
float32 sums in another order). Another model's
checkpoint stops the trainer with one line saying what to do.
"""

import contextlib
import io
import os
import re
import shutil
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import devices

devices.SplitCpu(4)  # before TensorFlow starts: the K=4 split in-process

import tensorflow as tf  # noqa: E402

from lingvo_pipe.tasks.image import synthetic_images  # noqa: E402
from tests import trainer_testlib  # noqa: E402

_MODULE = '''
from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.image import model
from params.image import synthetic


@model_registry.RegisterSingleTaskModel
class ResNetK4(synthetic.ResNetTinyGPipe):
  NUM_PARTITIONS = 4


@model_registry.RegisterSingleTaskModel
class ResNetK1(synthetic.ResNetTinyGPipe):
  NUM_PARTITIONS = 1


@model_registry.RegisterSingleTaskModel
class ResNet1F1B(synthetic.ResNetTinyGPipe):
  SCHEDULE = '1f1b'


@model_registry.RegisterSingleTaskModel
class ResNetInterleaved(synthetic.ResNetTinyGPipe):
  """K=2 devices x V=2 stages."""
  SCHEDULE = 'interleaved_1f1b'
  NUM_VIRTUAL_STAGES = 2


@model_registry.RegisterSingleTaskModel
class ResNetZeroBubbleV(synthetic.ResNetTinyGPipe):
  """ZB-V: K=2 devices x 2 stages in a V, backwards split."""
  SCHEDULE = 'zb_v'
  NUM_VIRTUAL_STAGES = 2
  RECOMPUTE = 'never'


@model_registry.RegisterSingleTaskModel
class ResNetTwoReplicas(synthetic.ResNetTinyGPipe):

  def Task(self):
    p = super().Task()
    p.train.num_replicas = 2
    return p


@model_registry.RegisterSingleTaskModel
class ResNetByParams(synthetic.ResNetTinyGPipe):
  """K=2 balanced by parameter count instead of flops."""

  def Task(self):
    p = super().Task()
    p.network = model.GPipeNetworkParams(
        self.Network(), self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES,
        self.MicroBatchInputShapes(), recompute=self.RECOMPUTE,
        cost='params')
    return p
'''

_TINY_DATA = f"'{synthetic_images.NAME}/tiny'"
# The tiny data (200 train images); no evaluation batches.
_OVERRIDE = '\n'.join([
    f'train_input.dataset_name : {_TINY_DATA}',
    f'dev_input.dataset_name : {_TINY_DATA}',
    'task.train.eval_steps : 0', 'task.train.summary_interval_steps : 1'])
_SAVED = 20
_VALUE = '/.ATTRIBUTES/VARIABLE_VALUE'


def _Unescape(key):
  """A variable's name from its object-based checkpoint key."""
  out, i = [], 0
  while i < len(key):
    if key[i] == '.':
      out.append('/' if key[i + 1] == 'S' else key[i + 1])
      i += 2
    else:
      out.append(key[i])
      i += 1
  return ''.join(out)


def _Saved(path):
  """{variable name: numpy value} of a trainer checkpoint."""
  reader = tf.train.load_checkpoint(path)
  return {_Unescape(k[:-len(_VALUE)]): reader.get_tensor(k)
          for k in reader.get_variable_to_shape_map()
          if k.endswith(_VALUE) and not k.startswith('save_counter/')}


def _Bits(value):
  return value.dtype, value.shape, value.tobytes()


class TrainerResplitTest(trainer_testlib.TrainerTestBase,
                         parameterized.TestCase):

  _k2_logdir = None  # the K=2 run, trained by the first test

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # TEST_TMPDIR may be shared by other runs: this class's own directory,
    # for its model module (the binary's PYTHONPATH), data and logdirs.
    cls._module_dir = tempfile.mkdtemp(prefix='resplit_', dir=cls._root)
    with open(os.path.join(cls._module_dir, 'lp_resplit_models.py'),
              'w') as f:
      f.write(_MODULE)
    sys.path.insert(0, cls._module_dir)  # for the runs in this process
    cls._data = os.path.join(cls._module_dir, 'data')

  @classmethod
  def tearDownClass(cls):
    sys.path.remove(cls._module_dir)
    shutil.rmtree(cls._module_dir, ignore_errors=True)
    super().tearDownClass()

  def _Train(self, logdir, model, steps):
    result = self._Run(logdir, f'--data_dir={self._data}',
                       f'--model_params_override={_OVERRIDE}\n'
                       f'task.train.max_steps : {steps}', model=model)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    return result.stdout

  def _K2Checkpoint(self):
    """The README's model trained _SAVED steps at K=2: its checkpoint."""
    cls = type(self)
    if cls._k2_logdir is None:
      logdir = os.path.join(self._module_dir, 'k2')
      out = self._Train(logdir, 'image.synthetic.ResNetTinyGPipe', _SAVED)
      self.assertIn("'task/network': K=2 partitions", out)
      cls._k2_logdir = logdir
    return cls._k2_logdir, os.path.join(cls._k2_logdir, 'train',
                                        f'ckpt-{_SAVED}')

  @parameterized.named_parameters(
      ('K4', 'ResNetK4', [['stem'], ['stage0_block0'], ['stage1_block0'],
                          ['stage2_block0', 'pool', 'logits']]),
      ('K1', 'ResNetK1', [['stem', 'stage0_block0', 'stage1_block0',
                           'stage2_block0', 'pool', 'logits']]),
      ('K2ByParams', 'ResNetByParams',
       [['stem', 'stage0_block0', 'stage1_block0'],
        ['stage2_block0', 'pool', 'logits']]),
      ('OneFOneB', 'ResNet1F1B', None),
      ('Interleaved', 'ResNetInterleaved', [
          ['stem'], ['stage0_block0'], ['stage1_block0'],
          ['stage2_block0', 'pool', 'logits']]),
      ('TwoReplicas', 'ResNetTwoReplicas', None))
  def testTheTrainerRestoresEveryVariableBitwise(self, model, cells):
    """The trainer's Runner on the K=2 logdir: restored, no step taken."""
    from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
    logdir, ckpt = self._K2Checkpoint()
    p = trainer.LoadParams(f'lp_resplit_models.{model}',
                           f'{_OVERRIDE}\ntask.train.max_steps : {_SAVED}',
                           data_dir=self._data)
    if cells is not None:  # else the K=2 split's
      self.assertEqual([[s.name for s in c.sub]
                        for c in p.task.network.cell_tpl], cells)
    runner = trainer.Runner(p, logdir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      runner.Train()
    self.assertIn(f'Resumed from {ckpt} at step {_SAVED}; input position '
                  'restored.', out.getvalue())
    variables = runner.task.VariablesToCheckpoint()
    saved = _Saved(ckpt)
    self.assertEqual(sorted(variables), sorted(saved))
    self.assertGreater(len(saved), 100)  # weights, BN, Adam slots, steps
    for name, var in variables.items():
      self.assertEqual(_Bits(var.numpy()), _Bits(saved[name]), name)
    self.assertEqual(int(variables['global_step'].numpy()), _SAVED)

  def testAnotherModelStopsWithWhatToDo(self):
    from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
    logdir, ckpt = self._K2Checkpoint()
    p = trainer.LoadParams('image.synthetic.AmoebaNetTinyGPipe',
                           f'{_OVERRIDE}\ntask.train.max_steps : {_SAVED}',
                           data_dir=self._data)
    runner = trainer.Runner(p, logdir)
    with self.assertRaises(trainer.TrainingStopped) as err:
      runner.Train()
    message = str(err.exception)
    self.assertEqual(message.splitlines(), [message])
    self.assertRegex(message, (
        rf'^No checkpoint in {re.escape(logdir)}/train can be restored '
        rf'\(ckpt-{_SAVED}: Checkpoint {re.escape(ckpt)} has no '
        r'task/network/\S+ \(and \d+ more\), with or without a partition '
        r'index \(cell_<k>\); resume with the model that wrote it, or '
        'start a new --logdir from it with '
        r'task.train.init_from_checkpoint_rules\); use another --logdir, '
        'or the model that wrote them.$'))

  def testTheBinaryResumesAtK4AndTrainsOn(self):
    logdir = self.create_tempdir().full_path
    shutil.copytree(self._K2Checkpoint()[0], logdir, dirs_exist_ok=True)
    before = tf.io.gfile.glob(os.path.join(logdir, 'train', 'events.*'))
    out = self._Train(logdir, 'lp_resplit_models.ResNetK4', _SAVED + 2)
    self.assertIn("'task/network': K=4 partitions", out)
    ckpt = os.path.join(logdir, 'train', f'ckpt-{_SAVED}')
    self.assertIn(f'Resumed from {ckpt} at step {_SAVED}; input position '
                  'restored.', out)
    resumed = trainer_testlib.Scalars(os.path.join(logdir, 'train'),
                                      skip=before)
    self.assertEqual([s for s, _ in resumed['loss']], [21, 22])
    saved = _Saved(os.path.join(logdir, 'train', f'ckpt-{_SAVED + 2}'))
    self.assertEqual(sorted(saved), sorted(_Saved(ckpt)))
    self.assertEqual(int(saved['global_step']), _SAVED + 2)


  def _Losses(self, *overrides, model='image.synthetic.ResNetTinyGPipe'):
    """Each step's loss of the README's model (or `model`) trained _SAVED
    steps."""
    logdir = self.create_tempdir().full_path
    result = self._Run(logdir, f'--data_dir={self._data}',
                       f'--model_params_override={_OVERRIDE}\n'
                       f'task.train.max_steps : {_SAVED}\n' +
                       '\n'.join(overrides), model=model)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    losses = trainer_testlib.Scalars(os.path.join(logdir, 'train'))['loss']
    self.assertEqual([s for s, _ in losses], list(range(1, _SAVED + 1)))
    return [v for _, v in losses], result.stdout

  def testOneFOneBTrainsToTheSameLossAsGPipe(self):
    """--model_params_override="task.network.schedule : '1f1b'" on the
    README's model: the same objective, so the first step's loss is
    GPipe's bitwise; the gradients' sums run in another order, so float32
    rounding then drifts the runs apart (here under 2e-3 of the loss in
    20 steps). ZB-H1 sums in 1F1B's order: its run is 1F1B's, bitwise."""
    gpipe = [v for _, v in trainer_testlib.Scalars(
        os.path.join(self._K2Checkpoint()[0], 'train'))['loss']]
    one_f, out = self._Losses("task.network.schedule : '1f1b'")
    self.assertIn('schedule=1f1b', out)
    self.assertEqual(one_f[0], gpipe[0])
    for step, (got, want) in enumerate(zip(one_f, gpipe), start=1):
      self.assertAlmostEqual(got, want, delta=5e-3 * abs(want),
                             msg=f'step {step}')
    self.assertLess(one_f[-1], 0.7 * one_f[0])  # it learnt
    # Bare words, as Lingvo users write them.
    zero_bubble, out = self._Losses('task.network.schedule : zb_h1',
                                    'task.network.recompute : never')
    self.assertIn('schedule=zb_h1', out)
    self.assertEqual(zero_bubble, one_f)

  def testZeroBubbleVTrainsToGPipesLoss(self):
    """ZB-V (K=2 x 2 stages in a V, the loss on device 0) through the
    binary: the first step's loss is GPipe's bitwise (the same forward),
    then within float32 drift of GPipe's, as 1F1B's are."""
    gpipe = [v for _, v in trainer_testlib.Scalars(
        os.path.join(self._K2Checkpoint()[0], 'train'))['loss']]
    zbv, out = self._Losses(model='lp_resplit_models.ResNetZeroBubbleV')
    self.assertIn('K=2 devices x V=2 stages', out)
    self.assertIn('schedule=zb_v', out)
    self.assertEqual(zbv[0], gpipe[0])
    for step, (got, want) in enumerate(zip(zbv, gpipe), start=1):
      self.assertAlmostEqual(got, want, delta=5e-3 * abs(want),
                             msg=f'step {step}')
    self.assertLess(zbv[-1], 0.7 * zbv[0])

if __name__ == '__main__':
  absltest.main()
