"""PipeliningLayer.FPropWithLoss: one training pass, every schedule, exact.

Against the sequential reference of pipeline_testlib: with the same
micro-batch split and each variable's gradients summed in the order of its
stage's backwards in the table, loss, input gradient and every variable's
gradient (the loss head's included) are bitwise equal; against one tape
over the whole batch (BatchNorm's: over its micro-batches, as BatchNorm
normalises each), within 1e-12 in float64, so a wrong table order
cannot hide behind the bitwise check. The matrix: schedule, K, V, M and
recompute mode, dropout on; BatchNorm on for every schedule and mode.
Zero bubble (zb_h1) splits each backward into B and W (backward_split.py):
the same ops, so the same bits; so does any schedule with split_backward.
"""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf
from tensorflow.python.eager import context

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import normalization  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core import schedule_file  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import pipeline_testlib as lib  # noqa: E402


def _Target():
  return tf.reshape(tf.range(lib.BATCH * lib.DIM, dtype=tf.float64),
                    [lib.BATCH, lib.DIM])


def _HeadMetrics(head_theta, out, batch):
  """A loss head with a variable: mean of sum(vec^2 * target * scale)."""
  per_example = tf.reduce_sum(
      out.vec * out.vec * (batch.target * head_theta.scale), axis=1)
  n = tf.cast(tf.shape(per_example)[0], tf.float64)
  return {'loss': (tf.reduce_sum(per_example) / n, n),
          'mean_vec': (tf.reduce_mean(out.vec), n)}


