"""The planner's step memory against TensorFlow's allocator, end to end.

Two 1024 x 1024 projections (8 MiB of parameters) on 32 rows, K=1: the
parameters outweigh the activations, so the step's peak is the gradients:
one copy of the parameters with M=1, two with M > 1, the running sum and
the new one made in the gradient's buffer (step_model.py). The step is
the trainer's: one pass (PipeliningLayer.FPropWithLoss, each
micro-batch's loss as its forward ends) in the schedule's order, GPipe
and 1F1B re-computing, and GPipe, 1F1B and ZB-H1 keeping activations
(the backward then measured as it runs from kept residuals; 1F1B also
with its backwards split into B and W, split_backward). A child
process (this file with --child; the allocator keeps
statistics only if told before TensorFlow starts) profiles the layers
(one by one, and as the one partition the planner's refinement
measures), predicts and measures.
"""
import json
import os
import subprocess
import sys

if __name__ == '__main__' and sys.argv[1:2] == ['--child']:
  from lingvo_pipe.tools import plan
  plan.SetUpProcess()  # the allocator's statistics, as the planner runs

from absl.testing import absltest  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.core import devices  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402

MIB = 2**20
DIM, BATCH = 1024, 32
PARAMS = 2 * (DIM * DIM + DIM) * 4


def _Layers():
  return [layers.ProjectionLayer.Params().Set(
      name=f'proj{i}', input_dim=DIM, output_dim=DIM) for i in range(2)]


def _Head(head_theta, out, batch):
  """One micro-batch's loss: mean(out ** 2), weighed by its rows."""
  del head_theta, batch
  return {'loss': (tf.reduce_mean(tf.square(out)),
                   tf.constant(out.shape[0], out.dtype))}


def _Params(m: int, schedule_name: str, recompute: str, how: str):
  """The pipeline of a case; `how` 'split' splits its backwards."""
  cell = layers.SequentialLayer.Params().Set(name='cell_0', sub=_Layers())
  return gpipe.PipeliningLayer.Params().Set(
      name=f'pipe{m}_{schedule_name}_{recompute}{how}', cell_tpl=[cell],
      num_micro_batches=m, recompute=recompute, devices=['/device:CPU:0'],
      schedule=schedule_name, split_backward=how == 'split')


def _Measured(p) -> int:
  """The allocator's peak above what it held before, the most of 3 steps."""
  layer = p.Instantiate()
  layer.SetTraining(True)
  variables = layer.vars.Flatten()

  def Step(x):
    with tf.GradientTape() as tape:
      loss = layer.FPropWithLoss(layer.theta, x, _Head, NestedMap(),
                                 NestedMap(), float(BATCH)).loss[0]
    return loss, tape.gradient(loss, variables)

  step = tf.function(Step, autograph=False)
  x = tf.random.stateless_normal([BATCH, DIM], [1, 2])
  step(x)[0].numpy()
  return layer_profile.PeakBytes(step, (x,), 'CPU:0', num_runs=3)


def _Child(cases: str) -> None:
  """The child: predicted and measured step bytes per
  'M:schedule:recompute[:split]', as JSON."""
  devices.SplitCpu(1)
  out = {}
  for case in cases.split(','):
    m, name, recompute, how = (case + ':').split(':')[:4]
    m, never = int(m), recompute == 'never'
    p = _Params(m, name, recompute, how)
    split = p.split_backward
    shape = tf.TensorShape([BATCH // m, DIM])
    profiles = layer_profile.ProfileLayers(_Layers(), shape, num_runs=3,
                                           keeps_activations=never)
    predicted = step_model.Predict(profiles, [0, 2], m, recompute, name,
                                   split_backward=split)[0].step_bytes
    # The planner's refinement: the partition measured as one layer.
    whole = layer_profile.ProfilePartitions(_Layers(), [0, 2], shape,
                                            num_runs=3,
                                            keeps_activations=never)
    refined = step_model.Predict(whole, [0, 1], m, recompute, name,
                                 split_backward=split)[0].step_bytes
    out[case] = [predicted, refined, _Measured(p)]
  print(json.dumps(out), flush=True)


class StepMemoryTest(absltest.TestCase):

  def testPredictionMatchesTheAllocator(self):
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), '--child',
         '1:gpipe:always,4:gpipe:always,4:1f1b:always,4:gpipe:never,'
         '4:1f1b:never,4:1f1b:never:split,4:zb_h1:never'],
        capture_output=True, text=True, timeout=600, cwd=root,
        env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='2'))
    self.assertEqual(0, child.returncode, child.stderr[-3000:])
    out = json.loads(child.stdout.strip().splitlines()[-1])
    for case, copies in (('1:gpipe:always', 1), ('4:gpipe:always', 2),
                         ('4:1f1b:always', 2), ('4:gpipe:never', 2),
                         ('4:1f1b:never', 2), ('4:1f1b:never:split', 2),
                         ('4:zb_h1:never', 2)):
      predicted, refined, measured = out[case]
      msg = (f'M:schedule={case}: predicted {predicted / MIB:.2f} MiB (refined '
             f'{refined / MIB:.2f}), measured {measured / MIB:.2f} MiB, '
             f'parameters {PARAMS / MIB:.2f} MiB')
      # The gradients' copies of the parameters, plus the activations
      # (under 1 MiB here).
      self.assertBetween(measured, copies * PARAMS, copies * PARAMS + MIB,
                         msg)
      self.assertBetween(predicted / measured, 0.95, 1.05, msg)
      self.assertBetween(refined / measured, 0.95, 1.05, msg)


if __name__ == '__main__':
  if sys.argv[1:2] == ['--child']:
    _Child(sys.argv[2])
  else:
    absltest.main()
