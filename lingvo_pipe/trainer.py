"""The trainer binary: train, evaluate or decode a registered model.

  python -m lingvo_pipe.trainer --model=image.synthetic.ResNetTinyGPipe \\
      --logdir=/tmp/run1 --run_locally=cpu

Jobs (`--job`):
  trainer        train to task.train.max_steps, saving checkpoints, writing
                 summaries, evaluating the Dev set every eval_interval_steps
                 and at the end; a restart on the same logdir resumes.
                 SIGTERM or Ctrl-C: the step in flight finishes and its
                 checkpoint is written (core/interrupts.py).
  evaler_dev     follow the trainer's checkpoints in --logdir and evaluate
  evaler_test    each new one on Dev / Test, until max_steps.
  decoder_dev    the same, running the task's Decode and its metrics.
  decoder_test
  server         serve task --task_index of the worker job of
                 --cluster_spec (a tf.distribute.Server) until killed.

Where it runs: `--run_locally=cpu` (logical CPUs), `gpu`, or `processes`
(one pinned worker server per device, started and stopped by the
trainer); or `--cluster_spec` of running servers; or, without it, the
cluster and this task's role in TF_CONFIG (core/tf_config.py).
`--num_replicas=R` adds data parallelism (R x K devices or tasks). With a
cluster, a worker that is unreachable, too few tasks, a server of another
cluster, or a worker lost mid-run ends the run with one line naming the
task (`--max_restarts`: the run goes on, core/restarts.py).

Layout of the logdir: `params.txt` (the final params), `train/` (checkpoints
and training summaries), `eval_<dataset>/`, `decode_<dataset>/` (summaries),
`decoder_<dataset>/step_<N>.*` (what the task's DecodeFinalize writes: for
translation the sources, hypotheses and references as text), `vocab.txt`
(a vocabulary built from the training data, for models whose inputs and
task leave vocab_file unset).
This is the only module that defines flags.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from typing import Any, Optional

from absl import app
from absl import flags
from absl import logging

from lingvo_pipe.core import quiet

# Before any module that imports TensorFlow: its start-up lines stay off
# the console (quiet.py).
quiet.ImportTensorFlow()

from lingvo_pipe.core import devices  # noqa: E402
from lingvo_pipe.core import interrupts  # noqa: E402
from lingvo_pipe.core import restarts  # noqa: E402
from lingvo_pipe.core import tf_config  # noqa: E402
from lingvo_pipe import runner as runner_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string('model', None, 'Registered model key, e.g. '
                    'image.synthetic.ResNetTinyGPipe, or module.Class of '
                    "one's own importable module.")
flags.DEFINE_string('logdir', None, 'Directory for checkpoints, summaries '
                    'and params.txt.')
flags.DEFINE_enum('run_locally', 'cpu', ['cpu', 'gpu', 'processes'],
                  'Without --cluster_spec: cpu: split the CPU into as many '
                  'logical devices as the model needs (replicas x '
                  'partitions); gpu: use the visible GPUs; processes: start '
                  'one worker server per device on 127.0.0.1, each pinned '
                  'to a core (round-robin), train against them and stop '
                  'them on exit.')
flags.DEFINE_integer('worker_timeout_secs', 60,
                     'With a cluster: how long to wait for every worker '
                     'task to come up before saying which is unreachable.')
flags.DEFINE_float('worker_grace_secs', 60.0,
                   'With --job=server (and the workers of '
                   '--run_locally=processes): on SIGTERM, serve on this long '
                   'at most, so that the trainer can write the checkpoint '
                   'of the step in flight (it ends the run and releases '
                   'the server); 0: stop at once.', lower_bound=0.0)
flags.DEFINE_integer('max_restarts', 0,
                     'Trainer with --run_locally=processes or a cluster: '
                     'when a worker dies, restart (local: a fresh set of '
                     'workers; cluster: wait --worker_timeout_secs for the '
                     'lost task to answer again) and resume from the newest '
                     'checkpoint, at most this many times.',
                     lower_bound=0)
flags.DEFINE_integer('num_replicas', 0,
                     'Data-parallel replicas of the model (R): replica r '
                     'runs partition k of each pipeline on device (or '
                     'worker task) r * K + k, on batch / R examples. 0: '
                     "the model's task.train.num_replicas.")
flags.DEFINE_bool('share_cores', True,
                  'With --run_locally=cpu and several logical CPUs: give '
                  'each op cores / devices intra-op threads, so partitions '
                  "that run at once do not contend (--noshare_cores: TF's "
                  'default thread pools).')
flags.DEFINE_enum('job', 'trainer', ['trainer', 'evaler_dev', 'evaler_test',
                                     'decoder_dev', 'decoder_test',
                                     'server'],
                  'What to run (see the module docstring).')
flags.DEFINE_string('cluster_spec', '',
                    "TF cluster, e.g. 'worker=host1:2222,host2:2222'. With "
                    '--job=server this process serves --task_index; with '
                    'other jobs, partition k of each pipeline runs on '
                    'worker task k.')
flags.DEFINE_integer('task_index', 0, 'With --job=server: which worker task.')
flags.DEFINE_string('model_params_override', '',
                    "Params text applied to the model params, lines of "
                    "'path : value' (e.g. 'task.train.max_steps : 100').")
flags.DEFINE_string('model_params_file_override', '',
                    'A file of params text, applied before '
                    '--model_params_override.')
flags.DEFINE_string('data_dir', None,
                    'If set, the TFDS data_dir of every input.')
flags.DEFINE_string('pipeline_trace', '',
                    'PATH: before training, measure one step of the model '
                    '(after warm-up; forward and backward on the first '
                    'training batch, no update) and write PATH.json (a '
                    'Chrome trace: ui.perfetto.dev or chrome://tracing) and '
                    'PATH.svg (the picture), with the measured bubble.')
flags.DEFINE_integer('follower_timeout_secs', 600,
                     'Evaler/decoder: stop after waiting this long for a '
                     'new checkpoint.')

@flags.multi_flags_validator(
    ['job', 'model', 'logdir', 'cluster_spec'],
    message='--model and --logdir are required (except with --job=server, '
    'which needs --cluster_spec, and for a worker of TF_CONFIG).')
def _CheckRequired(values) -> bool:
  if values['job'] == 'server':
    return bool(values['cluster_spec'])
  if not values['cluster_spec'] and not (values['model'] and
                                         values['logdir']):
    try:
      role = tf_config.Read()
    except tf_config.TfConfigError:
      return True  # _Main says what is wrong with it, in one line
    return role is not None and role.job == 'server'
  return bool(values['model'] and values['logdir'])

_DATASETS = ('train', 'dev', 'test')
VOCAB_FILE = 'vocab.txt'  # in the logdir (VocabularyInLogdir)


TrainingStopped = runner_lib.TrainingStopped


class WorkerLost(TrainingStopped):
  """A worker went away mid-run (one line: which, what is kept)."""

  def __init__(self, task: int, address: str, why: str):
    super().__init__(_WorkerLost(task, address, why))
    self.task, self.address, self.why = task, address, why


Runner, Preempted = runner_lib.Runner, runner_lib.Preempted


def LoadParams(model: str, override_text: str = '',
               override_file: str = '', data_dir: Optional[str] = None,
               num_replicas: int = 0):
  """The registered model's params with the overrides applied."""
  from lingvo_pipe.core import model_registry  # pylint: disable=g-import-not-at-top
  p = model_registry.GetParams(model)
  if override_file:
    with open(override_file, encoding='utf-8') as f:
      p.FromText(f.read())
  if override_text:
    p.FromText(override_text)
  if num_replicas:
    p.task.train.num_replicas = num_replicas
  CheckReplicas(p)
  CheckBatches(p)
  if data_dir:
    for dataset in _DATASETS:
      input_p = p.Get(f'{dataset}_input')
      if input_p is not None and 'data_dir' in input_p:
        input_p.data_dir = data_dir
  FillFromData(p)
  return p


