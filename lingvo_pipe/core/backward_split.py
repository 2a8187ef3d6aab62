"""A kept-activation stage's backward in two halves, for zero-bubble tables.

`residuals.SplitCell` traces a stage's gradient once, as a GraphDef: every
op the gradient runs, each input (theta, x, residuals, dy) a placeholder.
A zero-bubble schedule (schedule.ZeroBubbleH1) runs it as two actions:

  B(s, m)  the ops d(stage inputs) needs                 -> dx, carry
  W(s, m)  every other op d(stage variables) needs       -> acc + dtheta

The ops are partitioned, not copied: B is every ancestor of the d(inputs)
outputs; W every other ancestor of the d(variables) outputs (a constant
both read is in each). The tensors of B that W reads (the gradient
arriving at each layer's output) are B's extra outputs, `carry`, held
until W runs. Nothing is computed twice, and they are the ops of the
whole gradient, so the gradients are bitwise those of the unsplit
backward. B runs as soon as dy arrives, so the previous stage gets its
gradient sooner; W waits for a gap in its device's table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import tensorflow as tf

from lingvo_pipe.core import residuals

Leaves = List[Optional[tf.Tensor]]
_CARRY = 'lp_carry_'


def _OpOf(name: str) -> str:
  return name[1:] if name.startswith('^') else name.split(':')[0]


def _Tensor(name: str) -> str:
  return name if ':' in name else name + ':0'


@dataclasses.dataclass
class _Halves:
  """One gradient (one `wanted`) partitioned into B and W."""
  b_graph: Any  # GraphDef: B's nodes and the placeholders they read
  b_refs: List[int]  # gradient inputs B reads
  carry: List[str]  # tensors of B that W reads
  w_nodes: List[Any]  # W's NodeDefs, inputs from B renamed to carry
  w_refs: List[int]
  backward: Any  # residuals._Backward


def _Closure(nodes: Dict[str, Any], roots: List[str],
             stop: Set[str]) -> Set[str]:
  """Names of the nodes `roots` need, not entering `stop` or inputs."""
  seen: Set[str] = set()
  todo = [r for r in roots if r in nodes]
  while todo:
    name = todo.pop()
    if name in seen or name in stop:
      continue
    seen.add(name)
    todo += [_OpOf(i) for i in nodes[name].input if _OpOf(i) in nodes]
  return seen


def _Partition(backward: Any) -> _Halves:
  graph = backward.graph_def
  inputs = {residuals.InputName(i): i for i in range(len(backward.refs))}
  nodes = {n.name: n for n in graph.node if n.name not in inputs}
  outs = backward.outputs
  x_roots = [_OpOf(o[1]) for o in outs[:backward.num_x]
             if o and o[0] == 'node']
  b_set = _Closure(nodes, x_roots, set())
  w_roots = [_OpOf(o[1]) for o in outs[backward.num_x:]
             if o and o[0] == 'node']
  # A constant both halves read is in each of them, not carried.
  constants = {n for n in b_set if nodes[n].op == 'Const'
               and not nodes[n].input}
  w_set = _Closure(nodes, w_roots, b_set - constants)
  carried = b_set - w_set
  carry = sorted({_Tensor(i) for n in w_set for i in nodes[n].input
                  if not i.startswith('^') and _OpOf(i) in carried} |
                 {_Tensor(o[1]) for o in outs[backward.num_x:]
                  if o and o[0] == 'node' and _OpOf(o[1]) in carried})

  def Refs(names: Set[str], extra: List[int]) -> List[int]:
    used = {inputs[_OpOf(i)] for n in names for i in nodes[n].input
            if _OpOf(i) in inputs}
    return sorted(used | set(extra))

  ref_out = lambda part: [o[1] for o in part if o and o[0] == 'ref']  # noqa: E731
  b_refs = Refs(b_set, ref_out(outs[:backward.num_x]))
  w_refs = Refs(w_set, ref_out(outs[backward.num_x:]))
  b_graph = type(graph)()
  b_graph.library.CopyFrom(graph.library)
  b_graph.versions.CopyFrom(graph.versions)
  for node in graph.node:
    if node.name in b_set or (node.name in inputs and
                              inputs[node.name] in b_refs):
      b_graph.node.add().CopyFrom(node)
  w_nodes = [nodes[n] for n in sorted(w_set)]
  return _Halves(b_graph, b_refs, carry, w_nodes, w_refs, backward)


class BackwardSplit:
  """B and W of one SplitCell (module docstring); `wrap(fn)` makes the
  stage's tf.function on its device."""

  def __init__(self, cell: residuals.SplitCell, name: str,
               wrap: Callable[[Callable[..., Any]], Any]):
    self._cell = cell
    self._name = name
    self._wrap = wrap
    self._halves: Dict[Tuple[bool, ...], _Halves] = {}
    self._b_fns: Dict[Tuple[bool, ...], Any] = {}
    self._w_fns: Dict[Tuple[bool, ...], Any] = {}

  def _Halves(self, wanted: Tuple[bool, ...], backward: Any) -> _Halves:
    if wanted not in self._halves:
      self._halves[wanted] = _Partition(backward)
    return self._halves[wanted]

  def Input(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor],
            kept: List[tf.Tensor], dy: Leaves, y: List[tf.Tensor]
            ) -> Tuple[Leaves, List[tf.Tensor]]:
    """B: (d x, carry) of the forward that kept `kept`."""
    wanted, backward, refs = self._cell.Gradient(theta_leaves, x, kept, dy,
                                                 y)
    halves = self._Halves(wanted, backward)
    if wanted not in self._b_fns:
      self._b_fns[wanted] = self._wrap(self._InputBody(halves, wanted))
    out = list(self._b_fns[wanted]([refs[i] for i in halves.b_refs]))
    return out[:backward.num_x], out[backward.num_x:]

  def _InputBody(self, halves: _Halves, wanted: Tuple[bool, ...]) -> Any:
    backward = halves.backward
    dx = backward.outputs[:backward.num_x]
    names = [o[1] for o in dx if o and o[0] == 'node'] + halves.carry

    def BackwardInput(inputs):
      by_ref = dict(zip(halves.b_refs, inputs))
      imported = tf.graph_util.import_graph_def(
          halves.b_graph, return_elements=names, name='gradient',
          input_map={residuals.InputName(i): t for i, t in by_ref.items()})
      found = iter(imported)
      out = [None if o is None else (
          next(found) if o[0] == 'node' else tf.identity(by_ref[o[1]]))
             for o in dx]
      return out + list(found)

    BackwardInput.__name__ = (f'{self._name}_backward_input_' +
                              ''.join('1' if w else '0' for w in wanted))
    return BackwardInput

  def Weight(self, theta_leaves: List[tf.Tensor], x: List[tf.Tensor],
             kept: List[tf.Tensor], dy: Leaves, y: List[tf.Tensor],
             carry: List[tf.Tensor], acc: Leaves) -> Leaves:
    """W: acc + d theta, from B's `carry` of the same micro-batch."""
    wanted, backward, refs = self._cell.Gradient(theta_leaves, x, kept, dy,
                                                 y)
    halves = self._Halves(wanted, backward)
    if wanted not in self._w_fns:
      self._w_fns[wanted] = self._wrap(self._WeightBody(halves, wanted,
                                                        carry))
    return list(self._w_fns[wanted]([refs[i] for i in halves.w_refs],
                                    carry, acc))

  def WeightResiduals(self, theta_leaves: List[tf.Tensor],
                      x: List[tf.Tensor], kept: List[tf.Tensor], dy: Leaves,
                      y: List[tf.Tensor]) -> List[int]:
    """Indices in `kept` of the residuals W reads: with B's carry, what a
    micro-batch holds from B until W (the planner counts them)."""
    wanted, backward, _ = self._cell.Gradient(theta_leaves, x, kept, dy, y)
    halves = self._Halves(wanted, backward)
    return sorted({backward.refs[i][1] for i in halves.w_refs
                   if backward.refs[i][0] == 'out'})

  def _WeightGraph(self, halves: _Halves, carry: List[tf.Tensor]) -> Any:
    """W's GraphDef: its nodes, its inputs' and the carry's placeholders."""
    graph = type(halves.b_graph)()
    graph.library.CopyFrom(halves.b_graph.library)
    graph.versions.CopyFrom(halves.b_graph.versions)
    placeholders = {n.name: n for n in halves.backward.graph_def.node}
    for i in halves.w_refs:
      graph.node.add().CopyFrom(placeholders[residuals.InputName(i)])
    for j, t in enumerate(carry):
      node = graph.node.add()
      node.name, node.op = f'{_CARRY}{j}', 'Placeholder'
      node.attr['dtype'].type = t.dtype.as_datatype_enum
      node.attr['shape'].shape.CopyFrom(t.shape.as_proto())
    renamed = {name: f'{_CARRY}{j}:0' for j, name in enumerate(halves.carry)}
    mine = {n.name for n in halves.w_nodes}
    kept = {residuals.InputName(i) for i in halves.w_refs} | mine
    for node in halves.w_nodes:
      new = graph.node.add()
      new.CopyFrom(node)
      del new.input[:]
      for name in node.input:
        if name.startswith('^'):
          if name[1:] in kept:
            new.input.append(name)
        else:
          new.input.append(renamed.get(_Tensor(name), name))
    return graph

  def _WeightBody(self, halves: _Halves, wanted: Tuple[bool, ...],
                  carry: List[tf.Tensor]) -> Any:
    backward = halves.backward
    graph = self._WeightGraph(halves, carry)
    dtheta = backward.outputs[backward.num_x:]
    carried = {name: j for j, name in enumerate(halves.carry)}
    names = [o[1] for o in dtheta if o and o[0] == 'node' and
             _Tensor(o[1]) not in carried]

    def BackwardWeight(inputs, carry, acc):
      by_ref = dict(zip(halves.w_refs, inputs))
      input_map = {residuals.InputName(i): t for i, t in by_ref.items()}
      input_map.update({f'{_CARRY}{j}': t for j, t in enumerate(carry)})
      found = iter(tf.graph_util.import_graph_def(
          graph, input_map=input_map, return_elements=names,
          name='gradient'))
      grads = []
      for o in dtheta:
        if o is None:
          grads.append(None)
        elif o[0] == 'ref':
          grads.append(tf.identity(by_ref[o[1]]))
        elif _Tensor(o[1]) in carried:
          grads.append(tf.identity(carry[carried[_Tensor(o[1])]]))
        else:
          grads.append(next(found))
      return residuals.AddGradients(list(acc), grads)

    BackwardWeight.__name__ = (f'{self._name}_backward_weight_' +
                               ''.join('1' if w else '0' for w in wanted))
    return BackwardWeight
