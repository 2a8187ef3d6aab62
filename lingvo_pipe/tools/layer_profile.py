"""Per-layer costs of a layer list, measured once on the target device.

`ProfileLayers(layers, input_shapes, ...)` builds each layer in turn on
the current device (wrap the call in `tf.device(...)` for an accelerator),
feeds it random inputs of one micro-batch (its predecessor's output) and
measures:

  forward_s     median seconds of FProp (one tf.function call)
  backward_s    median seconds of FProp + the gradient of every floating
                output w.r.t. the layer's inputs and variables, minus
                forward_s: the gradient alone
  residual_bytes  forward intermediates the gradient reads (kept for the
                backward when activations are kept); a view (reshape,
                expand_dims ...) counts as what it views, once, and
                nothing if it views an input or a variable
  input_read_bytes  bytes of the layer's own inputs the gradient reads
  output_bytes  the layer's outputs for one micro-batch
  num_params, param_bytes, slot_bytes  trainable scalars, their bytes,
                and the optimizer's slots
                for them (created, then counted)
  kept_*, input_*, weight_*, carry_bytes  with `keeps_activations`
                (recompute 'never'): the backward as a stage that keeps
                its activations runs it, from the forward's residuals
                (residuals.SplitCell) into a running sum of the
                gradients; whole (kept_backward_s, _peak_bytes) and as a
                zero-bubble table's two actions (backward_split): B, the
                input gradient (input_backward_s, _peak_bytes), and W,
                the weight gradient (weight_backward_s, _peak_bytes);
                median seconds, and how far the allocator's peak rises
                above what it held before the call (the residuals and
                the gradient sum are held before it, so the call's own
                results and temporaries: the whole call holds its inputs
                to its end, so no residual is freed early); carry_bytes,
                B's results that W reads (each inner output's gradient),
                and weight_read_bytes, the residuals W reads (counted as
                residual_bytes); kept_residual_bytes, what the allocator
                holds more after the kept forward, its outputs let go
                (they leave the stage): its residuals as held, where
                buffers TF shares between them count once (AmoebaNet-D:
                214 MiB held of 251 listed).
                None (0) otherwise
  backward_peak_bytes  how far the allocator's peak rises above what it
                held before, while the layer's forward is re-computed and
                differentiated for given output gradients (a partition's
                backward task, one layer of it): its residuals, the
                gradient's temporaries and its results; the most of three
                calls. None where TensorFlow keeps no allocator statistics.

Residuals come from the traced gradient graph: `residuals.SplitCell`
(the pipeline's own kept-activation analysis) lists the tensors of the
forward that the gradient's ops read; their sizes are exact and the same
on every device type. They are what waits while later layers are
differentiated. What a layer holds while it is differentiated itself
(temporaries, and the ops the executor's threads run side by side) the
graph does not show: that is measured, with
`tf.config.experimental.get_memory_info`, which a GPU always supports and
a CPU when TF_CPU_ALLOCATOR_USE_BFC=true is set before TensorFlow makes
its devices (`python -m lingvo_pipe.tools.plan` does). The resident set
(bench/gpipe/memory.py) is no substitute: glibc keeps freed small blocks
resident, so it under-reads small tensors.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import backward_split
from lingvo_pipe.core import cluster
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import partitioner
from lingvo_pipe.core import residuals


@dataclasses.dataclass(frozen=True)
class LayerProfile:
  """One layer's measured costs for one micro-batch (module docstring)."""
  name: str
  forward_s: float
  backward_s: float
  residual_bytes: int
  input_read_bytes: int
  input_bytes: int
  output_bytes: int
  num_params: int
  param_bytes: int
  slot_bytes: int
  # Measured where the allocator keeps statistics (module docstring); None
  # elsewhere, and the cost model falls back on residual_bytes.
  backward_peak_bytes: Optional[int] = None
  # With keeps_activations (module docstring).
  kept_residual_bytes: Optional[int] = None
  kept_backward_s: Optional[float] = None
  kept_backward_peak_bytes: Optional[int] = None
  input_backward_s: Optional[float] = None
  input_backward_peak_bytes: Optional[int] = None
  weight_backward_s: Optional[float] = None
  weight_backward_peak_bytes: Optional[int] = None
  carry_bytes: int = 0
  weight_read_bytes: int = 0


# Ops whose output shares its input's buffer: a kept view costs nothing
# beyond what it views.
_ALIASING_OPS = ('Reshape', 'ExpandDims', 'Squeeze', 'Identity',
                 'StopGradient')


