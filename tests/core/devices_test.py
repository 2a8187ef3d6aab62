"""Tests of devices: splitting the CPU into logical devices."""

import os
import subprocess
import sys
import textwrap

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.core import devices  # noqa: E402

devices.SplitCpu(4)  # before any TensorFlow op

_CPU = '/device:CPU:'


class DevicesTest(tf.test.TestCase, parameterized.TestCase):

  def testSplitCpuReturnsTheFirstNames(self):
    self.assertEqual(devices.SplitCpu(4), [_CPU + str(i) for i in range(4)])
    # Asking again for fewer is harmless and returns a prefix.
    self.assertEqual(devices.SplitCpu(2), [_CPU + '0', _CPU + '1'])
    self.assertEqual(devices.SplitCpu(1), [_CPU + '0'])
    self.assertEqual(devices.LogicalDevices('CPU')[:4],
                     [_CPU + str(i) for i in range(4)])

  def testLogicalDevicesAreUsable(self):
    names = devices.LogicalDevices('CPU')
    self.assertGreaterEqual(len(names), 4)
    for name in names:
      with tf.device(name):
        x = tf.constant(1.0) + 1.0
      self.assertTrue(x.device.endswith(name), (x.device, name))
    self.assertEqual(devices.LogicalDevices('NO_SUCH_TYPE'), [])

  def testDefaultDevicesAreTheCpusWithoutAccelerators(self):
    if tf.config.list_logical_devices('GPU') or (
        tf.config.list_logical_devices('TPU')):
      self.skipTest('This machine has accelerators.')
    self.assertEqual(devices.DefaultDevices(), devices.LogicalDevices('CPU'))
    self.assertGreaterEqual(len(devices.DefaultDevices()), 4)

  @parameterized.parameters(0, -1)
  def testSplitCpuRejectsNonPositive(self, n):
    with self.assertRaisesRegex(ValueError, f'num_devices >= 1, got {n}'):
      devices.SplitCpu(n)

  def testSplitCpuForMoreAfterTheRuntimeStartedFails(self):
    _ = tf.constant(1.0) + 1.0  # make sure the runtime is up
    have = len(devices.LogicalDevices('CPU'))  # 4 unless a test asked more
    more = have + 4
    with self.assertRaisesRegex(
        RuntimeError,
        rf'started with {have} logical CPU.*SplitCpu\({more}\) before'):
      devices.SplitCpu(more)
    # The failed call changed nothing.
    self.assertLen(devices.LogicalDevices('CPU'), have)
    self.assertLen(devices.SplitCpu(have), have)

  def testSplitCpuSharesTheCoresAmongTheDevices(self):
    # This process split into 4 at import.
    self.assertEqual(tf.config.threading.get_intra_op_parallelism_threads(),
                     max(1, devices.NumCores() // 4))

  def testIntraOpThreadsInFreshProcesses(self):
    cores = devices.NumCores()
    cases = [
        # (statements before any op, intra-op threads expected)
        ('devices.SplitCpu(1)', 0),
        ('devices.SplitCpu(2)', max(1, cores // 2)),
        ('devices.SplitCpu(4)', max(1, cores // 4)),
        ('devices.SplitCpu(2, share_cores=False)', 0),
        # A count the user set is kept.
        ('tf.config.threading.set_intra_op_parallelism_threads(3); '
         'devices.SplitCpu(2)', 3),
    ]
    for statements, want in cases:
      with self.subTest(statements):
        out = _RunFresh(
            f'{statements}; _ = tf.constant(1.0) + 1.0; '
            'print(tf.config.threading.get_intra_op_parallelism_threads())')
        self.assertEqual(out.strip().split('\n')[-1], str(want))

  def testSplitCpuAfterAnOpInAFreshProcess(self):
    # A fresh process: an op starts the runtime with one CPU, so splitting
    # is no longer possible and the error says what to do.
    script = textwrap.dedent("""
        _ = tf.constant(1.0) + 1.0
        print('ONE', devices.SplitCpu(1))
        try:
          devices.SplitCpu(8)
        except RuntimeError as e:
          print('ERROR', e)
        else:
          print('NO ERROR')
        """)
    lines = _RunFresh(script).strip().split('\n')
    self.assertEqual(lines[0], f"ONE ['{_CPU}0']")
    self.assertRegex(
        lines[-1],
        r'^ERROR .*already started with 1 logical CPU.*'
        r'call devices\.SplitCpu\(8\) before running any TensorFlow op')


def _RunFresh(script: str) -> str:
  """stdout of `script` (with tf and devices imported) in a new Python."""
  env = dict(os.environ)
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env['PYTHONPATH'] = os.pathsep.join(p for p in sys.path if p)
  script = ('import tensorflow as tf\n'
            'from lingvo_pipe.core import devices\n' + script)
  proc = subprocess.run([sys.executable, '-c', script], env=env,
                        capture_output=True, text=True, timeout=120,
                        check=False)
  if proc.returncode:
    raise AssertionError(f'{script!r} failed:\n{proc.stderr[-2000:]}')
  return proc.stdout


if __name__ == '__main__':
  absltest.main()
