"""The functions one pipeline call runs per stage, traced once each.

`Stages` is what a PipeliningLayer hands a call (gpipe.py): its cells,
devices, placement, recompute mode and replicas, as plain arguments.
`StageCalls` makes each stage's `stage_function.OnDevice` functions on its
device (pipeline_run.py's module docstring lists them):

  forward[s](theta, x) -> y                  the cell
  backward[s](theta, x, dy, acc[, clock])    re-computes the cell under a
    -> dx, acc + dtheta[, recomputed]        tape, then its gradient
  kept[s]                                    a stage keeping its
                                             activations (residuals.py)
  halves[s]                                  its B and W, for tables that
                                             split backwards
                                             (backward_split.py)
  Stage0(...)                                stage 0's backward, and its
                                             input gradient apart when
                                             nobody may need it
                                             (input_gradient.py)

and records each stage's input structure as the cells are traced.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import backward_split
from lingvo_pipe.core import hand_offs
from lingvo_pipe.core import input_gradient
from lingvo_pipe.core import residuals
from lingvo_pipe.core import stage_function
from lingvo_pipe.core import stamps

Leaves = List[Optional[tf.Tensor]]
Call = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Stages:
  """What a call needs of its pipeline, from the layer (gpipe.py).

  `device_names[d]` is pipeline device d of this replica, `placement[s]`
  stage s's device (the schedule's, one for every replica), `mirrors[s]`
  stage s's device in each replica (one entry without replicas).
  """
  path: str  # the layer's, for errors
  cells: Sequence[Any]
  device_names: Sequence[str]
  placement: Sequence[int]
  keeps_activations: Sequence[bool]  # per stage: the recompute mode's
  batch_dim: int = 0
  hand_off_dtype: Optional[tf.DType] = None
  replica: int = 0
  mirrors: Sequence[Sequence[str]] = ()

  @property
  def devices(self) -> List[str]:
    """Each stage's device in this replica."""
    return [self.device_names[d] for d in self.placement]

  @property
  def num_replicas(self) -> int:
    return len(self.mirrors[0]) if self.mirrors else 1


def _FirstLine(err: Exception) -> str:
  text = str(err).strip().splitlines()
  return text[0] if text else type(err).__name__


def _Shapes(structure: Any) -> str:
  return str(tf.nest.map_structure(lambda t: t.shape.as_list(), structure))


def _Floats(leaves: Sequence[Optional[tf.Tensor]]) -> List[tf.Tensor]:
  return [t for t in leaves if t is not None and residuals.IsFloat(t)]


