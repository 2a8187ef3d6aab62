"""Shared by the trainer tests: a user's model module and the binary's runs.

The model lives in a module written to a temporary directory (outside the
package) and is found with --model=lp_user_models.<Class>; each test starts
the real binary in a subprocess.
"""

import glob
import os
import re
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
import tensorflow as tf

from tensorflow.core.util import event_pb2

USER_MODULE = '''
import tensorflow as tf

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import base_model
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import layers
from lingvo_pipe.core import model_registry
from lingvo_pipe.core.nested_map import NestedMap


class RegressionInput(base_input_generator.BaseInputGenerator):
  """x [4] ~ N(0, 1), y = tanh(x @ teacher); example `nan_at` has x NaN."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('nan_at', -1, 'Index of an example whose x is NaN; -1: none.')
    return p

  def _LoadExamples(self):
    x = tf.random.stateless_normal([4096, 4], [1, self.params.seed])
    teacher = tf.reshape(tf.range(16, dtype=tf.float32) / 8.0 - 1.0, [4, 4])
    y = tf.tanh(x @ teacher)
    if self.params.nan_at >= 0:
      x = tf.tensor_scatter_nd_update(x, [[self.params.nan_at, 0]],
                                      [float('nan')])
    return tf.data.Dataset.from_tensor_slices({'x': x, 'y': y})


class RegressionTask(base_model.BaseTask):

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('network', None, 'The network params.')
    p.Define('outputs', 4, 'Entries of y the network predicts (the first).')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('network', self.params.network)

  def ComputePredictions(self, theta, batch):
    return NestedMap(y=self.network.FProp(theta.network, batch.x))

  def ComputeLoss(self, theta, predictions, batch):
    y = batch.y[:, :self.params.outputs]
    loss = tf.reduce_mean(tf.square(predictions.y - y))
    return {'loss': (loss, tf.constant(16.0))}, NestedMap()

  def Decode(self, theta, batch):
    return NestedMap(pred=self.ComputePredictions(theta, batch).y,
                     y=batch.y[:, :self.params.outputs])

  def CreateDecoderMetrics(self):
    return {'mean_abs_error': base_model.AverageMetric()}

  def PostProcessDecodeOut(self, decode_out, metrics):
    error = abs(decode_out['pred'] - decode_out['y']).mean()
    metrics['mean_abs_error'].Update(float(error), len(decode_out['y']))


@model_registry.RegisterSingleTaskModel
class Tiny:

  def Train(self):
    return RegressionInput.Params().Set(
        dataset_name='regression', batch_size=16, repeat=True, seed=1)

  def Dev(self):
    return RegressionInput.Params().Set(
        dataset_name='regression', batch_size=16, seed=2)

  def Test(self):
    return RegressionInput.Params().Set(
        dataset_name='regression', batch_size=16, seed=3)

  def Task(self):
    proj = layers.ProjectionLayer.Params
    cells = [proj().Set(input_dim=4, output_dim=32, activation='TANH'),
             proj().Set(input_dim=32, output_dim=4)]
    p = RegressionTask.Params().Set(
        network=gpipe.PipeliningLayer.Params().Set(
            cell_tpl=cells, num_micro_batches=4))
    p.train.Set(learning_rate=0.02, max_steps=60, save_interval_steps=20,
                summary_interval_steps=10, eval_interval_steps=30,
                eval_steps=4)
    return p


@model_registry.RegisterSingleTaskModel
class BrokenTask(Tiny):

  def Task(self):
    return {}['no_such_key']  # a bug in the user's own code
'''


def Scalars(directory, skip=()):
  """{tag: [(step, value)]} of the scalars in the event files in
  `directory` (text and images, string tensors, left out)."""
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, 'events.*'))):
    if path in skip:
      continue
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tensor.string_val:
          continue
        number = tf.make_ndarray(value.tensor) if value.HasField(
            'tensor') else value.simple_value
        found.setdefault(value.tag, []).append((event.step, float(number)))
  return found


def LiveCommandLines():
  """{pid: command line, arguments joined by spaces} of the live (not
  zombie) processes of this machine."""
  found = {}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace').replace('\0', ' ')
      with open(f'/proc/{pid}/stat') as f:
        state = f.read().rpartition(')')[2].split()[0]
    except OSError:
      continue
    if state != 'Z':
      found[int(pid)] = cmdline
  return found


def ProcessesWith(*texts):
  """Pids of the live processes whose command line has every one of
  `texts` (e.g. a cluster spec: the servers started for it)."""
  return [pid for pid, cmdline in LiveCommandLines().items()
          if all(text in cmdline for text in texts)]


def StartedSpecs(stdout):
  """The cluster specs of the local workers the trainer said it started
  (--run_locally=processes), in order."""
  return re.findall(r'Started \d+ local worker process\(es\), one core each '
                    r'\(round-robin\): (worker=\S+);', stdout)


def CheckpointValues(path):
  """{name: value} of every variable in the checkpoint at `path` but the
  checkpoint's own count of saves (one more where a run was stopped and
  saved, or resumed)."""
  reader = tf.train.load_checkpoint(path)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.endswith('.ATTRIBUTES/VARIABLE_VALUE')
          and not n.startswith('save_counter/')}


class TrainerTestBase(absltest.TestCase):
  """Writes the user module once; runs the trainer on it."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._root = absltest.TEST_TMPDIR.value
    cls._module_dir = os.path.join(cls._root, 'user_models')
    os.makedirs(cls._module_dir, exist_ok=True)
    with open(os.path.join(cls._module_dir, 'lp_user_models.py'), 'w') as f:
      f.write(textwrap.dedent(USER_MODULE))

  def _Command(self, logdir, *extra, model='lp_user_models.Tiny'):
    return [sys.executable, '-m', 'lingvo_pipe.trainer', f'--model={model}',
            f'--logdir={logdir}', '--run_locally=cpu', *extra]

  def _Env(self, extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    env.update(extra or {})
    env['PYTHONPATH'] = os.pathsep.join(
        [self._module_dir, os.getcwd(), env.get('PYTHONPATH', '')])
    return env

  def _Run(self, logdir, *extra, env=None, **kwargs):
    return subprocess.run(self._Command(logdir, *extra, **kwargs),
                          env=self._Env(env), capture_output=True, text=True,
                          timeout=300)

  def assertSameVariables(self, path, other):
    """The checkpoints at `path` and `other` hold the same variables,
    bitwise (weights, biases, optimizer slots, the step)."""
    values = [CheckpointValues(p) for p in (path, other)]
    self.assertEqual(sorted(values[0]), sorted(values[1]))
    self.assertGreater(len(values[0]), 4)
    for name, value in values[0].items():
      self.assertTrue((value == values[1][name]).all(), name)

  def _WaitForCheckpoint(self, proc, logdir, step):
    deadline = time.time() + 240
    while not glob.glob(os.path.join(logdir, 'train', f'ckpt-{step}.index')):
      self.assertIsNone(proc.poll(), f'the trainer exited before step {step}')
      self.assertLess(time.time(), deadline)
      time.sleep(0.2)

