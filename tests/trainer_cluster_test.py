"""The trainer against worker processes: local workers, replicas, failures.

`--run_locally=processes` starts and always stops its workers; against a
cluster the trainer names an unreachable worker, refuses too few tasks or
a server of another cluster before training, and stops within 60 s with
one line when a worker is killed or frozen mid-run (also one whose
all-reduce peer it is, with replicas), keeping the last checkpoint, from
which a restarted run resumes with no step lost; with --max_restarts it
waits for the lost task to answer again and goes on by itself.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

from absl.testing import absltest
import tensorflow as tf

from lingvo_pipe.core import local_workers
from tests import trainer_testlib

_Scalars = trainer_testlib.Scalars


def _Spans(trace):
  """Every span of a --pipeline_trace JSON."""
  with open(trace + '.json') as f:
    return [e for e in json.load(f)['traceEvents'] if e['ph'] == 'X']


def _StartedSpec(stdout, num):
  """The cluster spec the trainer said it started `num` workers for."""
  specs = [spec for spec in trainer_testlib.StartedSpecs(stdout)
           if spec.count(',') == num - 1]
  if not specs:
    raise AssertionError(f'no start line in {stdout!r}')
  return specs[0]


_ProcessesWith = trainer_testlib.ProcessesWith


class TrainerClusterTest(trainer_testlib.TrainerTestBase):

  def testRunLocallyProcessesTrainsAndStopsItsWorkers(self):
    logdir = self.create_tempdir().full_path
    trace = os.path.join(logdir, 'trace')
    result = self._Run(logdir, '--run_locally=processes', '--num_replicas=2',
                       f'--pipeline_trace={trace}',
                       '--model_params_override=task.train.max_steps : 20')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    # Stopping the workers leaves the runtime's teardown lines in the
    # logdir, not on the console.
    self.assertNotIn('remotely', result.stderr)
    spec = _StartedSpec(result.stdout, 4)
    # The measured step: both replicas' tasks, four workers' clocks.
    with open(trace + '.json') as f:
      spans = [e for e in json.load(f)['traceEvents'] if e['ph'] == 'X'
               and e['cat'] in ('forward', 'backward')]
    self.assertLen(spans, 2 * 2 * 2 * 2)  # R x K x (F, B) x M / R
    reduces = [e for e in _Spans(trace) if e['cat'] == 'all-reduce']
    self.assertLen(reduces, 2 * 2)  # R x K: each partition's, each replica
    clocks = re.search(r'^clocks: (.*)$', result.stdout, re.M).group(1)
    for task in range(4):
      self.assertRegex(clocks, rf'/job:worker/replica:0/task:{task}: offset '
                       r'[-+]\d+\.\d+ ms \+- \d+\.\d+ ms')
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
    # The workers (their own session: a terminal's Ctrl-C reaches the
    # trainer alone) serve on while it writes the step's checkpoint.
    step = re.fullmatch(r'Preempted at step (\d+); checkpoint ckpt-\1 '
                        r'(written|kept); run the same command to resume\.',
                        err.strip().splitlines()[-1])
    self.assertIsNotNone(step, err[-3000:])
    self.assertEqual(tf.train.latest_checkpoint(os.path.join(logdir, 'train')),
                     os.path.join(logdir, 'train', f'ckpt-{step.group(1)}'))
    spec = _StartedSpec(out, 2)
    self.assertEqual(_ProcessesWith(spec), [])

  def testAnErrorStopsTheTrainerAndItsWorkers(self):
    result = self._Run(
        self.create_tempdir().full_path, '--run_locally=processes',
        '--model_params_override=train_input.nan_at : 40')
    self.assertEqual(result.returncode, 1)
    self.assertIn('error: Training stopped at step', result.stderr)
    self.assertEqual(_ProcessesWith(_StartedSpec(result.stdout, 2)), [])

  def testKilledWorkerStopsTheTrainerAndTheRunResumes(self):
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
    # The cancelled step's lines (when the runtime logs them) and
    # TensorFlow's teardown lines go to the logdir: the console shows the
    # error line alone.
    self.assertEqual(err.strip().count('\n'), 0, err[-3000:])
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

  def testWithMaxRestartsTheTrainerWaitsForALostWorkerAndGoesOn(self):
    """On a cluster, --max_restarts waits for the lost task's address to
    answer again (here: the test restarts its server 3 s later)."""
    logdir = self.create_tempdir().full_path
    workers = local_workers.LocalWorkers(2, os.path.join(logdir, 'workers'))
    self.addCleanup(workers.Stop)
    workers.Start()
    proc = subprocess.Popen(
        self._Command(logdir, f'--cluster_spec={workers.spec}',
                      '--max_restarts=1', '--model_params_override='
                      'task.train.eval_interval_steps : 0\n'
                      'task.train.max_steps : 100000'),
        env=self._Env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    self._WaitForCheckpoint(proc, logdir, 40)
    os.kill(workers.pids[1], signal.SIGKILL)
    time.sleep(3)
    self.assertIsNone(proc.poll())  # waiting for the task
    workers.Restart(1)
    self._WaitForCheckpoint(proc, logdir, 200)  # trains on
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 143, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertRegex(err, rf'Restart 1 of 1: worker task 1 at '
                     rf'{workers.addresses[1]} went away \(.+\); resuming '
                     r'from ckpt-(\d+) at step \1\.')
    self.assertRegex(err.strip().splitlines()[-1], r'^Preempted at step \d+')

  def _StopAWorkerMidRun(self, num_workers, task, sig, *flags):
    """Trains on `num_workers` servers until a checkpoint, sends `sig` to
    worker `task`, and waits for the trainer: (workers, its stderr). The
    trainer must stop by itself within 60 s, status 1, no traceback."""
    logdir = self.create_tempdir().full_path
    workers = local_workers.LocalWorkers(num_workers,
                                         os.path.join(logdir, 'workers'))
    self.addCleanup(workers.Stop)
    workers.Start()
    proc = subprocess.Popen(
        self._Command(logdir, f'--cluster_spec={workers.spec}', *flags,
                      '--model_params_override=task.train.max_steps : 5000'),
        env=self._Env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    self._WaitForCheckpoint(proc, logdir, 20)
    os.kill(workers.pids[task], sig)
    if sig == signal.SIGSTOP:
      self.addCleanup(os.kill, workers.pids[task], signal.SIGCONT)
    stopped = time.time()
    _, err = proc.communicate(timeout=90)
    self.assertLess(time.time() - stopped, 60)
    self.assertEqual(proc.returncode, 1, err[-3000:])
    self.assertNotIn('Traceback', err)
    return workers, err

  def testFrozenWorkerStopsTheTrainer(self):
    """SIGSTOP: the call hangs in TensorFlow; the watchdog ends the run."""
    workers, err = self._StopAWorkerMidRun(2, 1, signal.SIGSTOP)
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^error: Worker task 1 at {workers.addresses[1]} went away \(no '
        r'gRPC answer within 2 s\); training stopped and the last checkpoint '
        r'is \S+/ckpt-\d+\.')

  def _StopAPeerOfTheAllReduce(self, sig):
    """R=2 K=2 on four workers; task 3 (replica 1's partition 1) stops:
    replica 0's all-reduce of partition 1 waits on it."""
    workers, err = self._StopAWorkerMidRun(4, 3, sig, '--num_replicas=2')
    self.assertEqual(err.strip().count('\n'), 0, err[-3000:])
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^error: Worker task 3 at {workers.addresses[3]} went away \(.+\); '
        r'training stopped and the last checkpoint is \S+/ckpt-\d+\.')

  def testKilledPeerOfAnAllReduceStopsTheTrainer(self):
    self._StopAPeerOfTheAllReduce(signal.SIGKILL)

  def testFrozenPeerOfAnAllReduceStopsTheTrainer(self):
    self._StopAPeerOfTheAllReduce(signal.SIGSTOP)

  def testUnreachableWorkersAreNamed(self):
    ports = local_workers.FreePorts(2)
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
    ports = local_workers.FreePorts(3)
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


if __name__ == '__main__':
  absltest.main()