def FillFromData(p: Any) -> None:
  """Each input's FillFromData (base_input_generator): checks the data and
  fills the params that come from it, e.g. the classes of an image folder;
  a DataError stops the run before anything is built."""
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  for dataset in _DATASETS:
    input_p = p.Get(f'{dataset}_input')
    fill = getattr(getattr(input_p, 'cls', None), 'FillFromData', None)
    if fill is None:
      continue
    try:
      fill(input_p, p)
    except base_input_generator.DataError as err:
      raise TrainingStopped(str(err)) from None


def VocabularyInLogdir(p: Any, logdir: str) -> None:
  """Every `vocab_file` left None (inputs and task) -> <logdir>/vocab.txt.

  The first job that reads the training data builds the vocabulary there;
  every other job of the run (and a resumed run) reads the same file.
  """
  path = os.path.join(logdir, VOCAB_FILE)
  for name in ('task',) + tuple(f'{d}_input' for d in _DATASETS):
    sub = p.Get(name)
    if sub is not None and 'vocab_file' in sub and sub.vocab_file is None:
      sub.vocab_file = path


def CheckReplicas(p: Any) -> None:
  """A clear error unless the replicas can split the train batch."""
  replicas = p.task.train.num_replicas
  if not isinstance(replicas, int) or replicas < 1:
    raise TrainingStopped(
        f'num_replicas is {replicas!r}; use an integer >= 1 '
        '(--num_replicas or task.train.num_replicas).')
  train_input = p.Get('train_input')
  batch = train_input.batch_size if train_input is not None else None
  if batch is not None and batch % replicas:
    raise TrainingStopped(
        f'The train batch size {batch} does not split over {replicas} '
        f'replicas; set train_input.batch_size to a multiple of {replicas} '
        'or change --num_replicas.')


