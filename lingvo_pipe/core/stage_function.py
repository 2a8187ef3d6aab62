"""A pipeline stage's function: traced once, called once per action.

The engine (pipeline_engine.py) calls each stage's forward and backward
S x M times per trace; each is one `tf.function` (`OnDevice`: every op on
the stage's device), so the graph has S x M call ops instead of S x M
copies of the layers (docs/DESIGN.md section 2).

The functions are marked `_noinline`: the runtime runs each call as one
function instead of pasting S x M copies of the layers back into the
graph, so start-up does not grow with M either; `ShareCallBodies` stops
Grappler from copying the body per call site. Each call op is created
with `_disable_call_shape_inference`: TensorFlow would otherwise infer
the shapes of every op of the called body again at each call, while
tracing and again when the runtime builds the graph; the outputs' shapes
are the body's, set from its signature all the same.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
# get_default_graph: the graph a stage call creates its call op in.
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops
# pylint: enable=g-direct-tensorflow-import

# The op types of a function call.
CALLS = ('PartitionedCall', 'StatefulPartitionedCall')

# Function attributes of every stage function (module docstring).
_FUNCTION_ATTRIBUTES = {'_noinline': True}


def ShareCallBodies() -> None:
  """Stops Grappler from copying a stage function for each call.

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


class StageFunction:
  """A non-inlined tf.function, called through its concrete functions.

  A stage's function is called once per action, S x M times per trace;
  the tf.function's own dispatch (argument types, cache lookup) took
  about half of the tracing time, so each pattern of None arguments is
  looked up once and its ConcreteFunction called directly.
  """

  def __init__(self, fn: Any):
    self._fn = fn
    self._concrete: Dict[Tuple[bool, ...], Any] = {}

  def get_concrete_function(self, *args: Any) -> Any:  # pylint: disable=invalid-name
    key = tuple(x is None for x in tf.nest.flatten(args))
    if key not in self._concrete:
      self._concrete[key] = self._fn.get_concrete_function(*args)
    return self._concrete[key]

  def __call__(self, *args: Any) -> Any:
    concrete = self.get_concrete_function(*args)
    if tf.executing_eagerly():
      return concrete(*args)
    with _WithoutBodyShapes(ops.get_default_graph()):
      return concrete(*args)


_NO_BODY_SHAPES = '_disable_call_shape_inference'


@contextlib.contextmanager
def _WithoutBodyShapes(graph: Any) -> Iterator[None]:
  """Within it, the call ops `graph` creates carry `_NO_BODY_SHAPES`.

  TensorFlow infers a call op's output shapes by running shape inference
  over every op of the called body, at each call, while tracing and again
  when the runtime converts the traced graph on the first step: a tenth
  of the time to the first step at K=8 M=32 (docs/DESIGN.md section 2).
  The attribute must be on the op when it is created, before that
  inference runs, and TensorFlow's call (kept whole: tapes, gradients,
  output shapes from the body's signature) takes no extra attributes; so
  for the length of one stage call, `create_op` of `graph`'s class adds
  it to call ops of `graph` alone. One thread at a time (`_CREATE_LOCK`);
  the class's own method is back on exit.
  """
  cls = type(graph)
  with _CREATE_LOCK:
    before = cls.__dict__.get('create_op')
    create = cls.create_op

    def CreateOp(this, op_type, *args, **kwargs):
      if (this is graph and op_type in CALLS
          and kwargs.get('attrs') is not None):
        kwargs['attrs'] = dict(kwargs['attrs'], **{
            _NO_BODY_SHAPES: attr_value_pb2.AttrValue(b=True)})
      return create(this, op_type, *args, **kwargs)

    cls.create_op = CreateOp
    try:
      yield
    finally:
      if before is None:
        del cls.create_op
      else:
        cls.create_op = before


_CREATE_LOCK = threading.RLock()


def OnDevice(fn: Callable[..., Any], device: str) -> StageFunction:
  """`fn` as a non-inlined tf.function whose every op is on `device`."""

  def Body(*args):
    with tf.device(device):
      return fn(*args)

  Body.__name__ = fn.__name__
  return StageFunction(tf.function(
      Body, autograph=False, experimental_attributes=_FUNCTION_ATTRIBUTES))
