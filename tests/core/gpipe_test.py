"""PipeliningLayer against a plain sequential reference on one device.

The model is a stack of L layers over a NestedMap state of mixed dtypes:
`vec` (float64 [b, d], transformed), `skip` (float64 [b, d], carried and
mixed in), `example_keys` (int64 [b], for dropout). The pipeline and the
reference share seed paths, so they start from identical weights
(checked); every variable's gradient is compared, never a sum or a norm.
"""

import collections
import glob
import itertools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import input_gradient  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import normalization  # noqa: E402
from lingvo_pipe.core import pipeline_run  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

DIM = 3
BATCH = 8
NUM_LAYERS = 4


class Block(base_layer.BaseLayer):
  """state.vec <- tanh(dropout(state.vec) @ w + b) + 0.5 * state.skip.

  FProp(theta, NestedMap(vec [b, d], skip [b, d], example_keys [b] int64)); an
  optional BatchNorm follows the projection. Counts its executions in
  `calls` when counting is on (a stateful op, so it runs every time).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', DIM, 'Width.')
    p.Define('keep_prob', 1.0, 'Dropout keep probability.')
    p.Define('batch_norm', False, 'Whether to add a BatchNorm.')
    p.Define('count_calls', False, 'Whether to count executions.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('proj', layers.ProjectionLayer.Params().Set(
        input_dim=p.dim, output_dim=p.dim))
    self.CreateChild('drop', dropout.DropoutLayer.Params().Set(
        keep_prob=p.keep_prob))
    if p.batch_norm:
      self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(
          dim=p.dim, decay=0.5))
    if p.count_calls:
      self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

  def FProp(self, theta, state):
    h = self.drop.FProp(theta.drop, state.vec, state.example_keys)
    h = self.proj.FProp(theta.proj, h)
    if self.params.batch_norm:
      h = self.bn.FProp(theta.bn, h)
    if self.params.count_calls:
      self.calls.assign_add(1)
    return NestedMap(vec=tf.tanh(h) + 0.5 * state.skip, skip=state.skip,
                     example_keys=state.example_keys)


def _LayerParams(**kwargs):
  return [Block.Params().Set(name=f'block{i}', dtype=tf.float64, **kwargs)
          for i in range(NUM_LAYERS)]


def _Reference(**kwargs):
  return layers.SequentialLayer.Params().Set(
      name='model', dtype=tf.float64, sub=_LayerParams(**kwargs)
  ).Instantiate()


def _Pipeline(k, m, recompute, schedule='gpipe', v=1, **kwargs):
  """K devices x V stages per device over the NUM_LAYERS blocks."""
  layer_ps = _LayerParams(**kwargs)
  num_stages = k * v
  bounds = [round(i * NUM_LAYERS / num_stages) for i in range(num_stages + 1)]
  cells = [layers.SequentialLayer.Params().Set(sub=layer_ps[a:b])
           for a, b in zip(bounds, bounds[1:])]
  return gpipe.PipeliningLayer.Params().Set(
      name='model', dtype=tf.float64, cell_tpl=cells, num_micro_batches=m,
      recompute=recompute, schedule=schedule,
      num_virtual_stages=v).Instantiate()


def _Inputs(step=7):
  x = tf.random.stateless_normal([BATCH, DIM], [1, 2], dtype=tf.float64)
  skip = tf.random.stateless_normal([BATCH, DIM], [3, 4], dtype=tf.float64)
  return NestedMap(vec=x, skip=skip,
                   example_keys=dropout.ExampleKeys(step, BATCH))


def _Loss(out):
  target = tf.reshape(tf.range(BATCH * DIM, dtype=tf.float64), [BATCH, DIM])
  return tf.reduce_sum(out.vec * out.vec * target) / BATCH


def _BlockVars(layer):
  """block name -> {var path below the block: variable}, for both models."""
  found = {}
  for var in layer.vars.Flatten():
    parts = var.name.split(':')[0].split('/')
    block = next(p for p in parts if p.startswith('block'))
    rest = '/'.join(parts[parts.index(block) + 1:])
    found.setdefault(block, {})[rest] = var
  return found


def _Device(name):
  """A device name without the local job/replica/task, for comparison."""
  spec = tf.DeviceSpec.from_string(name)
  if spec.job in (None, 'localhost'):
    spec = spec.replace(job=None, replica=None, task=None)
  return spec.to_string()


def _CalledFunction(op):
  """Name of the function a call op runs, or ''."""
  if op.type not in ('PartitionedCall', 'StatefulPartitionedCall'):
    return ''
  return op.get_attr('f').name


def _FunctionNodes(op, library):
  """Every node_def of the function `op` calls and of those it calls."""
  todo, seen = [_CalledFunction(op)], set()
  while todo:
    name = todo.pop()
    if not name or name in seen or name not in library:
      continue
    seen.add(name)
    for node in library[name].node_def:
      yield node
      if 'f' in node.attr:
        todo.append(node.attr['f'].func.name)


def _PairedVariables(pipe, ref):
  pv, rv = _BlockVars(pipe), _BlockVars(ref)
  assert sorted(pv) == sorted(rv), (sorted(pv), sorted(rv))
  return [(pv[b][n], rv[b][n]) for b in sorted(rv) for n in sorted(rv[b])]


def _Function(fn):
  return tf.function(fn, autograph=False)


def _Grads(layer, inputs, fn_wrapper=_Function):
  variables = layer.vars.Flatten()

  def Step(inputs):
    with tf.GradientTape() as tape:
      tape.watch(inputs.vec)
      loss = _Loss(layer.FPropDefaultTheta(inputs))
    grads = tape.gradient(loss, variables + [inputs.vec],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, grads

  loss, grads = fn_wrapper(Step)(inputs)
  by_var = {id(v): g for v, g in zip(variables, grads)}
  return loss, by_var, grads[-1]


def _SplitReferenceGrads(ref, inputs, m):
  """Reference on the same micro-batch split, summed m = M-1 .. 0.

  Run eagerly: a plain model with no graph rewriting. (In a tf.function,
  Grappler's arithmetic optimiser re-associates this chain of sums, so
  the reference itself would change in the last bit.)
  """
  variables = ref.vars.Flatten()

  def Step(inputs):
    parts = [NestedMap(zip(sorted(inputs), t)) for t in zip(*[
        tf.split(inputs[key], m) for key in sorted(inputs)])]
    tapes, outs = [], []
    for part in parts:
      tape = tf.GradientTape()
      with tape:
        tape.watch(part.vec)
        outs.append(ref.FProp(ref.theta, part))
      tapes.append(tape)
    with tf.GradientTape() as head:
      full = [o.vec for o in outs]
      head.watch(full)
      loss = _Loss(NestedMap(vec=tf.concat(full, 0)))
    dys = head.gradient(loss, full)
    acc, dxs = None, [None] * m
    for i in reversed(range(m)):
      g = tapes[i].gradient(
          outs[i].vec, variables + [parts[i].vec], output_gradients=dys[i],
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
      dxs[i] = g[-1]
      acc = g[:-1] if acc is None else [a + b for a, b in zip(acc, g[:-1])]
    return loss, acc, tf.concat(dxs, 0)

  loss, acc, dx = Step(inputs)
  return loss, {id(v): g for v, g in zip(variables, acc)}, dx


class ExactnessTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tf.config.experimental.enable_op_determinism()
    # The references do not depend on K or the recompute mode: one
    # full-batch reference, and one same-split reference per M.
    cls._ref = _Reference(keep_prob=0.75)
    cls._inputs = _Inputs()
    cls._full = _Grads(cls._ref, cls._inputs)
    cls._split = {}

  def _Split(self, m):
    if m not in self._split:
      self._split[m] = _SplitReferenceGrads(self._ref, self._inputs, m)
    return self._split[m]

  def _CheckAgainstReferences(self, pipe, m, grads_fn):
    pairs = _PairedVariables(pipe, self._ref)
    self.assertLen(pairs, 2 * NUM_LAYERS)
    for pv, rv in pairs:  # same seed paths, so identical initial values
      self.assertAllEqual(pv, rv)
    ref_loss, ref_grads, ref_dx = self._full
    loss, grads, dx = grads_fn(pipe, self._inputs)
    self.assertAllClose(ref_loss, loss, atol=1e-12, rtol=0)
    self.assertAllClose(ref_dx, dx, atol=1e-12, rtol=0)
    for pv, rv in pairs:
      self.assertAllClose(ref_grads[id(rv)], grads[id(pv)], atol=1e-12,
                          rtol=0, msg=pv.name)
    # Same micro-batch split and op determinism: bitwise equal.
    split_loss, split_grads, split_dx = self._Split(m)
    self.assertAllEqual(split_loss, loss)
    self.assertAllEqual(split_dx, dx)
    for pv, rv in pairs:
      self.assertAllEqual(split_grads[id(rv)], grads[id(pv)], msg=pv.name)

  @parameterized.parameters(itertools.product(
      (1, 2, 3, 4), (1, 2, 4, 8), gpipe.RECOMPUTE_MODES))
  def testEveryGradientMatchesSequential(self, k, m, recompute):
    """The whole matrix, run eagerly (5x quicker than tracing each case).

    Dropout is on: masks depend on the example key, not on K or M.
    """
    pipe = _Pipeline(k, m, recompute, keep_prob=0.75)
    self._CheckAgainstReferences(
        pipe, m, lambda p, x: _Grads(p, x, fn_wrapper=lambda f: f))

  @parameterized.parameters(
      (1, 8, 'never'), (2, 4, 'always'), (2, 4, 'except_last'),
      (3, 2, 'except_last'), (4, 8, 'always'), (4, 1, 'never'))
  def testTracedStepMatchesSequential(self, k, m, recompute):
    """In a tf.function (control dependencies, Grappler): still bitwise."""
    pipe = _Pipeline(k, m, recompute, keep_prob=0.75)
    self._CheckAgainstReferences(pipe, m, _Grads)

  def testEagerMatchesFunction(self):
    pipe = _Pipeline(2, 4, 'always', keep_prob=0.75)
    inputs = _Inputs()
    loss_f, grads_f, _ = _Grads(pipe, inputs)
    loss_e, grads_e, _ = _Grads(pipe, inputs, fn_wrapper=lambda f: f)
    self.assertAllClose(loss_f, loss_e, atol=1e-12, rtol=0)
    for key in grads_f:
      self.assertAllClose(grads_f[key], grads_e[key], atol=1e-12, rtol=0)

  def testDropoutMasksChangeWithStep(self):
    pipe = _Pipeline(2, 2, 'always', keep_prob=0.5)
    out7 = pipe.FPropDefaultTheta(_Inputs(step=7)).vec
    out8 = pipe.FPropDefaultTheta(_Inputs(step=8)).vec
    self.assertNotAllClose(out7, out8)


def _Target():
  return tf.reshape(tf.range(BATCH * DIM, dtype=tf.float64), [BATCH, DIM])


def _HeadMetrics(head_theta, out, batch):
  """A loss head with a variable: mean of sum(vec^2 * target * scale)."""
  per_example = tf.reduce_sum(
      out.vec * out.vec * (batch.target * head_theta.scale), axis=1)
  n = tf.cast(tf.shape(per_example)[0], tf.float64)
  return {'loss': (tf.reduce_sum(per_example) / n, n),
          'mean_vec': (tf.reduce_mean(out.vec), n)}


def _OnePassGrads(pipe, scale, inputs, fn_wrapper=_Function):
  """(loss, {id(var): grad}, d inputs.vec, metrics) of FPropWithLoss."""
  variables = pipe.vars.Flatten() + [scale]

  def Step(inputs):
    with tf.GradientTape() as tape:
      tape.watch(inputs.vec)
      metrics = pipe.FPropWithLoss(
          pipe.theta, inputs, _HeadMetrics, NestedMap(scale=scale),
          NestedMap(target=_Target()), tf.constant(BATCH, tf.float64))
    grads = tape.gradient(metrics['loss'][0], variables + [inputs.vec],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return metrics, grads

  metrics, grads = fn_wrapper(Step)(inputs)
  return (metrics['loss'][0], {id(v): g for v, g in zip(variables, grads)},
          grads[-1], metrics)


def _OnePassReference(ref, scale, inputs, m, sum_orders):
  """The plain model on the same split, each micro-batch's loss share
  differentiated alone; per-variable sums in `sum_orders[id(var)]` order
  (the table's backward order of the variable's stage). Eager."""
  variables = ref.vars.Flatten() + [scale]
  parts = [NestedMap(zip(sorted(inputs), t)) for t in zip(*[
      tf.split(inputs[key], m) for key in sorted(inputs)])]
  targets = tf.split(_Target(), m)
  losses, grads, dxs = [], [], []
  for part, target in zip(parts, targets):
    with tf.GradientTape() as tape:
      tape.watch(part.vec)
      out = ref.FProp(ref.theta, part)
      value, weight = _HeadMetrics(NestedMap(scale=scale), out,
                                   NestedMap(target=target))['loss']
      loss = value * tf.stop_gradient(
          weight / tf.constant(BATCH, tf.float64))
    g = tape.gradient(loss, variables + [part.vec],
                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
    losses.append(loss)
    grads.append(g[:-1])
    dxs.append(g[-1])
  total = losses[0]
  for share in losses[1:]:
    total = total + share
  summed = {}
  for i, var in enumerate(variables):
    order = sum_orders.get(id(var), list(range(m)))
    acc = grads[order[0]][i]
    for j in order[1:]:
      acc = acc + grads[j][i]
    summed[id(var)] = acc
  return total, summed, tf.concat(dxs, 0)


def _SumOrders(pipe, ref, m):
  """id(reference var) -> micro-batches in its stage's backward order."""
  table = pipe.Table(m)
  block_stage = {name: s for s, cell in enumerate(pipe.cells)
                 for name in cell.sub_names}
  orders = {}
  for block, named in _BlockVars(ref).items():
    stage = block_stage[block]
    order = [a.micro_batch for a in table.Actions('B') if a.stage == stage]
    for var in named.values():
      orders[id(var)] = order
  return orders


