"""A cell's gradient split at its forward: kept residuals, no re-computation.

A pipeline partition that keeps its activations (recompute `never`, the
last one of `except_last`) runs two functions per micro-batch, each traced
once however many micro-batches there are (docs/DESIGN.md section 2):

  forward(theta, x) -> (y, residuals)
  backward(inputs, dy[, acc]) -> (dx, dtheta [+ acc])

`residuals` are exactly the tensors of the forward that the gradient reads
(activations, softmax outputs, masks ...). They are found by tracing the
cell and then its gradient once, in an analysis function that is never
called: every op created after the cell that is not a stand-in for dy
belongs to the gradient, and every tensor it reads that the cell made is a
residual. Those gradient ops become the backward function (their GraphDef,
with each residual and dy replaced by an input, imported into the
backward's trace). The forward function traces the cell alone and returns
the residuals found by name (the two traces run the same code in fresh
graphs, so the cell's ops get the same names). The gradient ops are the
ones a tape over the inline cell would run, so the gradients are bitwise
the same.

Which outputs get a gradient is known only when the backward runs: the
forward keeps what the gradient of every floating output needs, and a
backward whose dy has None leaves (an output the loss does not use) is
traced for exactly those outputs; it reads a subset of the residuals.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

Leaves = List[Optional[tf.Tensor]]
# A backward input: ('theta', i), ('x', i), ('dy', j), ('out', j) (the j-th
# residual the forward returns) or ('capture', j) (a value from outside).
Ref = Tuple[str, int]

_DY_STAND_IN = 'lp_dy_stand_in'
_IMPORT_SCOPE = 'gradient'


def IsFloat(x: tf.Tensor) -> bool:
  return x.dtype.is_floating or x.dtype.is_complex


def Gradients(tape: tf.GradientTape, y: Any, dy: Leaves, x: List[tf.Tensor],
              theta_leaves: List[tf.Tensor]) -> Tuple[Leaves, Leaves]:
  """(d x, d theta) from a tape over y = cell(theta, x); None if not float.

  Outputs whose gradient `dy` is None contribute nothing and are left out.
  """
  pairs = [(t, d) for t, d in zip(tf.nest.flatten(y), dy)
           if IsFloat(t) and d is not None]
  sources = [t for t in x + theta_leaves if IsFloat(t)]
  grads = iter(tape.gradient(
      [t for t, _ in pairs], sources,
      output_gradients=[d for _, d in pairs],
      unconnected_gradients=tf.UnconnectedGradients.ZERO))
  full = [next(grads) if IsFloat(t) else None for t in x + theta_leaves]
  return full[:len(x)], full[len(x):]


def AddGradients(acc: Leaves, grads: Leaves) -> Leaves:
  """acc + grads leaf by leaf, in acc's dtype; None where a leaf has no
  gradient.

  Called inside a backward function, the sum can take the buffer of the
  gradient just computed, so a running sum costs no third copy
  (docs/DESIGN.md section 26). A bfloat16 gradient of a leaf the stage
  read in bfloat16 is added to its float32 sum (section 32).
  """
  return [None if g is None else a + tf.cast(g, a.dtype)
          for a, g in zip(acc, grads)]


class _Backward:
  """The gradient ops of one trace, as a GraphDef with inputs `refs`."""

  def __init__(self, graph_def: Any, refs: List[Ref],
               outputs: List[Optional[Tuple[str, Any]]], num_x: int):
    self.graph_def = graph_def
    self.refs = refs
    # Per d x / d theta leaf: None, ('node', tensor name in graph_def) or
    # ('ref', index into refs) when the gradient is an input itself.
    self.outputs = outputs
    self.num_x = num_x


class SplitCell:
  """forward / backward functions of `cell` (module docstring).

  `cell(theta_leaves, x) -> y leaves` is traced in the current graph;
  `wrap(fn)` turns a Python function into the tf.function to run (the
  pipeline's `stage_function.OnDevice`: non-inlined, on the partition's
  device).
  """

  def __init__(self, name: str, cell: Callable[..., List[tf.Tensor]],
               wrap: Callable[[Callable[..., Any]], Any]):
    self._name = name
    self._cell = cell
    self._wrap = wrap
    self._residual_names: List[str] = []
    self._backwards: Dict[Tuple[bool, ...], _Backward] = {}
    self._backward_fns: Dict[Tuple[bool, ...], Any] = {}
    self._theta_specs: List[tf.TensorSpec] = []
    self._x_specs: List[tf.TensorSpec] = []
    self._captured: List[tf.Tensor] = []

    def Forward(theta_leaves, x):
      return self._TraceForward(list(theta_leaves), list(x))

    Forward.__name__ = f'{name}_forward_keep'
    self.forward_function = wrap(Forward)

  # ---- tracing ---------------------------------------------------------

  def _Trace(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor],
             wanted: Optional[Sequence[bool]]
             ) -> Tuple[List[tf.Tensor], _Backward, Dict[str, Ref]]:
    """Cell, then its gradient; the gradient's ops as a `_Backward`.

    `wanted[i]`: output i gets a gradient (None: every floating output).
    Also returns the forward tensors the gradient reads, by name.
    """
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
      tape.watch([t for t in x + theta_leaves if IsFloat(t)])
      y = list(self._cell(theta_leaves, x))
    graph = (y + x + theta_leaves)[0].graph
    first_grad_op = len(graph.get_operations())
    if wanted is None:
      wanted = [IsFloat(t) for t in y]
    stand_ins = [tf.identity(t, name=_DY_STAND_IN) if want else None
                 for t, want in zip(y, wanted)]
    dx, dtheta = Gradients(tape, y, stand_ins, x, theta_leaves)
    grad_ops = graph.get_operations()[first_grad_op:]
    stand_in_ops = {s.op.name: j for j, s in enumerate(
        s for s in stand_ins if s is not None)}
    # A value the cell took from outside its arguments (a constant, a
    # variable's handle): the backward takes the same outside value.
    captured = {id(inside): outside for outside, inside in graph.captures}
    args = {id(t): ('x', i) for i, t in enumerate(x)}
    args.update({id(t): ('theta', i) for i, t in enumerate(theta_leaves)})
    mine = {op.name for op in grad_ops} - set(stand_in_ops)
    refs: List[Ref] = []
    ref_of: Dict[str, int] = {}  # tensor name -> index into refs
    specs: List[tf.Tensor] = []  # the tensor of each ref
    reads: Dict[str, Ref] = {}  # forward intermediates read, by name

    def RefOf(t: tf.Tensor) -> int:
      if t.name not in ref_of:
        if t.op.name in stand_in_ops:
          ref = ('dy', stand_in_ops[t.op.name])
        elif id(t) in args:
          ref = args[id(t)]
        elif id(t) in captured:
          ref = ('capture', len(self._captured))
          self._captured.append(captured[id(t)])
        else:
          ref = ('out', len(reads))
          reads[t.name] = ref
        ref_of[t.name] = len(refs)
        refs.append(ref)
        specs.append(t)
      return ref_of[t.name]

    for op in grad_ops:
      if op.name in mine:
        for t in op.inputs:
          if t.op.name not in mine:
            RefOf(t)
    outputs = []
    for g in dx + dtheta:
      if g is None:
        outputs.append(None)
      elif g.op.name in mine:
        outputs.append(('node', g.name))
      else:
        outputs.append(('ref', RefOf(g)))
    graph_def = _GradientGraphDef(graph.as_graph_def(), mine, ref_of, specs)
    _ShareConstants(graph_def, {o[1].split(':')[0] for o in outputs
                                if o and o[0] == 'node'})
    return y, _Backward(graph_def, refs, outputs, len(x)), reads

  def Forward(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor]
              ) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """One forward call: (y, residuals)."""
    if not self._backwards:  # the first call
      # In the caller's graph: what the analysis captures from outside
      # is then a value the backward call can be given.
      self._theta_specs = [tf.TensorSpec(t.shape, t.dtype)
                           for t in theta_leaves]
      self._x_specs = [tf.TensorSpec(t.shape, t.dtype) for t in x]
      wanted, backward, reads = self._Analyse(None)
      self._backwards = {wanted: backward}
      self._residual_names = list(reads)
    return self.forward_function(theta_leaves, x)

  def InputsRead(self) -> List[int]:
    """Indices of the inputs x that the gradient reads (after a Forward).

    With the residuals, these are what a kept forward holds until its
    backward (the planner counts their bytes).
    """
    if not self._backwards:
      raise RuntimeError(f'{self._name}: call Forward before InputsRead.')
    backward = next(iter(self._backwards.values()))
    return sorted({i for kind, i in backward.refs if kind == 'x'})

  def _TraceForward(self, theta_leaves: List[tf.Tensor],
                    x: List[tf.Tensor]) -> Tuple[List[tf.Tensor],
                                                 List[tf.Tensor]]:
    """The cell alone, and the residuals its gradient reads, by name.

    The gradient was traced in a separate function, never called, so this
    body (which TF reads again for every call op it creates) is the cell.
    """
    y = list(self._cell(theta_leaves, x))
    graph = (y + x + theta_leaves)[0].graph
    residuals = []
    for name in self._residual_names:
      try:
        residuals.append(graph.get_tensor_by_name(name))
      except (KeyError, ValueError) as err:
        raise RuntimeError(
            f'{self._name}: the gradient reads {name}, which the forward '
            'does not have (its trace named its ops differently); use '
            "recompute='always' for this cell.") from err
    return y, residuals

  def _Analyse(self, wanted: Optional[Tuple[bool, ...]]
               ) -> Tuple[Tuple[bool, ...], _Backward, Dict[str, Ref]]:
    """Traces cell and gradient in a function never called.

    Returns which outputs got a gradient (`wanted`, or every floating
    one), the gradient as a `_Backward` and the forward tensors it reads.
    """
    found = {}

    def Analysis(theta_leaves, x):
      y, found['backward'], found['reads'] = self._Trace(
          list(theta_leaves), list(x), wanted)
      found['wanted'] = tuple(IsFloat(t) for t in y) if wanted is None else (
          wanted)
      return []

    Analysis.__name__ = f'{self._name}_gradient_analysis'
    self._wrap(Analysis).get_concrete_function(self._theta_specs,
                                               self._x_specs)
    return found['wanted'], found['backward'], found['reads']

  def _BackwardFor(self, wanted: Tuple[bool, ...]) -> _Backward:
    """The gradient of the outputs in `wanted`, reading forward residuals."""
    if wanted in self._backwards:
      return self._backwards[wanted]
    _, backward, reads = self._Analyse(wanted)
    index = {n: j for j, n in enumerate(self._residual_names)}
    renumber = {}
    for name, ref in reads.items():
      if name not in index:
        raise RuntimeError(
            f'{self._name}: the gradient of some outputs reads {name}, '
            'which the forward did not keep (its trace named its ops '
            "differently); use recompute='always' for this cell.")
      renumber[ref] = ('out', index[name])
    backward.refs = [renumber.get(r, r) for r in backward.refs]
    self._backwards[wanted] = backward
    return backward

  # ---- running ---------------------------------------------------------

  def Backward(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor],
               residuals: List[tf.Tensor], dy: Leaves, y: List[tf.Tensor],
               acc: Optional[Leaves] = None) -> Tuple[Leaves, Leaves]:
    """One backward call: (d x, d theta) of the forward that made `residuals`.

    `y` is that forward's output (which outputs can have a gradient). With
    `acc` (a tensor per floating theta leaf) the call returns acc + d theta
    instead of d theta, added inside the call (`AddGradients`).
    """
    wanted, backward, inputs = self.Gradient(theta_leaves, x, residuals, dy,
                                             y)
    key = wanted + ((acc is not None),)
    if key not in self._backward_fns:
      self._backward_fns[key] = self._BackwardFn(backward, wanted,
                                                 acc is not None)
    extra = [] if acc is None else [acc]
    grads = list(self._backward_fns[key](inputs, *extra))
    return grads[:backward.num_x], grads[backward.num_x:]

  def Gradient(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor],
               residuals: List[tf.Tensor], dy: Leaves, y: List[tf.Tensor]
               ) -> Tuple[Tuple[bool, ...], _Backward, List[tf.Tensor]]:
    """(which outputs get a gradient, the gradient's GraphDef, the value of
    each of its inputs `refs`) for one backward of the forward that made
    `residuals` (backward_split.py splits it)."""
    wanted = tuple(d is not None and IsFloat(t) for t, d in zip(y, dy))
    backward = self._BackwardFor(wanted)
    live_dy = [d for d, want in zip(dy, wanted) if want]
    pools = {'theta': theta_leaves, 'x': x, 'out': residuals, 'dy': live_dy,
             'capture': self._captured}
    return wanted, backward, [pools[kind][i] for kind, i in backward.refs]

  def _BackwardFn(self, backward: _Backward, wanted: Tuple[bool, ...],
                  accumulates: bool) -> Any:
    names = [o[1] for o in backward.outputs if o and o[0] == 'node']

    def Backward(inputs, *acc):
      inputs = list(inputs)
      imported = iter(tf.graph_util.import_graph_def(
          backward.graph_def,
          input_map={_InputName(i): t for i, t in enumerate(inputs)},
          return_elements=names, name=_IMPORT_SCOPE))
      out = []
      for o in backward.outputs:
        if o is None:
          out.append(None)
        elif o[0] == 'node':
          out.append(next(imported))
        else:
          out.append(tf.identity(inputs[o[1]]))
      if acc:
        out[backward.num_x:] = AddGradients(list(acc[0]),
                                            out[backward.num_x:])
      return out

    Backward.__name__ = (f'{self._name}_backward_keep_' +
                         ''.join('1' if w else '0' for w in wanted) +
                         ('_accumulate' if accumulates else ''))
    return self._wrap(Backward)


def InputName(i: int) -> str:
  """The placeholder of the gradient GraphDef's input i."""
  return _InputName(i)


