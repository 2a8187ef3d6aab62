"""The trainer binary, run as a user runs it, on a model in a user's file.

The model lives in a module written to a temporary directory (outside the
package) and is found with --model=<module>.<Class>. Each test starts the
real binary in a subprocess: train and evaluate, resume after SIGKILL, stop
on a non-finite loss, and reject an unknown model.
"""

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tensorflow.core.util import event_pb2

_USER_MODULE = '''
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
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('network', self.params.network)

  def ComputePredictions(self, theta, batch):
    return NestedMap(y=self.network.FProp(theta.network, batch.x))

  def ComputeLoss(self, theta, predictions, batch):
    loss = tf.reduce_mean(tf.square(predictions.y - batch.y))
    return {'loss': (loss, tf.constant(16.0))}, NestedMap()

  def Decode(self, theta, batch):
    return NestedMap(pred=self.ComputePredictions(theta, batch).y, y=batch.y)

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
'''


def _Scalars(directory, skip=()):
  """{tag: [(step, value)]} from the event files in `directory`."""
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, 'events.*'))):
    if path in skip:
      continue
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        number = tf.make_ndarray(value.tensor) if value.HasField(
            'tensor') else value.simple_value
        found.setdefault(value.tag, []).append((event.step, float(number)))
  return found


def _StartedSpec(stdout, num):
  """The cluster spec the trainer said it started `num` workers for."""
  hit = re.search(rf'Started {num} local worker process\(es\), one core each '
                  r'\(round-robin\): (worker=\S+);', stdout)
  if not hit:
    raise AssertionError(f'no start line in {stdout!r}')
  return hit.group(1)


def _ProcessesWith(text):
  """Pids of live (not zombie) processes whose command line has `text`."""
  found = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace')
      with open(f'/proc/{pid}/stat') as f:
        state = f.read().rpartition(')')[2].split()[0]
    except OSError:
      continue
    if text in cmdline and state != 'Z':
      found.append(int(pid))
  return found


class TrainerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._root = absltest.TEST_TMPDIR.value
    cls._module_dir = os.path.join(cls._root, 'user_models')
    os.makedirs(cls._module_dir, exist_ok=True)
    with open(os.path.join(cls._module_dir, 'lp_user_models.py'), 'w') as f:
      f.write(textwrap.dedent(_USER_MODULE))

  def _Command(self, logdir, *extra, model='lp_user_models.Tiny'):
    return [sys.executable, '-m', 'lingvo_pipe.trainer', f'--model={model}',
            f'--logdir={logdir}', '--run_locally=cpu', *extra]

  def _Env(self, extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', **(extra or {}))
    env['PYTHONPATH'] = os.pathsep.join(
        [self._module_dir, os.getcwd(), env.get('PYTHONPATH', '')])
    return env

  def _Run(self, logdir, *extra, env=None, **kwargs):
    return subprocess.run(self._Command(logdir, *extra, **kwargs),
                          env=self._Env(env), capture_output=True, text=True,
                          timeout=300)

  def testTrainsEvaluatesAndWritesEverything(self):
    logdir = self.create_tempdir().full_path
    result = self._Run(logdir)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
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

  def testResumesAfterSigkill(self):
    logdir = self.create_tempdir().full_path
    override = ('--model_params_override=task.train.max_steps : 400\n'
                'task.train.eval_interval_steps : 0')
    proc = subprocess.Popen(self._Command(logdir, override), env=self._Env(),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = os.path.join(logdir, 'train', 'checkpoint')
    deadline = time.time() + 240
    while not glob.glob(os.path.join(logdir, 'train', 'ckpt-40.index')):
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
    result = self._Run(logdir, '--model_params_override='
                       'task.train.max_steps : 440')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn(f'Resumed from {latest} at step {killed_at}; input '
                  'position restored.', result.stdout)
    # The second run starts right after the checkpoint: no step is lost
    # and none is trained twice.
    resumed = _Scalars(os.path.join(logdir, 'train'), skip=first_run)
    self.assertEqual([s for s, _ in resumed['loss']],
                     list(range(killed_at + 10, 441, 10)))
    final = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    self.assertTrue(final.endswith('ckpt-440'))

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
    values = []
    for logdir in (whole, split):
      reader = tf.train.load_checkpoint(os.path.join(logdir, 'train',
                                                     'ckpt-60'))
      names = sorted(n for n in reader.get_variable_to_shape_map()
                     if n.endswith('.ATTRIBUTES/VARIABLE_VALUE'))
      values.append({n: reader.get_tensor(n) for n in names})
    self.assertEqual(sorted(values[0]), sorted(values[1]))
    self.assertIn('global_step/.ATTRIBUTES/VARIABLE_VALUE', values[0])
    self.assertGreater(len(values[0]), 4)  # weights, biases, slots
    for name, value in values[0].items():
      self.assertTrue((value == values[1][name]).all(), name)

  def testCheckpointOfTwoReplicasResumesWithOne(self):
    """One copy of the variables: R=2 trains as R=1 and resumes as R=1."""
    common = ('--model_params_override=task.train.eval_interval_steps : 0\n'
              'task.train.max_steps : ')
    two, one = (self.create_tempdir().full_path for _ in range(2))
    result = self._Run(two, common + '20', '--num_replicas=2')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('R=2 replicas x K=2 partitions, M=4 micro-batches',
                  result.stdout)
    self.assertIn('partition 1: /device:CPU:1 | /device:CPU:3', result.stdout)
    result = self._Run(one, common + '20')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    values = []
    for logdir in (two, one):
      reader = tf.train.load_checkpoint(os.path.join(logdir, 'train',
                                                     'ckpt-20'))
      names = sorted(n for n in reader.get_variable_to_shape_map()
                     if n.endswith('.ATTRIBUTES/VARIABLE_VALUE'))
      values.append({n: reader.get_tensor(n) for n in names})
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

  def _WaitForCheckpoint(self, proc, logdir, step):
    deadline = time.time() + 240
    while not glob.glob(os.path.join(logdir, 'train', f'ckpt-{step}.index')):
      self.assertIsNone(proc.poll(), f'the trainer exited before step {step}')
      self.assertLess(time.time(), deadline)
      time.sleep(0.2)

  def testRunLocallyProcessesTrainsAndStopsItsWorkers(self):
    logdir = self.create_tempdir().full_path
    result = self._Run(logdir, '--run_locally=processes', '--num_replicas=2',
                       '--model_params_override=task.train.max_steps : 20')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    spec = _StartedSpec(result.stdout, 4)
    self.assertIn('partition 1: /job:worker/replica:0/task:1/device:CPU:0 | '
                  '/job:worker/replica:0/task:3/device:CPU:0', result.stdout)
    self.assertTrue(os.path.exists(os.path.join(logdir, 'train',
                                                'ckpt-20.index')))
    self.assertEqual(_ProcessesWith(spec), [])

  def testCtrlCStopsTheTrainerAndItsWorkers(self):
    logdir = self.create_tempdir().full_path
    proc = subprocess.Popen(
        self._Command(logdir, '--run_locally=processes',
                      '--model_params_override=task.train.max_steps : 5000'),
        env=self._Env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    self._WaitForCheckpoint(proc, logdir, 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    self.assertEqual(proc.returncode, 130, err[-3000:])
    self.assertNotIn('Traceback', err)
    spec = _StartedSpec(out, 2)
    self.assertEqual(_ProcessesWith(spec), [])

  def testKilledWorkerStopsTheTrainerAndTheRunResumes(self):
    from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
    logdir = self.create_tempdir().full_path
    workers = local_workers.LocalWorkers(2, os.path.join(logdir, 'workers'))
    self.addCleanup(workers.Stop)
    workers.Start()
    flags = [f'--cluster_spec={workers.spec}',
             '--model_params_override=task.train.eval_interval_steps : 0\n'
             'task.train.max_steps : 5000']
    proc = subprocess.Popen(self._Command(logdir, *flags), env=self._Env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    self._WaitForCheckpoint(proc, logdir, 40)
    os.kill(workers.pids[1], signal.SIGKILL)
    killed = time.time()
    _, err = proc.communicate(timeout=90)
    self.assertLess(time.time() - killed, 60)
    self.assertEqual(proc.returncode, 1, err[-3000:])
    self.assertNotIn('Traceback', err)
    latest = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^error: Worker task 1 at {workers.addresses[1]} went away \(.+\); '
        rf'training stopped and the last checkpoint is {latest}\. Restart '
        'the worker, then the trainer')
    killed_at = int(latest.rsplit('-', 1)[-1])
    first_run = glob.glob(os.path.join(logdir, 'train', 'events.*'))
    workers.Restart(1)
    flags[1] = flags[1].replace('5000', str(killed_at + 20))
    result = self._Run(logdir, *flags)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn(f'Resumed from {latest} at step {killed_at}',
                  result.stdout)
    resumed = _Scalars(os.path.join(logdir, 'train'), skip=first_run)
    self.assertEqual([s for s, _ in resumed['loss']],
                     list(range(killed_at + 10, killed_at + 21, 10)))

  def testFrozenWorkerStopsTheTrainer(self):
    """SIGSTOP: the call hangs in TensorFlow; the watchdog ends the run."""
    from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
    logdir = self.create_tempdir().full_path
    workers = local_workers.LocalWorkers(2, os.path.join(logdir, 'workers'))
    self.addCleanup(workers.Stop)
    workers.Start()
    proc = subprocess.Popen(
        self._Command(logdir, f'--cluster_spec={workers.spec}',
                      '--model_params_override=task.train.max_steps : 5000'),
        env=self._Env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    self._WaitForCheckpoint(proc, logdir, 20)
    os.kill(workers.pids[1], signal.SIGSTOP)
    self.addCleanup(os.kill, workers.pids[1], signal.SIGCONT)
    frozen = time.time()
    _, err = proc.communicate(timeout=90)
    self.assertLess(time.time() - frozen, 60)
    self.assertEqual(proc.returncode, 1, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^error: Worker task 1 at {workers.addresses[1]} went away \(no '
        r'gRPC answer within 2 s\); training stopped and the last checkpoint '
        r'is \S+/ckpt-\d+\.')

  def testUnreachableWorkersAreNamed(self):
    from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
    ports = local_workers._FreePorts(2)  # pylint: disable=protected-access
    spec = 'worker=' + ','.join(f'127.0.0.1:{p}' for p in ports)
    began = time.time()
    result = self._Run(self.create_tempdir().full_path,
                       f'--cluster_spec={spec}', '--worker_timeout_secs=2')
    self.assertLess(time.time() - began, 60)
    self.assertEqual(result.returncode, 1)
    self.assertEqual(
        result.stderr.strip().splitlines()[-1],
        f'error: Worker task 0 at 127.0.0.1:{ports[0]} is unreachable after '
        '2 s (no connection: Connection refused) (and 1 more task(s): [1]); '
        'start its server (python -m lingvo_pipe.trainer --job=server '
        '--cluster_spec=... --task_index=0) or fix --cluster_spec.')

  def testTooFewTasksForTheReplicas(self):
    result = self._Run(self.create_tempdir().full_path,
                       '--cluster_spec=worker=127.0.0.1:1,127.0.0.1:2',
                       '--num_replicas=2')
    self.assertEqual(result.returncode, 1)
    self.assertEqual(
        result.stderr.strip().splitlines()[-1],
        'error: The model needs 4 worker tasks (2 replica(s) x 2 '
        'partition(s)) but --cluster_spec lists 2; add worker tasks, or use '
        'fewer replicas or partitions.')

  def testWorkerOfAnotherClusterIsRefused(self):
    from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
    ports = local_workers._FreePorts(3)  # pylint: disable=protected-access
    ours = f'worker=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}'
    theirs = f'worker=127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}'
    servers = []
    for spec, task in ((ours, 0), (theirs, 0)):
      servers.append(subprocess.Popen(
          [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
           f'--cluster_spec={spec}', f'--task_index={task}'],
          env=self._Env(), stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL))
      self.addCleanup(servers[-1].wait)
      self.addCleanup(servers[-1].kill)
    result = self._Run(self.create_tempdir().full_path,
                       f'--cluster_spec={ours}', '--worker_timeout_secs=60')
    self.assertEqual(result.returncode, 1)
    self.assertEqual(
        result.stderr.strip().splitlines()[-1],
        f'error: Worker task 1 at 127.0.0.1:{ports[1]} serves another '
        "cluster (started as task 0 of {'worker': ['127.0.0.1:"
        f"{ports[1]}', '127.0.0.1:{ports[2]}']}}, not task 1 of {{'worker': "
        f"['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']}}); restart it "
        'with this --cluster_spec and --task_index=1, or fix --cluster_spec.')

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

  def testUnknownModelSaysWhatExists(self):
    result = self._Run(self.create_tempdir().full_path,
                       model='lp_user_models.Tinny')
    self.assertEqual(result.returncode, 1)
    self.assertIn("error: Unknown model 'lp_user_models.Tinny'; did you "
                  "mean 'lp_user_models.Tiny'?", result.stderr)


if __name__ == '__main__':
  absltest.main()
