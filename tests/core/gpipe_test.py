"""PipeliningLayer's FProp against a plain sequential reference.

The model is pipeline_testlib's stack of blocks over a NestedMap state of
mixed dtypes. The pipeline and the reference share seed paths, so they
start from identical weights (checked); every variable's gradient is
compared, never a sum or a norm. The differentiable FProp runs GPipe's
order; one-pass training, every schedule: gpipe_one_pass_test.py.
"""

import collections
import glob
import itertools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import input_gradient  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import normalization  # noqa: E402
from lingvo_pipe.core import stage_function  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from tests.core import pipeline_testlib as lib  # noqa: E402


def _Loss(out):
  target = tf.reshape(tf.range(lib.BATCH * lib.DIM, dtype=tf.float64),
                      [lib.BATCH, lib.DIM])
  return tf.reduce_sum(out.vec * out.vec * target) / lib.BATCH


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


def _Grads(layer, inputs, fn_wrapper=lib.Function):
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
    parts = lib.Split(inputs, m)
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
    cls._ref = lib.Reference(keep_prob=0.75)
    cls._inputs = lib.Inputs()
    cls._full = _Grads(cls._ref, cls._inputs)
    cls._split = {}

  def _Split(self, m):
    if m not in self._split:
      self._split[m] = _SplitReferenceGrads(self._ref, self._inputs, m)
    return self._split[m]

  def _CheckAgainstReferences(self, pipe, m, grads_fn):
    pairs = lib.PairedVariables(pipe, self._ref)
    self.assertLen(pairs, 2 * lib.NUM_LAYERS)
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
    pipe = lib.Pipeline(k, m, recompute, keep_prob=0.75)
    self._CheckAgainstReferences(
        pipe, m, lambda p, x: _Grads(p, x, fn_wrapper=lambda f: f))

  @parameterized.parameters(
      (1, 8, 'never'), (2, 4, 'always'), (2, 4, 'except_last'),
      (3, 2, 'except_last'), (4, 8, 'always'), (4, 1, 'never'))
  def testTracedStepMatchesSequential(self, k, m, recompute):
    """In a tf.function (control dependencies, Grappler): still bitwise."""
    pipe = lib.Pipeline(k, m, recompute, keep_prob=0.75)
    self._CheckAgainstReferences(pipe, m, _Grads)

  def testBatchAxisKnownOnlyWhenTheStepRuns(self):
    """One trace for batches of every size (length buckets): the batch
    splits into the M micro-batches when the step runs; still bitwise."""
    pipe = lib.Pipeline(2, 4, 'always', keep_prob=0.75)
    spec = tf.nest.map_structure(
        lambda x: tf.TensorSpec([None] + x.shape[1:].as_list(), x.dtype),
        self._inputs)
    self._CheckAgainstReferences(pipe, 4, lambda p, x: _Grads(
        p, x, fn_wrapper=lambda f: tf.function(
            f, autograph=False, input_signature=[spec])))

  def testEagerMatchesFunction(self):
    pipe = lib.Pipeline(2, 4, 'always', keep_prob=0.75)
    inputs = lib.Inputs()
    loss_f, grads_f, _ = _Grads(pipe, inputs)
    loss_e, grads_e, _ = _Grads(pipe, inputs, fn_wrapper=lambda f: f)
    self.assertAllClose(loss_f, loss_e, atol=1e-12, rtol=0)
    for key in grads_f:
      self.assertAllClose(grads_f[key], grads_e[key], atol=1e-12, rtol=0)

  def testDropoutMasksChangeWithStep(self):
    pipe = lib.Pipeline(2, 2, 'always', keep_prob=0.5)
    out7 = pipe.FPropDefaultTheta(lib.Inputs(step=7)).vec
    out8 = pipe.FPropDefaultTheta(lib.Inputs(step=8)).vec
    self.assertNotAllClose(out7, out8)


class BatchNormTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testMicroBatchNormAndFullBatchMovingAverages(self, recompute):
    m = 4
    ref = lib.Reference(batch_norm=True)
    pipe = lib.Pipeline(2, m, recompute, batch_norm=True)
    pairs = lib.PairedVariables(pipe, ref)
    inputs = lib.Inputs()
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
      self.assertEqual(float(bn.accumulators.acc_count), lib.BATCH, bn.path)
    # Moving averages equal one update with the full mini-batch moments of
    # each BatchNorm's input, computed here with the pipeline's forward.
    expected = lib.FullBatchMoments(pipe, inputs, m)
    pipe.UpdateStats()
    for bn, (mean, var) in expected.items():
      self.assertAllClose(bn.vars.moving_mean, 0.5 * mean, atol=1e-12,
                          rtol=0)
      self.assertAllClose(bn.vars.moving_variance, 0.5 + 0.5 * var,
                          atol=1e-12, rtol=0)
      self.assertEqual(float(bn.accumulators.acc_count), 0.0)

class CountAndPlacementTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      ('always', [2, 2]), ('except_last', [2, 1]), ('never', [1, 1]))
  def testForwardRunsPerMicroBatch(self, recompute, per_micro_batch):
    m = 4
    pipe = lib.Pipeline(2, m, recompute, count_calls=True)
    _Grads(pipe, lib.Inputs())
    for k, cell in enumerate(pipe.cells):
      for block in cell.sub_layers:
        self.assertEqual(int(block.calls), per_micro_batch[k] * m,
                         f'{block.path} ({recompute})')

  def _TrainGraph(self, pipe):
    variables = pipe.vars.Flatten()

    @lib.Function
    def Step(inputs):
      with tf.GradientTape() as tape:
        loss = _Loss(pipe.FPropDefaultTheta(inputs))
      return tape.gradient(loss, variables)

    return Step.get_concrete_function(lib.Inputs()).graph

  @parameterized.parameters(*gpipe.RECOMPUTE_MODES)
  def testEveryOpOfPartitionKOnDeviceK(self, recompute):
    pipe = lib.Pipeline(4, 2, recompute, keep_prob=0.5)
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
    pipe = lib.Pipeline(2, 2, recompute)
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
    graph = self._TrainGraph(lib.Pipeline(2, 2, 'always'))
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
      graph = self._TrainGraph(lib.Pipeline(2, m, recompute))
      library = graph.as_graph_def().library.function
      calls = [op for op in graph.get_operations()
               if _CalledFunction(op).startswith('__inference_cell_')]
      return (len(graph.get_operations()), sum(len(f.node_def)
                                               for f in library), calls)

    self.assertTrue(stage_function.CallBodiesShared())  # by SplitCpu
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

  def testMicroBatchSizeNeedsAKnownBatch(self):
    pipe = self._Build(micro_batch_size=2)
    fprop = tf.function(pipe.FPropDefaultTheta, autograph=False,
                        input_signature=[tf.TensorSpec([None, 3])])
    with self.assertRaisesRegex(ValueError, 'with micro_batch_size needs a '
                                'static batch size; .* set num_micro_batches'):
      fprop.get_concrete_function()

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
      lib.Function(pipe.FPropDefaultTheta)(tf.zeros([8, 3]))

  def testBadRecomputeMode(self):
    with self.assertRaisesRegex(ValueError, "recompute='sometimes'"):
      self._Build(recompute='sometimes')

  def testScheduleErrors(self):
    """One line each, at construction, saying what to change."""
    cells = self._Cells([3] * 5)  # four cells
    cases = [
        (dict(schedule='zero'), r"'pipe': Unknown schedule 'zero'; use one "
         r"of \('gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', .*\) or a "
         r"table's \.csv file\.$"),
        (dict(schedule='zb_h1'), r"'pipe': Schedule 'zb_h1' splits each "
         r"backward in B and W, which needs every stage's activations kept: "
         r"set recompute='never' \(got 'always'\)\.$"),
        (dict(schedule='zb_v', recompute='never'), r"'pipe': Schedule 'zb_v' "
         r'runs 2 stages per device, got num_virtual_stages=1; set '
         r'num_virtual_stages=2'),
        (dict(schedule='interleaved_1f1b'), r"'interleaved_1f1b' runs 2 or "
         r'more stages per device, got num_virtual_stages=1; set '
         r'num_virtual_stages >= 2'),
        (dict(num_virtual_stages=3), r'num_virtual_stages=3 must be a '
         r'positive divisor of the 4 cells'),
        (dict(schedule='1f1b', num_virtual_stages=2), r"Schedule '1f1b' "
         r'runs one stage per device'),
        (dict(schedule='interleaved_1f1b', num_virtual_stages=2,
              num_micro_batches=3), r"'pipe': Schedule 'interleaved_1f1b' "
         r'needs M a multiple of K: M=3, K=2; set num_micro_batches to 2 or '
         r'4\.$'),
        (dict(schedule='1f1b', split_backward=True, recompute='except_last'),
         r"'pipe': Schedule '1f1b' with split_backward splits each backward, "
         r"which needs every stage's activations kept: set "
         r"recompute='never' \(got 'except_last'\)\.$"),
        (dict(schedule='/no/such/table.csv'), r"'pipe': Schedule file "
         r'/no/such/table\.csv: cannot read it \(No such file or '
         r'directory\); give a path to a \.csv table\.$'),
        (dict(split_backward='yes', recompute='never'),
         r"'pipe': split_backward='yes'; use True or False\.$"),
    ]
    for kwargs, regex in cases:
      p = gpipe.PipeliningLayer.Params().Set(name='pipe', cell_tpl=cells,
                                             **kwargs)
      with self.assertRaisesRegex(ValueError, regex, msg=str(kwargs)):
        p.Instantiate()

  def testBackwardsSplitOnlyWhenAsked(self):
    # Whole by default in every mode; split_backward=True splits (recompute
    # 'never' only), ZB-H1 is split by itself; evaluation's table never is.
    cells = self._Cells([3] * 5)
    for schedule_name, v in (('gpipe', 1), ('1f1b', 1),
                             ('interleaved_1f1b', 2), ('zb_h1', 1)):
      for recompute in gpipe.RECOMPUTE_MODES:
        for split in (False, True):
          if ((split or schedule_name == 'zb_h1') and
              recompute != 'never'):
            continue
          pipe = gpipe.PipeliningLayer.Params().Set(
              name='pipe', cell_tpl=cells, schedule=schedule_name,
              num_virtual_stages=v, recompute=recompute,
              num_micro_batches=4, split_backward=split).Instantiate()
          expected = schedule_name == 'zb_h1' or split
          what = (schedule_name, recompute, split)
          self.assertEqual(pipe.Table(4).split_backward, expected, what)
          self.assertEqual(pipe.Table(4).split_in_place,
                           expected and schedule_name != 'zb_h1', what)
          self.assertFalse(pipe.Table(4, training=False).split_backward,
                           what)


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

    @lib.Function
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

    @lib.Function
    def Check(x):
      batch = next(iter(dataset))
      return [tf.constant(input_gradient.MayDependOnVariables([t]))
              for t in (x, batch * 3.0, x * v, tf.gather(v * x, [0]))]

    self.assertEqual([bool(b) for b in Check(tf.ones([2]))],
                     [False, False, True, True])


if __name__ == '__main__':
  absltest.main()
