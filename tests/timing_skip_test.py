"""A timing test that skips under load is counted in the run's summary.

Runs pytest with the suite's conftest on two tests written here: one that
skips as a timing test on a loaded machine does (the reason starts with
conftest.TIMING_SKIP), one that skips for another reason; and with
LINGVO_PIPE_STRICT_TIMING=1 (tools/test.sh --strict-timing) the timing
skip fails.
"""

import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

_STRICT = 'LINGVO_PIPE_STRICT_TIMING'  # _STRICT

_TESTS = '''
import unittest

class Timed(unittest.TestCase):

  def testSpeedUp(self):
    self.skipTest('timing skipped under load: the control ran only 1.10x')

  def testNeedsTaskset(self):
    self.skipTest('needs taskset')
'''


class TimingSkipTest(absltest.TestCase):

  def _Run(self, **env):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = self.create_tempdir().full_path
    with open(os.path.join(folder, 'timed_test.py'), 'w') as f:
      f.write(textwrap.dedent(_TESTS))
    base = {k: v for k, v in os.environ.items()
            if k != _STRICT}
    return subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'tests.conftest',
         '-p', 'no:cacheprovider', folder], cwd=root, capture_output=True,
        text=True, timeout=120,
        env=dict(base, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='3', **env))

  def testTheSummaryCountsAndNamesTimingSkips(self):
    result = self._Run()
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    self.assertIn('2 skipped', result.stdout)
    self.assertIn('timing tests skipped under load: 1\n', result.stdout)
    self.assertRegex(
        result.stdout, r'SKIPPED \(not measured\) \S*timed_test\.py::Timed::'
        r'testSpeedUp: the control ran only 1\.10x')
    self.assertNotIn('needs taskset', result.stdout)

  def testStrictTimingTurnsATimingSkipIntoAFailure(self):
    """tools/test.sh --strict-timing sets LINGVO_PIPE_STRICT_TIMING=1:
    the timing skip fails, the other skip stays a skip."""
    result = self._Run(**{_STRICT: '1'})
    self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
    self.assertIn('1 failed, 1 skipped', result.stdout)
    self.assertIn('a timing test may not skip: the control ran only 1.10x',
                  result.stdout)


if __name__ == '__main__':
  absltest.main()
