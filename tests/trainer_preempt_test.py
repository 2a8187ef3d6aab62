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

  def _StopAtARandomStep(self, logdir, sig, *flags):
    """Trains (no end in sight) until step 10's summary, then sends `sig`
    0-0.3 s later: (exit status, stdout, stderr)."""
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
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err

  def _Check(self, sig, status, *flags):
    stopped, whole = (self.create_tempdir().full_path for _ in range(2))
    code, _, err = self._StopAtARandomStep(stopped, sig, *flags)
    self.assertEqual(code, status, err[-3000:])
    self.assertNotIn('Traceback', err)
    last = err.strip().splitlines()[-1]
    hit = re.fullmatch(r'Preempted at step (\d+); checkpoint ckpt-\1 written;'
                       r' run the same command to resume\.', last)
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

  def testSigtermWritesTheStepsCheckpointAndTheRunResumesExactly(self):
    self._Check(signal.SIGTERM, 143)

  def testCtrlCWritesTheStepsCheckpointAndTheRunResumesExactly(self):
    self._Check(signal.SIGINT, 130)


if __name__ == '__main__':
  absltest.main()