def _IsWholeSlice(t: tf.Tensor) -> bool:
  """A StridedSlice that takes all of its input, in order (x[:, ::1]):
  TF's kernel returns the input's buffer."""
  if t.op.type != 'StridedSlice':
    return False
  source, strides = t.op.inputs[0], tf.get_static_value(t.op.inputs[3])
  return (strides is not None and all(s == 1 for s in strides) and
          t.shape.is_fully_defined() and t.shape == source.shape)


def _Bytes(tensors: Any) -> int:
  return sum(int(t.shape.num_elements()) * t.dtype.size
             for t in tf.nest.flatten(tensors))


def _GradientFn(layer: Any, args: Tuple[Any, ...], out: Any,
                input_gradient: bool = True) -> Any:
  """(tf.function, its inputs): the forward again, then d(outputs) /
  d(inputs, variables) for given output gradients, as a partition's
  backward task does; without `input_gradient`, d(outputs) / d(variables)
  only, as the pipeline's first partition does when its inputs come from
  no variable (images: pipeline_run leaves their gradient out)."""
  x_leaves = tf.nest.flatten(args)
  dy = [tf.ones_like(t) if residuals.IsFloat(t) else None
        for t in tf.nest.flatten(out)]
  dy_at = [i for i, d in enumerate(dy) if d is not None]

  def Step(*inputs):
    x, dy_given = list(inputs[:len(x_leaves)]), inputs[len(x_leaves):]
    theta = layer.theta.Transform(tf.convert_to_tensor)
    theta_leaves = theta.Flatten()
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
      sources = x if input_gradient else []
      tape.watch([t for t in sources + theta_leaves if residuals.IsFloat(t)])
      y = tf.nest.flatten(layer.FProp(
          theta.Pack(theta_leaves), *tf.nest.pack_sequence_as(args, x)))
    full_dy = [None] * len(y)
    for i, d in zip(dy_at, dy_given):
      full_dy[i] = d
    return residuals.Gradients(tape, y, full_dy, sources, theta_leaves)

  return (tf.function(Step, autograph=False),
          tuple(x_leaves) + tuple(dy[i] for i in dy_at))


def AllocatorDevice() -> Optional[str]:
  """The profiled device ('GPU:0' or 'CPU:0') if TF's allocator keeps
  statistics for it, else None: a CPU with TF's default allocator and no
  TF_CPU_ALLOCATOR_USE_BFC=true. Where TensorFlow turns oneDNN on (its
  default on CPUs with AVX-512, seen on an AMD EPYC) the CPU allocator is
  oneDNN's, which keeps them; with TF_ENABLE_ONEDNN_OPTS=0 it kept none."""
  name = 'GPU:0' if tf.config.list_logical_devices('GPU') else 'CPU:0'
  try:
    tf.config.experimental.get_memory_info(name)
  except ValueError:
    return None
  return name


def PeakBytes(fn: Any, inputs: Tuple[Any, ...], device: Optional[str],
              num_runs: int = 3) -> Optional[int]:
  """Bytes the allocator's peak rises above what it holds before a call of
  the (warmed-up) function `fn`, the most of `num_runs` calls (with
  two threads the executor's order, and so the peak, varies); None
  without statistics."""
  if device is None:
    return None
  most = 0
  for _ in range(num_runs):
    tf.config.experimental.reset_memory_stats(device)
    before = tf.config.experimental.get_memory_info(device)['current']
    result = fn(*inputs)
    tf.test.experimental.sync_devices()
    most = max(most,
               tf.config.experimental.get_memory_info(device)['peak'] - before)
    del result
  return most


def _Current(allocator: Optional[str]) -> Optional[int]:
  """Bytes the allocator holds now (None without statistics)."""
  if allocator is None:
    return None
  tf.test.experimental.sync_devices()
  return tf.config.experimental.get_memory_info(allocator)['current']


def _StageFunction(fn: Callable[..., Any]) -> Any:
  """`fn` as the pipeline makes a stage's function: a tf.function that the
  graph calling it does not inline (stage_function.OnDevice)."""
  return tf.function(fn, autograph=False,
                     experimental_attributes={'_noinline': True})


