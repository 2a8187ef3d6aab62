"""Tests of quiet: TensorFlow's start-up lines go, everything else stays."""

import os
import subprocess
import sys

from absl.testing import absltest

from lingvo_pipe.core import quiet

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(quiet.__file__))))

# Writes noise and real lines to fd 2 inside the filter, as C++ code would
# (os.write, below Python's sys.stderr), then one line after it.
_WRITER = r'''
import os, sys
from lingvo_pipe.core import quiet
lines = [
    'WARNING: All log messages before absl::InitializeLog() is called are '
    'written to STDERR\n',
    'I0000 00:00:1795453114.774530    6214 cudart_stub.cc:31] Could not find '
    'cuda drivers on your machine, GPU will not be used.\n',
    'real line 1\n',
    'I0000 00:00:1795731735.031024    1940 port.cc:153] oneDNN custom '
    'operations are on. You may see slightly different numerical results '
    'due to floating-point round-off errors from different computation '
    'orders. To turn them off, set the environment variable '
    '`TF_ENABLE_ONEDNN_OPTS=0`.\n',
    'I0000 00:00:1795731735.031024    1940 port.cc:153] another port line\n',
    'I0000 00:00:1795453114.886240    6214 cpu_feature_guard.cc:227] This '
    'TensorFlow binary is optimized\n',
    'To enable the following instructions: AVX2 FMA, in other operations, '
    'rebuild TensorFlow with the appropriate compiler flags.\n',
    'E0000 00:00:1795453119.040879    6214 cuda_platform.cc:52] failed call '
    'to cuInit: INTERNAL: CUDA error\n',
    'W0000 00:00:1795453119.040879    6214 other.cc:1] a real warning\n',
    'E0000 00:00:1795453119.040879    6214 cuda_platform.cc:60] another '
    'cuda_platform error\n',
]
with quiet.FilteredStderr():
  for line in lines:
    os.write(2, line.encode())
  print('real line 2', file=sys.stderr)
print('after', file=sys.stderr)
'''


_WARNING = 'W0000 00:00:1.0  1 other.cc:1] a real warning'


class QuietTest(absltest.TestCase):

  def _Run(self, code):
    env = dict(os.environ, PYTHONPATH=_REPO)
    env.pop('TF_CPP_MIN_LOG_LEVEL', None)
    return subprocess.run([sys.executable, '-c', code], env=env, cwd=_REPO,
                          capture_output=True, text=True, timeout=120)

  def testOnlyTheKnownLinesGoInOrder(self):
    result = self._Run(_WRITER)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stderr.splitlines(), [
        'real line 1',
        'I0000 00:00:1795731735.031024    1940 port.cc:153] another port '
        'line',
        'W0000 00:00:1795453119.040879    6214 other.cc:1] a real warning',
        'E0000 00:00:1795453119.040879    6214 cuda_platform.cc:60] another '
        'cuda_platform error',
        'real line 2',
        'after'])

  def testAnErrorInsideStillShowsItsLines(self):
    result = self._Run(
        'import os\nfrom lingvo_pipe.core import quiet\n'
        'with quiet.FilteredStderr():\n'
        '  os.write(2, b"kept\\n")\n'
        '  raise SystemExit("stopped")\n')
    self.assertEqual(result.returncode, 1)
    self.assertEqual(result.stderr.splitlines(), ['kept', 'stopped'])

  def testImportTensorFlowPrintsNothing(self):
    result = self._Run(
        'from lingvo_pipe.core import quiet\n'
        'tf = quiet.ImportTensorFlow()\n'
        'print(tf.reduce_sum(tf.ones([3])).numpy())\n')
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout, '3.0\n')
    self.assertEqual(result.stderr, '')

  def testACancelledStepsLinesGoToTheLog(self):
    log = os.path.join(self.create_tempdir().full_path, 'cancelled.txt')
    # What a client logged when a worker was killed mid-step (TF 2.21).
    cancelled = [
        'W0000 00:00:1795769039.799894   15664 grpc_worker_service.cc:536] '
        'RecvTensor cancelled for -5948435186611152707',
        'W0000 00:00:1795769039.800973   15577 local_rendezvous.cc:412] '
        'Local rendezvous is aborting with status: UNAVAILABLE: Socket '
        'closed',
        'Additional GRPC error information from remote target '
        '/job:worker/replica:0/task:1 while calling '
        '/tensorflow.WorkerService/RecvTensor:',
        ':UNKNOWN:Error received from peer  {grpc_status:14}',
        '\t [[{{node cond/then/_10/cond/Read_83/ReadVariableOp/_150}}]]']
    code = ('import os, sys\nfrom lingvo_pipe.core import quiet\n'
            f'lines = {cancelled!r}\n'
            f'with quiet.CancelledStepLinesTo({log!r}):\n'
            '  os.write(2, b"real line 1\\n")\n'
            '  for line in lines:\n'
            '    os.write(2, (line + "\\n").encode())\n'
            '  print("real line 2", file=sys.stderr)\n'
            '  os.write(2, (lines[0] + "\\n").encode())\n'
            f'  os.write(2, b"{_WARNING}\\n")\n'
            '  quiet.WriteToConsole("straight\\n")\n'
            'print("after", file=sys.stderr)\n')
    result = self._Run(code)
    self.assertEqual(result.returncode, 0, result.stderr)
    # WriteToConsole's line does not wait for the copier: it may come
    # anywhere before 'after'; the others keep their order.
    lines = result.stderr.splitlines()
    self.assertLess(lines.index('straight'), lines.index('after'))
    lines.remove('straight')
    self.assertEqual(lines, ['real line 1', 'real line 2', _WARNING,
                             'after'])
    with open(log) as f:
      self.assertEqual(f.read().splitlines(), cancelled + cancelled[:1])


if __name__ == '__main__':
  absltest.main()
