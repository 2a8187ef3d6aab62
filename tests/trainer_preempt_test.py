"""Stopped from outside: SIGTERM (what Kubernetes, Slurm and preemptible
VMs send before they kill a job) or Ctrl-C, at a random step of a run whose
next periodic checkpoint is far off. The trainer finishes the step in
flight, writes its checkpoint with the input's position, says so in one
line and exits 128 + the signal; the same command resumes it and reaches
exactly (bitwise, TF_DETERMINISTIC_OPS) the variables of a run that was
never stopped.
"""

import glob
import os
import random
import re
import signal
import subprocess
import time

from absl.testing import absltest

from tests import trainer_testlib

# save_interval 1000: no periodic checkpoint comes before the signal.
_COMMON = ('task.train.eval_interval_steps : 0\n'
           'task.train.save_interval_steps : 1000\n'
           'train_input.shuffle_buffer_size : 256\n')
_DETERMINISTIC = {'TF_DETERMINISTIC_OPS': '1'}


class TrainerPreemptTest(trainer_testlib.TrainerTestBase):

  def _StopAtARandomStep(self, logdir, sig, *flags, worker=None):
    """Trains (no end in sight) until step 10's summary, then sends `sig`
    0-0.3 s later to the trainer, or to its local worker task `worker`:
    (exit status, stdout, stderr)."""
    proc = subprocess.Popen(
        self._Command(logdir, *flags, '--model_params_override=' + _COMMON +
                      'task.train.max_steps : 1000000'),
        env=self._Env(_DETERMINISTIC), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    deadline = time.time() + 240
    while not trainer_testlib.Scalars(os.path.join(logdir, 'train')).get(
        'loss'):
      self.assertIsNone(proc.poll(), 'the trainer exited before step 10')
      self.assertLess(time.time(), deadline)
      time.sleep(0.2)
    time.sleep(random.uniform(0, 0.3))
    if worker is None:
      proc.send_signal(sig)
    else:
      os.kill(_ServerOf(proc.pid, worker), sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err

  def _Check(self, sig, status, *flags, worker=None, why=''):
    """The stopped run's checks and its resume; the stopped run's stdout."""
    stopped, whole = (self.create_tempdir().full_path for _ in range(2))
    code, out, err = self._StopAtARandomStep(stopped, sig, *flags,
                                             worker=worker)
    self.assertEqual(code, status, err[-3000:])
    self.assertNotIn('Traceback', err)
    last = err.strip().splitlines()[-1]
    hit = re.fullmatch(rf'Preempted at step (\d+){why}; checkpoint ckpt-\1 '
                       r'written; run the same command to resume\.', last)
    self.assertIsNotNone(hit, err[-3000:])
    step = int(hit.group(1))
    self.assertGreaterEqual(step, 10)
    ckpts = glob.glob(os.path.join(stopped, 'train', 'ckpt-*.index'))
    self.assertEqual([os.path.basename(p) for p in ckpts],
                     [f'ckpt-{step}.index'])
    # The same command (to a nearer end) resumes right after it; a run
    # never stopped reaches the same variables.
    end = f'task.train.max_steps : {step + 20}'
    runs = [self._Run(d, *flags, '--model_params_override=' + _COMMON + end,
                      env=_DETERMINISTIC) for d in (stopped, whole)]
    for run in runs:
      self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    latest = os.path.join(stopped, 'train', f'ckpt-{step}')
    self.assertIn(f'Resumed from {latest} at step {step}; input position '
                  'restored.', runs[0].stdout)
    self.assertSameVariables(*(os.path.join(d, 'train', f'ckpt-{step + 20}')
                               for d in (stopped, whole)))
    return out

  def testSigtermWritesTheStepsCheckpointAndTheRunResumesExactly(self):
    self._Check(signal.SIGTERM, 143)

  def testCtrlCWritesTheStepsCheckpointAndTheRunResumesExactly(self):
    self._Check(signal.SIGINT, 130)

  def testSigtermToAWorkerWritesTheStepsCheckpointAndTheRunResumes(self):
    """The worker serves on through its grace period (60 s by default)
    while the trainer notices, writes the step's checkpoint, releases it
    and exits; no worker is left running."""
    start = time.monotonic()
    out = self._Check(signal.SIGTERM, 143, '--run_locally=processes',
                      worker=1, why=r' \(worker task 1 at 127\.0\.0\.1:\d+ '
                      r'was told to stop\)')
    self.assertLess(time.monotonic() - start, 240)  # not held for the grace
    specs = trainer_testlib.StartedSpecs(out)
    self.assertLen(specs, 1)
    self.assertEqual(trainer_testlib.ProcessesWith(specs[0]), [])

  def testWithNoGraceALostWorkerIsOneLine(self):
    logdir = self.create_tempdir().full_path
    code, _, err = self._StopAtARandomStep(
        logdir, signal.SIGTERM, '--run_locally=processes',
        '--worker_grace_secs=0', worker=1)
    self.assertEqual(code, 1, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertEqual(err.strip().count('\n'), 0, err[-3000:])
    self.assertRegex(err, r'^error: Worker task 1 at 127\.0\.0\.1:\d+ went '
                     r'away \(.+\); training stopped and no checkpoint was '
                     r'written yet\.')


def _ServerOf(trainer, task):
  """Pid of worker task `task` among the servers `trainer` started."""
  pids = [pid for pid in trainer_testlib.ProcessesWith(
      '--job=server', f'--task_index={task} ') if _Parent(pid) == trainer]
  assert len(pids) == 1, pids
  return pids[0]


def _Parent(pid):
  with open(f'/proc/{pid}/stat') as f:
    return int(f.read().rpartition(')')[2].split()[1])


if __name__ == '__main__':
  absltest.main()