def _SplitCellOf(layer: Any, args: Tuple[Any, ...]
                 ) -> Tuple[residuals.SplitCell, List[Any], List[Any]]:
  """(the layer as the pipeline's kept-activation cell, its theta leaves,
  its input leaves), the cell's forward traced."""

  def Cell(theta_leaves, x):
    theta = layer.theta.Pack(theta_leaves)
    return tf.nest.flatten(layer.FProp(
        theta, *tf.nest.pack_sequence_as(args, x)))

  cell = residuals.SplitCell(layer.params.name, Cell, _StageFunction)
  x = tf.nest.flatten(args)
  theta_leaves = [tf.convert_to_tensor(v) for v in layer.theta.Flatten()]
  cell.Forward(theta_leaves, x)
  return cell, theta_leaves, x


def _KeptBytes(split: residuals.SplitCell, theta_leaves: List[Any],
               x: List[Any], only: Optional[List[int]] = None
               ) -> Tuple[int, int]:
  """(residual bytes, bytes of the inputs read) of the cell's gradient;
  with `only`, of those residuals alone."""
  graph = split.forward_function.get_concrete_function(theta_leaves,
                                                       x).graph
  _, kept = graph.structured_outputs
  sources = {}
  for t in (kept if only is None else [kept[i] for i in only]):
    while t.op.type in _ALIASING_OPS or _IsWholeSlice(t):
      t = t.op.inputs[0]
    if t.op.type != 'Placeholder':  # not a view of an input or variable
      sources[t.name] = t
  read = sum(_Bytes(x[i]) for i in split.InputsRead())
  return _Bytes(list(sources.values())), read


def _KeptBackward(name: str, cell: residuals.SplitCell,
                  theta_leaves: List[Any], x: List[Any],
                  allocator: Optional[str]
                  ) -> Tuple[Dict[str, Any], Dict[str, Callable[[], Any]]]:
  """(the peaks and bytes of the module docstring's kept_*, input_*,
  weight_*, carry_bytes and weight_read_bytes, by field name; the three
  backward calls to time, warmed up), for output gradients of ones."""
  halves = backward_split.BackwardSplit(cell, name, _StageFunction)
  # What the forward leaves held, the least of three calls: the allocator
  # counts whole chunks, so a block that lands in a larger free chunk
  # reads more (0.86 MiB more, seen in a process with a history). Its
  # outputs are let go first: they leave the stage (the next stage's
  # inputs, counted there, or the last stage's output) and stay only
  # where its gradient reads them (AmoebaNet-D's first three layers
  # held 25.6 MiB a micro-batch with their 3.5 MiB output, the pipeline's
  # first worker 22.2 after its forwards).
  held = []
  for _ in range(3):
    kept = None  # the last call's, let go before this one's reading
    before = _Current(allocator)
    kept = list(cell.Forward(theta_leaves, x)[1])
    if before is not None:
      held.append(_Current(allocator) - before)
  y, kept = cell.Forward(theta_leaves, x)
  y, kept = list(y), list(kept)
  dy = [tf.ones_like(t) if residuals.IsFloat(t) else None for t in y]
  acc = [tf.zeros_like(t) if residuals.IsFloat(t) else None
         for t in theta_leaves]
  _, carry = halves.Input(theta_leaves, x, kept, dy, y)
  # Each stage function (not inlined, _StageFunction) is called from a
  # tf.function of no arguments, as the pipeline's graph calls it: called
  # eagerly, its hundreds of inputs cost milliseconds of Python
  # (AmoebaNet-D (6, 16), 530 residuals: B 34.5 ms against 29.5), and
  # inlined into its caller it ran 7-20% faster than in the pipeline.
  calls = {what: tf.function(fn, autograph=False) for what, fn in {
      'kept': lambda: cell.Backward(theta_leaves, x, kept, dy, y, acc),
      'input': lambda: halves.Input(theta_leaves, x, kept, dy, y),
      'weight': lambda: halves.Weight(theta_leaves, x, kept, dy, y, carry,
                                      acc)}.items()}
  read = halves.WeightResiduals(theta_leaves, x, kept, dy, y)
  out = {'kept_residual_bytes': min(held) if held else None,
         'carry_bytes': _Bytes(carry),
         'weight_read_bytes': _KeptBytes(cell, theta_leaves, x, read)[0]}
  for what, call in calls.items():
    call()  # traced before the allocator's peak is read
    out[f'{what}_backward_peak_bytes'] = PeakBytes(call, (), allocator)
  return out, calls


