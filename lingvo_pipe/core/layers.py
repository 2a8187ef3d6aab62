"""Basic layers, the softmax cross-entropy loss, and two combinators.

Activations, projections, convolutions, pooling and embeddings;
`SoftmaxCrossEntropy` (a function); `SequentialLayer` and `ResidualLayer`.

Every layer follows base_layer's conventions: variables are made in
`__init__`, `FProp(theta, ...)` reads weights only from `theta`, and the
classmethod `FPropMeta(params, *input_shapes)` returns
`NestedMap(flops=int, out_shapes=(tf.TensorShape, ...))` without building
the layer (flops count a multiply-add as 2), so the partitioner can balance
pipeline stages.

Images are NHWC: `[batch, height, width, channels]`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import kernels
from lingvo_pipe.core.nested_map import NestedMap

# ---- activations -------------------------------------------------------

# tf.nn.gelu(approximate=False) goes through erfc, which TF computes only to
# ~1e-9 in float64; erf is exact to rounding, so GELU uses it.
_SQRT_HALF = math.sqrt(0.5)

_ACTIVATIONS: Dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    'NONE': tf.identity,
    'RELU': tf.nn.relu,
    'RELU6': tf.nn.relu6,
    'SIGMOID': tf.sigmoid,
    'TANH': tf.tanh,
    'GELU': lambda x: 0.5 * x * (1.0 + tf.math.erf(x * _SQRT_HALF)),
    'SWISH': tf.nn.silu,
}

# Rough flops per element, for FPropMeta.
_ACTIVATION_FLOPS = {'NONE': 0, 'RELU': 1, 'RELU6': 2, 'SIGMOID': 4,
                     'TANH': 4, 'GELU': 8, 'SWISH': 5}


def CheckActivation(name: str, where: str = 'Activation') -> None:
  """Raises a one-line ValueError unless `name` is a known activation."""
  if name not in _ACTIVATIONS:
    raise ValueError(
        f'{where}: unknown activation {name!r}; use one of '
        f'{", ".join(_ACTIVATIONS)}.')


def Activation(name: str, x: tf.Tensor) -> tf.Tensor:
  """Applies activation `name` ('NONE', 'RELU', 'GELU', ...) to `x`.

  GELU is the exact (erf) form; SWISH is x * sigmoid(x).
  """
  CheckActivation(name)
  return _ACTIVATIONS[name](x)


# ---- helpers -----------------------------------------------------------


def _Shape(shape: Any) -> tf.TensorShape:
  return tf.TensorShape(shape)


def _FPropTheta(layer: base_layer.BaseLayer, theta: NestedMap) -> NestedMap:
  """theta with every leaf as a tensor of the layer's fprop dtype."""
  dtype = layer.fprop_dtype
  return theta.Transform(lambda v: tf.cast(v, dtype))


def _CheckLastDim(layer: base_layer.BaseLayer, x: tf.Tensor,
                  dim: int) -> None:
  last = x.shape[-1] if x.shape.rank else None
  if last is not None and last != dim:
    raise ValueError(
        f"{type(layer).__name__} '{layer.path}': input shape {x.shape} has "
        f'last dimension {last}; expected {dim}.')


def _CheckPositiveInts(where: str, name: str, values: Any,
                       length: int) -> None:
  if (not isinstance(values, Sequence) or isinstance(values, str) or
      len(values) != length or
      not all(isinstance(v, int) and v > 0 for v in values)):
    raise ValueError(
        f'{where}: {name}={values!r} must be {length} positive ints.')


def _CheckPadding(where: str, padding: str) -> None:
  if padding not in ('SAME', 'VALID'):
    raise ValueError(
        f"{where}: padding={padding!r} must be 'SAME' or 'VALID'.")


