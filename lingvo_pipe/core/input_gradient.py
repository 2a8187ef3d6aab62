"""Stage 0's input gradient: made only when someone uses it.

Pipeline functions are `_noinline` and Grappler's function optimizer is
off (docs/DESIGN.md section 2), so a call computes every output it has,
used or not: B(0, m) would compute d(images) for a trainer that drops it.
The rule:

  stage 0 keeps its activations           B(0, m) makes d(inputs)
  an input may come from a variable       B(0, m) makes d(inputs)
    (an embedding outside the pipeline)
  otherwise                               B(0, m) leaves it out; a
                                          separate stateless call makes it,
                                          which the runtime prunes unless
                                          the caller's tape uses it

"May come from a variable": a walk back through the graph finds an op
with a resource input other than a dataset iterator's. A separate call
that would be stateful always runs, so then B(0, m) makes it after all.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import tensorflow as tf

from lingvo_pipe.core import residuals

# Ops that take a resource but read no variable: a batch from a dataset
# iterator has no gradient to give.
_NOT_VARIABLE_READS = frozenset([
    'IteratorGetNext', 'IteratorGetNextSync', 'IteratorGetNextAsOptional',
    'OptionalGetValue', 'OptionalHasValue'])


def MayDependOnVariables(tensors: Sequence[tf.Tensor],
                         limit: int = 20000) -> bool:
  """Whether some floating tensor here may be computed from a variable.

  Walks the graph back from `tensors`; any op with a resource input
  (other than a dataset iterator's) counts as reading a variable. True
  when unsure: eagerly, or past `limit` ops.
  """
  if tf.executing_eagerly():
    return True
  stack = [t.op for t in tensors if residuals.IsFloat(t)]
  seen = set()
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if len(seen) > limit:
      return True
    if op.type not in _NOT_VARIABLE_READS and any(
        t.dtype == tf.resource for t in op.inputs):
      return True
    stack.extend(t.op for t in op.inputs)
  return False


def Separate(keeps_activations: bool, inputs: Sequence[tf.Tensor]) -> bool:
  """Whether B(0, m) leaves d(inputs) to a separate call (module
  docstring)."""
  return not keeps_activations and not MayDependOnVariables(inputs)


def IsStateful(fn: Any, *args: Any) -> bool:
  """Whether tf.function `fn` traced for `args` is stateful (always runs)."""
  return fn.get_concrete_function(*args).function_def.signature.is_stateful


def InputGradientBody(cell: Callable[[List[tf.Tensor], List[tf.Tensor]],
                                     List[tf.Tensor]],
                      no_stat_updates: Callable[[], Any]
                      ) -> Callable[..., Any]:
  """d(stage 0's inputs) of one micro-batch alone: the stage again.

  `cell(theta_leaves, x) -> y leaves`; `no_stat_updates()` a context in
  which the cell adds nothing to statistics (it is a re-computation).
  """

  def InputGradient(theta_leaves, x, dy):
    theta_leaves, x = list(theta_leaves), list(x)
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape, no_stat_updates():
      tape.watch([t for t in x if residuals.IsFloat(t)])
      y = cell(theta_leaves, x)
    return residuals.Gradients(tape, y, list(dy), x, [])[0]

  InputGradient.__name__ = 'cell_0_input_gradient'
  return InputGradient