def _InputName(i: int) -> str:
  return f'lp_backward_input_{i}'


def _GradientGraphDef(full: Any, mine: set, ref_of: Dict[str, int],
                      specs: List[tf.Tensor]) -> Any:
  """The nodes in `mine`; each input from outside them is a placeholder."""
  out = type(full)()
  out.library.CopyFrom(full.library)
  out.versions.CopyFrom(full.versions)
  for i, t in enumerate(specs):
    node = out.node.add()
    node.name = _InputName(i)
    node.op = 'Placeholder'
    node.attr['dtype'].type = t.dtype.as_datatype_enum
    node.attr['shape'].shape.CopyFrom(t.shape.as_proto())
  for node in full.node:
    if node.name not in mine:
      continue
    new = out.node.add()
    new.CopyFrom(node)
    if '_class' in new.attr:  # colocation with forward ops left behind
      del new.attr['_class']
    del new.input[:]
    for name in node.input:
      if name.startswith('^'):
        if name[1:] in mine:
          new.input.append(name)
        continue
      op_name, _, port = name.partition(':')
      if op_name in mine:
        new.input.append(name)
      else:
        new.input.append(_InputName(ref_of[f'{op_name}:{port or 0}']))
  return out


def _ShareConstants(graph_def: Any, keep: set) -> None:
  """Makes equal constants one node: a gradient traces its own shapes and
  axes per op (112 Const nodes, 23 values, in one Transformer layer's),
  and TensorFlow builds each backward body again for every call of it on
  the first step. A constant with a control input, or named in `keep`,
  stays as it is."""
  canonical: Dict[Tuple[Any, ...], str] = {}
  alias: Dict[str, str] = {}  # a constant -> the equal one that stays
  for node in graph_def.node:
    if node.op != 'Const' or node.input or node.name in keep:
      continue
    key = (node.device,) + tuple(
        (k, node.attr[k].SerializeToString(deterministic=True))
        for k in sorted(node.attr))
    first = canonical.setdefault(key, node.name)
    if first != node.name:
      alias[node.name] = first
  if not alias:
    return
  nodes = []
  for node in graph_def.node:
    if node.name in alias:
      continue
    nodes.append(type(node)())
    nodes[-1].CopyFrom(node)
    del nodes[-1].input[:]
    for name in node.input:
      control = name.startswith('^')
      op, colon, port = name.lstrip('^').partition(':')
      name = ('^' if control else '') + alias.get(op, op) + colon + port
      if not (control and name in nodes[-1].input):
        nodes[-1].input.append(name)
  del graph_def.node[:]
  graph_def.node.extend(nodes)
