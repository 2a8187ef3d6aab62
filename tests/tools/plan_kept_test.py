"""Tests of the planner where stages keep their activations (recompute
'never'): the backward measured as it runs from kept residuals, whole and
in ZB-H1's two halves; the step and what each stage holds from the table,
the running sum of the gradients only after a stage's first backward; and
ZB-H1 among the schedules the planner compares.

Hand-computed tables and simulations are the references, as in
plan_test; the halves' carry against the bytes the layers' algebra says.
"""

import dataclasses
import json
import os
import subprocess
import sys

from absl.testing import absltest

from lingvo_pipe.core import devices

devices.SplitCpu(4)

import tensorflow as tf  # noqa: E402

from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core import schedule_file  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import budget_split  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import plan  # noqa: E402
from lingvo_pipe.tools import plan_search  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402

MIB = 2**20
# MeasuredHalvesTest's child: a partition's residual bytes, listed and as
# the allocator holds them.
_HELD_CHILD = """
import json
import tensorflow as tf
from lingvo_pipe.core import layers
from lingvo_pipe.tools import layer_profile
import sys
dims = [256, 512, 512, 256]
ps = [layers.ProjectionLayer.Params().Set(
    name=f'proj{i}', input_dim=a, output_dim=b, activation=sys.argv[1])
      for i, (a, b) in enumerate(zip(dims, dims[1:]))]
whole, = layer_profile.ProfilePartitions(
    ps, [0, 3], tf.TensorShape([1024, 256]), num_runs=1,
    keeps_activations=True)
print(json.dumps([whole.residual_bytes, whole.kept_residual_bytes]))
"""


def _Layer(i, fwd=1.0, b=1.0, w=1.0, carry=2):
  """in = out = 1 MiB, residuals 3 MiB (W reads 1), no parameters; the
  backward's halves b and w seconds, B leaving W `carry` MiB; no peaks
  measured."""
  return layer_profile.LayerProfile(
      name=f'layer_{i}', forward_s=fwd, backward_s=b + w,
      residual_bytes=3 * MIB, input_read_bytes=MIB, input_bytes=MIB,
      output_bytes=MIB, num_params=0, param_bytes=0, slot_bytes=0,
      input_backward_s=b, weight_backward_s=w, carry_bytes=carry * MIB,
      weight_read_bytes=MIB)


class HoldingTest(absltest.TestCase):

  def testMicroBatchesWaitFromTheirBToTheirW(self):
    table = registry.Make('zb_h1', 2, 4)
    # Device 0: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3. Device 1:
    # F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3. A micro-batch is in flight from
    # its F through its B, then waits for its W; an input of stage 1 is
    # held from the action before its F through its W, so three during W0
    # and W1 (the next one arrives while they run). The running sum exists
    # after each stage's first W.
    self.assertEqual(step_model.Holding(table), [
        [{0: c + (int(i > 3),)} for i, c in enumerate([
            (4, 1, 0), (4, 2, 0), (4, 2, 0), (4, 1, 1), (4, 2, 0), (4, 2, 0),
            (4, 1, 1), (4, 2, 0), (4, 2, 0), (4, 1, 1), (4, 1, 0),
            (4, 0, 1)])],
        [{1: c + (int(i > 4),)} for i, c in enumerate([
            (1, 1, 0), (2, 1, 0), (2, 1, 1), (2, 1, 1), (3, 0, 2), (2, 1, 1),
            (2, 1, 1), (3, 0, 2), (2, 1, 1), (2, 1, 1), (2, 0, 2),
            (1, 0, 1)])]])

  def testStageKHoldsWhatTheTableSays(self):
    # K=2 M=4, one layer a stage: in 1, R = 3 kept, working set W = 4
    # (3 on the last: its output gradient is in flight), so W - R = 1 and
    # 0 during B, nothing measured for W; from F through B, H = R = 3, on
    # the last R + out = 4; after B through W, C = carry 2 + the d y it
    # got 1 + the residual W reads 1 = 4.
    #   stage 0 at each B: 4 inputs + 2 x 3 + 1 = 11; at W0: 4 + 3 + 4
    #   stage 1 at W0: 3 inputs + 2 waiting x 4 = 11; at F1: 2 + 4 + 4 = 10
    # 1F1B holds 4 + 2 x 3 + 1 = 11 and 2 + 1 x 4 = 6.
    profiles = [_Layer(0), _Layer(1)]
    zb = step_model.Predict(profiles, [0, 1, 2], 4, 'never', 'zb_h1')
    self.assertEqual([p.kept_bytes for p in zb], [11 * MIB, 11 * MIB])
    self.assertEqual([p.carry_bytes for p in zb], [4 * MIB, 4 * MIB])
    one = step_model.Predict(profiles, [0, 1, 2], 4, 'never', '1f1b')
    self.assertEqual([p.kept_bytes for p in one], [11 * MIB, 6 * MIB])


  def testTheSplitUnderABudgetCountsWhatWaitsForW(self):
    # Four layers, K=2 M=4: the split's peaks under a budget are the
    # prediction's, carries and W's residuals included.
    profiles = [dataclasses.replace(_Layer(i), param_bytes=(i + 1) * MIB)
                for i in range(4)]
    zb = plan_search.Layout('zb_h1')
    least = budget_split.LeastPeak(profiles, 2, 4, 'never', zb)
    bounds = budget_split.Split(profiles, 2, 4, 'never', least, zb)
    peaks = [p.peak_bytes for p in step_model.Predict(
        profiles, bounds, 4, 'never', 'zb_h1')]
    self.assertEqual(max(peaks), least)


