"""A stack of convolutions' backward on a CPU, against TensorFlow's
allocator: what it holds beyond the activations (docs/DESIGN.md
section 27).

TF's CPU Conv2DBackpropInput and Conv2DBackpropFilter each hold a 32 MiB
scratch buffer even for these small images, and im2col's patches, if built
as soon as the input exists, would all be held until their layer's
backward. kernels.Conv2D avoids both: the step below peaks at its kept
activations plus about one layer's patches. A child process (this file
with --child; the allocator keeps statistics only if told before
TensorFlow starts) measures it.
"""

import json
import os
import subprocess
import sys

if __name__ == '__main__' and sys.argv[1:2] == ['--child']:
  from lingvo_pipe.tools import plan
  plan.SetUpProcess()  # the allocator's statistics; two inter-op threads

from absl.testing import absltest  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.core import kernels  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402

LAYERS, BATCH, SIDE, CHANNELS = 8, 8, 16, 16
ACTIVATION = BATCH * SIDE * SIDE * CHANNELS * 4  # bytes, float32
PATCHES = 9 * ACTIVATION  # 3x3, stride 1


def _Child() -> None:
  """The child: the step's peak above what was held before, as JSON."""
  filters = [tf.Variable(tf.random.stateless_normal(
      [3, 3, CHANNELS, CHANNELS], [i, 0]) * 0.1) for i in range(LAYERS)]

  def Step(x):
    with tf.GradientTape() as tape:
      h = x
      for w in filters:
        h = tf.nn.relu(kernels.Conv2D(h, w, (1, 1), 'SAME'))
      loss = tf.reduce_sum(tf.square(h))
    return tape.gradient(loss, filters)

  step = tf.function(Step, autograph=False)
  x = tf.random.stateless_normal([BATCH, SIDE, SIDE, CHANNELS], [9, 9])
  step(x)
  print(json.dumps(layer_profile.PeakBytes(step, (x,), 'CPU:0',
                                           num_runs=5)), flush=True)


class ConvMemoryTest(absltest.TestCase):

  def testBackwardHoldsNoScratchAndOnePatchesBuffer(self):
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), '--child'],
        capture_output=True, text=True, timeout=600, cwd=root,
        env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='2'))
    self.assertEqual(0, child.returncode, child.stderr[-3000:])
    peak = json.loads(child.stdout.strip().splitlines()[-1])
    # Kept for the backward: each layer's conv output and ReLU output
    # (2 MiB in all); in flight: the patches of at most two layers (two
    # inter-op threads). One kernel scratch (32 MiB), or the patches of
    # all eight layers (9 MiB), would break the bound.
    bound = 2 * LAYERS * ACTIVATION + 2 * PATCHES
    self.assertLess(peak, bound, f'peak {peak / 2**20:.2f} MiB, bound '
                    f'{bound / 2**20:.2f} MiB')
    # And no less than what the backward cannot do without: every layer's
    # ReLU output (its own gradient and the next filter's read it) beside
    # the patches of the filter gradient it computes first. A measurement
    # that missed the backward, or read nothing, is below it.
    least = LAYERS * ACTIVATION + PATCHES
    self.assertGreater(peak, least, f'peak {peak / 2**20:.2f} MiB, least '
                       f'{least / 2**20:.2f} MiB')


if __name__ == '__main__':
  if sys.argv[1:2] == ['--child']:
    _Child()
  else:
    absltest.main()
