"""BaseLayer: layers built from Params whose FProp is a pure function.

A layer is made from its params (`p.Instantiate()`); its `__init__` creates
every variable and child at once, so a layer built under `tf.device(d)` has
its variables on `d`. After `__init__` the layer is sealed: creating a
variable or child later is an error, and its params are frozen.

  class Scale(BaseLayer):
    '''y = x * w, with w of shape [dim].'''

    @classmethod
    def Params(cls):
      p = super().Params()
      p.Define('dim', 0, 'Size of the last axis.')
      return p

    def __init__(self, params):
      super().__init__(params)
      self.CreateVariable('w', WeightParams([self.params.dim]))

    def FProp(self, theta, x):
      return x * theta.w

`theta` mirrors the layer tree: `theta.w` is this layer's variable,
`theta.child.w` a child's, `theta.children_list[i].w` one of a list of
children. `FProp(theta, ...)` may read only `theta` and its inputs, so the
pipeline can call it with any values for theta (for example tensors read on
another device, or the same variables twice when it re-computes).

Initial values depend only on the random seed and the variable's seed
path, which is its path (`root/child/w`) unless a parent leaves a child's
name out (`CreateChild(..., seed_name='')`); never on devices or on
construction order.

Mode flags (`training`, `update_stats`, `replica`, `num_replicas`) are
plain Python attributes read while tracing: set them with `SetTraining` /
`SetUpdateStats` / `SetReplica` on the root, which sets the whole subtree.
`replica` says which of `num_replicas` data-parallel replicas a
PipeliningLayer runs as (0 of 1 unless BaseTask's training step runs
several): its devices, its share of the micro-batches, and the copies
its gradients are summed with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap

_INIT_METHODS = ('gaussian', 'uniform', 'xavier', 'gaussian_sqrt_fanin',
                 'constant')


@dataclasses.dataclass(frozen=True)
class VariableShape:
  """What `VariableShapesOnly` makes instead of a variable."""
  name: str
  shape: tf.TensorShape
  dtype: tf.DType
  trainable: bool


_SHAPES_ONLY = threading.local()


@contextlib.contextmanager
def VariableShapesOnly() -> Iterator[None]:
  """Layers built inside have `VariableShape`s, not variables.

  For counting parameters and sizes of layers that may be far too big for
  this host: no initial value is computed and nothing is allocated. Such a
  layer cannot run FProp.
  """
  before = getattr(_SHAPES_ONLY, 'on', False)
  _SHAPES_ONLY.on = True
  try:
    yield
  finally:
    _SHAPES_ONLY.on = before


class WeightInit:
  """Factories of initialiser params: `WeightInit.Xavier(1.0)` etc."""

  @staticmethod
  def _Make(method: str, scale: float) -> hyperparams.Params:
    p = hyperparams.Params()
    p.Define('method', method, f'One of {_INIT_METHODS}.')
    p.Define('scale', float(scale), 'Scale of the initial values.')
    return p

  @staticmethod
  def Gaussian(scale: float = 1.0) -> hyperparams.Params:
    """Normal(0, scale)."""
    return WeightInit._Make('gaussian', scale)

  @staticmethod
  def Uniform(scale: float = 1.0) -> hyperparams.Params:
    """Uniform(-scale, scale)."""
    return WeightInit._Make('uniform', scale)

  @staticmethod
  def Xavier(scale: float = 1.0) -> hyperparams.Params:
    """Uniform(-l, l), l = scale * sqrt(6 / (fan_in + fan_out))."""
    return WeightInit._Make('xavier', scale)

  @staticmethod
  def GaussianSqrtFanIn(scale: float = 1.0) -> hyperparams.Params:
    """Normal(0, scale / sqrt(fan_in))."""
    return WeightInit._Make('gaussian_sqrt_fanin', scale)

  @staticmethod
  def Constant(value: float = 0.0) -> hyperparams.Params:
    """Every element equal to `value`."""
    return WeightInit._Make('constant', value)


def WeightParams(shape: Sequence[int],
                 init: Optional[hyperparams.Params] = None,
                 dtype: Optional[tf.DType] = None,
                 trainable: bool = True) -> hyperparams.Params:
  """Describes one variable for `BaseLayer.CreateVariable`."""
  p = hyperparams.Params()
  p.Define('shape', list(shape), 'Shape of the variable.')
  p.Define('init', init, 'WeightInit params; None uses the layer default.')
  p.Define('dtype', dtype, 'Variable dtype; None uses the layer dtype.')
  p.Define('trainable', trainable, 'Whether optimisers update it.')
  return p


def _FanInOut(shape: Sequence[int]):
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive = math.prod(shape[:-2])
  return receptive * shape[-2], receptive * shape[-1]


def PathSeed(random_seed: int, path: str) -> tf.Tensor:
  """The stateless-op seed of the variable at `path`: a pure function."""
  digest = hashlib.sha256(path.encode('utf-8')).digest()
  return tf.constant(
      [int(random_seed) & 0x7FFFFFFF,
       int.from_bytes(digest[:4], 'little') & 0x7FFFFFFF], tf.int64)


def InitialValue(init: hyperparams.Params, shape: Sequence[int],
                 dtype: tf.DType, seed: tf.Tensor) -> tf.Tensor:
  """A deterministic initial value for a variable."""
  shape = list(shape)
  method, scale = init.method, init.scale
  fan_in, fan_out = _FanInOut(shape)
  if method == 'constant':
    return tf.fill(shape, tf.constant(scale, dtype))
  if method == 'gaussian':
    return scale * tf.random.stateless_normal(shape, seed, dtype=dtype)
  if method == 'gaussian_sqrt_fanin':
    return (scale / math.sqrt(fan_in)) * tf.random.stateless_normal(
        shape, seed, dtype=dtype)
  if method == 'uniform':
    limit = scale
  elif method == 'xavier':
    limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
  else:
    raise ValueError(
        f'Unknown WeightInit method {method!r}; use one of {_INIT_METHODS}.')
  return tf.random.stateless_uniform(
      shape, seed, minval=-limit, maxval=limit, dtype=dtype)


class _BaseLayerMeta(type):
  """Passes the parent in before `__init__` and seals the layer after it."""

  def __call__(cls, params, *args, parent=None, seed_name=None,
               path_name=None, **kwargs):
    if not isinstance(params, hyperparams.Params):
      raise TypeError(
          f'{cls.__name__} takes its Params as first argument; build it '
          f'with {cls.__name__}.Params().Instantiate().')
    obj = cls.__new__(cls)
    obj._parent = parent  # pylint: disable=protected-access
    obj._seed_name = seed_name  # pylint: disable=protected-access
    obj._path_name = path_name  # pylint: disable=protected-access
    obj._sealed = False  # pylint: disable=protected-access
    obj.__init__(params, *args, **kwargs)
    obj._Seal()  # pylint: disable=protected-access
    return obj


class BaseLayer(metaclass=_BaseLayerMeta):
  """The base of every layer. See the module docstring."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Name of the layer, its part of variable paths.')
    p.Define('dtype', None,
             "Variable dtype; None inherits the parent's (float32 at root).")
    p.Define('fprop_dtype', None,
             'Activation dtype; None means the same as dtype. '
             'tf.bfloat16 over float32 variables: bfloat16 compute and '
             'pipeline hand-offs; statistics, softmax cross-entropy and '
             'losses in float32 (docs/DESIGN.md section 32).')
    p.Define('random_seed', None,
             "Seed of initial values; None inherits the parent's (0 at root).")
    p.Define('params_init', None,
             "Default WeightInit; None inherits the parent's "
             '(Xavier(1.0) at the root).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    if getattr(self, '_sealed', None) is None:
      raise TypeError(
          f'Build {type(self).__name__} with p.Instantiate(), not by '
          'calling the class with other arguments.')
    p = params.Copy()
    parent = self._parent
    if not p.name:
      raise ValueError(
          f'{type(self).__name__} params have no name; set p.name.')
    if '/' in p.name:
      raise ValueError(f"Layer name {p.name!r} must not contain '/'.")
    if parent is not None:
      for key in ('dtype', 'fprop_dtype', 'random_seed', 'params_init'):
        if p.Get(key) is None:
          p.Set(**{key: parent.params.Get(key)})
    if p.dtype is None:
      p.dtype = tf.float32
    if p.random_seed is None:
      p.random_seed = 0
    if p.params_init is None:
      p.params_init = WeightInit.Xavier(1.0)
    self._params = p
    path_name = p.name if self._path_name is None else self._path_name
    if parent is None:
      self._path = p.name
    elif path_name:
      self._path = f'{parent.path}/{path_name}'
    else:
      self._path = parent.path
    seed_name = p.name if self._seed_name is None else self._seed_name
    if parent is None:
      self._seed_path = seed_name
    elif seed_name:
      self._seed_path = f'{parent._seed_path}/{seed_name}'  # pylint: disable=protected-access
    else:
      self._seed_path = parent._seed_path  # pylint: disable=protected-access
    self._vars = NestedMap()
    self._children = NestedMap()
    self._accumulators = NestedMap()
    self._path_names = set()  # names used as path components
    self.training = True
    self.update_stats = True
    self.replica = 0
    self.num_replicas = 1

  # ---- construction ---------------------------------------------------

  def _Seal(self) -> None:
    self._sealed = True
    self._params.Freeze()

  def _CheckUnsealed(self, what: str, name: str,
                     path_names: Optional[Sequence[str]] = None) -> None:
    if self._sealed:
      raise RuntimeError(
          f"Layer '{self.path}' created {what} '{name}' outside __init__; "
          'create every variable and child in __init__.')
    if name in self._vars or name in self._children or (
        name in self._accumulators):
      raise ValueError(
          f"Layer '{self.path}' already has a variable or child "
          f"named '{name}'; pick another name.")
    NestedMap.CheckKey(name)
    if what in ('child', 'children') and hasattr(self, name):
      raise ValueError(
          f"Layer '{self.path}' cannot name a {what} '{name}': "
          f'{type(self).__name__}.{name} would hide it; pick another name.')
    path_names = [name] if path_names is None else list(path_names)
    for n in path_names:
      if n in self._path_names:
        raise ValueError(
            f"Layer '{self.path}' already has a variable or child at path "
            f"'{self.path}/{n}'; pick another name.")
    self._path_names.update(path_names)

  def CreateVariable(self, name: str, wp: hyperparams.Params) -> tf.Variable:
    """Creates variable `name` from WeightParams, in `theta.<name>`."""
    self._CheckUnsealed('variable', name)
    var = self._NewVariable(name, wp)
    self._vars[name] = var
    return var

  def CreateAccumulator(self, name: str, shape: Sequence[int],
                        dtype: Optional[tf.DType] = None) -> tf.Variable:
    """A zero-initialised non-trainable variable kept out of theta.

    Accumulators gather statistics across several FProp calls (BatchNorm
    over micro-batches); they are updated with `assign_add`, not read from
    theta, and are not checkpointed.
    """
    self._CheckUnsealed('accumulator', name)
    wp = WeightParams(shape, WeightInit.Constant(0.0), dtype, trainable=False)
    var = self._NewVariable(name, wp)
    self._accumulators[name] = var
    return var

  def _NewVariable(self, name: str, wp: hyperparams.Params) -> tf.Variable:
    dtype = wp.dtype or self.params.dtype
    init = wp.init or self.params.params_init
    path = f'{self.path}/{name}'
    for dim in wp.shape:
      if not isinstance(dim, int) or dim < 0:
        raise ValueError(
            f"Variable '{path}' has shape {list(wp.shape)}; every dimension "
            'must be a non-negative int.')
    if getattr(_SHAPES_ONLY, 'on', False):
      return VariableShape(path, tf.TensorShape(wp.shape), tf.as_dtype(dtype),
                           bool(wp.trainable))
    seed = PathSeed(self.params.random_seed, f'{self._seed_path}/{name}')
    value = InitialValue(init, wp.shape, dtype, seed)
    return tf.Variable(value, trainable=wp.trainable, name=path, dtype=dtype)

  def CreateChild(self, name: str, params: hyperparams.Params,
                  seed_name: Optional[str] = None,
                  path_name: Optional[str] = None) -> 'BaseLayer':
    """Builds a child layer from a copy of `params`, as `self.<name>`.

    `seed_name` is the child's part of the seed path of its variables
    (default: `name`); '' leaves it out, so the child's variables start
    as if they belonged to this layer's own subtree directly. `path_name`
    is the same for the child's path (variable and checkpoint names); ''
    is for a parent whose children's own children have names unique among
    all of them (a pipeline's cells).
    """
    self._CheckUnsealed('child', name)
    p = params.Copy()
    p.name = name
    child = p.cls(p, parent=self, seed_name=seed_name, path_name=path_name)
    self._children[name] = child
    return child

  def CreateChildren(self, name: str,
                     params_list: Sequence[hyperparams.Params]
                     ) -> List['BaseLayer']:
    """Builds a list of children named `name_0`, `name_1`, ..."""
    self._CheckUnsealed('children', name,
                        [f'{name}_{i}' for i in range(len(params_list))])
    built = []
    for i, params in enumerate(params_list):
      p = params.Copy()
      p.name = f'{name}_{i}'
      built.append(p.cls(p, parent=self))
    self._children[name] = built
    return built

  def __getattr__(self, name: str) -> Any:
    children = self.__dict__.get('_children')
    if children is not None and name in children:
      return children[name]
    raise AttributeError(
        f"'{type(self).__name__}' layer has no attribute '{name}'")

  # ---- the tree --------------------------------------------------------

  @property
  def params(self) -> hyperparams.Params:
    """This layer's params (a frozen copy)."""
    return self._params

  @property
  def path(self) -> str:
    """'root/child/grandchild': the prefix of this layer's variable paths."""
    return self._path

  @property
  def seed_path(self) -> str:
    """The path that seeds this layer's initial values (module docstring)."""
    return self._seed_path

  @property
  def fprop_dtype(self) -> tf.DType:
    return self.params.fprop_dtype or self.params.dtype

  @property
  def children(self) -> NestedMap:
    return self._children

  def _Tree(self, attr: str) -> NestedMap:
    tree = NestedMap(getattr(self, attr))
    for name, child in self._children.items():
      if isinstance(child, list):
        tree[name] = [c._Tree(attr) for c in child]  # pylint: disable=protected-access
      else:
        tree[name] = child._Tree(attr)  # pylint: disable=protected-access
    return tree

  @property
  def vars(self) -> NestedMap:
    """Every variable of the subtree (not accumulators), as a NestedMap."""
    return self._Tree('_vars')

  @property
  def theta(self) -> NestedMap:
    """What FProp reads: the variables of the subtree."""
    return self.vars

  @property
  def accumulators(self) -> NestedMap:
    return self._Tree('_accumulators')

  def VariablesByPath(self) -> Dict[str, tf.Variable]:
    """{'root/child/w': variable} for the subtree, for checkpoints."""
    out = {}
    for layer in self.Layers():
      for name, var in layer._vars.items():  # pylint: disable=protected-access
        out[f'{layer.path}/{name}'] = var
    return dict(sorted(out.items()))

  def Layers(self) -> Iterator['BaseLayer']:
    """This layer and every descendant, parents first."""
    yield self
    for child in self._children.values():
      for c in (child if isinstance(child, list) else [child]):
        yield from c.Layers()

  # ---- modes -----------------------------------------------------------

  def SetTraining(self, training: bool) -> None:
    """Training (dropout on, batch statistics) or eval, for the subtree."""
    for layer in self.Layers():
      layer.training = bool(training)

  def SetUpdateStats(self, update: bool) -> None:
    """Whether FProp adds to statistics accumulators, for the subtree."""
    for layer in self.Layers():
      layer.update_stats = bool(update)

  def SetReplica(self, replica: int, num_replicas: int = 1) -> None:
    """Which of how many replicas pipelines of the subtree run as."""
    for layer in self.Layers():
      layer.replica = int(replica)
      layer.num_replicas = int(num_replicas)

  @contextlib.contextmanager
  def NoStatUpdates(self) -> Iterator[None]:
    """Traces FProp without touching accumulators (for re-computation)."""
    saved = [(layer, layer.update_stats) for layer in self.Layers()]
    self.SetUpdateStats(False)
    try:
      yield
    finally:
      for layer, value in saved:
        layer.update_stats = value

  # ---- computation -----------------------------------------------------

  def FProp(self, theta: NestedMap, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        f'{type(self).__name__} must implement FProp(theta, ...).')

  def FPropDefaultTheta(self, *args: Any, **kwargs: Any) -> Any:
    """FProp with this layer's own variables as theta."""
    return self.FProp(self.theta, *args, **kwargs)

  def UpdateStats(self) -> List[tf.Operation]:
    """Folds accumulated statistics into the layer's state; resets them.

    The base does nothing for itself and recurses into children; layers
    with accumulators (BatchNorm) override `_UpdateOwnStats`.
    """
    updates = []
    for layer in self.Layers():
      updates.extend(layer._UpdateOwnStats())  # pylint: disable=protected-access
    return updates

  def _UpdateOwnStats(self) -> List[Any]:
    return []

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any
                ) -> NestedMap:
    """Cost of FProp for the given input shapes, without building it.

    Returns NestedMap(flops=int, out_shapes=tuple of shapes matching what
    FProp returns). Layers the partitioner balances by flops override it.
    """
    raise NotImplementedError(
        f'{cls.__name__} has no FPropMeta; implement it, or balance '
        "partitions with cost='params' or cost='time'.")


HALF_DTYPES = (tf.bfloat16, tf.float16)


def AtLeastFloat32(x: tf.Tensor) -> tf.Tensor:
  """`x` in float32 if it is bfloat16 or float16, else `x` itself.

  What a half-precision model computes in float32: normalisation
  statistics, softmax cross-entropy, losses.
  """
  return tf.cast(x, tf.float32) if x.dtype in HALF_DTYPES else x


def MetaNumElements(shape: Any, where: str) -> int:
  """Elements of `shape` for `where`.FPropMeta; an error if not static."""
  shape = tf.TensorShape(shape)
  if not shape.is_fully_defined():
    raise ValueError(
        f'{where}.FPropMeta needs a fully defined input shape, got {shape}.')
  return int(shape.num_elements())


def NumParameters(layer: BaseLayer) -> int:
  """Number of scalar parameters in the layer's trainable variables."""
  return sum(int(v.shape.num_elements()) for v in layer.vars.Flatten()
             if v.trainable)
