"""One pipelined FProp and its gradient: the tasks of `schedule.py` as ops.

Each partition's work is traced once per FProp, as `tf.function`s that
the schedule then calls once per micro-batch, so the graph has K x M call
ops instead of K x M copies of the layers (docs/DESIGN.md section 2):

  Forward_k(theta_k, x) -> y                 partition k's cell
  Backward_k(theta_k, x, dy) -> dx, dtheta   re-computes the cell under a
                                             tape, then its gradient
  Accumulate_k(acc, dtheta) -> acc + dtheta

A partition that keeps its activations (recompute 'never', the last one
with 'except_last') uses `residuals.SplitCell` instead: a forward that also
returns the tensors its gradient reads, and a backward that reads them.

`PipelineRun.Call(leaves)` is a `tf.custom_gradient` function of the input
tensors and every partition's theta tensors:

  forward:   split inputs into M micro-batches (device 0)
             for each F(k, m) in schedule order:
               on device k, after F(k, m-1):  y[k][m] = Forward_k(x[k][m])
               (keeping: y[k][m], r[k][m] = forward(x[k][m]), r kept
               until B(k, m))
             concat y[K-1][*] (device K-1)
  backward:  split dy into M (device K-1)
             for each B(k, m) in schedule order:
               on device k, after B(k, m+1):
                 keeping: dx, dtheta = backward(r[k][m], dy[k][m])
                 else, once dy[k][m] is also here:
                   dx, dtheta = Backward_k(theta_k, x[k][m], dy[k][m])
                 acc_k = dtheta (m = M-1), else Accumulate_k(acc_k, dtheta)
             concat dx[0][*] (device 0)

"after" is a control dependency on the previous task of the same device,
so each device runs its tasks in schedule order whatever the executor
would prefer. Backward_k traces the cell under `NoStatUpdates`, so
statistics (BatchNorm) are accumulated once per micro-batch. The
functions are marked `_noinline`: the runtime runs each call as one
function instead of pasting K x M copies of the layers back into the
graph, so start-up does not grow with M either.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import residuals
from lingvo_pipe.core import schedule

# Function attributes of every partition function (see module docstring).
_FUNCTION_ATTRIBUTES = {'_noinline': True}


def ShareCallBodies() -> None:
  """Stops Grappler from copying a partition function for each call.

  Grappler's function optimizer specialises a non-inlined call to its call
  site (when an input is a constant or an output goes unused), and calls
  that differ get their own copy of the body, each instantiated and
  optimised on the first step: start-up then grows with M again
  (docs/DESIGN.md section 2). This turns that optimizer off for the
  process; the runtime still inlines every ordinary (not `_noinline`)
  function call. `devices.SplitCpu`, `cluster.Connect` and the trainer
  call it; call it yourself before the first step of your own loop.
  """
  tf.config.optimizer.set_experimental_options(
      {'function_optimization': False})


def CallBodiesShared() -> bool:
  """Whether `ShareCallBodies` is in force."""
  return tf.config.optimizer.get_experimental_options().get(
      'function_optimization') is False


def _After(deps: Sequence[tf.Tensor]) -> Any:
  """A scope whose ops run only after the ops producing `deps`."""
  return tf.control_dependencies(list(deps))


def _FirstLine(err: Exception) -> str:
  text = str(err).strip().splitlines()
  return text[0] if text else type(err).__name__


def _Shapes(structure: Any) -> str:
  return str(tf.nest.map_structure(lambda t: t.shape.as_list(), structure))


def _OnDevice(fn: Callable[..., Any], device: str) -> Callable[..., Any]:
  """`fn` as a non-inlined tf.function whose every op is on `device`."""

  def Body(*args):
    with tf.device(device):
      return fn(*args)

  Body.__name__ = fn.__name__
  return tf.function(Body, autograph=False,
                     experimental_attributes=_FUNCTION_ATTRIBUTES)


class PipelineRun:
  """The ops of one FProp of a PipeliningLayer (see module docstring)."""

  def __init__(self, layer: Any, num_micro_batches: int, in_structure: Any,
               thetas: List[Any], devices: List[str]):
    self._layer = layer
    self._cells = layer.cells
    self._devices = list(devices)
    self._axis = layer.params.batch_dim
    self._k = len(self._cells)
    self._m = num_micro_batches
    self._thetas = thetas
    self._out_structure = None
    # Per (k, m): the partition's input leaves, and when it keeps its
    # activations, its outputs and residuals.
    self._x: Dict[Tuple[int, int], List[tf.Tensor]] = {}
    self._kept: Dict[Tuple[int, int],
                     Tuple[List[tf.Tensor], List[tf.Tensor]]] = {}
    # Partition k's input structure (k = 0: the pipeline's inputs).
    self._structures: Dict[int, Any] = {0: in_structure}
    # Full-batch outputs, and each device's last forward task's outputs.
    self._outputs: List[tf.Tensor] = []
    self._last_forward: Dict[int, List[tf.Tensor]] = {}
    self._forward_fns = [_OnDevice(self._ForwardFn(k), d)
                         for k, d in enumerate(self._devices)]
    self._backward_fns = [_OnDevice(self._BackwardFn(k), d)
                          for k, d in enumerate(self._devices)]
    self._accumulate_fns = [_OnDevice(_Accumulate, d) for d in self._devices]
    self._split_cells = {
        k: residuals.SplitCell(f'cell_{k}', self._ForwardFn(k),
                               lambda fn, d=d: _OnDevice(fn, d))
        for k, d in enumerate(self._devices)
        if layer._KeepsActivations(k)}  # pylint: disable=protected-access

  # ---- the partition functions ------------------------------------------

  def _ForwardFn(self, k: int) -> Callable[..., Any]:
    def Forward(theta_leaves, x):
      return self._Cell(k, list(theta_leaves), list(x))
    Forward.__name__ = f'cell_{k}_forward'
    return Forward

  def _BackwardFn(self, k: int) -> Callable[..., Any]:
    def Backward(theta_leaves, x, dy):
      theta_leaves, x = list(theta_leaves), list(x)
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape, self._cells[k].NoStatUpdates():
        tape.watch([t for t in x + theta_leaves if residuals.IsFloat(t)])
        y = self._Cell(k, theta_leaves, x)
      return residuals.Gradients(tape, y, list(dy), x, theta_leaves)
    Backward.__name__ = f'cell_{k}_backward'
    return Backward

  # ---- forward ---------------------------------------------------------

  def Call(self, leaves: List[tf.Tensor]) -> Any:
    theta_leaves = [tf.nest.flatten(t) for t in self._thetas]
    sizes = [len(t) for t in theta_leaves]
    num_in = len(leaves)

    @tf.custom_gradient
    def Run(*args):
      xs = list(args[:num_in])
      flat_thetas, start = [], num_in
      for size in sizes:
        flat_thetas.append(list(args[start:start + size]))
        start += size
      outputs = self._Forward(xs, flat_thetas)

      def Grad(*dys):
        return self._Backward(list(dys), flat_thetas)

      return outputs, Grad

    flat_theta_args = [x for t in theta_leaves for x in t]
    flat_out = Run(*leaves, *flat_theta_args)
    if not isinstance(flat_out, (list, tuple)):
      flat_out = [flat_out]
    return tf.nest.pack_sequence_as(self._out_structure, list(flat_out))

  def _Split(self, leaves: List[Optional[tf.Tensor]], device: str
             ) -> List[List[Optional[tf.Tensor]]]:
    """[leaf] -> [micro-batch][leaf]; a None leaf stays None."""
    with tf.device(device), tf.name_scope('split'):
      parts = [[None] * self._m if x is None else
               tf.split(x, self._m, axis=self._axis) for x in leaves]
    return [[p[m] for p in parts] for m in range(self._m)]

  def _Concat(self, per_micro: List[List[Optional[tf.Tensor]]], device: str
              ) -> List[Optional[tf.Tensor]]:
    """[micro-batch][leaf] -> [leaf], None where a leaf has no values."""
    out = []
    with tf.device(device), tf.name_scope('concat'):
      for i in range(len(per_micro[0])):
        column = [row[i] for row in per_micro]
        if any(c is None for c in column):
          out.append(None)
        else:
          out.append(tf.concat(column, axis=self._axis))
    return out

  def _Forward(self, xs: List[tf.Tensor],
               thetas: List[List[tf.Tensor]]) -> List[tf.Tensor]:
    micro = self._Split(xs, self._devices[0])
    state = {(0, m): micro[m] for m in range(self._m)}
    last_on_device = self._last_forward
    outputs = [None] * self._m
    for task in schedule.GPipeSchedule(self._k, self._m, backward=False):
      k, m = task.partition, task.micro_batch
      with tf.device(self._devices[k]), tf.name_scope(f'cell_{k}/fwd_{m}'):
        x = state.pop((k, m))
        self._x[(k, m)] = x
        with _After(last_on_device.get(k, [])):
          y_leaves = self._RunForward(k, m, thetas[k], x)
      self._CheckBatch(k, m, y_leaves)
      last_on_device[k] = y_leaves
      if k + 1 < self._k:
        state[(k + 1, m)] = y_leaves
      else:
        outputs[m] = y_leaves
    self._out_structure = self._structures[self._k]
    self._outputs = self._Concat(outputs, self._devices[-1])
    return self._outputs

  def _RunForward(self, k: int, m: int, theta_leaves: List[tf.Tensor],
                  x: List[tf.Tensor]) -> List[tf.Tensor]:
    if k not in self._split_cells:
      return list(self._forward_fns[k](theta_leaves, x))
    y, kept = self._split_cells[k].Forward(theta_leaves, x)
    self._kept[(k, m)] = (list(y), list(kept))
    return list(y)

  def _Cell(self, k: int, theta_leaves: List[tf.Tensor],
            x: List[tf.Tensor]) -> List[tf.Tensor]:
    """Partition k's cell on flat leaves; records its output structure."""
    inputs = tf.nest.pack_sequence_as(self._structures[k], x)
    try:
      out = self._cells[k].FProp(
          tf.nest.pack_sequence_as(self._thetas[k], theta_leaves), inputs)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
      source = ('the pipeline inputs' if k == 0 else
                f"the output of partition {k - 1} ('cell_{k - 1}')")
      raise ValueError(
          f"PipeliningLayer '{self._layer.path}': partition {k} "
          f"('cell_{k}') cannot take {source} of shapes {_Shapes(inputs)}: "
          f'{_FirstLine(err)}') from err
    self._structures[k + 1] = out
    return tf.nest.flatten(out)

  def _CheckBatch(self, k: int, m: int, leaves: List[tf.Tensor]) -> None:
    want = self._x[(k, m)][0].shape[self._axis]
    for y in leaves:
      if y.shape.rank is None or y.shape.rank <= self._axis or (
          y.shape[self._axis] != want):
        raise ValueError(
            f"PipeliningLayer '{self._layer.path}': partition {k} "
            f"('cell_{k}') returned shape {y.shape}; every output needs "
            f'the micro-batch ({want}) on axis {self._axis}.')

  # ---- backward --------------------------------------------------------

  def _Backward(self, dys: List[Optional[tf.Tensor]],
                thetas: List[List[tf.Tensor]]) -> List[Optional[tf.Tensor]]:
    # An output without a gradient (None) stays None: it contributes
    # nothing, and a zero tensor here would be a constant that Grappler
    # specialises every call of the last partition's backward for.
    last = self._devices[-1]
    dys = [dy if residuals.IsFloat(y) else None
           for dy, y in zip(dys, self._outputs)]
    micro_dy = self._Split(dys, last)
    dstate = {(self._k - 1, m): micro_dy[m] for m in range(self._m)}
    acc: List[Optional[List[Optional[tf.Tensor]]]] = [None] * self._k
    last_on_device = dict(self._last_forward)
    dx0: List[Optional[List[Optional[tf.Tensor]]]] = [None] * self._m
    for task in schedule.GPipeSchedule(self._k, self._m):
      if task.phase != 'B':
        continue
      k, m = task.partition, task.micro_batch
      with tf.device(self._devices[k]), tf.name_scope(f'cell_{k}/bwd_{m}'):
        dx, dtheta = self._BackwardTask(
            k, m, thetas[k], dstate.pop((k, m)), last_on_device[k])
        acc[k] = dtheta if acc[k] is None else self._Add(k, acc[k], dtheta)
      last_on_device[k] = [t for t in dx + acc[k] if t is not None]
      if k > 0:
        dstate[(k - 1, m)] = dx
      else:
        dx0[m] = dx
    dxs = self._Concat(dx0, self._devices[0])
    return dxs + [g for part in acc for g in part]

  def _Add(self, k: int, acc: List[Optional[tf.Tensor]],
           dtheta: List[Optional[tf.Tensor]]) -> List[Optional[tf.Tensor]]:
    """acc + dtheta leaf by leaf, in one call; None leaves stay None."""
    where = [i for i, g in enumerate(dtheta) if g is not None]
    if not where:
      return list(acc)
    sums = self._accumulate_fns[k]([acc[i] for i in where],
                                   [dtheta[i] for i in where])
    out = list(acc)
    for i, s in zip(where, sums):
      out[i] = s
    return out

  def _BackwardTask(self, k: int, m: int, theta_leaves: List[tf.Tensor],
                    dy: List[Optional[tf.Tensor]], after: List[tf.Tensor],
                    ) -> Tuple[List[Optional[tf.Tensor]],
                               List[Optional[tf.Tensor]]]:
    """B(k, m): (d inputs, d theta_k), each None where not floating."""
    x = self._x.pop((k, m))
    if k in self._split_cells:
      y, kept = self._kept.pop((k, m))
      with _After(after):
        return self._split_cells[k].Backward(theta_leaves, x, kept, dy, y)
    # Re-compute only once this device's previous backward is done AND
    # the gradient from partition k+1 is here (a data input of the call):
    # otherwise the executor may re-compute while partition k+1 is still
    # busy and hold this partition's activations meanwhile.
    with _After(after):
      dx, dtheta = self._backward_fns[k](theta_leaves, x, dy)
    return list(dx), list(dtheta)


def _Accumulate(acc, dtheta):
  return [a + g for a, g in zip(acc, dtheta)]