class KeptBackwardTest(absltest.TestCase):

  def _Two(self):
    """Two layers, out 1 MiB, parameters 2 and 4 MiB, carries 2 and 3
    MiB; rises measured from kept residuals: whole 10 and 12, B 5 and 6,
    W 3 and 4 MiB."""
    return [dataclasses.replace(
        _Layer(i), param_bytes=p * MIB, carry_bytes=c * MIB,
        kept_backward_peak_bytes=k * MIB, input_backward_peak_bytes=b * MIB,
        weight_backward_peak_bytes=w * MIB)
            for i, (p, c, k, b, w) in enumerate([(2, 2, 10, 5, 3),
                                                 (4, 3, 12, 6, 4)])]

  def testWorkFromTheMeasuredRises(self):
    part = self._Two()
    # Whole: layer 0 while layer 1's gradients (4) are made, + its output
    # gradient 1: 4 + 10 + 1 = 15; layer 1: 12 + 1 (its d y: 0 on the
    # last stage, in H) = 13.
    self.assertEqual(step_model.KeptWorkingBytes(part, False, 'kept'),
                     15 * MIB)
    self.assertEqual(step_model.KeptWorkingBytes(part, True, 'kept'),
                     15 * MIB)
    # B: layer 1's carry 3 + 5 + 1 = 9; layer 1: 6 + 1 = 7.
    self.assertEqual(step_model.KeptWorkingBytes(part, False, 'input'),
                     9 * MIB)
    # W: 4 + 3 = 7 (d y waits in C); layer 1 4.
    self.assertEqual(step_model.KeptWorkingBytes(part, False, 'weight'),
                     7 * MIB)
    unmeasured = [part[0], dataclasses.replace(
        part[1], kept_backward_peak_bytes=None)]
    self.assertIsNone(step_model.KeptWorkingBytes(unmeasured, False, 'kept'))

  def testTheRunningSumExistsAfterTheFirstBackward(self):
    # K=1 GPipe M=2, F0 F1 B1 B0; one layer, the last stage: 2 inputs of
    # 1, H = R 3 + out 1, the whole backward's rise 10 (its new gradients
    # among it). B1 adds to zeros (no sum yet): 2 + 2 x 4 + 10 = 20; B0
    # holds the sum P besides 2 + 4 + 10.
    for p, sums, kept in ((8, 8, 16), (2, 0, 20)):
      layer = dataclasses.replace(_Layer(0), param_bytes=p * MIB,
                                  kept_backward_peak_bytes=10 * MIB,
                                  kept_backward_s=1.5)
      pred, = step_model.Predict([layer], [0, 1], 2, 'never')
      self.assertEqual((pred.gradient_bytes, pred.kept_bytes),
                       (sums * MIB, kept * MIB), p)
      self.assertEqual(pred.backward_s, 1.5)  # the measured kept backward