def CheckBatches(p: Any) -> None:
  """A clear error unless every input's batch splits into the micro-batches
  of every pipeline of the task (train: per replica; dev and test: whole,
  as evaluation and decoding run them)."""
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
  pipelines = base_model.PipelineParams(p.task)
  replicas = p.task.train.num_replicas
  for dataset in _DATASETS:
    input_p = p.Get(f'{dataset}_input')
    if input_p is None or 'batch_size' not in input_p:
      continue
    buckets = base_input_generator.Buckets(input_p)
    sizes = ([(n, f'bucket {i} (pairs up to {bound} tokens): '
               f'{dataset}_input.bucket_batch_limit[{i}]',
               f'{dataset}_input.bucket_batch_limit ('
               'input_generator.TokensPerBatch makes multiples)')
              for i, (bound, n) in enumerate(buckets)] or
             [(input_p.batch_size, f'{dataset}_input.batch_size',
               f'{dataset}_input.batch_size')])
    for batch, name, knob_in in sizes:
      if dataset == 'train' and batch % replicas:
        raise TrainingStopped(
            f'{name}={batch} does not split over {replicas} replicas; set '
            f'{knob_in} to a multiple of {replicas} or change '
            '--num_replicas.')
      per = batch // replicas if dataset == 'train' else batch
      where = f'{name}={batch}' + (f' ({per} per replica)'
                                   if per != batch else '')
      for path, pipeline in pipelines:
        why = gpipe.MicroBatchError(
            pipeline, per, replicas if dataset == 'train' else 1)
        if why:
          knob = ('micro_batch_size' if pipeline.micro_batch_size is not None
                  else 'num_micro_batches')
          raise TrainingStopped(
              f'{where} does not fit the pipeline {path}: {why} (set '
              f'{path}.{knob} or {knob_in}).')


def SetUpDevices(run_locally: str, needed: int,
                 share_cores: bool = True) -> None:
  """Makes the devices the model's pipelines need (before any TF op)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if run_locally == 'cpu':
    devices.SplitCpu(max(needed, 1), share_cores=share_cores)
    return
  from lingvo_pipe.core import stage_function  # pylint: disable=g-import-not-at-top
  stage_function.ShareCallBodies()
  gpus = tf.config.list_physical_devices('GPU')
  if len(gpus) < needed:
    raise TrainingStopped(
        f'The model needs {needed} devices but {len(gpus)} GPU(s) are '
        'visible; use --run_locally=cpu or fewer partitions.')


def _Run() -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  if FLAGS.job == 'server':
    spec = cluster.ParseClusterSpec(FLAGS.cluster_spec)
    print(f'Serving worker task {FLAGS.task_index} of {spec.as_dict()}.',
          flush=True)
    cluster.Serve(spec, 'worker', FLAGS.task_index,
                  grace_secs=FLAGS.worker_grace_secs)
    return
  p = LoadParams(FLAGS.model, FLAGS.model_params_override,
                 FLAGS.model_params_file_override, FLAGS.data_dir,
                 FLAGS.num_replicas)
  os.makedirs(FLAGS.logdir, exist_ok=True)
  VocabularyInLogdir(p, FLAGS.logdir)
  with contextlib.ExitStack() as stack:
    spec_text = FLAGS.cluster_spec
    if _role and _role.serves_task_0:
      stack.enter_context(tf_config.ServingTaskZero(
          spec_text, os.path.join(FLAGS.logdir, 'workers', 'worker0.log')))
    if not spec_text and FLAGS.run_locally == 'processes':
      spec_text = _StartLocalWorkers(p, stack)
    if not spec_text:
      SetUpDevices(FLAGS.run_locally, base_model.NumDevicesNeeded(p.task),
                   FLAGS.share_cores)
      _RunJob(p)
      return
    spec = cluster.ParseClusterSpec(spec_text)
    _CheckTaskCount(p, spec)
    names = cluster.Connect(spec, timeout_secs=FLAGS.worker_timeout_secs)
    base_model.PlacePipelines(p.task, names)
    watchdog = cluster.Watchdog(
        spec, _LostByWatchdog,
        status=restarts.LOST_WORKER_STATUS if restarts.Supervised() else 1,
        devices=names, on_stopping=_OnWorkerStopping).Start()
    stack.callback(watchdog.Stop)
    try:
      with quiet.CancelledStepLinesTo(os.path.join(FLAGS.logdir,
                                                   CANCELLED_LOG)):
        _RunJob(p)
    except Preempted:
      watchdog.ReleaseStopping()  # the checkpoint is out: they may go
      raise
    except tf.errors.OpError as err:
      failed = (watchdog.dead[:2] if watchdog.dead else
                cluster.FailedTask(err, spec))
      if failed is None:
        raise
      why = _Reason(err)
      if failed[0] in watchdog.stopping:
        grace = watchdog.stopping[failed[0]].get('grace_secs', 0)
        why = (f'stopped by SIGTERM, its grace of {grace:g} s over before '
               'the checkpoint of the step in flight: the steps since the '
               'last checkpoint are lost; raise --worker_grace_secs')
      raise WorkerLost(*failed, why) from None


def _CheckTaskCount(p: Any, spec: Any) -> None:
  """A clear error, before connecting, if the cluster is too small."""
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  needed = base_model.NumDevicesNeeded(p.task)
  have = spec.num_tasks('worker') if 'worker' in spec.jobs else 0
  if have < needed:
    replicas = base_model.NumReplicas(p.task)
    raise TrainingStopped(
        f'The model needs {needed} worker tasks ({replicas} replica(s) x '
        f'{needed // replicas} partition(s)) but --cluster_spec lists '
        f'{have}; add worker tasks, or use fewer replicas or partitions.')


def _Reason(err: Exception) -> str:
  """A short cause from a runtime error's long message."""
  hit = re.search(r'Socket closed|Connection reset by peer|Connection '
                  r'refused|Failed to connect to remote host', str(err))
  return hit.group(0) if hit else type(err).__name__


