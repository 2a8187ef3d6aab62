"""Tests of step_trace: the measured timeline of one step.

On 4 logical CPUs: the trace holds exactly the schedule's tasks, each
starting after the tasks it depends on end, each device running its tasks
in GPipe's order; recording changes no gradient; the Chrome trace and the
SVG hold every task.
"""

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
from lingvo_pipe.core import pipeline_run  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core import step_trace  # noqa: E402
from tests.core import replica_task  # noqa: E402

_K, _M = 2, 4


def _Layer(recompute):
  proj = layers.ProjectionLayer.Params
  p = gpipe.PipeliningLayer.Params().Set(
      name='pipe', num_micro_batches=_M, recompute=recompute,
      devices=devices.LogicalDevices('CPU')[:_K],
      cell_tpl=[proj().Set(input_dim=32, output_dim=128, activation='RELU'),
                proj().Set(input_dim=128, output_dim=32)])
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


class StepTraceTest(parameterized.TestCase):

  def _CheckSchedule(self, trace, layer_path, devs, recomputing):
    """`recomputing`: the partitions whose backward re-computes."""
    mine = [t for t in trace.tasks if t.layer == layer_path]
    by_key = {(t.phase, t.partition, t.micro_batch): t for t in mine}
    want = {(t.phase, t.partition, t.micro_batch)
            for t in schedule.GPipeSchedule(_K, _M)}
    self.assertLen(mine, len(want))
    self.assertEqual(set(by_key), want)
    for t in mine:
      self.assertEqual(t.device, devs[t.partition])
      self.assertLessEqual(0.0, t.start)
      self.assertLessEqual(t.start, t.end)
      if t.phase == 'B' and t.partition in recomputing:
        self.assertBetween(t.recomputed, t.start, t.end)
      else:
        self.assertIsNone(t.recomputed)
    last_forward = max(by_key[('F', _K - 1, m)].end for m in range(_M))
    for (phase, k, m), t in by_key.items():
      if phase == 'F':
        deps = [by_key[('F', k - 1, m)].end] if k else []
      else:
        deps = [by_key[('F', k, m)].end]
        deps.append(by_key[('B', k + 1, m)].end if k + 1 < _K else
                    last_forward)  # the loss needs every micro-batch
      for dep_end in deps:
        self.assertGreaterEqual(t.start, dep_end, (phase, k, m))
    for k, order in schedule.PerDeviceOrder(_K, _M).items():
      ran = sorted((t for t in mine if t.partition == k),
                   key=lambda t: t.start)
      self.assertEqual([(t.phase, t.micro_batch) for t in ran],
                       [(t.phase, t.micro_batch) for t in order])
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
    self._CheckSchedule(trace, 'pipe', layer.devices, recomputing)
    busy = trace.BusyFractions('pipe')
    self.assertLen(busy, _K)
    for b in busy:
      self.assertBetween(b, 0.0, 1.0)
    self.assertAlmostEqual(trace.Bubble('pipe'), 1 - sum(busy) / _K)
    self.assertEqual(trace.IdealBubble('pipe'), 1 / 5)
    self.assertIn('measured bubble', trace.Summary())
    self.assertIn('(K-1)/(M+K-1) = 20.0%', trace.Summary())
    self.assertIn("this process: the trainer's own clock", trace.Summary())

  def testRecordingChangesNoGradient(self):
    layer = _Layer('always')
    x = tf.random.stateless_normal([32, 32], [3, 4])
    plain = tf.function(_Step(layer), autograph=False)(x)
    with pipeline_run.RecordTasks() as recorder:
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
        2, 2, replicas=2, devices=devices.LogicalDevices('CPU')[:4])
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
      self.assertEqual(sorted((t.phase, t.partition, t.micro_batch)
                              for t in mine),
                       sorted((t.phase, t.partition, t.micro_batch)
                              for t in schedule.GPipeSchedule(2, 2)))
      for t in mine:
        self.assertEqual(t.device, devs[t.partition])
    self.assertEqual(int(task._State('x').global_step.numpy()), 0)  # pylint: disable=protected-access

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
      self._CheckSchedule(trace, 'pipe', layer.devices, {0, 1})
      self.assertEqual(min(t.start for t in trace.tasks), 0.0)
    # Each run is its own: the stamps are not the first run's again.
    self.assertNotEqual([t.end for t in traces[0].tasks],
                        [t.end for t in traces[1].tasks])

  def testAFunctionWithoutAPipelineIsAnError(self):
    with self.assertRaisesRegex(ValueError, 'ran no PipeliningLayer'):
      step_trace.Measure(lambda x: x * 2.0, tf.constant(1.0))


if __name__ == '__main__':
  absltest.main()
