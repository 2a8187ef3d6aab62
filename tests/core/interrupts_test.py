"""Ctrl-C and SIGTERM (lingvo_pipe.core.interrupts), in child processes.

A signal that comes while TensorFlow or a finalizer runs our code is
raised at the next check, never inside; inside Deferred() the first one
waits for the check whatever runs, and leaves the state resumable; a
second one raises at once; the exit status is 128 + the first signal.
"""

import os
import subprocess
import sys

from absl.testing import absltest

# Ctrl-C arrives while a finalizer runs: raised there, Python would print
# "Exception ignored" and a traceback and go on.
_IN_A_FINALIZER = """
import os, signal, time
from lingvo_pipe.core import interrupts
interrupts.Install()
class Finalized:
  def __del__(self):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # the handler runs here, inside __del__
    print('finalizer finished', flush=True)
Finalized()
print('after the finalizer', flush=True)
try:
  interrupts.RaiseIfRequested()
except KeyboardInterrupt:
  print('raised again', flush=True)
"""

# Ctrl-C while TensorFlow runs our code (a callback from nest): noted,
# raised at the check; a second one there raises at once; a wait in our
# own code (the followers' wait for a checkpoint) stops at once.
_INSIDE_TENSORFLOW = """
import os, signal, tempfile, threading, time
import tensorflow as tf
from lingvo_pipe import runner
from lingvo_pipe.core import interrupts
interrupts.Install()
def Once(x):
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(0.5)
  print('callback finished', flush=True)
  return x
tf.nest.map_structure(Once, [1])
try:
  interrupts.RaiseIfRequested()
except KeyboardInterrupt:
  print('raised at the check', flush=True)
def Twice(x):
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(0.5)
  print('callback finished again', flush=True)
  return x
try:
  tf.nest.map_structure(Twice, [1])
except KeyboardInterrupt:
  print('raised inside', flush=True)
interrupts.Reset()
threading.Timer(1, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
  list(runner.NewCheckpoints(tf, tempfile.mkdtemp(), 600))
except KeyboardInterrupt:
  print(f'wait stopped after {time.monotonic() - start:.0f} s', flush=True)
"""

# Inside Deferred(), plain Python code (where an undeferred signal would
# raise at once) runs on after SIGTERM; the check raises; the state is
# resumable and the status 143. A second signal raises where it lands.
_DEFERRED = """
import os, signal, sys, time
from lingvo_pipe.core import interrupts
interrupts.Install()
with interrupts.Deferred():
  try:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(50):
      time.sleep(0.01)
    print('step finished', flush=True)
    interrupts.RaiseIfRequested()
  except KeyboardInterrupt:
    print('raised at the check; resumable', interrupts.Resumable(),
          'status', interrupts.ExitStatus(), flush=True)
  interrupts.Reset()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print('not raised', flush=True)
  except KeyboardInterrupt:
    print('second raised; resumable', interrupts.Resumable(),
          'status', interrupts.ExitStatus(), flush=True)
"""


def _RunScript(script):
  return subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, timeout=120,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))


class InterruptsTest(absltest.TestCase):

  def testACtrlCDuringAFinalizerIsRaisedAtTheNextCheck(self):
    out = _RunScript(_IN_A_FINALIZER)
    self.assertNotIn('Traceback', out.stderr)
    self.assertNotIn('Exception ignored', out.stderr)
    self.assertEqual(out.stdout.split('\n')[:3], [
        'finalizer finished', 'after the finalizer', 'raised again'])

  def testACtrlCInsideTensorFlowIsRaisedAtTheNextCheck(self):
    out = _RunScript(_INSIDE_TENSORFLOW)
    self.assertNotIn('Traceback', out.stderr)
    self.assertEqual(out.stderr.count('Ctrl-C again stops at once'), 1,
                     out.stderr)
    lines = out.stdout.split('\n')
    self.assertEqual(lines[:3], ['callback finished', 'raised at the check',
                                 'raised inside'])
    self.assertRegex(lines[3], r'^wait stopped after [12] s$')

  def testDeferredWaitsForTheCheckAndASecondSignalDoesNot(self):
    out = _RunScript(_DEFERRED)
    self.assertNotIn('Traceback', out.stderr)
    self.assertEqual(out.stdout.split('\n')[:3], [
        'step finished', 'raised at the check; resumable True status 143',
        'second raised; resumable False status 130'])
    self.assertEqual([x for x in out.stderr.splitlines() if x], [
        'SIGTERM: stopping after the step in flight to write its '
        'checkpoint; Ctrl-C again stops at once.',
        'Ctrl-C: stopping after the step in flight to write its '
        'checkpoint; Ctrl-C again stops at once.'])


if __name__ == '__main__':
  absltest.main()