def _OnePassGrads(pipe, scale, inputs, fn_wrapper=lib.Function):
  """(loss, {id(var): grad}, d inputs.vec, metrics) of FPropWithLoss."""
  variables = pipe.vars.Flatten() + [scale]

  def Step(inputs):
    with tf.GradientTape() as tape:
      tape.watch(inputs.vec)
      metrics = pipe.FPropWithLoss(
          pipe.theta, inputs, _HeadMetrics, NestedMap(scale=scale),
          NestedMap(target=_Target()), tf.constant(lib.BATCH, tf.float64))
    grads = tape.gradient(metrics['loss'][0], variables + [inputs.vec],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return metrics, grads

  metrics, grads = fn_wrapper(Step)(inputs)
  return (metrics['loss'][0], {id(v): g for v, g in zip(variables, grads)},
          grads[-1], metrics)


def _MicroBatchReference(ref, scale, inputs, m):
  """The plain model on the same split, each micro-batch's loss share
  differentiated alone: (losses, [per-variable grads], dxs). Eager."""
  variables = ref.vars.Flatten() + [scale]
  parts = lib.Split(inputs, m)
  targets = tf.split(_Target(), m)
  losses, grads, dxs = [], [], []
  for part, target in zip(parts, targets):
    with tf.GradientTape() as tape:
      tape.watch(part.vec)
      out = ref.FProp(ref.theta, part)
      value, weight = _HeadMetrics(NestedMap(scale=scale), out,
                                   NestedMap(target=target))['loss']
      loss = value * tf.stop_gradient(
          weight / tf.constant(lib.BATCH, tf.float64))
    g = tape.gradient(loss, variables + [part.vec],
                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
    losses.append(loss)
    grads.append(g[:-1])
    dxs.append(g[-1])
  return losses, grads, dxs


def _OneTape(ref, scale, inputs, m):
  """(loss, {id(var): grad}, d inputs.vec) of the plain model with the
  batch cut into m micro-batches in one forward (the loss of the whole
  batch, one tape: TensorFlow's own order of sums). Eager."""
  variables = ref.vars.Flatten() + [scale]
  with tf.GradientTape() as tape:
    tape.watch(inputs.vec)
    parts = lib.Split(inputs, m)
    outs = [ref.FProp(ref.theta, part) for part in parts]
    out = tf.nest.map_structure(lambda *t: tf.concat(t, 0), *outs)
    loss = _HeadMetrics(NestedMap(scale=scale), out,
                        NestedMap(target=_Target()))['loss'][0]
  g = tape.gradient(loss, variables + [inputs.vec],
                    unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return loss, {id(v): x for v, x in zip(variables, g)}, g[-1]


def _OnePassReference(variables, per_micro_batch, sum_orders):
  """`_MicroBatchReference`'s shares summed: the loss in micro-batch
  order, each variable's gradients in `sum_orders[id(var)]` order (the
  table's backward order of the variable's stage)."""
  losses, grads, dxs = per_micro_batch
  total = losses[0]
  for share in losses[1:]:
    total = total + share
  summed = {}
  for i, var in enumerate(variables):
    order = sum_orders.get(id(var), list(range(len(losses))))
    acc = grads[order[0]][i]
    for j in order[1:]:
      acc = acc + grads[j][i]
    summed[id(var)] = acc
  return total, summed, tf.concat(dxs, 0)


def _SumOrders(pipe, ref, m):
  """id(reference var) -> micro-batches in its stage's backward order (its
  W's, where the table splits its backwards: W adds to the sum)."""
  table = pipe.Table(m)
  phase = 'W' if table.split_backward else 'B'
  block_stage = {name: s for s, cell in enumerate(pipe.cells)
                 for name in cell.sub_names}
  orders = {}
  for block, named in lib.BlockVars(ref).items():
    stage = block_stage[block]
    order = [a.micro_batch for a in table.Actions(phase)
             if a.stage == stage]
    for var in named.values():
      orders[id(var)] = order
  return orders


def _ScheduleCases():
  """(schedule, K, V, M, recompute) for every registered schedule: each
  (K, V) of at most NUM_LAYERS stages, M of 1, 2, 4 and 8 (three of them a
  (K, V), taking turns) and each recompute mode its rules allow
  (registry.Check), so a schedule that is registered joins the matrix."""
  shapes = ((1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 2), (1, 4))
  micro = (1, 2, 4, 8)
  cases = []
  for name in registry.Names():
    for i, (k, v) in enumerate(shapes):
      for m in micro[:i % 2] + micro[i % 2 + 1:]:
        for recompute in gpipe.RECOMPUTE_MODES:
          try:
            registry.Check(name, k * v, m, v, recompute)
          except ValueError:
            continue
          cases.append((name, k, v, m, recompute))
  return cases


_SCHEDULE_CASES = _ScheduleCases()


class OnePassTest(tf.test.TestCase, parameterized.TestCase):
  """FPropWithLoss: every schedule, K, V, M and recompute mode, exact."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tf.config.experimental.enable_op_determinism()
    cls._ref = lib.Reference(keep_prob=0.75)
    cls._inputs = lib.Inputs()
    cls._scale = tf.Variable(
        tf.random.stateless_normal([lib.DIM], [9, 9], dtype=tf.float64),
        name='head/scale')
    cls._full = cls._FullBatch()
    cls._split = {}

  @classmethod
  def _FullBatch(cls):
    return _OneTape(cls._ref, cls._scale, cls._inputs, 1)

  def _Check(self, pipe, m, fn_wrapper, ref=None):
    """Within 1e-12 against one tape over the whole batch (with `ref`,
    BatchNorm's, over the batch's M micro-batches, as it normalises per
    micro-batch: no order taken from the table), and bitwise against the
    same split summed in the table's order."""
    full = ref is None
    ref = self._ref if full else ref
    pairs = lib.PairedVariables(pipe, ref) + [(self._scale, self._scale)]
    for pv, rv in pairs:  # same seed paths, so identical initial values
      self.assertAllEqual(pv, rv)
    whole_loss, whole_grads, whole_dx = (
        self._full if full else _OneTape(ref, self._scale, self._inputs, m))
    loss, grads, dx, metrics = _OnePassGrads(pipe, self._scale, self._inputs,
                                             fn_wrapper)
    self.assertAllClose(whole_loss, loss, atol=1e-12, rtol=0)
    self.assertAllClose(whole_dx, dx, atol=1e-12, rtol=0)
    for pv, rv in pairs:
      self.assertAllClose(whole_grads[id(rv)], grads[id(pv)], atol=1e-12,
                          rtol=0, msg=pv.name)
    self.assertEqual(float(metrics['loss'][1]), lib.BATCH)
    self.assertEqual(float(metrics['mean_vec'][1]), lib.BATCH)
    # Same split, op determinism, the table's order of sums: bitwise.
    # The plain model's shares depend on the split alone: made once per M
    # for the shared reference (a BatchNorm test brings its own).
    shares = self._split.get(m) if full else None
    if shares is None:
      shares = _MicroBatchReference(ref, self._scale, self._inputs, m)
      if full:
        self._split[m] = shares
    ref_loss, ref_grads, ref_dx = _OnePassReference(
        ref.vars.Flatten() + [self._scale], shares, _SumOrders(pipe, ref, m))
    self.assertAllEqual(ref_loss, loss)
    self.assertAllEqual(ref_dx, dx)
    for pv, rv in pairs:
      self.assertAllEqual(ref_grads[id(rv)], grads[id(pv)], msg=pv.name)

  @parameterized.parameters(*_SCHEDULE_CASES)
  def testEveryGradientMatchesSequential(self, sched, k, v, m, recompute):
    """Run eagerly; dropout on (masks depend on the example key only)."""
    pipe = lib.Pipeline(k, m, recompute, sched, v, keep_prob=0.75)
    self._Check(pipe, m, lambda f: f)

  @parameterized.parameters(
      [(sched, k, 1, m) for sched in ('gpipe', '1f1b') for k in (1, 2, 3, 4)
       for m in (1, 4, 8)] +
      [('interleaved_1f1b', 2, 2, m) for m in (4, 8)] +
      [('gpipe', 2, 2, 4), ('zb_h1', 2, 1, 4)])
  def testSplitBackwardMatchesSequential(self, sched, k, v, m):
    """split_backward: each B then its W; eager, dropout on."""
    pipe = lib.Pipeline(k, m, 'never', sched, v, split_backward=True,
                        keep_prob=0.75)
    table = pipe.Table(m)
    self.assertEqual(len(table.Actions('W')), len(table.Actions('B')))
    self._Check(pipe, m, lambda f: f)

  @parameterized.parameters(('gpipe', 1), ('1f1b', 1),
                            ('interleaved_1f1b', 2))
  def testSplitBackwardTracedWithBatchNorm(self, sched, v):
    """split_backward in a tf.function, dropout and BatchNorm on: bitwise
    against the same split."""
    pipe = lib.Pipeline(2, 4, 'never', sched, v, split_backward=True,
                        keep_prob=0.75, batch_norm=True)
    self._Check(pipe, 4, lib.Function,
                lib.Reference(keep_prob=0.75, batch_norm=True))

  @parameterized.parameters(
      [((s, v), r) for s, v in (('gpipe', 1), ('1f1b', 1),
                                ('interleaved_1f1b', 2))
       for r in gpipe.RECOMPUTE_MODES] + [(('zb_h1', 1), 'never')] +
      [(('looped_bfs', 2), r) for r in gpipe.RECOMPUTE_MODES] +
      [((s, v), 'never') for s, v in (('zb_v', 2), ('interleaved_zb', 2),
                                      ('auto', 1))])
  def testWithBatchNorm(self, sched_v, recompute):
    """Dropout and BatchNorm on: bitwise against the same split (BatchNorm
    normalises per micro-batch), each BatchNorm sees the batch once, and
    (dropout off) its moving averages move by the whole batch's moments."""
    (sched, v), k, m = sched_v, 2, 4
    pipe = lib.Pipeline(k, m, recompute, sched, v, keep_prob=0.75,
                     batch_norm=True)
    self._Check(pipe, m, lambda f: f,
                lib.Reference(keep_prob=0.75, batch_norm=True))
    bns = [layer for layer in pipe.Layers()
           if isinstance(layer, normalization.BatchNormLayer)]
    self.assertLen(bns, lib.NUM_LAYERS)
    for bn in bns:  # re-computation added nothing
      self.assertEqual(float(bn.accumulators.acc_count), lib.BATCH, bn.path)
    pipe = lib.Pipeline(k, m, recompute, sched, v, batch_norm=True)
    expected = lib.FullBatchMoments(pipe, self._inputs, m)
    _OnePassGrads(pipe, self._scale, self._inputs, lambda f: f)
    pipe.UpdateStats()
    for bn, (mean, var) in expected.items():
      self.assertAllClose(bn.vars.moving_mean, 0.5 * mean, atol=1e-12,
                          rtol=0)
      self.assertAllClose(bn.vars.moving_variance, 0.5 + 0.5 * var,
                          atol=1e-12, rtol=0)

  @parameterized.parameters(
      ('1f1b', 2, 1, 4, 'always'), ('1f1b', 3, 1, 8, 'except_last'),
      ('1f1b', 4, 1, 2, 'never'), ('interleaved_1f1b', 2, 2, 4, 'always'),
      ('interleaved_1f1b', 2, 2, 2, 'never'), ('gpipe', 2, 1, 4, 'always'),
      ('zb_h1', 2, 1, 4, 'never'), ('zb_h1', 4, 1, 8, 'never'),
      ('zb_v', 2, 2, 4, 'never'), ('interleaved_zb', 2, 2, 4, 'never'),
      ('looped_bfs', 2, 2, 4, 'always'), ('auto', 2, 1, 4, 'never'))
  def testTracedStepMatchesSequential(self, sched, k, v, m, recompute):
    """In a tf.function (control dependencies, Grappler): still bitwise."""
    pipe = lib.Pipeline(k, m, recompute, sched, v, keep_prob=0.75)
    self._Check(pipe, m, lib.Function)

  @parameterized.parameters(('gpipe', 1, 'always'), ('1f1b', 1, 'never'),
                            ('interleaved_1f1b', 2, 'never'),
                            ('zb_h1', 1, 'never'))
  def testCallsSkipTheShapeInferenceOfTheirBodies(self, sched, v, recompute):
    """Every call op the pipeline makes carries
    `_disable_call_shape_inference` and still has its body's output shapes;
    the graph class's create_op is TensorFlow's again afterwards."""
    pipe = lib.Pipeline(2, 4, recompute, sched, v)
    scale = tf.Variable(tf.ones([lib.DIM], tf.float64))
    step = tf.function(lambda x: _OnePassGrads(pipe, scale, x, lambda f: f),
                       autograph=False)
    graph = step.get_concrete_function(lib.Inputs()).graph
    calls = [op for op in graph.get_operations()
             if op.type in ('PartitionedCall', 'StatefulPartitionedCall')]
    # F, B (and W) of 2 x V stages on 4 micro-batches, 4 losses at least.
    self.assertGreaterEqual(len(calls), 2 * v * 4 * 2 + 4)
    for op in calls:
      self.assertTrue(op.get_attr('_disable_call_shape_inference'), op.name)
      for t in op.outputs:
        if t.dtype != tf.resource:
          self.assertTrue(t.shape.is_fully_defined(), t)
    self.assertNotIn('create_op', type(graph).__dict__)

  @parameterized.parameters(('gpipe', 'always', False),
                            ('1f1b', 'never', False), ('gpipe', 'never', True))
  def testEagerCallsUnderATapeBuildNoGradientFunctions(self, sched, recompute,
                                                       fprop):
    """Eagerly, under the caller's tape, the stage calls are plain calls:
    no tape-built forward or backward function of any of them (TensorFlow
    registers those as '__forward_*' and '*__backward_*'), and the
    gradients still match the full batch."""
    def Built():
      return {n for n in context.context().list_function_names()
              if n.startswith('__forward_') or '__backward_' in n}

    before = Built()
    pipe = lib.Pipeline(2, 4, recompute, sched, keep_prob=0.75)
    if fprop:
      variables = pipe.vars.Flatten()
      with tf.GradientTape() as tape:
        out = pipe.FProp(pipe.theta, self._inputs)
        loss = tf.reduce_sum(out.vec * out.vec)
      grads = dict(zip(map(id, variables), tape.gradient(loss, variables)))
      built = Built() - before  # before the reference runs
      with tf.GradientTape() as tape:
        ref_out = self._ref.FProp(self._ref.theta, self._inputs)
        ref_loss = tf.reduce_sum(ref_out.vec * ref_out.vec)
      ref_grads = dict(zip(map(id, self._ref.vars.Flatten()), tape.gradient(
          ref_loss, self._ref.vars.Flatten())))
      for pv, rv in lib.PairedVariables(pipe, self._ref):
        self.assertAllClose(ref_grads[id(rv)], grads[id(pv)], atol=1e-12,
                            rtol=0, msg=pv.name)
    else:
      loss, grads, _, _ = _OnePassGrads(pipe, self._scale, self._inputs,
                                        lambda f: f)
      built = Built() - before
      full_loss, full_grads, _ = self._full
      self.assertAllClose(full_loss, loss, atol=1e-12, rtol=0)
      for pv, rv in lib.PairedVariables(pipe, self._ref):
        self.assertAllClose(full_grads[id(rv)], grads[id(pv)], atol=1e-12,
                            rtol=0, msg=pv.name)
    self.assertEqual(built, set())


def _OldestLast(num_devices, num_micro_batches, num_virtual_stages):
  """A schedule that exists only in this file: GPipe's placement and
  forwards, each device's backwards oldest micro-batch first (GPipe runs
  them newest first)."""
  table = schedule.GPipe(num_devices, num_micro_batches, num_virtual_stages)
  order = []
  for row in table.order:
    forwards = [a for a in row if a.phase == 'F']
    backwards = sorted((a for a in row if a.phase == 'B'),
                       key=lambda a: (-a.stage, a.micro_batch))
    order.append(tuple(forwards + backwards))
  return schedule.Schedule('oldest_first', num_micro_batches,
                           table.stage_devices, tuple(order))


class NewScheduleTest(tf.test.TestCase, parameterized.TestCase):
  """A new schedule is a new table and nothing else: one registered in this
  file, and one read from a CSV file, train exactly."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tf.config.experimental.enable_op_determinism()
    schedule.Register(schedule.Definition(
        'oldest_first', _OldestLast, stages_per_device=(1, None)))

  @classmethod
  def tearDownClass(cls):
    # Other test files may run in this process after this one.
    schedule.Unregister('oldest_first')
    super().tearDownClass()

  def _Exact(self, pipe, m):
    ref = lib.Reference(keep_prob=0.75)
    scale = tf.Variable(tf.random.stateless_normal([lib.DIM], [9, 9],
                                                   dtype=tf.float64))
    inputs = lib.Inputs()
    loss, grads, _, _ = _OnePassGrads(pipe, scale, inputs)
    ref_loss, ref_grads, _ = _OnePassReference(
        ref.vars.Flatten() + [scale],
        _MicroBatchReference(ref, scale, inputs, m), _SumOrders(pipe, ref, m))
    self.assertAllEqual(ref_loss, loss)
    pairs = lib.PairedVariables(pipe, ref) + [(scale, scale)]
    for pv, rv in pairs:
      self.assertAllEqual(ref_grads[id(rv)], grads[id(pv)], msg=pv.name)

  @parameterized.parameters((2, 1, 'always'), (2, 2, 'never'),
                            (1, 4, 'except_last'))
  def testScheduleRegisteredInThisFile(self, k, v, recompute):
    pipe = lib.Pipeline(k, 4, recompute, 'oldest_first', v, keep_prob=0.75)
    table = pipe.Table(4)
    self.assertEqual('oldest_first', table.name)
    self.assertEqual([a.micro_batch for a in table.order[0]
                      if a.phase == 'B' and a.stage == 0], [0, 1, 2, 3])
    self._Exact(pipe, 4)

  def testTableFromACsvFile(self):
    """A hand-written V-shaped table on two devices with split backwards:
    stages 0 and 3 on device 0, 1 and 2 on device 1."""
    path = self.create_tempfile('mine.csv', content=(
        '0F0,0F1,,,,,3F0,3I0,3W0,3F1,3I1,3W1,,,0I0,0W0,0I1,0W1\n'
        ',,1F0,1F1,2F0,2F1,,,,,2I0,2W0,2I1,2W1,1I0,1I1,1W0,1W1\n'
    )).full_path
    pipe = lib.Pipeline(2, 2, 'never', path, 2, keep_prob=0.75)
    self.assertEqual((0, 1, 1, 0), pipe.placement)
    self.assertEqual(schedule_file.Load(path).order, pipe.Table(2).order)
    for s, cell in enumerate(pipe.cells):
      want = tf.DeviceSpec.from_string(pipe.devices[pipe.placement[s]])
      for var in cell.vars.Flatten():
        have = tf.DeviceSpec.from_string(var.device)
        self.assertEqual((want.device_type, want.device_index),
                         (have.device_type, have.device_index), var.name)
    self._Exact(pipe, 2)


if __name__ == '__main__':
  absltest.main()