class StepTest(absltest.TestCase):

  def testTheMeasuredHalvesRunTheTable(self):
    # K=2 M=2, F = B = W = 1 a stage (1F1B: the whole backward, 2):
    #   zb_h1 dev 0: F0 0-1 F1 1-2 B0 3-4 W0 4-5 B1 5-6 W1 6-7
    #         dev 1: F0 1-2 B0 2-3 F1 3-4 B1 4-5 W0 5-6 W1 6-7
    #   1f1b  dev 0: F0 0-1 F1 1-2 B0 4-6 B1 7-9
    #         dev 1: F0 1-2 B0 2-4 F1 4-5 B1 5-7
    profiles = [_Layer(0), _Layer(1)]
    zb = plan_search.Evaluate('toy', profiles, 8, 2, 2, 'never',
                              layout=plan_search.Layout('zb_h1'))
    self.assertEqual(zb.step_s, 7.0)
    self.assertEqual([(p.backward_s, p.weight_s) for p in zb.partitions],
                     [(1.0, 1.0), (1.0, 1.0)])
    # Each device works 2 x (F + B + W) = 6 of the 7.
    self.assertAlmostEqual(zb.idle, 1 / 7, places=12)
    one = plan_search.Evaluate('toy', profiles, 8, 2, 2, 'never',
                               layout=plan_search.Layout('1f1b'))
    self.assertEqual(one.step_s, 9.0)
    self.assertIn('W/micro', str(zb))
    self.assertNotIn('W/micro', str(one))
    # 1f1b, split: each B then its W; B0 reaches device 0 one W sooner.
    #   dev 0: F0 0-1 F1 1-2 B0 3-4 W0 4-5 B1 6-7 W1 7-8
    #   dev 1: F0 1-2 B0 2-3 W0 3-4 F1 4-5 B1 5-6 W1 6-7
    split = plan_search.Evaluate('toy', profiles, 8, 2, 2, 'never',
                                 layout=plan_search.Layout('1f1b', 1, True))
    self.assertEqual(split.step_s, 8.0)
    self.assertIn('W/micro', str(split))
    self.assertIn('schedule 1f1b (backwards split: split_backward)',
                  str(split))

  def testAutoSearchesWithTheMeasuredCosts(self):
    """plan --schedule=auto: the table searched with the partitions' own
    F, B and W costs simulates no longer than any named table on the same
    split, and is written as a file a pipeline takes."""
    profiles = [_Layer(0, 1.0, 1.0, 1.0), _Layer(1, 2.0, 1.5, 0.5)]
    auto = plan_search.Evaluate('toy', profiles, 8, 2, 4, 'never',
                                layout=plan_search.Layout('auto'))
    self.assertEqual(auto.table.name, 'auto')
    self.assertTrue(auto.table.split_backward)
    schedule.Validate(auto.table)
    self.assertEqual(auto.step_s, schedule.Simulate(
        auto.table, [1.0, 2.0], [1.0, 1.5], weight_s=[1.0, 0.5]).step)
    named = [plan_search.InLayout(auto, layout)
             for layout in plan_search.Layouts('', 1, 'never')]
    self.assertLen(named, 7)
    for other in named:
      self.assertLessEqual(auto.step_s, other.step_s, str(other.layout))
    self.assertLess(auto.step_s, min(
        o.step_s for o in named if o.layout.schedule_name == '1f1b'))
    path = os.path.join(self.create_tempdir().full_path, 'auto.csv')
    report = plan.Searched(auto, path)
    self.assertEqual(schedule_file.Load(path).order, auto.table.order)
    self.assertEqual(2, registry.Check(path, 2, 4, 1, 'never'))
    self.assertIn(f'Searched table written to {path} (K=2 M=4)', report)
    for other in named:
      self.assertIn(f'  {other.layout}: step {other.step_s:.3f} s', report)

  def testAutoSearchesEveryPlacementOfItsStages(self):
    """With two stages a device the search tries the looped placement and
    ZB-V's V, and is no slower than any named V=2 table, ZB-V included."""
    self.assertEqual(plan_search.Placements(2, 2), [(0, 1, 0, 1),
                                                    (0, 1, 1, 0)])
    self.assertEqual(plan_search.Placements(2, 1), [(0, 1)])
    profiles = [_Layer(i, 1.0, 1.0 + i / 4, 1.0) for i in range(4)]
    auto = plan_search.Evaluate('toy', profiles, 8, 2, 8, 'never',
                                layout=plan_search.Layout('auto', 2))
    self.assertIn(auto.table.stage_devices, plan_search.Placements(2, 2))
    named = [plan_search.InLayout(auto, layout)
             for layout in plan_search.Layouts('', 2, 'never')]
    self.assertIn('zb_v', [o.layout.schedule_name for o in named])
    for other in named:
      self.assertLessEqual(auto.step_s, other.step_s, str(other.layout))

  def testSuggestedWhenItsStepIsFastest(self):
    by_m = {4: [_Layer(i, 0.25, 0.25, 0.25) for i in range(4)]}
    self.assertEqual(plan_search.Layouts('', 1, 'never'), [
        plan_search.Layout('gpipe'), plan_search.Layout('1f1b'),
        plan_search.Layout('1f1b_ahead'),
        plan_search.Layout('gpipe', 1, True),
        plan_search.Layout('1f1b', 1, True),
        plan_search.Layout('1f1b_ahead', 1, True),
        plan_search.Layout('zb_h1')])
    self.assertEqual(plan_search.Layouts('1f1b', 1, 'never', True),
                     [plan_search.Layout('1f1b', 1, True)])
    # Re-computing stages cannot run it: not compared.
    self.assertEqual(plan_search.Layouts('', 1, 'always'),
                     [plan_search.Layout('gpipe'), plan_search.Layout('1f1b'),
                      plan_search.Layout('1f1b_ahead')])
    chosen = plan_search.Suggest('toy', by_m, 8, [2], 'never',
                                 layouts=plan_search.Layouts('', 1, 'never'))
    self.assertEqual(chosen.layout, plan_search.Layout('zb_h1'))
    self.assertRegex(chosen.why_schedule,
                     r'^zb_h1 at K=2 M=4: [\d.]+% faster than gpipe .*; '
                     r'[\d.]+% faster than 1f1b ')