def _WorkerLost(task: int, address: str, why: str) -> str:
  """One line: which worker went away, what is kept, what to do."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  latest = tf.train.latest_checkpoint(os.path.join(FLAGS.logdir, 'train'))
  kept = (f'the last checkpoint is {latest}' if latest else
          'no checkpoint was written yet')
  return (f'Worker task {task} at {address} went away ({why}); training '
          f'stopped and {kept}. Restart the worker, then the trainer: it '
          'resumes from the last checkpoint.')


_role: Optional[tf_config.Role] = None  # what TF_CONFIG made this task


def _TakeRole() -> None:
  """The job, cluster and task index of TF_CONFIG (tf_config.py), unless
  --cluster_spec is given: one line then says that it wins."""
  global _role
  if not os.environ.get(tf_config.ENV, '').strip():
    return
  if FLAGS.cluster_spec:
    print(f'{tf_config.ENV} is set and so is --cluster_spec: --cluster_spec '
          f'wins, {tf_config.ENV} is not read.', file=sys.stderr, flush=True)
    return
  _role = tf_config.Read()
  if FLAGS['job'].present and FLAGS.job != _role.job:
    raise TrainingStopped(
        f'{tf_config.ENV} makes this task the {_role.name}, which runs '
        f'--job={_role.job}, but --job={FLAGS.job} is given; drop --job or '
        f'unset {tf_config.ENV}.')
  # In this order: absl checks _CheckRequired as each is set.
  FLAGS.cluster_spec, FLAGS.task_index = _role.cluster_spec, _role.task_index
  FLAGS.job = _role.job


def _OnWorkerStopping(task: int, address: str, unused_note: dict) -> None:
  """A worker was told to stop (SIGTERM, its grace period): the trainer
  stops as if it had been (core/interrupts.py)."""
  interrupts.Request(signal.SIGTERM,
                     f'worker task {task} at {address} was told to stop')


def _LostByWatchdog(task: int, address: str, why: str) -> str:
  """The watchdog's last line; '' under --max_restarts, where the
  supervisor says it (restarts.py)."""
  line = _WorkerLost(task, address, why)
  note = restarts.Supervised()
  if note:
    restarts.NoteLostWorker(note, task, address, why, line)
    return ''
  return f'error: {line}'


def _Supervise() -> int:
  """--max_restarts: runs the trainer as a child until it ends other than
  by a lost worker (restarts.py); returns the exit status."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not FLAGS.cluster_spec and FLAGS.run_locally != 'processes':
    raise TrainingStopped(
        f'--max_restarts={FLAGS.max_restarts} restarts lost worker '
        'processes: use it with --run_locally=processes or --cluster_spec.')
  train_dir = os.path.join(FLAGS.logdir, 'train')
  return restarts.Supervise(
      restarts.ChildCommand(sys.argv), FLAGS.max_restarts,
      lambda: tf.train.latest_checkpoint(train_dir),
      lambda line: print(line, file=sys.stderr, flush=True))