def _OutSize(size: int, window: int, stride: int, padding: str) -> int:
  """Output length of a strided window along one axis (TF's rule)."""
  if padding == 'SAME':
    return -(-size // stride)
  return max(0, -(-(size - window + 1) // stride))


def _OutImageShape(where: str, shape: tf.TensorShape, window: Sequence[int],
                   stride: Sequence[int], padding: str,
                   channels: int) -> tf.TensorShape:
  if shape.rank != 4 or None in shape.as_list()[1:3]:
    raise ValueError(
        f'{where}.FPropMeta needs an NHWC input shape with known height '
        f'and width, got {shape}.')
  b, h, w, _ = shape.as_list()
  return tf.TensorShape([b, _OutSize(h, window[0], stride[0], padding),
                         _OutSize(w, window[1], stride[1], padding),
                         channels])


# ---- simple layers -----------------------------------------------------


class ActivationLayer(base_layer.BaseLayer):
  """y = activation(x), elementwise; any shape."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('activation', 'RELU',
             f'One of {", ".join(_ACTIVATIONS)}.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    CheckActivation(self.params.activation,
                    f"ActivationLayer '{self.path}'")

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    del theta  # no variables
    return Activation(self.params.activation, inputs)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    shape = _Shape(input_shape)
    CheckActivation(params.activation, cls.__name__)
    n = base_layer.MetaNumElements(shape, cls.__name__)
    return NestedMap(flops=_ACTIVATION_FLOPS[params.activation] * n,
                     out_shapes=(shape,))


class ProjectionLayer(base_layer.BaseLayer):
  """Fully connected: y = activation(x @ w + b).

  x [..., input_dim] -> y [..., output_dim]; `w` is [input_dim,
  output_dim], `b` is [output_dim] (zero-initialised, only if has_bias).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last axis of the input.')
    p.Define('output_dim', 0, 'Size of the last axis of the output.')
    p.Define('has_bias', True, 'Whether to add the bias b.')
    p.Define('activation', 'NONE',
             f'One of {", ".join(_ACTIVATIONS)}.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"ProjectionLayer '{self.path}'"
    for key in ('input_dim', 'output_dim'):
      if not isinstance(p.Get(key), int) or p.Get(key) <= 0:
        raise ValueError(f'{where}: {key}={p.Get(key)!r} must be > 0.')
    CheckActivation(p.activation, where)
    self.CreateVariable(
        'w', base_layer.WeightParams([p.input_dim, p.output_dim]))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.output_dim], base_layer.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    p = self.params
    _CheckLastDim(self, inputs, p.input_dim)
    theta = _FPropTheta(self, theta)
    y = kernels.MatmulLastDim(inputs, theta.w)
    if p.has_bias:
      y += theta.b
    return Activation(p.activation, y)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    shape = _Shape(input_shape)
    rows = base_layer.MetaNumElements(shape, cls.__name__) // params.input_dim
    out = rows * params.output_dim
    flops = 2 * rows * params.input_dim * params.output_dim
    flops += (out if params.has_bias else 0)
    flops += _ACTIVATION_FLOPS[params.activation] * out
    return NestedMap(flops=flops,
                     out_shapes=(shape[:-1].concatenate([params.output_dim]),))


class Conv2DLayer(base_layer.BaseLayer):
  """2-D convolution: y = activation(conv2d(x, w) + b), NHWC.

  x [batch, height, width, in] -> y [batch, out_h, out_w, out]; `w` is
  filter_shape [h, w, in, out], `b` is [out] (only if has_bias).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('filter_shape', (0, 0, 0, 0),
             'Filter shape [height, width, in_channels, out_channels].')
    p.Define('filter_stride', (1, 1), 'Strides [height, width].')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    p.Define('has_bias', True, 'Whether to add a bias per output channel.')
    p.Define('activation', 'NONE',
             f'One of {", ".join(_ACTIVATIONS)}.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"Conv2DLayer '{self.path}'"
    _CheckPositiveInts(where, 'filter_shape', p.filter_shape, 4)
    _CheckPositiveInts(where, 'filter_stride', p.filter_stride, 2)
    _CheckPadding(where, p.padding)
    CheckActivation(p.activation, where)
    self.CreateVariable('w', base_layer.WeightParams(list(p.filter_shape)))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.filter_shape[3]], base_layer.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    p = self.params
    _CheckLastDim(self, inputs, p.filter_shape[2])
    theta = _FPropTheta(self, theta)
    sh, sw = p.filter_stride
    if tuple(p.filter_shape[:2]) == (1, 1):
      # A 1x1 filter reads every stride-th pixel, with either padding. No
      # slice at stride 1: TF runs it as a view, but it would be one more
      # op, and one more kept tensor for the planner to recognise.
      strided = inputs if (sh, sw) == (1, 1) else inputs[:, ::sh, ::sw, :]
      y = kernels.PointwiseConv(strided, theta.w)
    else:
      y = kernels.Conv2D(inputs, theta.w, (sh, sw), p.padding)
    if p.has_bias:
      y += theta.b
    return Activation(p.activation, y)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    fh, fw, cin, cout = params.filter_shape
    out = _OutImageShape(cls.__name__, _Shape(input_shape), (fh, fw),
                         params.filter_stride, params.padding, cout)
    n = base_layer.MetaNumElements(out, cls.__name__)
    flops = 2 * n * fh * fw * cin
    flops += (n if params.has_bias else 0)
    flops += _ACTIVATION_FLOPS[params.activation] * n
    return NestedMap(flops=flops, out_shapes=(out,))


class DepthwiseSeparableConv2DLayer(base_layer.BaseLayer):
  """Depthwise then pointwise convolution, bias and activation, NHWC.

  x [batch, height, width, in] -> y [batch, out_h, out_w, out]:
    d = depthwise_conv2d(x, depthwise_w)   # depthwise_w [h, w, in, mult]
    y = activation(conv2d(d, pointwise_w) + b)  # pointwise_w [1, 1,
                                                #   in * mult, out]
  Channel c * mult + m of d is channel c filtered by depthwise_w[..., c, m].
  The stride applies to the depthwise step and must be equal along height
  and width (a TensorFlow restriction); so does the dilation rate, which
  needs stride 1.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('filter_shape', (0, 0, 0, 0),
             'Depthwise filter shape [height, width, in_channels, '
             'depth_multiplier].')
    p.Define('output_dim', 0, 'Output channels of the pointwise step.')
    p.Define('filter_stride', (1, 1),
             'Strides [height, width]; the two must be equal.')
    p.Define('dilation_rate', (1, 1),
             'Dilation [height, width] of the depthwise filter; the two '
             'must be equal, and > 1 only with stride 1.')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    p.Define('has_bias', True, 'Whether to add a bias per output channel.')
    p.Define('activation', 'NONE',
             f'One of {", ".join(_ACTIVATIONS)}.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"DepthwiseSeparableConv2DLayer '{self.path}'"
    _CheckPositiveInts(where, 'filter_shape', p.filter_shape, 4)
    _CheckPositiveInts(where, 'filter_stride', p.filter_stride, 2)
    if p.filter_stride[0] != p.filter_stride[1]:
      raise ValueError(
          f'{where}: filter_stride={p.filter_stride!r} must be equal along '
          'height and width.')
    _CheckPositiveInts(where, 'dilation_rate', p.dilation_rate, 2)
    if (p.dilation_rate[0] != p.dilation_rate[1] or
        (p.dilation_rate[0] > 1 and p.filter_stride[0] > 1)):
      raise ValueError(
          f'{where}: dilation_rate={p.dilation_rate!r} must be equal along '
          'height and width, and 1 when filter_stride is not 1.')
    _CheckPositiveInts(where, 'output_dim', [p.output_dim], 1)
    _CheckPadding(where, p.padding)
    CheckActivation(p.activation, where)
    fh, fw, cin, mult = p.filter_shape
    self.CreateVariable('depthwise_w',
                        base_layer.WeightParams([fh, fw, cin, mult]))
    self.CreateVariable('pointwise_w', base_layer.WeightParams(
        [1, 1, cin * mult, p.output_dim]))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.output_dim], base_layer.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    p = self.params
    _CheckLastDim(self, inputs, p.filter_shape[2])
    theta = _FPropTheta(self, theta)
    sh, sw = p.filter_stride
    y = tf.nn.depthwise_conv2d(inputs, theta.depthwise_w, [1, sh, sw, 1],
                               p.padding, dilations=p.dilation_rate)
    y = kernels.PointwiseConv(y, theta.pointwise_w)
    if p.has_bias:
      y += theta.b
    return Activation(p.activation, y)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    fh, fw, cin, mult = params.filter_shape
    rh, rw = params.dilation_rate
    out = _OutImageShape(cls.__name__, _Shape(input_shape),
                         ((fh - 1) * rh + 1, (fw - 1) * rw + 1),
                         params.filter_stride, params.padding,
                         params.output_dim)
    n = base_layer.MetaNumElements(out, cls.__name__)
    positions = n // params.output_dim
    flops = 2 * positions * fh * fw * cin * mult
    flops += 2 * positions * cin * mult * params.output_dim
    flops += (n if params.has_bias else 0)
    flops += _ACTIVATION_FLOPS[params.activation] * n
    return NestedMap(flops=flops, out_shapes=(out,))


class PoolingLayer(base_layer.BaseLayer):
  """Max or average pooling over height and width, NHWC.

  x [batch, height, width, c] -> y [batch, out_h, out_w, c]. With 'SAME'
  padding, average pooling divides by the number of in-image elements of
  each window (TensorFlow's rule), not by the window size.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pooling_type', 'MAX', "'MAX' or 'AVG'.")
    p.Define('window_shape', (0, 0), 'Window [height, width].')
    p.Define('window_stride', (1, 1), 'Strides [height, width].')
    p.Define('padding', 'SAME', "'SAME' or 'VALID'.")
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"PoolingLayer '{self.path}'"
    if p.pooling_type not in ('MAX', 'AVG'):
      raise ValueError(
          f"{where}: pooling_type={p.pooling_type!r} must be 'MAX' or "
          "'AVG'.")
    _CheckPositiveInts(where, 'window_shape', p.window_shape, 2)
    _CheckPositiveInts(where, 'window_stride', p.window_stride, 2)
    _CheckPadding(where, p.padding)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    del theta  # no variables
    p = self.params
    pool = (tf.nn.max_pool2d if p.pooling_type == 'MAX'
            else tf.nn.avg_pool2d)
    return pool(inputs, list(p.window_shape), list(p.window_stride),
                p.padding)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    shape = _Shape(input_shape)
    out = _OutImageShape(cls.__name__, shape, params.window_shape,
                         params.window_stride, params.padding, shape[-1])
    n = base_layer.MetaNumElements(out, cls.__name__)
    return NestedMap(flops=n * math.prod(params.window_shape),
                     out_shapes=(out,))


class EmbeddingLayer(base_layer.BaseLayer):
  """Looks up ids: y[b, t] = w[ids[b, t]] (* sqrt(embedding_dim)).

  ids [...] int -> y [..., embedding_dim]; `w` is [vocab_size,
  embedding_dim]. `Logits(theta, x)` reuses `w` as softmax weights (tied
  embeddings): x [..., embedding_dim] -> [..., vocab_size].
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 0, 'Number of ids.')
    p.Define('embedding_dim', 0, 'Size of each embedding vector.')
    p.Define('scale_sqrt_depth', False,
             'Multiply looked-up vectors by sqrt(embedding_dim).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"EmbeddingLayer '{self.path}'"
    for key in ('vocab_size', 'embedding_dim'):
      if not isinstance(p.Get(key), int) or p.Get(key) <= 0:
        raise ValueError(f'{where}: {key}={p.Get(key)!r} must be > 0.')
    self.CreateVariable(
        'w', base_layer.WeightParams([p.vocab_size, p.embedding_dim]))

  def EmbLookup(self, theta: NestedMap, ids: tf.Tensor) -> tf.Tensor:
    """ids [...] int -> [..., embedding_dim]."""
    p = self.params
    theta = _FPropTheta(self, theta)
    y = tf.gather(theta.w, ids)
    if p.scale_sqrt_depth:
      y *= math.sqrt(p.embedding_dim)
    return y

  def FProp(self, theta: NestedMap, ids: tf.Tensor) -> tf.Tensor:
    return self.EmbLookup(theta, ids)

  def Logits(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """inputs [..., embedding_dim] -> logits [..., vocab_size] = x @ w^T."""
    _CheckLastDim(self, inputs, self.params.embedding_dim)
    theta = _FPropTheta(self, theta)
    return kernels.MatmulLastDim(inputs, theta.w, transpose_w=True)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                ids_shape: Any) -> NestedMap:
    shape = _Shape(ids_shape)
    out = shape.concatenate([params.embedding_dim])
    n = base_layer.MetaNumElements(out, cls.__name__)
    return NestedMap(flops=n if params.scale_sqrt_depth else 0,
                     out_shapes=(out,))


# ---- loss --------------------------------------------------------------


def SoftmaxCrossEntropy(logits: tf.Tensor,
                        class_ids: Optional[tf.Tensor] = None,
                        class_probabilities: Optional[tf.Tensor] = None,
                        label_smoothing: float = 0.0,
                        weights: Optional[tf.Tensor] = None,
                        paddings: Optional[tf.Tensor] = None) -> NestedMap:
  """Softmax cross-entropy with label smoothing and per-example weights.

  A function, not a layer: it has no variables, and the pipeline computes
  the loss after the last stage.

  Args:
    logits: [..., C].
    class_ids: int [...], the target classes. Give this or
      class_probabilities.
    class_probabilities: [..., C], one-hot or soft targets.
    label_smoothing: eps in [0, 1); the target is (1 - eps) * labels + eps
      / C, i.e. eps spread uniformly over all C classes.
    weights: optional [...] weight of each example (default 1).
    paddings: optional [...], 1 for padded positions, which get weight 0.

  Returns:
    NestedMap with
      log_probs: [..., C], log_softmax(logits).
      per_example_loss: [...], -sum_c target * log_probs (unweighted).
      per_example_weight: [...], weights * (1 - paddings).
      total_loss: [], sum of per_example_weight * per_example_loss.
      total_weight: [], sum of per_example_weight.
      avg_loss: [], total_loss / total_weight (0 if total_weight is 0).
    Half-precision logits are computed in float32.
  """
  if (class_ids is None) == (class_probabilities is None):
    raise ValueError(
        'SoftmaxCrossEntropy: pass exactly one of class_ids and '
        'class_probabilities.')
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(
        f'SoftmaxCrossEntropy: label_smoothing={label_smoothing} must be in '
        '[0, 1).')
  logits = tf.convert_to_tensor(logits)
  if logits.dtype in (tf.float16, tf.bfloat16):
    logits = tf.cast(logits, tf.float32)
  dtype = logits.dtype
  num_classes = logits.shape[-1]
  if num_classes is None:
    num_classes = tf.shape(logits)[-1]
  if class_ids is not None:
    target = tf.one_hot(class_ids, num_classes, dtype=dtype)
  else:
    target = tf.cast(class_probabilities, dtype)
  if label_smoothing:
    target = ((1.0 - label_smoothing) * target +
              label_smoothing / tf.cast(num_classes, dtype))
  log_probs = tf.nn.log_softmax(logits)
  per_example_loss = -tf.reduce_sum(target * log_probs, axis=-1)
  weight = (tf.ones_like(per_example_loss) if weights is None
            else tf.cast(weights, dtype))
  if paddings is not None:
    weight *= 1.0 - tf.cast(paddings, dtype)
  weight = tf.broadcast_to(weight, tf.shape(per_example_loss))
  total_loss = tf.reduce_sum(weight * per_example_loss)
  total_weight = tf.reduce_sum(weight)
  return NestedMap(
      log_probs=log_probs,
      per_example_loss=per_example_loss,
      per_example_weight=weight,
      total_loss=total_loss,
      total_weight=total_weight,
      avg_loss=tf.math.divide_no_nan(total_loss, total_weight))


# ---- combinators -------------------------------------------------------


class SequentialLayer(base_layer.BaseLayer):
  """Applies sub-layers in order: out = sub[n-1](... sub[0](*args)).

  Each sub-layer gets the previous one's output: a tuple output is splatted
  into positional arguments; anything else (a tensor, a NestedMap, a list)
  is passed as a single argument. The result is the last sub-layer's output
  as it returned it (with no sub-layers: the input, or the tuple of inputs).

  Children and theta: sub-layer i is the child named by its own params'
  `name`, or `sub_{i}` if that name is empty; names must be unique (a
  duplicate is an error). So theta is flat by name, `theta.<name>` being
  sub-layer <name>'s theta, and variable paths read `seq/<name>/w`.
  `sub_names` gives the order, `sub_layers` the layers in that order.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('sub', [],
             'List of layer params applied in order; each becomes the '
             "child named by its own name, or 'sub_{i}' if it is empty.")
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    names: List[str] = []
    for i, sub in enumerate(self.params.sub):
      name = sub.name or f'sub_{i}'
      if name in names:
        raise ValueError(
            f"SequentialLayer '{self.path}': sub-layers {names.index(name)} "
            f'and {i} are both named {name!r}; give them distinct names or '
            'leave them empty (they are then named sub_{i}).')
      self.CreateChild(name, sub)
      names.append(name)
    self._sub_names = tuple(names)

  @property
  def sub_names(self) -> Tuple[str, ...]:
    """Children names in application order."""
    return self._sub_names

  @property
  def sub_layers(self) -> List[base_layer.BaseLayer]:
    """Children in application order."""
    return [self.children[name] for name in self._sub_names]

  def FProp(self, theta: NestedMap, *args: Any) -> Any:
    out: Any = args[0] if len(args) == 1 else args
    for name in self._sub_names:
      out = self.children[name].FProp(theta[name], *args)
      args = out if isinstance(out, tuple) else (out,)
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                *input_shapes: Any) -> NestedMap:
    shapes = tuple(input_shapes)
    flops = 0
    for sub in params.sub:
      meta = sub.cls.FPropMeta(sub, *shapes)
      flops += int(meta.flops)
      shapes = tuple(meta.out_shapes)
    return NestedMap(flops=flops, out_shapes=shapes)


class ResidualLayer(base_layer.BaseLayer):
  """y = x + body(x); x and body(x) have the same shape [..., dim].

  The body is the child `body` (theta.body); it must return one tensor of
  its input's shape.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('body', None, 'Params of the layer the residual wraps.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    if self.params.body is None:
      raise ValueError(
          f"ResidualLayer '{self.path}': set p.body to the params of the "
          'wrapped layer.')
    self.CreateChild('body', self.params.body)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    y = self.body.FProp(theta.body, inputs)
    if not isinstance(y, tf.Tensor) or not y.shape.is_compatible_with(
        inputs.shape):
      raise ValueError(
          f"ResidualLayer '{self.path}': body output "
          f'{getattr(y, "shape", type(y).__name__)} does not match input '
          f'shape {inputs.shape}; the body must keep the shape.')
    if not (y.shape.is_fully_defined() and inputs.shape.is_fully_defined()):
      check = tf.debugging.assert_equal(
          tf.shape(y), tf.shape(inputs),
          message=f"ResidualLayer '{self.path}': body changed the shape")
      with tf.control_dependencies([check]):
        y = tf.identity(y)
    return inputs + y

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    shape = _Shape(input_shape)
    meta = params.body.cls.FPropMeta(params.body, shape)
    outs = tuple(meta.out_shapes)
    if len(outs) != 1 or not _Shape(outs[0]).is_compatible_with(shape):
      raise ValueError(
          f'ResidualLayer.FPropMeta: body output shapes {outs} do not match '
          f'input shape {shape}; the body must keep the shape.')
    flops = int(meta.flops) + base_layer.MetaNumElements(shape, cls.__name__)
    return NestedMap(flops=flops, out_shapes=(shape,))