class StageCalls:
  """Every stage's functions for one call (module docstring)."""

  def __init__(self, stages: Stages, in_structure: Any, thetas: List[Any]):
    self.where = f"PipeliningLayer '{stages.path}'"
    self._cells = list(stages.cells)
    self._thetas = thetas
    self._axis = stages.batch_dim
    self.dtype = stages.hand_off_dtype
    self.devices = stages.devices
    # Stage s's input structure (s = 0: the pipeline's inputs; S: its
    # outputs), as the traced cells return them.
    self.structures: Dict[int, Any] = {0: in_structure}
    self.forward = [stage_function.OnDevice(self._ForwardFn(s), d)
                    for s, d in enumerate(self.devices)]
    self.backward = [stage_function.OnDevice(self._BackwardFn(s, d), d)
                     for s, d in enumerate(self.devices)]
    self.kept = {
        s: residuals.SplitCell(f'cell_{s}', self._ForwardFn(s),
                               lambda fn, d=d: stage_function.OnDevice(fn, d))
        for s, d in enumerate(self.devices) if stages.keeps_activations[s]}
    self.halves: Dict[int, backward_split.BackwardSplit] = {}
    self._stage_0: Optional[Tuple[Call, Optional[Call]]] = None

  def CastTheta(self, theta: List[Leaves]) -> List[Leaves]:
    """Each stage's theta leaves as its functions read them: with a
    hand-off dtype each trainable floating leaf cast to it once per call,
    on the stage's device (cast inside, every micro-batch would make its
    own copy of the weights, and a stage keeping its activations keep
    them all); the gradient sums stay in the variables' dtype."""
    if self.dtype is None:
      return theta
    out = []
    for s, leaves in enumerate(theta):
      cast = [v.trainable and v.dtype.is_floating
              for v in tf.nest.flatten(self._cells[s].vars)]
      with tf.device(self.devices[s]), tf.name_scope(f'cell_{s}/theta'):
        out.append([tf.cast(t, self.dtype) if c else t
                    for t, c in zip(leaves, cast)])
    return out

  def SplitBackwards(self) -> None:
    """B and W of every stage, for a table with W actions (zero bubble):
    every stage must keep its activations (backward_split.py)."""
    missing = [s for s in range(len(self._cells)) if s not in self.kept]
    if missing:
      raise ValueError(
          f"{self.where}: a table that splits its backwards needs "
          f"recompute='never' (stages {missing} re-compute); set "
          'p.recompute.')
    self.halves = {
        s: backward_split.BackwardSplit(
            cell, f'cell_{s}',
            lambda fn, d=self.devices[s]: stage_function.OnDevice(fn, d))
        for s, cell in self.kept.items()}

  def _ForwardFn(self, s: int) -> Call:
    def Forward(theta_leaves, x):
      return self.Cell(s, list(theta_leaves), list(x))
    Forward.__name__ = f'cell_{s}_forward'
    return Forward

  def _BackwardFn(self, s: int, device: str,
                  input_gradient: bool = True) -> Call:
    """B(s, m)'s call: (dx, acc + dtheta[, recomputed]); dx None if unwanted."""
    stamp = stamps.Current() is not None

    def Backward(theta_leaves, x, dy, acc, *clock):
      theta_leaves, x = list(theta_leaves), list(x)
      sources = x if input_gradient else []
      tape = tf.GradientTape(watch_accessed_variables=False)
      with tape, self._cells[s].NoStatUpdates():
        tape.watch(_Floats(sources + theta_leaves))
        y = self.Cell(s, theta_leaves, x)

      def Grads():
        dx, dtheta = residuals.Gradients(tape, y, list(dy), sources,
                                         theta_leaves)
        return ((dx if input_gradient else [None] * len(x)),
                residuals.AddGradients(list(acc), dtheta))

      if not stamp:
        return Grads()
      # Recording: the gradient ops start after the re-computation's stamp.
      recomputed = stamps.Stamp(device, clock[0], y)
      with tf.control_dependencies([recomputed]):
        dx, dtheta = Grads()
      return dx, dtheta, recomputed
    Backward.__name__ = (f'cell_{s}_backward' if input_gradient else
                         f'cell_{s}_backward_without_input_gradient')
    return Backward

  def Cell(self, s: int, theta_leaves: List[tf.Tensor],
           x: List[tf.Tensor]) -> List[tf.Tensor]:
    """Stage s's cell on flat leaves; records its output structure."""
    inputs = tf.nest.pack_sequence_as(self.structures[s], x)
    try:
      out = self._cells[s].FProp(
          tf.nest.pack_sequence_as(self._thetas[s], theta_leaves), inputs)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
      source = ('the pipeline inputs' if s == 0 else
                f"the output of partition {s - 1} ('cell_{s - 1}')")
      raise ValueError(
          f"{self.where}: partition {s} ('cell_{s}') cannot take {source} "
          f'of shapes {_Shapes(inputs)}: {_FirstLine(err)}') from err
    self.structures[s + 1] = out
    return hand_offs.CastFloats(tf.nest.flatten(out), self.dtype)

  def CheckBatch(self, s: int, m: int, x: Leaves, y: Leaves) -> None:
    """Raises if stage s's outputs y lost the micro-batch of x."""
    del m  # the same for every micro-batch
    want = x[0].shape[self._axis]
    for t in y:
      if t.shape.rank is None or t.shape.rank <= self._axis or (
          t.shape[self._axis] != want):
        raise ValueError(
            f"{self.where}: partition {s} ('cell_{s}') returned shape "
            f'{t.shape}; every output needs the micro-batch ({want}) on '
            f'axis {self._axis}.')

  def Stage0(self, inputs: Leaves, theta_leaves: Leaves, x: Leaves,
             dy: Leaves) -> Tuple[Call, Optional[Call]]:
    """Stage 0's backward call, and the call making its input gradient
    apart (None: the backward makes it), by input_gradient.py's rule:
    apart when the inputs need no gradient from this stage's kept
    activations and none may come from a variable, unless the separate
    call would be stateful (it would always run). Chosen at the call's
    first B(0, m); `inputs` are the pipeline's."""
    if self._stage_0 is None:
      self._stage_0 = (self.backward[0], None)
      if input_gradient.Separate(0 in self.kept, inputs):
        device = self.devices[0]
        dx_fn = stage_function.OnDevice(input_gradient.InputGradientBody(
            lambda t, x: self.Cell(0, t, x), self._cells[0].NoStatUpdates),
                                        device)
        if not input_gradient.IsStateful(dx_fn, theta_leaves, x, dy):
          self._stage_0 = (stage_function.OnDevice(
              self._BackwardFn(0, device, input_gradient=False), device),
                           dx_fn)
    return self._stage_0
