"""pytest set-up shared by every test: four logical CPUs, quiet logs.

Test files also work alone (python tests/core/x_test.py, or Bazel): those
that need several devices call devices.SplitCpu themselves.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import devices  # noqa: E402

devices.SplitCpu(4)
