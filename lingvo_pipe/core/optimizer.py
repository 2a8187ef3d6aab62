"""Optimizers built from Params: SGD, Momentum, Adam, RMSProp, Adafactor.

An optimizer is a plain object (not a layer) made from its params. Its
state (slots) is created eagerly, each slot on its variable's device, and
`Apply` runs every variable's update on that variable's device, so a
pipelined model's optimizer state and updates stay with its partitions:

  opt = optimizer.Adam.Params().Set(beta1=0.9).Instantiate()
  opt.CreateSlots(task.VariablesByPath())      # eagerly, once
  ...
  ops = opt.Apply(lr, grads_and_vars)          # inside a tf.function

Slots are keyed by the variable's path ('task/proj/w'), and
`SlotVariables()` names them '<var path>/<slot>' for checkpoints; an
optimizer with a step counter (Adam, Adafactor) adds '<p.name>/step'.

Update rules, with g the gradient, lr the learning rate and t the step
counter after its increment (t = 1 at the first Apply):

  SGD        var -= lr * g
  Momentum   accum = momentum * accum + g
             var -= lr * accum                        (use_nesterov=False)
             var -= lr * (g + momentum * accum)       (use_nesterov=True)
  Adam       m = beta1 * m + (1 - beta1) * g
             v = beta2 * v + (1 - beta2) * g**2
             var -= lr * (m / (1 - beta1**t)) /
                    (sqrt(v / (1 - beta2**t)) + epsilon)
  RMSProp    ms = decay * ms + (1 - decay) * g**2     (ms starts at 0)
             mom = momentum * mom + lr * g / sqrt(ms + epsilon)
             var -= mom
             (momentum = 0 keeps no 'mom' slot: var -= lr * g /
             sqrt(ms + epsilon))
  Adafactor  see the Adafactor class docstring.

Gradients may be IndexedSlices; they are made dense. A None gradient
leaves its variable and slots untouched.
"""

from __future__ import annotations

