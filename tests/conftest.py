"""pytest set-up shared by every test: four logical CPUs, quiet logs.

Test files also work alone (python tests/core/x_test.py, or Bazel): those
that need several devices call devices.SplitCpu themselves, and absltest's
main parses flags there (here we mark them parsed, for create_tempdir).
"""

import os
import signal

import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# Tests send SIGINT to the processes they start, as a terminal's Ctrl-C
# would. A shell without job control (`(cmd &)`, a script's `cmd &`) starts
# background commands with SIGINT ignored, and an ignored signal stays
# ignored in every child, so those children would never see it: restore
# Python's default here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

from absl import flags  # noqa: E402

from lingvo_pipe.core import quiet  # noqa: E402

# TensorFlow's start-up lines: pytest-xdist's workers import this before
# pytest captures their output.
quiet.ImportTensorFlow()

from lingvo_pipe.core import devices  # noqa: E402

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

devices.SplitCpu(4)


# Files whose tests start worker servers for a training step (several
# processes pinned to the cores, with timeouts of seconds) or time how
# partitions overlap: tools/test.sh runs them alone, after the rest has
# run two files at a time (pytest-xdist), so that another test's load does
# not read as a slow or frozen worker. local_workers_test's servers start
# and stop without work and its waits are of a minute: it runs with the
# rest.
SERIAL_FILES = frozenset({
    'cluster_test.py', 'replicas_cluster_test.py', 'trainer_cluster_test.py'})


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'serial: run alone, not beside other tests (conftest.py)')


def pytest_collection_modifyitems(config, items):
  del config  # unused
  for item in items:
    if item.path.name in SERIAL_FILES:
      item.add_marker('serial')


# A timing test that cannot measure on a loaded machine skips with a reason
# starting with this (written out in the test, which also runs under Bazel
# without this file); every run's summary counts and lists such skips, so
# a speed-up that was not measured does not pass unnoticed.
TIMING_SKIP = 'timing skipped under load: '


# Set (tools/test.sh --strict-timing), such a skip fails instead: for a
# release check, on a machine known to be quiet (CONTRIBUTING.md).
STRICT_TIMING = 'LINGVO_PIPE_STRICT_TIMING'


def _TimingSkipReason(report):
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ''
  return reason.split(TIMING_SKIP, 1)[1] if TIMING_SKIP in reason else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  del item, call  # unused
  outcome = yield
  report = outcome.get_result()
  if not (report.skipped and os.environ.get(STRICT_TIMING) == '1'):
    return
  reason = _TimingSkipReason(report)
  if reason is not None:
    report.outcome = 'failed'
    report.longrepr = (f'{STRICT_TIMING}=1: a timing test may not skip: '
                       f'{reason}')


def pytest_terminal_summary(terminalreporter):
  skipped = []
  for report in terminalreporter.stats.get('skipped', []):
    reason = _TimingSkipReason(report)
    if reason is not None:
      skipped.append(f'{report.nodeid}: {reason}')
  terminalreporter.write_line(
      f'timing tests skipped under load: {len(skipped)}',
      yellow=bool(skipped))
  for line in skipped:
    terminalreporter.write_line(f'  SKIPPED (not measured) {line}',
                                yellow=True)