class ErrorsTest(absltest.TestCase):

  def testOneLineEach(self):
    whole = [dataclasses.replace(_Layer(i), input_backward_s=None,
                                 weight_backward_s=None) for i in range(2)]
    with self.assertRaisesRegex(ValueError, r'^layer_0: a table that splits '
                                r'its backwards needs each backward '
                                r'measured in two halves; [^\n]*$'):
      step_model.Predict(whole, [0, 1, 2], 4, 'never', 'zb_h1')
    with self.assertRaisesRegex(ValueError, r"^Schedule 'zb_h1' splits each "
                                r'backward in B and W, which needs every '
                                r"stage's activations kept: set "
                                r"recompute='never' \(got 'always'\)\.$"):
      step_model.Predict([_Layer(0), _Layer(1)], [0, 1, 2], 4, 'always',
                         'zb_h1')
    model = '--model=image.synthetic.ResNetTinyGPipe'
    with self.assertRaisesRegex(ValueError, r"^Schedule 'zb_h1' splits each "
                                r'backward'):
      plan.Main([model, '--schedule=zb_h1', '--recompute=always'])
    with self.assertRaisesRegex(ValueError, r"^--schedule=zb_h1: Schedule "
                                r"'zb_h1' runs one stage per device, got "
                                r'num_virtual_stages=2; '):
      plan.Main([model, '--schedule=zb_h1', '--num_virtual_stages=2'])
    with self.assertRaisesRegex(ValueError, r"^--split_backward goes with "
                                r"--schedule and recompute 'never' \(got "
                                r"--schedule='1f1b', recompute='always'\)"):
      plan.Main([model, '--schedule=1f1b', '--split_backward',
                 '--recompute=always'])
    with self.assertRaisesRegex(ValueError, r"^Schedule '1f1b' with "
                                r'split_backward splits each backward, '
                                r"which needs every stage's activations "
                                r"kept: set recompute='never' \(got "
                                r"'always'\)\.$"):
      step_model.MakeTable('1f1b', 2, 4, 1, 'always', split_backward=True)


