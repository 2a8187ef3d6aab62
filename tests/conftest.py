"""pytest set-up shared by every test: four logical CPUs, quiet logs.

Test files also work alone (python tests/core/x_test.py, or Bazel): those
that need several devices call devices.SplitCpu themselves, and absltest's
main parses flags there (here we mark them parsed, for create_tempdir).
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # noqa: E402

from lingvo_pipe.core import devices  # noqa: E402

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

devices.SplitCpu(4)