def _StartLocalWorkers(p: Any, stack: contextlib.ExitStack) -> str:
  """Starts one pinned worker server per device the model needs."""
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
  needed = base_model.NumDevicesNeeded(p.task)
  log_dir = os.path.join(FLAGS.logdir, 'workers')
  workers = stack.enter_context(local_workers.LocalWorkers(
      needed, log_dir, grace_secs=FLAGS.worker_grace_secs))
  print(f'Started {needed} local worker process(es), one core each '
        f'(round-robin): {workers.spec}; logs in {log_dir}.', flush=True)
  return workers.spec


def _RunJob(p: Any) -> None:
  text = p.ToText()
  logging.info('Model params:\n%s', text)
  if FLAGS.job == 'trainer':
    params_path = os.path.join(FLAGS.logdir, 'params.txt')
    with open(params_path, 'w', encoding='utf-8') as f:
      f.write(text + '\n')
    print(f'Model params: {params_path}', flush=True)
  runner = Runner(p, FLAGS.logdir, FLAGS.follower_timeout_secs)
  if FLAGS.job == 'trainer':
    print(runner.ParameterLine(), flush=True)
    runner.WriteTimelines()
    if FLAGS.pipeline_trace:
      runner.TracePipeline(FLAGS.pipeline_trace)
    runner.Train()
  else:
    runner.Follow(FLAGS.job)


def _Main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:
    # The console shows progress, evaluations and problems; the libraries'
    # INFO logs (TFDS, checkpoints, the model params, the balance report)
    # need --verbosity=0.
    logging.set_verbosity(logging.WARNING)
  from lingvo_pipe.core import params_text  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import model_registry  # pylint: disable=g-import-not-at-top
  interrupts.Install()
  try:
    _TakeRole()
    if (FLAGS.job == 'trainer' and FLAGS.max_restarts and
        not restarts.Supervised()):
      sys.exit(_Supervise())
    _Run()
    # The job is done: what the runtime logs as the process tears down
    # (a cluster's stopped workers still hold our functions) stays off
    # the console.
    _StderrToExitLog()
  except WorkerLost as lost:
    note = restarts.Supervised()
    if not note:
      _LastLine(f'error: {lost}')
      sys.exit(1)
    restarts.NoteLostWorker(note, lost.task, lost.address, lost.why,
                            str(lost))
    _StderrToExitLog()
    sys.exit(restarts.LOST_WORKER_STATUS)
  except (TrainingStopped, model_registry.UnknownModelError,
          params_text.ParamsTextError, tf_config.TfConfigError,
          FileNotFoundError, local_workers.WorkersFailed,
          cluster.ClusterError) as err:
    _LastLine(f'error: {err}')
    sys.exit(1)
  except Preempted as stop:
    _LastLine(str(stop))
    sys.exit(interrupts.ExitStatus())
  except KeyboardInterrupt:
    _LastLine('Interrupted; checkpoints written so far are kept.')
    sys.exit(interrupts.ExitStatus())


EXIT_LOG = 'exit_stderr.txt'  # in the logdir (_LastLine)
# In the logdir: what the runtime logs about steps cancelled on worker
# servers (quiet.CancelledStepLinesTo), off the console.
CANCELLED_LOG = 'cancelled_steps.txt'



def _LastLine(line: str) -> None:
  """Prints `line` to stderr as the last thing the console shows.

  What is written to stderr after it (TensorFlow's C++ runtime logs
  "Failed to remove function remotely" for every function a lost worker
  held, as the process tears down) goes to <logdir>/exit_stderr.txt, or
  nowhere if there is no logdir yet.
  """
  sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  _StderrToExitLog()


def _StderrToExitLog() -> None:
  """From now on fd 2 goes to <logdir>/exit_stderr.txt (or nowhere)."""
  sys.stdout.flush()
  sys.stderr.flush()
  logdir = FLAGS.logdir if FLAGS.is_parsed() else None
  path = (os.path.join(logdir, EXIT_LOG) if logdir and os.path.isdir(logdir)
          else os.devnull)
  with open(path, 'ab') as f:
    os.dup2(f.fileno(), 2)


def main() -> None:
  app.run(_Main)


if __name__ == '__main__':
  main()