def _ProfileOne(p: hyperparams.Params, args: Tuple[Any, ...],
                optimizer_p: Optional[hyperparams.Params], num_runs: int,
                allocator: Optional[str],
                ready: Optional[Callable[[], Any]] = None,
                input_gradient: bool = True, keeps_activations: bool = False
                ) -> Tuple[LayerProfile, Any, Tuple[Any, Any]]:
  """(the layer's profile, its outputs, (its gradient step, the step's
  inputs)). Everything but the timing comes first; `ready`, if given, is
  called just before the timing starts; `input_gradient` as _GradientFn's,
  `keeps_activations` as ProfileLayers'."""
  layer = p.Instantiate()
  layer.SetTraining(True)
  fprop = tf.function(lambda *a: layer.FProp(layer.theta, *a),
                      autograph=False)
  out = fprop(*args)
  grad_fn, grad_inputs = _GradientFn(layer, args, out, input_gradient)
  grad_fn(*grad_inputs)  # traced before the allocator's peak is read
  backward_peak = PeakBytes(grad_fn, grad_inputs, allocator)
  cell, theta_leaves, x = _SplitCellOf(layer, args)
  residual_bytes, read_bytes = _KeptBytes(cell, theta_leaves, x)
  kept, calls = {}, {}
  if keeps_activations:
    kept, calls = _KeptBackward(p.name, cell, theta_leaves, x, allocator)
  variables = [v for v in layer.vars.Flatten() if v.trainable]
  slot_bytes = 0
  if optimizer_p is not None and variables:
    opt = optimizer_p.Copy().Set(name='planner_slots').Instantiate()
    opt.CreateSlots({f'v{i}': v for i, v in enumerate(variables)})
    slot_bytes = sum(_Bytes(s) for s in opt.SlotVariables().values()
                     if s.shape.rank)  # the step counter is a scalar
  if ready is not None:
    ready()
  forward_s, out = partitioner.MedianSeconds(fprop, args, num_runs)
  both_s, _ = partitioner.MedianSeconds(grad_fn, grad_inputs, num_runs)
  for what, call in calls.items():
    kept[f'{what}_backward_s'] = partitioner.MedianSeconds(call, (),
                                                           num_runs)[0]
  profile = LayerProfile(
      name=p.name, forward_s=forward_s,
      backward_s=max(both_s - forward_s, 0.0),
      residual_bytes=residual_bytes, input_read_bytes=read_bytes,
      input_bytes=_Bytes(args), output_bytes=_Bytes(out),
      num_params=sum(int(v.shape.num_elements()) for v in variables),
      param_bytes=sum(_Bytes(v) for v in variables), slot_bytes=slot_bytes,
      backward_peak_bytes=backward_peak, **kept)
  return profile, out, (grad_fn, grad_inputs)


def _Typed(p: hyperparams.Params, dtype: tf.DType) -> hyperparams.Params:
  """A copy of `p` with `dtype` where it has none."""
  q = p.Copy()
  if q.dtype is None:
    q.dtype = dtype
  return q


def ProfileLayers(layers: Sequence[hyperparams.Params], input_shapes: Any,
                  dtype: tf.DType = tf.float32,
                  optimizer_p: Optional[hyperparams.Params] = None,
                  num_runs: int = 5,
                  input_gradient: bool = True,
                  keeps_activations: bool = False) -> List[LayerProfile]:
  """One LayerProfile per layer, in order (module docstring).

  Args:
    layers: layer params applied in order (copied; empty names become
      `layer_{i}`, as the partitioner names them).
    input_shapes: the first layer's inputs for one micro-batch
      (partitioner.PartitionWithReport's input_shapes).
    dtype: dtype of layers whose params leave it None.
    optimizer_p: the training optimizer's params, to count its slots; None
      counts none.
    num_runs: timed runs per measurement, after one warm-up.
    input_gradient: whether the first layer's backward also makes the
      gradient of its inputs. The pipeline leaves it out when its inputs
      come from no variable (images, a batch): then pass False, or the
      first layer's backward is measured with work the step does not do
      (model_pipeline.ModelPipeline.input_gradient says for a model).
    keeps_activations: also measure the backward as a stage that keeps
      its activations runs it (recompute 'never'), whole and in a
      zero-bubble table's two halves (kept_*, input_*, weight_*,
      carry_bytes).
  """
  layer_ps = partitioner.NamedCopies(layers)
  args = partitioner.RandomInputs(
      partitioner.InputArgs(input_shapes),
      partitioner.LayerDtype(layer_ps[0], dtype))
  profiles = []
  allocator = AllocatorDevice()
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel('ERROR')  # one tf.function per layer: TF warns retracing
  try:
    for i, p in enumerate(layer_ps):
      profile, out, _ = _ProfileOne(_Typed(p, dtype), args, optimizer_p,
                                    num_runs, allocator,
                                    input_gradient=input_gradient or i > 0,
                                    keeps_activations=keeps_activations)
      profiles.append(profile)
      args = out if isinstance(out, tuple) else (out,)
  finally:
    logger.setLevel(level)
  return profiles


