"""Tests of step_trace: the measured timeline of one step.

On 4 logical CPUs: the trace holds exactly the table's actions, each
starting after the actions it reads end, each device running its actions
in the table's order; the table read back from the trace is the one that
ran, and its ideal bubble is its simulation. Measured from the stamps of
one-pass training steps: 1F1B's stage k holds at most K-k micro-batches
(GPipe's holds all M). Recording changes no gradient; the Chrome trace
and the SVG hold every task.
"""

import dataclasses
import json
import os
from xml.etree import ElementTree

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import devices  # noqa: E402

devices.SplitCpu(4)

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import config as tf_config  # noqa: E402

from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.core import stamps  # noqa: E402
from lingvo_pipe.core import step_trace  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import replica_task  # noqa: E402

_K, _M = 2, 4
_BATCH = 32
F, B = 'F', 'B'


def _Layer(recompute, schedule_name='gpipe', k=_K, m=_M, v=1,
           split_backward=False):
  """k x v stages 32 -> 128 -> 32 -> ..., stage s on device s mod k."""
  proj = layers.ProjectionLayer.Params
  cells = [proj().Set(input_dim=32, output_dim=128, activation='RELU'),
           proj().Set(input_dim=128, output_dim=32)] * (k * v // 2)
  p = gpipe.PipeliningLayer.Params().Set(
      name='pipe', num_micro_batches=m, recompute=recompute,
      schedule=schedule_name, num_virtual_stages=v,
      split_backward=split_backward,
      devices=devices.LogicalDevices('CPU')[:k], cell_tpl=cells)
  layer = p.Instantiate()
  layer.SetTraining(True)
  return layer


def _Step(layer):
  def Step(x):
    with tf.GradientTape() as tape:
      y = layer.FProp(layer.theta, x)
      loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, layer.vars.Flatten())
  return Step


def _Head(head_theta, out, batch):
  """Mean over examples of |out - target|^2."""
  del head_theta
  n = tf.cast(tf.shape(out)[0], out.dtype)
  per_example = tf.reduce_sum(tf.square(out - batch.target), axis=1)
  return {'loss': (tf.reduce_sum(per_example) / n, n)}


def _OnePassStep(layer):
  """One training pass in the layer's schedule (FPropWithLoss)."""
  def Step(x):
    with tf.GradientTape() as tape:
      metrics = layer.FPropWithLoss(
          layer.theta, x, _Head, NestedMap(), NestedMap(target=x),
          tf.constant(float(x.shape[0])))
    return tape.gradient(metrics['loss'][0], layer.vars.Flatten())
  return Step


def _MeasuredPeaks(mine, num_stages, num_micro_batches):
  """Per stage, the most micro-batches held at once by the stamps: m is
  held on stage s from the end of F(s, m) to the end of B(s, m)."""
  ends = {t.action: t.end for t in mine}
  peaks = []
  for s in range(num_stages):
    spans = [(ends[schedule.Action(F, s, m)], ends[schedule.Action(B, s, m)])
             for m in range(num_micro_batches)]
    peaks.append(max(sum(1 for f, b in spans if f <= t < b)
                     for t, _ in spans))
  return peaks


