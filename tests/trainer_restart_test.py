"""--max_restarts with --run_locally=processes: a worker SIGKILLed mid-run
(as the OOM killer does) is replaced by a fresh set of workers, the run
resumes from the newest checkpoint and ends exactly (bitwise,
TF_DETERMINISTIC_OPS) where a run never broken ends; one more loss than
allowed ends it with the one-line error of a run without restarts. No
worker is left running after either.
"""

import os
import re
import signal
import subprocess
import threading
import time

from absl.testing import absltest

from tests import trainer_testlib

_COMMON = ('task.train.eval_interval_steps : 0\n'
           'train_input.shuffle_buffer_size : 256\n')
_DETERMINISTIC = {'TF_DETERMINISTIC_OPS': '1'}
_RESUMED = re.compile(r'^Resumed from \S+ at step (\d+);')


def _Steps(logdir):
  """Steps of the checkpoints in the logdir."""
  names = os.listdir(os.path.join(logdir, 'train')) if os.path.isdir(
      os.path.join(logdir, 'train')) else []
  return [int(n[5:-6]) for n in names
          if n.startswith('ckpt-') and n.endswith('.index')]


class TrainerRestartTest(trainer_testlib.TrainerTestBase):

  def _KillWorkerTimes(self, logdir, kills, max_steps):
    """Runs with --max_restarts=2, SIGKILLs worker task 1 `kills` times
    (each time a checkpoint 40 steps past the set's start is written);
    (status, stdout lines, stderr, the specs of the sets started)."""
    proc = subprocess.Popen(
        self._Command(logdir, '--run_locally=processes', '--max_restarts=2',
                      '--model_params_override=' + _COMMON +
                      f'task.train.max_steps : {max_steps}'),
        env=self._Env(_DETERMINISTIC), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    lines, errs = [], []
    readers = [threading.Thread(target=lambda: lines.extend(proc.stdout)),
               threading.Thread(target=lambda: errs.extend(proc.stderr))]
    for reader in readers:
      reader.start()
    deadline = time.time() + 300
    for kill in range(kills):
      while True:
        specs = trainer_testlib.StartedSpecs(''.join(lines))
        resumed = [int(m.group(1)) for m in map(_RESUMED.search, list(lines))
                   if m]
        if len(specs) > kill and len(resumed) >= kill:
          start = resumed[kill - 1] if kill else 0
          if any(s >= start + 40 for s in _Steps(logdir)):
            break
        self.assertIsNone(proc.poll(), f'the trainer exited before kill '
                          f'{kill + 1}')
        self.assertLess(time.time(), deadline)
        time.sleep(0.1)
      pid = trainer_testlib.ProcessesWith(specs[kill], '--task_index=1')
      self.assertLen(pid, 1)
      os.kill(pid[0], signal.SIGKILL)
    proc.wait(timeout=300)
    for reader in readers:
      reader.join()
    err = ''.join(errs)
    specs = trainer_testlib.StartedSpecs(''.join(lines))
    for spec in specs:  # nothing left running
      self.assertEqual(trainer_testlib.ProcessesWith(spec), [])
    return proc.returncode, lines, err, specs

  def testTwoLostWorkersAreReplacedAndTheRunEndsAsAnUnbrokenOne(self):
    broken, whole = (self.create_tempdir().full_path for _ in range(2))
    code, lines, err, specs = self._KillWorkerTimes(broken, 2, 800)
    self.assertEqual(code, 0, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertNotIn('retracing', err)
    self.assertLen(specs, 3)
    restarts = re.findall(
        r'^Restart (\d) of 2: worker task 1 at (\S+) went away \(.+\); '
        r'resuming from ckpt-(\d+) at step \3\.$', err, re.M)
    self.assertEqual([(n, a) for n, a, _ in restarts],
                     [('1', specs[0].split(',')[1]),
                      ('2', specs[1].split(',')[1])])
    for _, _, step in restarts:
      self.assertTrue(any(f'at step {step}; input position restored.' in line
                          for line in lines), step)
    result = self._Run(whole, '--run_locally=processes',
                       '--model_params_override=' + _COMMON +
                       'task.train.max_steps : 800', env=_DETERMINISTIC)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertSameVariables(*(os.path.join(d, 'train', 'ckpt-800')
                               for d in (broken, whole)))

  def testAThirdLostWorkerEndsTheRunWithOneLine(self):
    logdir = self.create_tempdir().full_path
    code, _, err, specs = self._KillWorkerTimes(logdir, 3, 1000000)
    self.assertEqual(code, 1, err[-3000:])
    self.assertNotIn('Traceback', err)
    self.assertEqual(len(re.findall(r'^Restart \d of 2:', err, re.M)), 2)
    self.assertRegex(
        err.strip().splitlines()[-1],
        rf'^error: Worker task 1 at {specs[2].split(",")[1]} went away '
        r'\(.+\); training stopped and the last checkpoint is \S+/ckpt-\d+\. '
        r'.*\(after 2 restart\(s\), --max_restarts=2\)$')


if __name__ == '__main__':
  absltest.main()