def ProfilePartitions(layers: Sequence[hyperparams.Params],
                      bounds: Sequence[int], input_shapes: Any,
                      dtype: tf.DType = tf.float32,
                      optimizer_p: Optional[hyperparams.Params] = None,
                      num_runs: int = 5,
                      input_gradient: bool = True,
                      keeps_activations: bool = False) -> List[LayerProfile]:
  """One LayerProfile per partition of the split `bounds`: its layers as
  one SequentialLayer (named `partition_{k}`), as the pipeline runs them.

  Per-layer profiles add up to more than a partition holds: the executor
  starts a layer's gradient ops while later ones still run and frees
  residuals early, so summed residuals and backward peaks over-count
  (AmoebaNet-D, 10 layers in one partition: 259 MiB from the layers,
  220 measured whole and in the pipeline; docs/DESIGN.md section 18).
  Arguments as ProfileLayers'.
  """
  # ProfileLayers gives each partition `dtype` where it has none, and its
  # layers inherit it from there.
  parts = partitioner.Cells(partitioner.NamedCopies(layers), bounds,
                            prefix='partition')
  return ProfileLayers(parts, input_shapes, dtype, optimizer_p, num_runs,
                       input_gradient, keeps_activations)


def ProfilePartitionsTogether(layers: Sequence[hyperparams.Params],
                              bounds: Sequence[int], input_shapes: Any,
                              cores: Sequence[int],
                              dtype: tf.DType = tf.float32,
                              optimizer_p: Optional[hyperparams.Params] = None,
                              num_runs: int = 5,
                              timeout: float = 1800.0,
                              input_gradient: bool = True,
                              keeps_activations: bool = False,
                              num_virtual_stages: int = 1
                              ) -> List[LayerProfile]:
  """ProfilePartitions' profiles, measured all at once as K worker
  processes on this host run them: partition k in a child process pinned
  to `cores[k]`, each measured while the others run theirs (and, once
  done, run its gradient step in a loop until every partition is
  measured). With `num_virtual_stages` V > 1, the S partitions are the
  stages of K = S / V workers, stage s on worker s mod K (interleaved
  1F1B's placement): worker k's child measures its V stages one after
  another, beside the other workers' children.

  Partitions that share a host's caches and memory slow each other: on
  this machine AmoebaNet-D's first partition's backward took 19% longer
  with the other core busy (docs/DESIGN.md section 18). Each child
  measures partition k on the real outputs of partitions 0..k-1 (run once
  before the barrier), as ProfilePartitions does, and
  keeps allocator statistics if this process's environment asks for them
  (TF_CPU_ALLOCATOR_USE_BFC; children inherit it). Other arguments as
  ProfilePartitions'; `timeout` bounds the whole measurement in seconds.
  """
  parts = [_Typed(p, dtype) for p in partitioner.Cells(
      partitioner.NamedCopies(layers), bounds, prefix='partition')]
  cores, v = list(cores), num_virtual_stages
  if v < 1 or len(parts) % v:
    raise ValueError(
        f'num_virtual_stages={v} must divide the {len(parts)} partitions; '
        'change V or the split.')
  k_workers = len(parts) // v
  if len(cores) < k_workers:
    what = (f'{len(parts)} partitions' if v == 1 else
            f'{len(parts)} stages, {v} a worker, on {k_workers} workers')
    raise ValueError(
        f'{what} need {k_workers} cores, got cores={cores}: give one core '
        f'per {"partition" if v == 1 else "worker"}.')
  cores = cores[:k_workers]
  if len(set(cores)) < len(cores):
    raise ValueError(
        f'cores={cores} repeats a core: partitions on one core take turns '
        'and would time each other; give distinct cores.')
  bad = [c for c in cores if not 0 <= c < (os.cpu_count() or 1)]
  if bad:
    raise ValueError(
        f'cores={cores}: {bad} not on this machine, which has cores 0 to '
        f'{(os.cpu_count() or 1) - 1}.')
  ctx = multiprocessing.get_context('spawn')  # TF does not survive fork
  barrier, stop, results = ctx.Barrier(k_workers), ctx.Event(), ctx.Queue()
  stages = [list(range(k, len(parts), k_workers)) for k in range(k_workers)]
  procs = [ctx.Process(
      target=_TogetherChild, daemon=True,
      args=(stages[k], core, parts, input_shapes, dtype, optimizer_p,
            num_runs, barrier, stop, results, input_gradient,
            keeps_activations))
           for k, core in enumerate(cores)]
  got = {}
  deadline = time.monotonic() + timeout
  try:
    for proc in procs:
      proc.start()
    while len(got) < len(parts):
      try:
        k, profile, error = results.get(timeout=1.0)
      except queue.Empty:
        lost = [k for k, proc in enumerate(procs)
                if proc.exitcode is not None and set(stages[k]) - set(got)]
        if lost:
          _RaiseChildError(results, lost[0], stages, cores, procs)
        if time.monotonic() > deadline:
          raise TimeoutError(
              f'profiling {len(parts)} partitions together took over '
              f'{timeout:.0f} s; raise the timeout or profile fewer runs.'
          ) from None
        continue
      if error:
        raise RuntimeError(error)
      got[k] = profile
  finally:
    stop.set()
    for proc in procs:
      proc.join(timeout=60)
      if proc.is_alive():
        proc.terminate()
        proc.join()
  return [got[k] for k in range(len(parts))]


