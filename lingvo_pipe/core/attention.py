"""Multi-head dot-product attention and positional embeddings.

Shapes use b = batch, tq = query time, tk = key time, d = input_dim,
h = num_heads, dh = hidden_dim / num_heads. Paddings follow Lingvo: 1.0
marks a padded position, 0.0 a real one.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple, Union

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import kernels
from lingvo_pipe.core.nested_map import NestedMap


def LargeNegative(dtype: tf.DType) -> tf.Tensor:
  """A logit that softmax turns into 0, safely representable in `dtype`."""
  return tf.constant(-0.7 * dtype.max, dtype)


def CausalMask(tq: Any, tk: Any) -> tf.Tensor:
  """bool [tq, tk]: True where key j is in the future of query i (j > i)."""
  q = tf.range(tq)[:, tf.newaxis]
  k = tf.range(tk)[tf.newaxis, :]
  return k > q


def PerExampleMatmul(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """x [b, t, i] @ w [i, o] -> [b, t, o], one [t, i] @ [i, o] per example.

  A flat [b * t, i] matmul may round an example's rows differently
  depending on b (Eigen picks kernels by size), which would make a
  micro-batch differ in the last bit from the same rows of the full batch.
  A batched matmul keeps each example's product independent of b.
  (Element-wise kernels such as exp can still round the last, partial
  vector of a buffer differently, at sizes that are not a multiple of the
  CPU's vector width.)

  The gradient of w is one flat [i, b * t] @ [b * t, o] matmul: it sums
  over the whole batch anyway, and TF's own gradient of a broadcast
  batched matmul would build a [b, i, o] product per example and reduce
  it (measured on a feed-forward layer, [32, 64, 256] inputs, hidden 1024:
  this takes 20% less time for the whole batch and 26% less in 8
  micro-batches).
  """
  return _PerExampleMatmul(x, tf.cast(w, x.dtype))


@tf.custom_gradient
def _PerExampleMatmul(x: tf.Tensor, w: tf.Tensor) -> Any:
  batched_w = tf.expand_dims(w, 0)
  y = tf.matmul(x, batched_w)

  def Grad(dy: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    dx = tf.matmul(dy, batched_w, transpose_b=True)
    return dx, kernels.RowsMatmul(x, dy)

  return y, Grad


def _Dims(x: tf.Tensor, n: int) -> list:
  """The first n sizes of x: Python ints where static, else scalars."""
  static = x.shape.as_list()[:n]
  if None not in static:
    return static
  dynamic = tf.shape(x)
  return [dynamic[i] if d is None else d for i, d in enumerate(static)]


def _Dim(shape: tf.TensorShape, i: int, what: str) -> int:
  value = tf.TensorShape(shape)[i]
  if value is None:
    raise ValueError(f'FPropMeta needs a static {what}; got shape {shape}.')
  return int(value)


class MultiHeadAttention(base_layer.BaseLayer):
  """Multi-head scaled dot-product attention (Vaswani et al. 2017).

  FProp(theta, query_vec [b, tq, d], key_vec [b, tk, d],
        value_vec [b, tk, d], paddings [b, tk], causal=False,
        example_keys=None) -> (encoded [b, tq, d], probs [b, h, tq, tk]):

    q = query_vec @ w_query + b_query        [b, tq, h, dh]
    k = key_vec @ w_key + b_key              [b, tk, h, dh]
    v = value_vec @ w_value + b_value        [b, tk, h, dh]
    logits[b, n, i, j] = q[b, i, n] . k[b, j, n] / sqrt(dh)
    logits = -inf-ish where paddings[b, j] > 0 or (causal and j > i)
    probs = softmax(logits, axis=-1), zeroed on rows with no valid key
    ctx[b, i, n] = sum_j dropout(probs)[b, n, i, j] * v[b, j, n]
    encoded = reshape(ctx, [b, tq, h * dh]) @ w_post + b_post

  `probs` is returned before dropout. A query row whose keys are all masked
  attends to nothing (its probs are 0, its encoded value is b_post), so no
  NaN appears. `causal` assumes query i and key i are the same position.
  Biases exist only if use_bias.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Dimension d of query, key and value vectors.')
    p.Define('hidden_dim', 0,
             'Total projected dimension over all heads; 0 means input_dim.')
    p.Define('num_heads', 1, 'Number of attention heads h.')
    p.Define('atten_dropout_prob', 0.0,
             'Dropout probability applied to the attention probabilities.')
    p.Define('use_bias', True, 'Whether the projections have biases.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    hidden = p.hidden_dim or p.input_dim
    if p.input_dim <= 0:
      raise ValueError(
          f"MultiHeadAttention '{self.path}': input_dim={p.input_dim} must "
          'be positive.')
    if p.num_heads <= 0 or hidden % p.num_heads:
      raise ValueError(
          f"MultiHeadAttention '{self.path}': hidden_dim={hidden} must be a "
          f'positive multiple of num_heads={p.num_heads}.')
    if not 0.0 <= p.atten_dropout_prob < 1.0:
      raise ValueError(
          f"MultiHeadAttention '{self.path}': atten_dropout_prob="
          f'{p.atten_dropout_prob} must be in [0, 1).')
    self._hidden_dim = hidden
    for name in ('query', 'key', 'value'):
      self.CreateVariable(f'w_{name}',
                          base_layer.WeightParams([p.input_dim, hidden]))
    self.CreateVariable('w_post',
                        base_layer.WeightParams([hidden, p.input_dim]))
    if p.use_bias:
      zeros = base_layer.WeightInit.Constant(0.0)
      for name in ('query', 'key', 'value'):
        self.CreateVariable(f'b_{name}',
                            base_layer.WeightParams([hidden], zeros))
      self.CreateVariable('b_post',
                          base_layer.WeightParams([p.input_dim], zeros))
    self.CreateChild(
        'atten_dropout',
        dropout.DropoutLayer.Params().Set(
            keep_prob=1.0 - p.atten_dropout_prob))

  @property
  def hidden_dim(self) -> int:
    return self._hidden_dim

  def _Project(self, theta: NestedMap, name: str,
               x: tf.Tensor) -> tf.Tensor:
    """x [b, t, d] -> [b, t, h, dh] with w_<name> (and b_<name>)."""
    y = PerExampleMatmul(x, theta[f'w_{name}'])
    if self.params.use_bias:
      y = tf.nn.bias_add(y, tf.cast(theta[f'b_{name}'], x.dtype))
    h = self.params.num_heads
    return tf.reshape(y, _Dims(y, 2) + [h, self._hidden_dim // h])

  def _Probs(self, logits: tf.Tensor, paddings: tf.Tensor,
             causal: bool) -> tf.Tensor:
    """Masked softmax of logits [b, h, tq, tk]; masked rows become 0."""
    masked = tf.cast(paddings, tf.float32)[:, tf.newaxis, tf.newaxis, :] > 0
    if causal:
      shape = tf.shape(logits)
      masked = tf.logical_or(
          masked, CausalMask(shape[2], shape[3])[tf.newaxis, tf.newaxis])
    logits = tf.where(masked, LargeNegative(logits.dtype), logits)
    probs = tf.nn.softmax(logits, axis=-1)
    # A row where every key is masked would spread evenly over padding.
    any_valid = tf.reduce_any(tf.logical_not(masked), axis=-1, keepdims=True)
    return probs * tf.cast(any_valid, probs.dtype)

  def FProp(self, theta: NestedMap, query_vec: tf.Tensor,
            key_vec: tf.Tensor, value_vec: tf.Tensor, paddings: tf.Tensor,
            causal: bool = False,
            example_keys: Optional[tf.Tensor] = None
            ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Attends from query_vec to key_vec/value_vec; see the class doc."""
    q = self._Project(theta, 'query', query_vec)
    k = self._Project(theta, 'key', key_vec)
    v = self._Project(theta, 'value', value_vec)
    return self._Attend(theta, q, k, v, paddings, causal, example_keys)

  def ProjectKeyValue(self, theta: NestedMap, source_vec: tf.Tensor
                      ) -> NestedMap:
    """NestedMap(key, value) [b, tk, h, dh] of source_vec: a cache that
    ExtendStep attends to as it is (cross-attention while decoding)."""
    return NestedMap(key=self._Project(theta, 'key', source_vec),
                     value=self._Project(theta, 'value', source_vec))

  def ExtendStep(self, theta: NestedMap, query_vec: tf.Tensor,
                 cache: NestedMap, paddings: tf.Tensor,
                 time_step: Optional[tf.Tensor] = None
                 ) -> Tuple[tf.Tensor, NestedMap]:
    """One decoding step: (encoded [b, 1, d], cache).

    query_vec [b, 1, d]; cache NestedMap(key, value) [b, T, h, dh];
    paddings [b, T] mask keys. With time_step (causal self-attention at
    position time_step < T): the query's own key and value are written into
    the cache at time_step and the keys after it are masked, so the result
    equals row time_step of FProp(..., causal=True) over the whole prefix
    while costing O(T) instead of O(T^2). Without: the cache is attended as
    it is (ProjectKeyValue's). Eval only: no dropout.
    """
    q = self._Project(theta, 'query', query_vec)
    if time_step is not None:
      length = cache.key.shape[1]
      # Row time_step of every example; a scatter update can reuse the
      # cache's buffer in a loop, where tf.where would copy all T rows.
      rows = tf.stack([tf.range(tf.shape(query_vec)[0]),
                       tf.fill([tf.shape(query_vec)[0]], time_step)], 1)
      cache = NestedMap(
          key=tf.tensor_scatter_nd_update(
              cache.key, rows, self._Project(theta, 'key', query_vec)[:, 0]),
          value=tf.tensor_scatter_nd_update(
              cache.value, rows,
              self._Project(theta, 'value', query_vec)[:, 0]))
      future = tf.cast(tf.range(length) > time_step, paddings.dtype)
      paddings = tf.maximum(paddings, future[tf.newaxis])
    encoded, _ = self._Attend(theta, q, cache.key, cache.value, paddings,
                              False, None)
    return encoded, cache

  def _Attend(self, theta: NestedMap, q: tf.Tensor, k: tf.Tensor,
              v: tf.Tensor, paddings: tf.Tensor, causal: bool,
              example_keys: Optional[tf.Tensor]
              ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(encoded, probs) from projected q [b, tq, h, dh], k and v."""
    dh = self._hidden_dim // self.params.num_heads
    q *= tf.constant(1.0 / math.sqrt(dh), q.dtype)
    # Heads first, then batched MatMuls: TF's CPU Einsum for the same two
    # products took 82 ms of a 750 ms step where transposes and
    # BatchMatMulV2 take 47 (docs/DESIGN.md section 11).
    swap = tf.constant([0, 2, 1, 3])
    logits = tf.matmul(tf.transpose(q, swap), tf.transpose(k, swap),
                       transpose_b=True)
    probs = self._Probs(logits, paddings, causal)
    dropped = self.atten_dropout.FProp(
        theta.atten_dropout, probs, example_keys)
    ctx = tf.transpose(tf.matmul(dropped, tf.transpose(v, swap)), swap)
    ctx = tf.reshape(ctx, _Dims(ctx, 2) + [self._hidden_dim])
    encoded = PerExampleMatmul(ctx, theta.w_post)
    if self.params.use_bias:
      encoded = tf.nn.bias_add(encoded, tf.cast(theta.b_post, ctx.dtype))
    return encoded, probs

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, query_shape: Any,
                key_shape: Any, *unused_shapes: Any) -> NestedMap:
    """Flops (2 per multiply-add) and the shapes (encoded, probs)."""
    b = _Dim(query_shape, 0, 'batch')
    tq = _Dim(query_shape, 1, 'query time')
    tk = _Dim(key_shape, 1, 'key time')
    d = params.input_dim
    hidden = params.hidden_dim or d
    h = params.num_heads
    projections = 2 * b * (tq * d * hidden * 2 + tk * d * hidden * 2)
    attend = 2 * 2 * b * tq * tk * hidden
    softmax = 5 * b * h * tq * tk
    flops = projections + attend + softmax
    if params.atten_dropout_prob > 0.0:
      flops += 10 * b * h * tq * tk
    return NestedMap(
        flops=int(flops),
        out_shapes=(tf.TensorShape([b, tq, d]),
                    tf.TensorShape([b, h, tq, tk])))


def SinusoidalEmbedding(positions: tf.Tensor, dim: int,
                        min_timescale: float = 1.0,
                        max_timescale: float = 1.0e4,
                        dtype: tf.DType = tf.float32) -> tf.Tensor:
  """sin/cos features of `positions` [...] -> [..., dim].

  For i < dim // 2, with timescale_i = min * (max / min)**(i / (n - 1)):
  out[..., i] = sin(pos / timescale_i), out[..., n + i] = cos(...), where
  n = dim // 2; an odd dim gets a final column of zeros.
  """
  n = dim // 2
  log_increment = math.log(max_timescale / min_timescale) / max(n - 1, 1)
  inv_timescales = tf.exp(
      tf.range(n, dtype=tf.float64) * -log_increment) / min_timescale
  scaled = tf.cast(positions, tf.float64)[..., tf.newaxis] * inv_timescales
  signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)
  if dim % 2:
    signal = tf.concat([signal, tf.zeros_like(signal[..., :1])], axis=-1)
  return tf.cast(signal, dtype)


def _PositionsOrRange(seq_length: Union[int, tf.Tensor, None],
                      positions: Optional[tf.Tensor],
                      path: str) -> tf.Tensor:
  if (seq_length is None) == (positions is None):
    raise ValueError(
        f"Positional embedding '{path}': pass exactly one of seq_length "
        'or positions.')
  if positions is None:
    return tf.range(seq_length)
  return positions


def _PositionalMeta(params: hyperparams.Params, dim: int,
                    seq_length_or_shape: Any, flops_per_value: int
                    ) -> NestedMap:
  if isinstance(seq_length_or_shape, int):
    shape = tf.TensorShape([seq_length_or_shape])
  else:
    shape = tf.TensorShape(seq_length_or_shape)
  out = shape.concatenate([dim])
  return NestedMap(flops=flops_per_value * out.num_elements(),
                   out_shapes=(out,))


class PositionalEmbeddingLayer(base_layer.BaseLayer):
  """Fixed sinusoidal position embeddings (no variables).

  FProp(theta, seq_length=t) -> [t, embedding_dim] for positions 0..t-1;
  FProp(theta, positions=[b, t] ints) -> [b, t, embedding_dim]. Values are
  `SinusoidalEmbedding` in the layer's fprop dtype.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('embedding_dim', 0, 'Dimension of each position embedding.')
    p.Define('min_timescale', 1.0, 'Shortest sinusoid period / (2 pi).')
    p.Define('max_timescale', 1.0e4, 'Longest sinusoid period / (2 pi).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.embedding_dim <= 0:
      raise ValueError(
          f"PositionalEmbeddingLayer '{self.path}': embedding_dim="
          f'{p.embedding_dim} must be positive.')
    if not 0.0 < p.min_timescale <= p.max_timescale:
      raise ValueError(
          f"PositionalEmbeddingLayer '{self.path}': need 0 < min_timescale "
          f'<= max_timescale, got {p.min_timescale}, {p.max_timescale}.')

  def FProp(self, theta: NestedMap,
            seq_length: Union[int, tf.Tensor, None] = None,
            positions: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Embeddings of range(seq_length) or of `positions`."""
    del theta  # no variables
    p = self.params
    pos = _PositionsOrRange(seq_length, positions, self.path)
    return SinusoidalEmbedding(pos, p.embedding_dim, p.min_timescale,
                               p.max_timescale, self.fprop_dtype)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                seq_length_or_shape: Any) -> NestedMap:
    """seq_length (int) -> [t, dim]; positions shape [b, t] -> [b, t, dim]."""
    return _PositionalMeta(params, params.embedding_dim,
                           seq_length_or_shape, 4)


class LearnedPositionalEmbeddingLayer(base_layer.BaseLayer):
  """Trained position embeddings: a table `emb` [max_seq_length, dim].

  FProp(theta, seq_length=t) -> emb[:t] [t, embedding_dim];
  FProp(theta, positions=[b, t] ints) -> emb[positions] [b, t, dim].
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('embedding_dim', 0, 'Dimension of each position embedding.')
    p.Define('max_seq_length', 0, 'Number of positions in the table.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.embedding_dim <= 0 or p.max_seq_length <= 0:
      raise ValueError(
          f"LearnedPositionalEmbeddingLayer '{self.path}': embedding_dim="
          f'{p.embedding_dim} and max_seq_length={p.max_seq_length} must '
          'be positive.')
    self.CreateVariable(
        'emb', base_layer.WeightParams([p.max_seq_length, p.embedding_dim]))

  def FProp(self, theta: NestedMap,
            seq_length: Union[int, tf.Tensor, None] = None,
            positions: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Rows of the table for range(seq_length) or for `positions`."""
    if isinstance(seq_length, int) and (
        seq_length > self.params.max_seq_length):
      raise ValueError(
          f"LearnedPositionalEmbeddingLayer '{self.path}': seq_length="
          f'{seq_length} exceeds max_seq_length='
          f'{self.params.max_seq_length}; raise max_seq_length.')
    pos = _PositionsOrRange(seq_length, positions, self.path)
    return tf.gather(tf.cast(theta.emb, self.fprop_dtype), pos)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                seq_length_or_shape: Any) -> NestedMap:
    """seq_length (int) -> [t, dim]; positions shape [b, t] -> [b, t, dim]."""
    return _PositionalMeta(params, params.embedding_dim,
                           seq_length_or_shape, 1)