_SCHEDULE_CASES = (
    [(sched, k, 1, m, r) for sched in ('gpipe', '1f1b') for k in (1, 2, 3, 4)
     for m in (1, 2, 4, 8) for r in gpipe.RECOMPUTE_MODES] +
    [('interleaved_1f1b', k, v, m, r) for k, v in ((1, 2), (2, 2), (1, 4))
     for m in (2, 4, 8) for r in gpipe.RECOMPUTE_MODES] +
    [('gpipe', 2, 2, 4, 'always')])


class OnePassTest(tf.test.TestCase, parameterized.TestCase):
  """FPropWithLoss: every schedule, K, V, M and recompute mode, exact."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tf.config.experimental.enable_op_determinism()
    cls._ref = _Reference(keep_prob=0.75)
    cls._inputs = _Inputs()
    cls._scale = tf.Variable(
        tf.random.stateless_normal([DIM], [9, 9], dtype=tf.float64),
        name='head/scale')
    cls._full = cls._FullBatch()
    cls._split = {}

  @classmethod
  def _FullBatch(cls):
    with tf.GradientTape() as tape:
      tape.watch(cls._inputs.vec)
      out = cls._ref.FProp(cls._ref.theta, cls._inputs)
      loss = _HeadMetrics(NestedMap(scale=cls._scale), out,
                          NestedMap(target=_Target()))['loss'][0]
    variables = cls._ref.vars.Flatten() + [cls._scale]
    g = tape.gradient(loss, variables + [cls._inputs.vec])
    return loss, {id(v): x for v, x in zip(variables, g)}, g[-1]

  def _Check(self, pipe, m, fn_wrapper):
    pairs = _PairedVariables(pipe, self._ref) + [(self._scale, self._scale)]
    for pv, rv in pairs:  # same seed paths, so identical initial values
      self.assertAllEqual(pv, rv)
    loss, grads, dx, metrics = _OnePassGrads(pipe, self._scale, self._inputs,
                                             fn_wrapper)
    full_loss, full_grads, full_dx = self._full
    self.assertAllClose(full_loss, loss, atol=1e-12, rtol=0)
    self.assertAllClose(full_dx, dx, atol=1e-12, rtol=0)
    for pv, rv in pairs:
      self.assertAllClose(full_grads[id(rv)], grads[id(pv)], atol=1e-12,
                          rtol=0, msg=pv.name)
    self.assertEqual(float(metrics['loss'][1]), BATCH)
    self.assertEqual(float(metrics['mean_vec'][1]), BATCH)
    # Same split, op determinism, the table's order of sums: bitwise.
    ref_loss, ref_grads, ref_dx = _OnePassReference(
        self._ref, self._scale, self._inputs, m,
        _SumOrders(pipe, self._ref, m))
    self.assertAllEqual(ref_loss, loss)
    self.assertAllEqual(ref_dx, dx)
    for pv, rv in pairs:
      self.assertAllEqual(ref_grads[id(rv)], grads[id(pv)], msg=pv.name)

  @parameterized.parameters(*_SCHEDULE_CASES)
  def testEveryGradientMatchesSequential(self, sched, k, v, m, recompute):
    """Run eagerly; dropout on (masks depend on the example key only)."""
    pipe = _Pipeline(k, m, recompute, sched, v, keep_prob=0.75)
    self._Check(pipe, m, lambda f: f)

  @parameterized.parameters(
      ('1f1b', 2, 1, 4, 'always'), ('1f1b', 3, 1, 8, 'except_last'),
      ('1f1b', 4, 1, 2, 'never'), ('interleaved_1f1b', 2, 2, 4, 'always'),
      ('interleaved_1f1b', 2, 2, 2, 'never'), ('gpipe', 2, 1, 4, 'always'))
  def testTracedStepMatchesSequential(self, sched, k, v, m, recompute):
    """In a tf.function (control dependencies, Grappler): still bitwise."""
    pipe = _Pipeline(k, m, recompute, sched, v, keep_prob=0.75)
    self._Check(pipe, m, _Function)


class BatchNormTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testMicroBatchNormAndFullBatchMovingAverages(self, recompute):
    m = 4
    ref = _Reference(batch_norm=True)
    pipe = _Pipeline(2, m, recompute, batch_norm=True)
    pairs = _PairedVariables(pipe, ref)
    inputs = _Inputs()
    # Normalisation is per micro-batch: the same split reference agrees.
    split_loss, split_grads, _ = _SplitReferenceGrads(ref, inputs, m)
    loss, grads, _ = _Grads(pipe, inputs)
    self.assertAllClose(split_loss, loss, atol=1e-12, rtol=0)
    for pv, rv in pairs:
      self.assertAllClose(split_grads[id(rv)], grads[id(pv)], atol=1e-12,
                          rtol=0, msg=pv.name)
    # Re-computation added nothing: each BatchNorm saw the batch once.
    for bn in [layer for layer in pipe.Layers()
               if isinstance(layer, normalization.BatchNormLayer)]:
      self.assertEqual(float(bn.accumulators.acc_count), BATCH, bn.path)
    # Moving averages equal one update with the full mini-batch moments of
    # each BatchNorm's input, computed here with the pipeline's forward.
    expected = self._FullBatchMoments(pipe, inputs, m)
    pipe.UpdateStats()
    for bn, (mean, var) in expected.items():
      self.assertAllClose(bn.vars.moving_mean, 0.5 * mean, atol=1e-12,
                          rtol=0)
      self.assertAllClose(bn.vars.moving_variance, 0.5 + 0.5 * var,
                          atol=1e-12, rtol=0)
      self.assertEqual(float(bn.accumulators.acc_count), 0.0)

  def _FullBatchMoments(self, pipe, inputs, m):
    """BatchNorm input of each block over the whole batch, in numpy."""
    moments = {}
    state = inputs
    blocks = [b for cell in pipe.cells for b in cell.sub_layers]
    parts = [NestedMap(zip(sorted(state), t)) for t in zip(*[
        tf.split(state[key], m) for key in sorted(state)])]
    for block in blocks:
      theta = block.theta
      with block.NoStatUpdates():
        hs = [block.proj.FProp(theta.proj, p.vec) for p in parts]
        parts = [block.FProp(theta, p) for p in parts]
      h = np.concatenate([x.numpy() for x in hs])
      moments[block.bn] = (h.mean(0), h.var(0))
    return moments


class CountAndPlacementTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      ('always', [2, 2]), ('except_last', [2, 1]), ('never', [1, 1]))
  def testForwardRunsPerMicroBatch(self, recompute, per_micro_batch):
    m = 4
    pipe = _Pipeline(2, m, recompute, count_calls=True)
    _Grads(pipe, _Inputs())
    for k, cell in enumerate(pipe.cells):
      for block in cell.sub_layers:
        self.assertEqual(int(block.calls), per_micro_batch[k] * m,
                         f'{block.path} ({recompute})')

  def _TrainGraph(self, pipe):
    variables = pipe.vars.Flatten()

    @_Function
    def Step(inputs):
      with tf.GradientTape() as tape:
        loss = _Loss(pipe.FPropDefaultTheta(inputs))
      return tape.gradient(loss, variables)

    return Step.get_concrete_function(_Inputs()).graph

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testEveryOpOfPartitionKOnDeviceK(self, recompute):
    pipe = _Pipeline(4, 2, recompute, keep_prob=0.5)
    for k, cell in enumerate(pipe.cells):
      for var in cell.vars.Flatten():
        self.assertEqual(_Device(var.device), _Device(pipe.devices[k]))
    graph = self._TrainGraph(pipe)
    library = {f.signature.name: f
               for f in graph.as_graph_def().library.function}
    seen, bodies = set(), 0
    for op in graph.get_operations():
      for k in range(4):
        if f'cell_{k}/' in op.name:
          seen.add((k, 'bwd' if '/bwd_' in op.name else 'fwd'))
          self.assertEqual(_Device(op.device), _Device(pipe.devices[k]),
                           f'{op.name} ({op.type})')
          # The ops inside a partition function run on device k too: on
          # it by name, or unnamed and so on the device of the call.
          for node in _FunctionNodes(op, library):
            bodies += 1
            if node.device:
              self.assertEqual(_Device(node.device),
                               _Device(pipe.devices[k]),
                               f'{op.name} calls {node.name} ({node.op})')
    self.assertEqual(seen, {(k, d) for k in range(4) for d in ('fwd', 'bwd')})
    self.assertGreater(bodies, 0)

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testActivationsKeptOnlyWithoutRecompute(self, recompute):
    """Backward of cell k reads from its forward only the gated inputs."""
    pipe = _Pipeline(2, 2, recompute)
    graph = self._TrainGraph(pipe)
    kept = {0: False, 1: False}
    for op in graph.get_operations():
      for k in (0, 1):
        if f'cell_{k}/bwd_' not in op.name:
          continue
        for t in op.inputs:
          src = t.op.name
          gate = src.split('/')[-1].startswith('after')
          if f'cell_{k}/fwd_' in src and not gate:
            kept[k] = True
    expect = {'always': {0: False, 1: False},
              'except_last': {0: False, 1: True},
              'never': {0: True, 1: True}}[recompute]
    self.assertEqual(kept, expect)

  def testRecomputationWaitsForItsGradient(self):
    """B(0, m) re-computes only after B(1, m) has produced its dy.

    The re-computation runs inside B(0, m)'s call, so the call must take
    an input from B(1, m) (a data input cannot be ready earlier).
    """
    graph = self._TrainGraph(_Pipeline(2, 2, 'always'))
    for m in (0, 1):
      calls = [op for op in graph.get_operations()
               if op.name.startswith(f'cell_0/bwd_{m}/') and
               'backward' in _CalledFunction(op)]
      self.assertLen(calls, 1, f'B(0, {m}) has no backward call')
      sources = [t.op.name for t in calls[0].inputs]
      self.assertTrue(any(f'cell_1/bwd_{m}/' in src for src in sources),
                      f'B(0, {m}) can run before B(1, {m}): {sources}')

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testGraphDoesNotGrowWithMicroBatches(self, recompute):
    """Each partition is traced once: M only adds calls, not layers."""

    def Count(m):
      graph = self._TrainGraph(_Pipeline(2, m, recompute))
      library = graph.as_graph_def().library.function
      calls = [op for op in graph.get_operations()
               if _CalledFunction(op).startswith('__inference_cell_')]
      return (len(graph.get_operations()), sum(len(f.node_def)
                                               for f in library), calls)

    self.assertTrue(pipeline_run.CallBodiesShared())  # by SplitCpu
    ops_2, body_2, calls_2 = Count(2)
    ops_8, body_8, calls_8 = Count(8)
    # One body per partition function, not one per micro-batch (the
    # bodies differ by a few shape-dependent ops between M=2 and 8).
    self.assertLess(body_8, 1.1 * body_2)
    # Four times the micro-batches: four times the calls, and the graph
    # outside the bodies grows by no more than a few ops per task.
    self.assertLen(calls_8, 4 * len(calls_2))
    self.assertLess(ops_8 - ops_2, 40 * (len(calls_8) - len(calls_2)))


class ErrorTest(tf.test.TestCase):

  def _Cells(self, dims):
    return [layers.ProjectionLayer.Params().Set(input_dim=a, output_dim=b)
            for a, b in zip(dims, dims[1:])]

  def _Build(self, **kwargs):
    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=self._Cells([3, 3, 3]))
    return p.Set(**kwargs).Instantiate()

  def testMicroBatchSizeMustDivideBatch(self):
    pipe = self._Build(micro_batch_size=3)
    with self.assertRaisesRegex(ValueError, 'batch size 8 is not a multiple '
                                'of micro_batch_size=3'):
      pipe.FPropDefaultTheta(tf.zeros([8, 3]))

  def testMoreMicroBatchesThanExamples(self):
    pipe = self._Build(num_micro_batches=16)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches=16 is larger '
                                'than the batch size 8'):
      pipe.FPropDefaultTheta(tf.zeros([8, 3]))

  def testUnevenSplit(self):
    pipe = self._Build(num_micro_batches=3)
    with self.assertRaisesRegex(ValueError, 'does not split into'):
      pipe.FPropDefaultTheta(tf.zeros([8, 3]))

  def testFewerDevicesThanPartitions(self):
    with self.assertRaisesRegex(ValueError, '2 partitions but p.devices '
                                'lists 1'):
      self._Build(devices=['/device:CPU:0'])

  def testTooManyPartitionsForTheRuntime(self):
    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=self._Cells([3] * 7))
    with self.assertRaisesRegex(ValueError, r'SplitCpu\(6\)'):
      p.Instantiate()

  def testUnknownDevice(self):
    with self.assertRaisesRegex(ValueError, "device '/device:GPU:7' of "
                                'partition 1 is not one of'):
      self._Build(devices=['/device:CPU:0', '/device:GPU:7'])

  def testPartitionsThatDoNotFit(self):
    p = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=self._Cells([3, 4]) + self._Cells([5, 2]))
    pipe = p.Instantiate()
    msg = (r"partition 1 \('cell_1'\) cannot take the output of partition 0 "
           r"\('cell_0'\) of shapes \[8, 4\]: ProjectionLayer 'pipe/cell_1': "
           'input shape .* expected 5')
    with self.assertRaisesRegex(ValueError, msg):
      pipe.FPropDefaultTheta(tf.zeros([8, 3]))
    with self.assertRaisesRegex(ValueError, msg):
      _Function(pipe.FPropDefaultTheta)(tf.zeros([8, 3]))

  def testBadRecomputeMode(self):
    with self.assertRaisesRegex(ValueError, "recompute='sometimes'"):
      self._Build(recompute='sometimes')


def _ConvPipeline(k, m):
  """k partitions of one 3x3 convolution each, float32 NHWC."""
  cells = [layers.SequentialLayer.Params().Set(sub=[
      layers.Conv2DLayer.Params().Set(name=f'conv{i}',
                                      filter_shape=[3, 3, 8, 8])])
           for i in range(k)]
  return gpipe.PipeliningLayer.Params().Set(
      name='convs', cell_tpl=cells, num_micro_batches=m).Instantiate()


def _OpsRun(fn, *args):
  """Op type -> how many times it ran in one call of `fn` (TF profiler)."""
  fn(*args)  # warm-up: tracing and optimisation are not in the count
  logdir = tempfile.mkdtemp()
  tf.profiler.experimental.start(logdir)
  try:
    fn(*args)
  finally:
    tf.profiler.experimental.stop()
  counts = collections.Counter()
  for path in glob.glob(os.path.join(logdir, '**', '*.xplane.pb'),
                        recursive=True):
    space = xplane_pb2.XSpace()
    with open(path, 'rb') as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      for line in plane.lines:
        for event in line.events:
          name = plane.event_metadata[event.metadata_id].name
          counts[name.rsplit(':', 1)[-1]] += 1
  return counts


class InputGradientTest(tf.test.TestCase):
  """Partition 0's input gradient is computed only when someone uses it."""

  def _Step(self, pipe, watch, scale=None):
    variables = pipe.vars.Flatten() + ([scale] if scale is not None else [])

    @_Function
    def Step(x):
      with tf.GradientTape() as tape:
        if watch:
          tape.watch(x)
        if scale is not None:
          x = x * scale
        y = pipe.FPropDefaultTheta(x)
        loss = tf.reduce_sum(y * y)
      return tape.gradient(loss, variables + ([x] if watch else []))

    return Step

  def testAnUnusedInputGradientDoesNotRun(self):
    k, m = 2, 2
    x = tf.random.stateless_normal([4, 6, 6, 8], [5, 6])
    unwatched = _OpsRun(self._Step(_ConvPipeline(k, m), watch=False), x)
    watched = _OpsRun(self._Step(_ConvPipeline(k, m), watch=True), x)
    # Partition 1 always needs d(its input) for partition 0; partition 0's
    # own input gradient only when the caller watched the images. Each is
    # TF's kernel or, on a CPU, a convolution with the filter turned 180
    # degrees (one ReverseV2; kernels.Conv2D).
    def InputGradients(counts):
      return counts['Conv2DBackpropInput'] + counts['ReverseV2']

    self.assertEqual(InputGradients(unwatched), (k - 1) * m)
    self.assertEqual(InputGradients(watched), k * m)
    # Every partition's filter gradient, each micro-batch: TF's kernel, or
    # on a CPU for inputs this small im2col's patches (kernels.Conv2D).
    self.assertEqual(unwatched['Conv2DBackpropFilter'] +
                     unwatched['ExtractImagePatches'], k * m)

  def testInputsFromAVariableGetTheirGradientInTheBackward(self):
    """Same variable gradients, bitwise, whichever way d(inputs) is made."""
    x = tf.random.stateless_normal([4, 6, 6, 8], [7, 8])
    pipe = _ConvPipeline(2, 2)
    scale = tf.Variable(1.0)
    lazy = self._Step(pipe, watch=True)
    inline = self._Step(pipe, watch=False, scale=scale)
    graph = inline.get_concrete_function(x).graph
    called = {_CalledFunction(op) for op in graph.get_operations()}
    self.assertFalse([f for f in called if 'input_gradient' in f], called)
    self.assertTrue([f for f in called if 'cell_0_backward' in f], called)
    got_lazy, got_inline = lazy(x), inline(x)
    for a, b in zip(got_lazy[:-1], got_inline[:-1]):
      self.assertAllEqual(a, b)
    self.assertAllClose(got_inline[-1], tf.reduce_sum(got_lazy[-1] * x),
                        rtol=1e-5)

  def testMayDependOnVariables(self):
    v = tf.Variable(2.0)
    dataset = tf.data.Dataset.from_tensors(tf.ones([2])).repeat()

    @_Function
    def Check(x):
      batch = next(iter(dataset))
      return [tf.constant(input_gradient.MayDependOnVariables([t]))
              for t in (x, batch * 3.0, x * v, tf.gather(v * x, [0]))]

    self.assertEqual([bool(b) for b in Check(tf.ones([2]))],
                     [False, False, True, True])


if __name__ == '__main__':
  absltest.main()
