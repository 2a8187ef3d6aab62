"""A timing test that skips under load is counted in the run's summary.

Runs pytest with the suite's conftest on two tests written here: one that
skips as a timing test on a loaded machine does (the reason starts with
conftest.TIMING_SKIP), one that skips for another reason.
"""

import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

_TESTS = '''
import unittest

class Timed(unittest.TestCase):

  def testSpeedUp(self):
    self.skipTest('timing skipped under load: the control ran only 1.10x')

  def testNeedsTaskset(self):
    self.skipTest('needs taskset')
'''


class TimingSkipTest(absltest.TestCase):

  def testTheSummaryCountsAndNamesTimingSkips(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = self.create_tempdir().full_path
    with open(os.path.join(folder, 'timed_test.py'), 'w') as f:
      f.write(textwrap.dedent(_TESTS))
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'tests.conftest',
         '-p', 'no:cacheprovider', folder], cwd=root, capture_output=True,
        text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='3'))
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    self.assertIn('2 skipped', result.stdout)
    self.assertIn('timing tests skipped under load: 1\n', result.stdout)
    self.assertRegex(
        result.stdout, r'SKIPPED \(not measured\) \S*timed_test\.py::Timed::'
        r'testSpeedUp: the control ran only 1\.10x')
    self.assertNotIn('needs taskset', result.stdout)


if __name__ == '__main__':
  absltest.main()