def _RaiseChildError(results: Any, k: int, stages: List[List[int]],
                     cores: List[int], procs: List[Any]) -> None:
  """Raises the first error a child reported, or why child k ended."""
  try:
    _, _, error = results.get(timeout=5.0)
  except queue.Empty:
    error = None
  if error:
    raise RuntimeError(error)
  which = ('partition ' if len(stages[k]) == 1 else 'partitions ') + (
      ' and '.join(map(str, stages[k])))
  raise RuntimeError(
      f'the process profiling {which} on core {cores[k]} ended '
      f'(exit code {procs[k].exitcode}) before its profile: if it was '
      'killed for memory, profile fewer micro-batches\' worth at once.')


def _TogetherChild(stages: List[int], core: int,
                   parts: List[hyperparams.Params], input_shapes: Any,
                   dtype: tf.DType,
                   optimizer_p: Optional[hyperparams.Params], num_runs: int,
                   barrier: Any, stop: Any, results: Any,
                   input_gradient: bool, keeps_activations: bool) -> None:
  """ProfilePartitionsTogether's partitions `stages` (one worker's), in
  their own process."""
  s = stages[0]
  try:
    # Before TensorFlow makes its thread pools, which size to the cores.
    os.sched_setaffinity(0, {core})
    cluster.EnsureInterOpThreads()
    tf.get_logger().setLevel('ERROR')
    args = partitioner.RandomInputs(
        partitioner.InputArgs(input_shapes),
        partitioner.LayerDtype(parts[0], dtype))
    inputs = {}
    for q, p in enumerate(parts[:stages[-1] + 1]):  # the real inputs
      inputs[q] = args
      if q < stages[-1]:
        layer = p.Instantiate()
        layer.SetTraining(True)
        out = tf.function(lambda *a, lay=layer: lay.FProp(lay.theta, *a),
                          autograph=False)(*args)
        args = out if isinstance(out, tuple) else (out,)
    # All workers' first stages time at once, after every one's tracing
    # and memory readings, so each is timed beside running neighbours; a
    # worker's later stages beside whatever its neighbour then runs.
    ready = barrier.wait
    for s in stages:
      profile, _, (step, step_inputs) = _ProfileOne(
          parts[s], inputs[s], optimizer_p, num_runs, AllocatorDevice(),
          ready=ready, input_gradient=input_gradient or s > 0,
          keeps_activations=keeps_activations)
      ready = None
      results.put((s, profile, None))
  except threading.BrokenBarrierError:
    return  # another partition failed first and said why
  except Exception as err:  # pylint: disable=broad-except
    results.put((s, None, f'profiling partition {s} on core {core} failed: '
                 f'{type(err).__name__}: {err}'))
    barrier.abort()
    return
  while not stop.is_set():  # stay a busy neighbour
    step(*step_inputs)