class StepTraceTest(parameterized.TestCase):

  def _CheckSchedule(self, trace, layer_path, table, devs, recomputing,
                     loss_waits_for_all=True):
    """The measured actions against `table`, run on `devs` (its K devices).

    `recomputing`: the stages whose backward re-computes.
    `loss_waits_for_all`: the loss (FProp's caller's) needs every
    micro-batch, so the last stage's backwards wait for every forward.
    """
    mine = [t for t in trace.tasks if t.layer == layer_path]
    by_key = {t.action: t for t in mine}
    self.assertLen(mine, len(table.Actions()))
    self.assertEqual(set(by_key), set(table.Actions()))
    last = table.num_stages - 1
    for t in mine:
      self.assertEqual(t.device, devs[table.stage_devices[t.partition]])
      self.assertLessEqual(0.0, t.start)
      self.assertLessEqual(t.start, t.end)
      if t.phase == B and t.partition in recomputing:
        self.assertBetween(t.recomputed, t.start, t.end)
      else:
        self.assertIsNone(t.recomputed)
    last_forward = max(t.end for a, t in by_key.items()
                       if a.phase == F and a.stage == last)
    for a, t in by_key.items():
      deps = [by_key[x].end for x in schedule.Dependencies(a, last + 1)]
      if loss_waits_for_all and a.phase == B and a.stage == last:
        deps.append(last_forward)
      for dep_end in deps:
        self.assertGreaterEqual(t.start, dep_end, str(a))
    # On each device, by the stamps, the table's order, one at a time.
    for d, row in enumerate(table.order):
      ran = sorted((t for t in mine if t.device == devs[d]),
                   key=lambda t: t.start)
      self.assertEqual([t.action for t in ran], list(row))
      for before, after in zip(ran, ran[1:]):
        self.assertGreaterEqual(after.start, before.end)

  @parameterized.parameters('always', 'never', 'except_last')
  def testTheTasksOfTheScheduleInItsOrder(self, recompute):
    layer = _Layer(recompute)
    x = tf.random.stateless_normal([32, 32], [1, 2])
    trace = step_trace.Measure(_Step(layer), x, warmup=1)
    self.assertEqual(trace.Layers(), ['pipe'])
    self.assertEqual(trace.Shape('pipe'), (_K, _M))
    self.assertEqual(trace.Devices('pipe'), layer.devices)
    recomputing = {'always': {0, 1}, 'never': set(),
                   'except_last': {0}}[recompute]
    table = registry.Make('gpipe', _K, _M)  # FProp's, then its gradient
    self._CheckSchedule(trace, 'pipe', table, layer.devices, recomputing)
    self.assertEqual(trace.Table('pipe'), table)
    busy = trace.BusyFractions('pipe')
    self.assertLen(busy, _K)
    for b in busy:
      self.assertBetween(b, 0.0, 1.0)
    self.assertAlmostEqual(trace.Bubble('pipe'), 1 - sum(busy) / _K)
    # GPipe, K=2, M=4, forward 1, backward 2: a step of 5 x 3, each device
    # busy 4 x 3.
    self.assertAlmostEqual(trace.IdealBubble('pipe', measured=False), 0.2)
    summary = trace.Summary()
    self.assertRegex(summary, r'pipe: K=2 M=4, gpipe schedule, .* measured '
                     r'bubble \d+\.\d% \(ideal for this order \d+\.\d%')
    self.assertNotIn('(K-1)', summary)
    self.assertIn("this process: the trainer's own clock", summary)

  @parameterized.named_parameters(
      # 1F1B: stage k holds at most K-k micro-batches, whatever M.
      ('1f1b', '1f1b', 4, 1, 8, [4, 3, 2, 1]),
      # GPipe holds every micro-batch on every stage until its backwards.
      ('gpipe', 'gpipe', 4, 1, 8, [8, 8, 8, 8]),
      # Stages 0, 2 on device 0 and 1, 3 on device 1.
      ('interleaved', 'interleaved_1f1b', 2, 2, 4, [4, 3, 2, 1]))
  def testAOnePassStepRunsItsTableAndHoldsWhatItShould(
      self, name, k, v, m, peaks):
    layer = _Layer('always', name, k, m, v)
    table = layer.Table(m)
    x = tf.random.stateless_normal([_BATCH, 32], [11, 12])
    trace = step_trace.Measure(_OnePassStep(layer), x, warmup=1)
    self._CheckSchedule(trace, 'pipe', table, layer.devices,
                        set(range(k * v)), loss_waits_for_all=False)
    mine = [t for t in trace.tasks if t.layer == 'pipe']
    self.assertEqual(_MeasuredPeaks(mine, k * v, m), peaks)
    # Read back from the trace: the table, one row per device.
    self.assertEqual(trace.Table('pipe'), table)
    self.assertEqual(trace.Table('pipe').name, name)
    self.assertEqual(trace.Shape('pipe'), (k, m))
    self.assertEqual(trace.Devices('pipe'), layer.devices)
    self.assertLen(trace.BusyFractions('pipe'), k)
    self.assertAlmostEqual(trace.IdealBubble('pipe', measured=False),
                           schedule.Simulate(table).bubble)
    means = [[np.mean([t.end - t.start for t in mine
                       if t.phase == phase and t.partition == s])
              for s in range(k * v)] for phase in 'FB']
    self.assertAlmostEqual(trace.IdealBubble('pipe'),
                           schedule.Simulate(table, *means).bubble)
    shape = f'K={k} V={v} M={m}' if v > 1 else f'K={k} M={m}'
    self.assertIn(f'pipe: {shape}, {name} schedule', trace.Summary())
    svg = ElementTree.fromstring(trace.Svg())
    ns = '{http://www.w3.org/2000/svg}'
    rows = [r for r in svg.iter(ns + 'rect') if r.get('fill') == '#eeeeee']
    self.assertLen(rows, k)
    titles = [r.find(ns + 'title').text for r in svg.iter(ns + 'rect')
              if r.find(ns + 'title') is not None]
    self.assertIn('F0 stage 1: ', '\n'.join(titles))
    # Chrome's names say the stage when a device holds several.
    names = sorted(e['name'] for e in trace.ChromeTrace()['traceEvents']
                   if e['ph'] == 'X' and e['cat'] != 'recompute')
    want = [f'{a.phase}{a.micro_batch}' + (f's{a.stage}' if v > 1 else '')
            for a in table.Actions()]
    self.assertEqual(names, sorted(want))

  def testASplitTableIsReadBackAndNamed(self):
    layer = _Layer('never', '1f1b', split_backward=True)
    table = layer.Table(_M)
    x = tf.random.stateless_normal([_BATCH, 32], [11, 12])
    trace = step_trace.Measure(_OnePassStep(layer), x, warmup=1)
    self.assertEqual(trace.Table('pipe'), table)
    self.assertTrue(trace.Table('pipe').split_backward)
    self.assertIn(f'pipe: K={_K} M={_M}, 1f1b schedule, backwards split',
                  trace.Summary())

  def testRecordingChangesNoGradient(self):
    layer = _Layer('always')
    x = tf.random.stateless_normal([32, 32], [3, 4])
    plain = tf.function(_Step(layer), autograph=False)(x)
    with stamps.RecordTasks() as recorder:
      recorded = tf.function(_Step(layer), autograph=False)
      recorded.get_concrete_function(x)
    with step_trace.TimestampsAllowed():
      recorded = recorded(x)
    self.assertLen(recorder.tasks, 2 * _K * _M)
    for a, b in zip(plain, recorded):
      np.testing.assert_array_equal(a.numpy(), b.numpy())

  def testFilesHoldEveryTask(self):
    layer = _Layer('always')
    trace = step_trace.Measure(
        _Step(layer), tf.random.stateless_normal([32, 32], [5, 6]),
        warmup=1)
    base = os.path.join(absltest.get_default_test_tmpdir(), 'trace')
    json_path, svg_path = trace.Write(base + '.json')
    self.assertEqual((json_path, svg_path), (base + '.json', base + '.svg'))
    with open(json_path) as f:
      events = json.load(f)['traceEvents']
    spans = [e for e in events if e['ph'] == 'X']
    self.assertLen([e for e in spans if e['cat'] != 'recompute'],
                   2 * _K * _M)
    self.assertLen([e for e in spans if e['cat'] == 'recompute'], _K * _M)
    names = {e['args']['name'] for e in events
             if e['ph'] == 'M' and e['name'] == 'process_name'}
    self.assertEqual(names, {f'pipe @ {d}' for d in layer.devices})
    for e in spans:
      self.assertGreaterEqual(e['ts'], 0.0)
      self.assertGreaterEqual(e['dur'], 0.0)
    root = ElementTree.parse(svg_path).getroot()
    titles = [r.find('{http://www.w3.org/2000/svg}title').text
              for r in root.iter('{http://www.w3.org/2000/svg}rect')
              if r.find('{http://www.w3.org/2000/svg}title') is not None]
    self.assertLen([t for t in titles if t[0] in 'FB'], 2 * _K * _M)
    self.assertIn('measured bubble', ElementTree.tostring(root).decode())

  def testATaskStepWithTwoReplicas(self):
    p = replica_task.TaskParams(
        2, 4, replicas=2, devices=devices.LogicalDevices('CPU')[:4])
    task = p.Instantiate()
    task.CreateTrainState()
    trace = step_trace.MeasureStep(task, replica_task.Batch(16), warmup=1)
    self.assertEqual(trace.Layers(), ['task/pipe'])
    self.assertEqual(trace.Devices('task/pipe'),
                     task.pipe.ReplicaDevices(0) + task.pipe.ReplicaDevices(1))
    self.assertLen(trace.BusyFractions('task/pipe'), 4)
    with self.assertRaisesRegex(ValueError, "no tasks of layer 'pipe'; its "
                                r"layers are \['task/pipe'\]"):
      trace.Shape('pipe')
    for r in range(2):
      devs = task.pipe.ReplicaDevices(r)
      mine = [t for t in trace.tasks if t.device in devs]
      # Each replica ran M / R = 2 micro-batches, and each stage's
      # all-reduce after its last backward.
      self.assertCountEqual(
          [t.action for t in mine],
          schedule.WithAllReduce(registry.Make('gpipe', 2, 2)).Actions())
      for t in mine:
        self.assertEqual(t.device, devs[t.partition])
    self.assertEqual(trace.Table('task/pipe'), registry.Make('gpipe', 2, 2))
    exposed = trace.ExposedAllReduce('task/pipe')
    self.assertLen(exposed, 4)
    self.assertTrue(all(0 <= e < 1 for e in exposed), exposed)
    self.assertEqual(int(task._State('x').global_step.numpy()), 0)  # pylint: disable=protected-access

  def testAnAllReduceHiddenBehindAnEarlierStagesBackwardIsNotExposed(self):
    # Two replicas, K=1, two stages on each device (ms). Replica 0: A(1)
    # runs beside B(0, 0) and ends before it; A(0) ends 4 ms after it.
    # Replica 1: A(1) outlasts its last backward by 3 ms, A(0) by 6.
    def Task(device, phase, stage, start, end):
      return step_trace.MeasuredTask('net', device, phase, stage, 0,
                                     start * 1e-3, end * 1e-3)
    tasks = []
    for device, ends in (('/r0', (25, 34)), ('/r1', (33, 36))):
      tasks += [Task(device, 'F', 0, 0, 5), Task(device, 'F', 1, 5, 10),
                Task(device, 'B', 1, 10, 20),
                Task(device, schedule.ALL_REDUCE, 1, 20, ends[0]),
                Task(device, 'B', 0, 20, 30),
                Task(device, schedule.ALL_REDUCE, 0, 30, ends[1])]
    trace = step_trace.StepTrace(tasks, {})
    self.assertEqual(trace.Devices('net'), ['/r0', '/r1'])
    np.testing.assert_allclose(trace.ExposedAllReduce('net'),
                               [4e-3, 6e-3], rtol=1e-9)
    no_sums = [t for t in tasks if t.phase != schedule.ALL_REDUCE]
    self.assertEqual(
        step_trace.StepTrace(no_sums, {}).ExposedAllReduce('net'), [0, 0])
    # Both replicas' backwards ended together: nothing waited.
    self.assertEqual(trace.ReplicaWait('net'), [0, 0])

  def testWaitingForASlowerReplicasBackwardIsNotExposedExchange(self):
    # Two replicas, K=1, one stage (ms). Replica 1's backward ends 10 ms
    # after replica 0's; the sum ends 4 ms after that on replica 0 and 6
    # ms after it on replica 1. Replica 0's 10 ms of waiting is the
    # replicas' imbalance (ReplicaWait), not exchange.
    def Task(device, phase, start, end):
      return step_trace.MeasuredTask('net', device, phase, 0, 0,
                                     start * 1e-3, end * 1e-3)
    tasks = []
    for device, (backward_end, sum_end) in (('/r0', (30, 44)),
                                            ('/r1', (40, 46))):
      tasks += [Task(device, 'F', 0, 10), Task(device, 'B', 10, backward_end),
                Task(device, schedule.ALL_REDUCE, backward_end, sum_end)]
    trace = step_trace.StepTrace(tasks, {})
    np.testing.assert_allclose(trace.ExposedAllReduce('net'),
                               [4e-3, 6e-3], rtol=1e-9)
    np.testing.assert_allclose(trace.ReplicaWait('net'), [10e-3, 0],
                               rtol=1e-9, atol=1e-15)
    # A split backward's W is the stage's last gradient work.
    split = [t if t.phase != 'B' else dataclasses.replace(t, phase='W')
             for t in tasks]
    np.testing.assert_allclose(
        step_trace.StepTrace(split, {}).ExposedAllReduce('net'),
        [4e-3, 6e-3], rtol=1e-9)

  def testMeasuresWithOpDeterminismOnAndLeavesItOn(self):
    layer = _Layer('always')
    was_on = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
      trace = step_trace.Measure(
          _Step(layer), tf.random.stateless_normal([32, 32], [7, 8]),
          warmup=0)
      self.assertTrue(tf_config.is_op_determinism_enabled())
    finally:
      if not was_on:
        tf_config.disable_op_determinism()
    self.assertLen(trace.tasks, 2 * _K * _M)

  def testATracerMeasuresEveryRunOfOneTrace(self):
    layer = _Layer('always')
    x = tf.random.stateless_normal([32, 32], [9, 10])
    step = _Step(layer)
    calls = []

    def Counted(inputs):
      calls.append(1)  # Python runs only while tracing
      return step(inputs)

    tracer = step_trace.Tracer(Counted, x)
    tracer.Step()
    traces = [tracer.Run() for _ in range(3)]
    self.assertLen(calls, 1)
    for trace in traces:
      self._CheckSchedule(trace, 'pipe', registry.Make('gpipe', _K, _M),
                          layer.devices, {0, 1})
      self.assertEqual(min(t.start for t in trace.tasks), 0.0)
    # Each run is its own: the stamps are not the first run's again.
    self.assertNotEqual([t.end for t in traces[0].tasks],
                        [t.end for t in traces[1].tasks])

  def testAFunctionWithoutAPipelineIsAnError(self):
    with self.assertRaisesRegex(ValueError, 'ran no PipeliningLayer'):
      step_trace.Measure(lambda x: x * 2.0, tf.constant(1.0))


if __name__ == '__main__':
  absltest.main()
