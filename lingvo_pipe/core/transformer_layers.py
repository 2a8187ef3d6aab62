"""Pre-layer-norm Transformer encoder and decoder layers.

Each sub-layer normalises its input, transforms it, applies dropout and
adds the residual (Lingvo's default, "pre-LN"):

  x = x + dropout(Attention(LN(x)))
  x = x + dropout(W2 dropout(relu(W1 LN(x) + b1)) + b2)

The encoder and decoder layers take and return one NestedMap, so a stack of
them chains in a SequentialLayer and the whole map travels between pipeline
partitions:

  encoder:  NestedMap(vec [b, t, d], paddings [b, t], example_keys [b])
  decoder:  NestedMap(vec [b, t, d], paddings [b, t],
                      encoder_vec [b, s, d], encoder_paddings [b, s],
                      example_keys [b])

Only `vec` changes; every other field is passed on unchanged. example_keys
(int64, see dropout.ExampleKeys) is needed only when training with dropout.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import attention
from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap


def _Dropout(prob: float) -> hyperparams.Params:
  return dropout.DropoutLayer.Params().Set(keep_prob=1.0 - prob)


def _CheckProbs(layer: base_layer.BaseLayer, *names: str) -> None:
  for name in names:
    prob = layer.params.Get(name)
    if not 0.0 <= prob < 1.0:
      raise ValueError(
          f"{type(layer).__name__} '{layer.path}': {name}={prob} must be "
          'in [0, 1).')


def _Shapes(inputs: Any) -> NestedMap:
  return NestedMap(inputs).Transform(tf.TensorShape)


def _BatchTime(shape: tf.TensorShape) -> Tuple[int, int]:
  b, t = shape[0], shape[1]
  if b is None or t is None:
    raise ValueError(f'FPropMeta needs static batch and time; got {shape}.')
  return b, t


def _LayerNormFlops(b: int, t: int, d: int) -> int:
  ln_p = normalization.LayerNorm.Params().Set(input_dim=d)
  return int(normalization.LayerNorm.FPropMeta(
      ln_p, tf.TensorShape([b, t, d])).flops)


class TransformerAttentionLayer(base_layer.BaseLayer):
  """Pre-LN attention sub-layer with a residual connection.

  FProp(theta, query_vec [b, tq, d], paddings, source_vec=None,
        causal=False, example_keys=None) -> (out [b, tq, d],
                                             probs [b, h, tq, tk]):

    x = LN(query_vec)
    kv = x if source_vec is None else source_vec    (self / cross attention)
    out = query_vec + dropout(MultiHeadAttention(x, kv, kv, paddings))

  `paddings` [b, tk] masks the keys: the query's own paddings for
  self-attention, the source's for cross-attention.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Model dimension d.')
    p.Define('hidden_dim', 0, 'Attention hidden dimension; 0 means d.')
    p.Define('num_heads', 1, 'Number of attention heads.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probs.')
    p.Define('residual_dropout_prob', 0.0,
             'Dropout on the attention output before the residual add.')
    p.Define('ln_epsilon', 1e-6, 'Layer norm epsilon.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckProbs(self, 'residual_dropout_prob')
    self.CreateChild('ln', normalization.LayerNorm.Params().Set(
        input_dim=p.input_dim, epsilon=p.ln_epsilon))
    self.CreateChild('atten', attention.MultiHeadAttention.Params().Set(
        input_dim=p.input_dim, hidden_dim=p.hidden_dim,
        num_heads=p.num_heads, atten_dropout_prob=p.atten_dropout_prob))
    self.CreateChild('residual_dropout', _Dropout(p.residual_dropout_prob))

  def FProp(self, theta: NestedMap, query_vec: tf.Tensor,
            paddings: tf.Tensor, source_vec: Optional[tf.Tensor] = None,
            causal: bool = False,
            example_keys: Optional[tf.Tensor] = None
            ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns (query_vec + attention output, attention probs)."""
    x = self.ln.FProp(theta.ln, query_vec)
    kv = x if source_vec is None else source_vec
    out, probs = self.atten.FProp(theta.atten, x, kv, kv, paddings,
                                  causal=causal, example_keys=example_keys)
    out = self.residual_dropout.FProp(
        theta.residual_dropout, out, example_keys)
    return query_vec + out, probs

  def ExtendStep(self, theta: NestedMap, query_vec: tf.Tensor,
                 cache: NestedMap, paddings: tf.Tensor,
                 time_step: Optional[tf.Tensor] = None
                 ) -> Tuple[tf.Tensor, NestedMap]:
    """One decoding step of FProp (MultiHeadAttention.ExtendStep's cache):
    (query_vec + attention of LN(query_vec) [b, 1, d], cache)."""
    x = self.ln.FProp(theta.ln, query_vec)
    out, cache = self.atten.ExtendStep(theta.atten, x, cache, paddings,
                                       time_step)
    return query_vec + out, cache

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, query_shape: Any,
                source_shape: Any) -> NestedMap:
    """Cost for query [b, tq, d] attending to source [b, tk, d]."""
    query_shape = tf.TensorShape(query_shape)
    (b, tq), d = _BatchTime(query_shape), params.input_dim
    atten_p = attention.MultiHeadAttention.Params().Set(
        input_dim=params.input_dim, hidden_dim=params.hidden_dim,
        num_heads=params.num_heads,
        atten_dropout_prob=params.atten_dropout_prob)
    atten = attention.MultiHeadAttention.FPropMeta(
        atten_p, query_shape, source_shape)
    flops = atten.flops + _LayerNormFlops(b, tq, d) + b * tq * d
    if params.residual_dropout_prob > 0.0:
      flops += 10 * b * tq * d
    return NestedMap(flops=flops, out_shapes=(query_shape,
                                              atten.out_shapes[1]))


class TransformerFeedForwardLayer(base_layer.BaseLayer):
  """Pre-LN feed-forward sub-layer with a residual connection.

  FProp(theta, inputs [b, t, d], example_keys=None) -> [b, t, d]:

    h = dropout_relu(relu(LN(inputs) @ w1 + b1))      [b, t, hidden_dim]
    out = inputs + dropout_residual(h @ w2 + b2)
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Model dimension d.')
    p.Define('hidden_dim', 0, 'Hidden (filter) dimension of the FFN.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout after the relu.')
    p.Define('residual_dropout_prob', 0.0,
             'Dropout on the FFN output before the residual add.')
    p.Define('ln_epsilon', 1e-6, 'Layer norm epsilon.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.input_dim <= 0 or p.hidden_dim <= 0:
      raise ValueError(
          f"TransformerFeedForwardLayer '{self.path}': input_dim="
          f'{p.input_dim} and hidden_dim={p.hidden_dim} must be positive.')
    _CheckProbs(self, 'relu_dropout_prob', 'residual_dropout_prob')
    zeros = base_layer.WeightInit.Constant(0.0)
    self.CreateChild('ln', normalization.LayerNorm.Params().Set(
        input_dim=p.input_dim, epsilon=p.ln_epsilon))
    self.CreateVariable(
        'w1', base_layer.WeightParams([p.input_dim, p.hidden_dim]))
    self.CreateVariable('b1', base_layer.WeightParams([p.hidden_dim], zeros))
    self.CreateVariable(
        'w2', base_layer.WeightParams([p.hidden_dim, p.input_dim]))
    self.CreateVariable('b2', base_layer.WeightParams([p.input_dim], zeros))
    self.CreateChild('relu_dropout', _Dropout(p.relu_dropout_prob))
    self.CreateChild('residual_dropout', _Dropout(p.residual_dropout_prob))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor,
            example_keys: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Returns inputs + FFN(LN(inputs))."""
    dtype = inputs.dtype
    x = self.ln.FProp(theta.ln, inputs)
    h = attention.PerExampleMatmul(x, theta.w1)
    h = tf.nn.relu(tf.nn.bias_add(h, tf.cast(theta.b1, dtype)))
    h = self.relu_dropout.FProp(theta.relu_dropout, h, example_keys)
    y = attention.PerExampleMatmul(h, theta.w2)
    y = tf.nn.bias_add(y, tf.cast(theta.b2, dtype))
    y = self.residual_dropout.FProp(theta.residual_dropout, y, example_keys)
    return inputs + y

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any, *unused: Any) -> NestedMap:
    """Flops of LN, two matmuls, relu, dropouts and the residual add."""
    input_shape = tf.TensorShape(input_shape)
    (b, t), d = _BatchTime(input_shape), params.input_dim
    hidden = params.hidden_dim
    flops = (_LayerNormFlops(b, t, d) + 2 * 2 * b * t * d * hidden +
             2 * b * t * hidden + 2 * b * t * d)
    if params.relu_dropout_prob > 0.0:
      flops += 10 * b * t * hidden
    if params.residual_dropout_prob > 0.0:
      flops += 10 * b * t * d
    return NestedMap(flops=flops, out_shapes=(input_shape,))


def _AttentionParams(p: hyperparams.Params) -> hyperparams.Params:
  return TransformerAttentionLayer.Params().Set(
      input_dim=p.model_dim, hidden_dim=p.atten_hidden_dim,
      num_heads=p.num_heads, atten_dropout_prob=p.atten_dropout_prob,
      residual_dropout_prob=p.residual_dropout_prob, ln_epsilon=p.ln_epsilon)


def _FeedForwardParams(p: hyperparams.Params) -> hyperparams.Params:
  return TransformerFeedForwardLayer.Params().Set(
      input_dim=p.model_dim, hidden_dim=p.hidden_dim,
      relu_dropout_prob=p.relu_dropout_prob,
      residual_dropout_prob=p.residual_dropout_prob, ln_epsilon=p.ln_epsilon)


def _DefineCommon(p: hyperparams.Params) -> None:
  p.Define('model_dim', 0, 'Model dimension d of vec.')
  p.Define('hidden_dim', 0, 'Hidden (filter) dimension of the FFN.')
  p.Define('num_heads', 1, 'Number of attention heads.')
  p.Define('atten_hidden_dim', 0,
           'Total attention hidden dimension; 0 means model_dim.')
  p.Define('residual_dropout_prob', 0.0,
           'Dropout on each sub-layer output before the residual add.')
  p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probs.')
  p.Define('relu_dropout_prob', 0.0, 'Dropout after the FFN relu.')
  p.Define('ln_epsilon', 1e-6, 'Layer norm epsilon.')


class TransformerEncoderLayer(base_layer.BaseLayer):
  """One encoder layer: self-attention then FFN, both pre-LN residual.

  FProp(theta, inputs: NestedMap(vec [b, t, d], paddings [b, t],
                                 example_keys [b] optional)) -> NestedMap
  with the same fields, vec replaced by:

    x = vec + dropout(SelfAttention(LN(vec), paddings))
    vec' = x + dropout(FFN(LN(x)))
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    _DefineCommon(p)
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('self_atten', _AttentionParams(p))
    self.CreateChild('ffn', _FeedForwardParams(p))

  def FProp(self, theta: NestedMap, inputs: NestedMap) -> NestedMap:
    """Returns a copy of `inputs` with vec transformed."""
    keys = inputs.get('example_keys')
    x, _ = self.self_atten.FProp(theta.self_atten, inputs.vec,
                                 inputs.paddings, example_keys=keys)
    out = NestedMap(inputs)
    out.vec = self.ffn.FProp(theta.ffn, x, example_keys=keys)
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                inputs: Any) -> NestedMap:
    """inputs: NestedMap of shapes; out_shapes = (the same NestedMap,)."""
    shapes = _Shapes(inputs)
    atten = TransformerAttentionLayer.FPropMeta(
        _AttentionParams(params), shapes.vec, shapes.vec)
    ffn = TransformerFeedForwardLayer.FPropMeta(
        _FeedForwardParams(params), shapes.vec)
    return NestedMap(flops=atten.flops + ffn.flops, out_shapes=(shapes,))


class TransformerDecoderLayer(base_layer.BaseLayer):
  """One decoder layer: causal self-attention, cross-attention, FFN.

  FProp(theta, inputs: NestedMap(vec [b, t, d], paddings [b, t],
                                 encoder_vec [b, s, d],
                                 encoder_paddings [b, s],
                                 example_keys [b] optional)) -> NestedMap
  with the same fields, vec replaced by:

    x = vec + dropout(CausalSelfAttention(LN(vec), paddings))
    y = x + dropout(Attention(LN(x), encoder_vec, encoder_paddings))
    vec' = y + dropout(FFN(LN(y)))
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    _DefineCommon(p)
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('self_atten', _AttentionParams(p))
    self.CreateChild('cross_atten', _AttentionParams(p))
    self.CreateChild('ffn', _FeedForwardParams(p))

  def FProp(self, theta: NestedMap, inputs: NestedMap) -> NestedMap:
    """Returns a copy of `inputs` with vec transformed."""
    keys = inputs.get('example_keys')
    x, _ = self.self_atten.FProp(theta.self_atten, inputs.vec,
                                 inputs.paddings, causal=True,
                                 example_keys=keys)
    x, _ = self.cross_atten.FProp(theta.cross_atten, x,
                                  inputs.encoder_paddings,
                                  source_vec=inputs.encoder_vec,
                                  example_keys=keys)
    out = NestedMap(inputs)
    out.vec = self.ffn.FProp(theta.ffn, x, example_keys=keys)
    return out

  def InitDecodeCache(self, theta: NestedMap, encoder_vec: tf.Tensor,
                      max_length: int) -> NestedMap:
    """The cache of ExtendStep for decoding up to max_length positions.

    NestedMap(self_kv=NestedMap(key, value) zeros [b, max_length, h,
    dh], cross_kv=the projected encoder_vec [b, s, h, dh]).
    """
    atten = self.self_atten.atten
    heads = self.params.num_heads
    zeros = tf.zeros([encoder_vec.shape[0], max_length, heads,
                      atten.hidden_dim // heads], encoder_vec.dtype)
    cross = self.cross_atten.atten.ProjectKeyValue(
        theta.cross_atten.atten, encoder_vec)
    return NestedMap(self_kv=NestedMap(key=zeros, value=zeros),
                     cross_kv=cross)

  def ExtendStep(self, theta: NestedMap, inputs: NestedMap,
                 cache: NestedMap, time_step: tf.Tensor
                 ) -> Tuple[NestedMap, NestedMap]:
    """FProp for position time_step alone: (inputs with vec [b, 1, d]
    transformed, cache). inputs: vec [b, 1, d], encoder_paddings [b, s];
    cache from InitDecodeCache (or the previous step). Its vec equals row
    time_step of FProp over the whole prefix (eval, no target paddings)."""
    vec = inputs.vec
    no_paddings = tf.zeros([vec.shape[0], cache.self_kv.key.shape[1]],
                           inputs.encoder_paddings.dtype)
    x, self_cache = self.self_atten.ExtendStep(
        theta.self_atten, vec, cache.self_kv, no_paddings, time_step)
    x, _ = self.cross_atten.ExtendStep(theta.cross_atten, x, cache.cross_kv,
                                       inputs.encoder_paddings)
    out = NestedMap(inputs)
    out.vec = self.ffn.FProp(theta.ffn, x)
    return out, NestedMap(self_kv=self_cache, cross_kv=cache.cross_kv)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                inputs: Any) -> NestedMap:
    """inputs: NestedMap of shapes; out_shapes = (the same NestedMap,)."""
    shapes = _Shapes(inputs)
    atten_p = _AttentionParams(params)
    self_atten = TransformerAttentionLayer.FPropMeta(
        atten_p, shapes.vec, shapes.vec)
    cross_atten = TransformerAttentionLayer.FPropMeta(
        atten_p, shapes.vec, shapes.encoder_vec)
    ffn = TransformerFeedForwardLayer.FPropMeta(
        _FeedForwardParams(params), shapes.vec)
    flops = self_atten.flops + cross_atten.flops + ffn.flops
    return NestedMap(flops=flops, out_shapes=(shapes,))