import math
from typing import (Any, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import tensorflow as tf

from lingvo_pipe.core import hyperparams

Variables = Union[Mapping[str, tf.Variable], Sequence[tf.Variable]]
GradsAndVars = Sequence[Tuple[Optional[Any], tf.Variable]]


def VariablePath(var: tf.Variable) -> str:
  """'task/proj/w' for the variable named 'task/proj/w:0'."""
  return var.name.split(':')[0]


class BaseOptimizer:
  """Owns the slots of a set of variables and applies updates to them.

  Subclasses define `_SlotShapes(var)` (slot name -> shape) and
  `_ApplyOne(lr, grad, var, slots, step)`, which returns the assign ops of
  one variable; it runs under `tf.device(var.device)`.
  """

  # Whether the optimizer keeps a step counter ('<name>/step').
  _HAS_STEP = False

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'optimizer',
             "Prefix of the optimizer's own variables in SlotVariables(), "
             "e.g. '<name>/step'.")
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    self._params = params.Copy().Freeze()
    if not self._params.name or '/' in self._params.name:
      raise ValueError(
          f'{type(self).__name__}: name={self._params.name!r} must be a '
          "non-empty string without '/'.")
    self._CheckParams()
    self._slots: Dict[str, Dict[str, tf.Variable]] = {}
    self._paths: Dict[Any, str] = {}  # var.ref() -> path
    self._step: Optional[tf.Variable] = None

  @property
  def params(self) -> hyperparams.Params:
    return self._params

  def _CheckParams(self) -> None:
    """Raises ValueError for bad params; subclasses extend it."""

  def _CheckInRange(self, key: str, low: float, high: float,
                    high_open: bool = True) -> None:
    value = self._params.Get(key)
    ok = low <= value < high if high_open else low <= value <= high
    if not ok:
      bracket = ')' if high_open else ']'
      raise ValueError(
          f'{type(self).__name__}: {key}={value!r} must be in '
          f'[{low}, {high}{bracket}.')

  # ---- slots -------------------------------------------------------------

  @property
  def slots(self) -> Dict[str, Dict[str, tf.Variable]]:
    """{var path: {slot name: variable}}."""
    return self._slots

  @property
  def step(self) -> Optional[tf.Variable]:
    """The int64 step counter (number of Apply calls), or None."""
    return self._step

  def _SlotShapes(self, var: tf.Variable) -> Dict[str, List[int]]:
    del var
    return {}

  def CreateSlots(self, variables: Variables) -> None:
    """Creates the slots of `variables` eagerly, each on its var's device.

    Args:
      variables: {path: variable}, or a list of variables (keyed by their
        names without ':0'). Variables that already have slots are skipped.
    """
    if not tf.executing_eagerly():
      raise RuntimeError(
          f'{type(self).__name__}.CreateSlots must run eagerly, outside '
          'tf.function: call it once before tracing the train step.')
    if not isinstance(variables, Mapping):
      variables = {VariablePath(v): v for v in variables}
    if self._HAS_STEP and self._step is None:
      self._step = tf.Variable(
          tf.constant(0, tf.int64), trainable=False,
          name=f'{self._params.name}/step')
    for path, var in variables.items():
      if var.ref() in self._paths:
        continue
      if path in self._slots:
        raise ValueError(
            f'{type(self).__name__}: two variables share the path '
            f'{path!r}; give them distinct names.')
      slots = {}
      with tf.device(var.device):
        for name, shape in self._SlotShapes(var).items():
          slots[name] = tf.Variable(
              tf.zeros(shape, var.dtype), trainable=False,
              name=f'{path}/{name}')
      self._slots[path] = slots
      self._paths[var.ref()] = path

  def SlotVariables(self) -> Dict[str, tf.Variable]:
    """Flat {'<var path>/<slot>': variable} (+ '<name>/step'), sorted."""
    out = {}
    if self._step is not None:
      out[f'{self._params.name}/step'] = self._step
    for path in sorted(self._slots):
      for name in sorted(self._slots[path]):
        out[f'{path}/{name}'] = self._slots[path][name]
    return out

  # ---- updates -----------------------------------------------------------

  def Apply(self, lr: Any, grads_and_vars: GradsAndVars) -> List[Any]:
    """Updates every variable with a gradient; returns the update ops.

    Works eagerly and inside tf.function. Each variable's update runs under
    `tf.device(var.device)`. `lr` is a scalar: a Python number, or a
    tensor cast to each variable's dtype. In a tf.function the result is a
    list of Operations (use them in tf.control_dependencies or tf.group;
    a tf.function cannot return them).
    """
    step = None
    ops = []
    if self._step is not None:
      with tf.name_scope('step'):
        step = self._step.read_value() + 1
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      path = self._paths.get(var.ref())
      if path is None:
        raise ValueError(
            f'{type(self).__name__}: variable {var.name!r} has no slots; '
            'pass it to CreateSlots() before Apply().')
      with tf.device(var.device):
        grad = tf.convert_to_tensor(grad)
        var_lr = _Scalar(lr, var.dtype)
        ops.extend(self._ApplyOne(var_lr, grad, var, self._slots[path], step))
    if step is not None:
      with tf.name_scope('step'):
        ops.append(self._step.assign(step, read_value=False))
    return ops

  def _ApplyOne(self, lr: tf.Tensor, grad: tf.Tensor, var: tf.Variable,
                slots: Dict[str, tf.Variable],
                step: Optional[tf.Tensor]) -> List[Any]:
    raise NotImplementedError(
        f'{type(self).__name__} must implement _ApplyOne.')


def _Scalar(value: Any, dtype: tf.DType) -> tf.Tensor:
  """`value` in `dtype`; a Python number is not rounded to float32 first."""
  if isinstance(value, (int, float)):
    return tf.constant(value, dtype)
  return tf.cast(value, dtype)


def _Assign(var: tf.Variable, value: tf.Tensor) -> Any:
  return var.assign(value, read_value=False)