class MeasuredHalvesTest(absltest.TestCase):

  def testHalvesAsTheTableRunsThem(self):
    # Three ReLU projections 64 -> 128 -> 96 -> 32 on 16 examples: W reads
    # the gradient before each activation, which B makes on the way to d x:
    # 16 x (128 + 96 + 32) floats in one partition of all three.
    dims = [64, 128, 96, 32]
    ps = [layers.ProjectionLayer.Params().Set(
        name=f'proj{i}', input_dim=a, output_dim=b, activation='RELU')
          for i, (a, b) in enumerate(zip(dims, dims[1:]))]
    shape = tf.TensorShape([16, 64])
    whole, = layer_profile.ProfilePartitions(ps, [0, 3], shape, num_runs=1,
                                             keeps_activations=True)
    self.assertEqual(whole.carry_bytes, 16 * (128 + 96 + 32) * 4)
    # W reads each layer's input: the two inner ones are residuals.
    self.assertEqual(whole.weight_read_bytes, 16 * (128 + 96) * 4)
    self.assertGreater(whole.input_backward_s, 0.0)
    self.assertGreater(whole.weight_backward_s, 0.0)
    each = layer_profile.ProfileLayers(ps, shape, num_runs=1,
                                       keeps_activations=True)
    self.assertEqual([p.carry_bytes for p in each],
                     [16 * d * 4 for d in dims[1:]])
    plain, = layer_profile.ProfilePartitions(ps, [0, 3], shape, num_runs=1)
    self.assertEqual((plain.input_backward_s, plain.weight_backward_s,
                      plain.carry_bytes), (None, None, 0))

  def testResidualsAsTheAllocatorHoldsThem(self):
    # 1024 rows through ReLU projections 256 -> 512 -> 512 -> 256: the
    # forward keeps both inner activations and its output (the ReLUs'
    # gradients read them), 2 + 2 + 1 MiB, no buffer shared; without the
    # ReLUs no gradient reads the output, which leaves the stage (the next
    # stage's input): 2 + 2. TF's BFC allocator holds them in blocks
    # rounded up by at most a few KiB. Each in a fresh process: with a
    # history, a block can land in a larger free chunk, which the
    # allocator counts whole (0.86 and 1 MiB more, seen).
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    for activation, mib in (('RELU', 5), ('NONE', 4)):
      child = subprocess.run(
          [sys.executable, '-c', _HELD_CHILD, activation],
          capture_output=True, text=True, timeout=300, cwd=root,
          env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL='2',
                   TF_CPU_ALLOCATOR_USE_BFC='true'))
      self.assertEqual(child.returncode, 0, child.stderr[-3000:])
      residual, held = json.loads(child.stdout.strip().splitlines()[-1])
      self.assertEqual(residual, mib * MIB, activation)
      self.assertBetween(held, mib * MIB, mib * MIB + 64 * 1024, activation)

  def testTheCommandComparesItAtRecomputeNever(self):
    report = plan.Main(['--model=image.synthetic.ResNetTinyGPipe',
                        '--num_partitions=2', '--num_micro_batches=4',
                        '--recompute=never', '--num_timing_runs=1'])
    line, = [x for x in report.splitlines() if x.startswith('Schedule: ')]
    for name in ('gpipe', '1f1b', 'zb_h1'):
      self.assertIn(name, line)
    given = plan.Main(['--model=image.synthetic.ResNetTinyGPipe',
                       '--num_partitions=2', '--num_micro_batches=4',
                       '--recompute=never', '--schedule=zb_h1',
                       '--num_timing_runs=1'])
    self.assertIn('the zb_h1 table run with these costs', given)
    self.assertIn('W/micro', given)


if __name__ == '__main__':
  absltest.main()