class SGD(BaseOptimizer):
  """var -= lr * g. No slots."""

  def _ApplyOne(self, lr, grad, var, slots, step):
    return [var.assign_sub(lr * grad, read_value=False)]


class Momentum(BaseOptimizer):
  """Heavy-ball momentum, slot 'accum' (module docstring for the rule)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('momentum', 0.9, 'Decay of the accumulated gradient, [0, 1).')
    p.Define('use_nesterov', False, 'Nesterov momentum.')
    return p

  def _CheckParams(self) -> None:
    self._CheckInRange('momentum', 0.0, 1.0)

  def _SlotShapes(self, var):
    return {'accum': var.shape}

  def _ApplyOne(self, lr, grad, var, slots, step):
    mu = tf.constant(self.params.momentum, var.dtype)
    accum = mu * slots['accum'].read_value() + grad
    update = grad + mu * accum if self.params.use_nesterov else accum
    return [_Assign(slots['accum'], accum),
            var.assign_sub(lr * update, read_value=False)]


class Adam(BaseOptimizer):
  """Adam with bias correction, slots 'm' and 'v' (module docstring)."""

  _HAS_STEP = True

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first moment, [0, 1).')
    p.Define('beta2', 0.999, 'Decay of the second moment, [0, 1).')
    p.Define('epsilon', 1e-8, 'Added to sqrt of the corrected second moment.')
    return p

  def _CheckParams(self) -> None:
    self._CheckInRange('beta1', 0.0, 1.0)
    self._CheckInRange('beta2', 0.0, 1.0)
    self._CheckInRange('epsilon', 0.0, math.inf)

  def _SlotShapes(self, var):
    return {'m': var.shape, 'v': var.shape}

  def _ApplyOne(self, lr, grad, var, slots, step):
    p = self.params
    dtype = var.dtype
    b1, b2 = tf.constant(p.beta1, dtype), tf.constant(p.beta2, dtype)
    t = tf.cast(step, dtype)
    m = b1 * slots['m'].read_value() + (1.0 - b1) * grad
    v = b2 * slots['v'].read_value() + (1.0 - b2) * tf.square(grad)
    m_hat = m / (1.0 - tf.pow(b1, t))
    v_hat = v / (1.0 - tf.pow(b2, t))
    update = m_hat / (tf.sqrt(v_hat) + tf.constant(p.epsilon, dtype))
    return [_Assign(slots['m'], m), _Assign(slots['v'], v),
            var.assign_sub(lr * update, read_value=False)]


class RMSProp(BaseOptimizer):
  """RMSProp, slots 'ms' and (if momentum > 0) 'mom' (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('decay', 0.9, 'Decay of the mean square ms, [0, 1).')
    p.Define('momentum', 0.0, 'Decay of the update mom, [0, 1).')
    p.Define('epsilon', 1e-10, 'Added to ms inside the sqrt.')
    return p

  def _CheckParams(self) -> None:
    self._CheckInRange('decay', 0.0, 1.0)
    self._CheckInRange('momentum', 0.0, 1.0)
    self._CheckInRange('epsilon', 0.0, math.inf)

  def _SlotShapes(self, var):
    shapes = {'ms': var.shape}
    if self.params.momentum > 0:
      shapes['mom'] = var.shape
    return shapes

  def _ApplyOne(self, lr, grad, var, slots, step):
    p = self.params
    dtype = var.dtype
    decay = tf.constant(p.decay, dtype)
    ms = decay * slots['ms'].read_value() + (1.0 - decay) * tf.square(grad)
    update = lr * grad / tf.sqrt(ms + tf.constant(p.epsilon, dtype))
    ops = [_Assign(slots['ms'], ms)]
    if 'mom' in slots:
      update += tf.constant(p.momentum, dtype) * slots['mom'].read_value()
      ops.append(_Assign(slots['mom'], update))
    ops.append(var.assign_sub(update, read_value=False))
    return ops


class Adafactor(BaseOptimizer):
  """Adafactor (simple form): factored second moments, update clipping.

  With t the step (from 1), eps1 = epsilon1, d = clipping_threshold:

    beta2_t = 1 - t**(-decay_exponent)
    g2 = g**2 + eps1
    rank >= 2 (factored over the last two axes; slots 'vr', 'vc'):
      vr = beta2_t * vr + (1 - beta2_t) * mean(g2, axis=-1)    [..., rows]
      vc = beta2_t * vc + (1 - beta2_t) * mean(g2, axis=-2)    [..., cols]
      v = vr[..., :, None] * vc[..., None, :] / mean(vr, axis=-1)[..., None,
          None]
    rank < 2 (slot 'v'):
      v = beta2_t * v + (1 - beta2_t) * g2
    u = g / sqrt(v)
    u = u / max(1, rms(u) / d)                    (if d > 0; rms = sqrt(mean))
    m = beta1 * m + (1 - beta1) * u; u = m        (if beta1 > 0; slot 'm')
    var -= lr * u

  No relative step size or parameter scaling: the learning rate is lr.
  """

  _HAS_STEP = True

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('decay_exponent', 0.8,
             'beta2_t = 1 - t**(-decay_exponent); in [0, 1].')
    p.Define('epsilon1', 1e-30, 'Added to the squared gradient.')
    p.Define('clipping_threshold', 1.0,
             'd: updates with rms above d are scaled to rms d; 0 = off.')
    p.Define('beta1', 0.0, 'First-moment decay; 0 keeps no slot m.')
    p.Define('factored', True, 'Factor second moments of rank >= 2 vars.')
    return p

  def _CheckParams(self) -> None:
    self._CheckInRange('decay_exponent', 0.0, 1.0, high_open=False)
    self._CheckInRange('beta1', 0.0, 1.0)
    self._CheckInRange('epsilon1', 0.0, math.inf)
    self._CheckInRange('clipping_threshold', 0.0, math.inf)

  def _Factored(self, var: tf.Variable) -> bool:
    return self.params.factored and var.shape.rank >= 2

  def _SlotShapes(self, var):
    shape = list(var.shape)
    if self._Factored(var):
      shapes = {'vr': shape[:-1], 'vc': shape[:-2] + shape[-1:]}
    else:
      shapes = {'v': shape}
    if self.params.beta1 > 0:
      shapes['m'] = shape
    return shapes

  def _ApplyOne(self, lr, grad, var, slots, step):
    p = self.params
    dtype = var.dtype
    t = tf.cast(step, dtype)
    beta2 = 1.0 - tf.pow(t, tf.constant(-p.decay_exponent, dtype))
    g2 = tf.square(grad) + tf.constant(p.epsilon1, dtype)
    ops = []
    if self._Factored(var):
      vr = beta2 * slots['vr'].read_value() + (1.0 - beta2) * tf.reduce_mean(
          g2, axis=-1)
      vc = beta2 * slots['vc'].read_value() + (1.0 - beta2) * tf.reduce_mean(
          g2, axis=-2)
      row_mean = tf.reduce_mean(vr, axis=-1, keepdims=True)
      v = (tf.expand_dims(vr / row_mean, -1) * tf.expand_dims(vc, -2))
      ops += [_Assign(slots['vr'], vr), _Assign(slots['vc'], vc)]
    else:
      v = beta2 * slots['v'].read_value() + (1.0 - beta2) * g2
      ops.append(_Assign(slots['v'], v))
    update = grad * tf.math.rsqrt(v)
    if p.clipping_threshold > 0:
      rms = tf.sqrt(tf.reduce_mean(tf.square(update)))
      d = tf.constant(p.clipping_threshold, dtype)
      update /= tf.maximum(tf.constant(1.0, dtype), rms / d)
    if p.beta1 > 0:
      b1 = tf.constant(p.beta1, dtype)
      update = b1 * slots['m'].read_value() + (1.0 - b1) * update
      ops.append(_Assign(slots['m'], update))
    ops.append(var.assign_sub(lr * update, read_value=False))
    return ops
