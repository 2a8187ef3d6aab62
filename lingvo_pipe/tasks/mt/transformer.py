"""The encoder-decoder Transformer of GPipe's MT experiments, as flat layers.

GPipe pipelines the whole translation model, encoder and decoder, as one
sequence of layers cut into K partitions. The layers here all take and
return one NestedMap, the state that travels between partitions; the source
and the target move through the pipeline together:

  src embeddings ---+          tgt embeddings (+ positions, dropout)
  (+ positions,     |                    |
   dropout)         v                    v
           NestedMap(vec=src, paddings=src_pad, tgt_vec=tgt,
                     tgt_paddings=tgt_pad, example_keys)
                    |
    encoder_0 .. encoder_{E-1}     TransformerEncoderLayer: vec changes,
                    |              tgt_vec rides along untouched
                    v
    switch                         EncoderDecoderSwitch: vec <- tgt_vec,
                    |              encoder_vec <- LN(encoder's vec)
                    v
           NestedMap(vec=tgt, paddings=tgt_pad, encoder_vec,
                     encoder_paddings=src_pad, example_keys)
                    |
    decoder_0 .. decoder_{D-1}     TransformerDecoderLayer: vec changes
                    |
    decoder_out                    DecoderOutputLayer: LN(vec)
                    v
           NestedMap(vec [b, t, d], paddings [b, t])  --> tied softmax

`TransformerLayers(...)` is that list. `PipelinedStack` cuts it into K
contiguous cells for a PipeliningLayer (partitioner.py, balanced by the
flops of one micro-batch), wherever the balance falls; the switch is an
ordinary layer of whichever cell holds it. E.g. 2 + 2 layers, K=2:

      device 0                          device 1
      +-------------------------------+ +-------------------------------+
      | encoder_0, encoder_1, switch  | | decoder_0, decoder_1,         |
      |                               | |   decoder_out                 |
      +-------------------------------+ +-------------------------------+
      state between them: NestedMap(vec, paddings, encoder_vec,
                                    encoder_paddings, example_keys)

The embeddings and the softmax stay outside the pipeline (model.py): they
share one table, and a variable belongs to exactly one partition.

For decoding, `StackSteps` lists the built layers in order (with their
theta and device) whether the stack is a PipeliningLayer or a plain
SequentialLayer, so the encoder can run once and the switch and decoder on
every step.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core import partitioner
from lingvo_pipe.core import transformer_layers
from lingvo_pipe.core.nested_map import NestedMap

Step = Tuple[Optional[str], base_layer.BaseLayer, NestedMap]


def _LayerNormFlops(shape: tf.TensorShape, dim: int) -> int:
  ln_p = normalization.LayerNorm.Params().Set(input_dim=dim)
  return int(normalization.LayerNorm.FPropMeta(ln_p, shape).flops)


def _CheckDim(layer: base_layer.BaseLayer) -> None:
  dim = layer.params.model_dim
  if not isinstance(dim, int) or dim <= 0:
    raise ValueError(
        f"{type(layer).__name__} '{layer.path}': model_dim={dim!r} must be "
        'a positive int.')


class _LayerNormStage(base_layer.BaseLayer):
  """A pipeline stage built around one LayerNorm `ln` over the model dim."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model_dim', 0, 'Model dimension d.')
    p.Define('ln_epsilon', 1e-6, 'Layer norm epsilon.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    _CheckDim(self)
    p = self.params
    self.CreateChild('ln', normalization.LayerNorm.Params().Set(
        input_dim=p.model_dim, epsilon=p.ln_epsilon))


class EncoderDecoderSwitch(_LayerNormStage):
  """The boundary between the encoder and the decoder in one pipeline.

  FProp(theta, NestedMap(vec [b, s, d], paddings [b, s], tgt_vec [b, t, d],
                         tgt_paddings [b, t], example_keys [b] optional))
    -> NestedMap(vec=tgt_vec, paddings=tgt_paddings,
                 encoder_vec=LN(vec), encoder_paddings=paddings,
                 example_keys)

  LN is the encoder's final layer norm (pre-LN layers leave their output
  un-normalised).
  """

  def FProp(self, theta: NestedMap, inputs: NestedMap) -> NestedMap:
    for key in ('tgt_vec', 'tgt_paddings'):
      if key not in inputs:
        raise ValueError(
            f"EncoderDecoderSwitch '{self.path}': the state has no "
            f'{key!r} (keys: {sorted(inputs)}); feed the target embeddings '
            'into the stack with the source.')
    out = NestedMap(vec=inputs.tgt_vec, paddings=inputs.tgt_paddings,
                    encoder_vec=self.ln.FProp(theta.ln, inputs.vec),
                    encoder_paddings=inputs.paddings)
    if 'example_keys' in inputs:
      out.example_keys = inputs.example_keys
    return out

  def EncoderOutput(self, theta: NestedMap, inputs: NestedMap) -> tf.Tensor:
    """LN(inputs.vec): FProp's encoder_vec, without a target (decoding)."""
    return self.ln.FProp(theta.ln, inputs.vec)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, inputs: Any) -> NestedMap:
    shapes = NestedMap(inputs).Transform(tf.TensorShape)
    out = NestedMap(vec=shapes.tgt_vec, paddings=shapes.tgt_paddings,
                    encoder_vec=shapes.vec, encoder_paddings=shapes.paddings)
    if 'example_keys' in shapes:
      out.example_keys = shapes.example_keys
    return NestedMap(flops=_LayerNormFlops(shapes.vec, params.model_dim),
                     out_shapes=(out,))


class DecoderOutputLayer(_LayerNormStage):
  """The decoder's final layer norm; drops the encoder fields.

  FProp(theta, NestedMap(vec [b, t, d], paddings [b, t], ...))
    -> NestedMap(vec=LN(vec), paddings)
  """

  def FProp(self, theta: NestedMap, inputs: NestedMap) -> NestedMap:
    return NestedMap(vec=self.ln.FProp(theta.ln, inputs.vec),
                     paddings=inputs.paddings)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, inputs: Any) -> NestedMap:
    shapes = NestedMap(inputs).Transform(tf.TensorShape)
    out = NestedMap(vec=shapes.vec, paddings=shapes.paddings)
    return NestedMap(flops=_LayerNormFlops(shapes.vec, params.model_dim),
                     out_shapes=(out,))


# ---- the flat layer lists --------------------------------------------------


def _BlockParams(cls: Any, name: str, model_dim: int, hidden_dim: int,
                 num_heads: int, dropout_prob: float,
                 atten_dropout_prob: float,
                 relu_dropout_prob: float) -> hyperparams.Params:
  return cls.Params().Set(
      name=name, model_dim=model_dim, hidden_dim=hidden_dim,
      num_heads=num_heads, residual_dropout_prob=dropout_prob,
      atten_dropout_prob=atten_dropout_prob,
      relu_dropout_prob=relu_dropout_prob)


def EncoderLayers(num_layers: int, model_dim: int, hidden_dim: int,
                  num_heads: int, dropout_prob: float = 0.0,
                  atten_dropout_prob: float = 0.0,
                  relu_dropout_prob: float = 0.0,
                  name: str = 'encoder') -> List[hyperparams.Params]:
  """TransformerEncoderLayer params named `{name}_0` .. `{name}_{n-1}`."""
  return [_BlockParams(transformer_layers.TransformerEncoderLayer,
                       f'{name}_{i}', model_dim, hidden_dim, num_heads,
                       dropout_prob, atten_dropout_prob, relu_dropout_prob)
          for i in range(num_layers)]


def DecoderLayers(num_layers: int, model_dim: int, hidden_dim: int,
                  num_heads: int, dropout_prob: float = 0.0,
                  atten_dropout_prob: float = 0.0,
                  relu_dropout_prob: float = 0.0,
                  name: str = 'decoder') -> List[hyperparams.Params]:
  """TransformerDecoderLayer params named `{name}_0` .. `{name}_{n-1}`."""
  return [_BlockParams(transformer_layers.TransformerDecoderLayer,
                       f'{name}_{i}', model_dim, hidden_dim, num_heads,
                       dropout_prob, atten_dropout_prob, relu_dropout_prob)
          for i in range(num_layers)]


def TransformerLayers(num_encoder_layers: int, num_decoder_layers: int,
                      model_dim: int, hidden_dim: int, num_heads: int,
                      dropout_prob: float = 0.0,
                      atten_dropout_prob: float = 0.0,
                      relu_dropout_prob: float = 0.0
                      ) -> List[hyperparams.Params]:
  """The whole model as one list (module docstring), names unique.

  encoder_0 .. encoder_{E-1}, switch, decoder_0 .. decoder_{D-1},
  decoder_out: ready for `partitioner.PartitionSequentialLayers`.
  """
  if num_encoder_layers < 1 or num_decoder_layers < 1:
    raise ValueError(
        f'TransformerLayers: num_encoder_layers={num_encoder_layers} and '
        f'num_decoder_layers={num_decoder_layers} must both be >= 1.')
  kwargs = dict(model_dim=model_dim, hidden_dim=hidden_dim,
                num_heads=num_heads, dropout_prob=dropout_prob,
                atten_dropout_prob=atten_dropout_prob,
                relu_dropout_prob=relu_dropout_prob)
  return (EncoderLayers(num_encoder_layers, **kwargs) +
          [EncoderDecoderSwitch.Params().Set(name='switch',
                                             model_dim=model_dim)] +
          DecoderLayers(num_decoder_layers, **kwargs) +
          [DecoderOutputLayer.Params().Set(name='decoder_out',
                                           model_dim=model_dim)])


def StateShapes(batch_size: int, src_length: int, tgt_length: int,
                model_dim: int) -> NestedMap:
  """Shapes of the stack's input state, for cost='flops' partitioning."""
  return NestedMap(
      vec=tf.TensorShape([batch_size, src_length, model_dim]),
      paddings=tf.TensorShape([batch_size, src_length]),
      tgt_vec=tf.TensorShape([batch_size, tgt_length, model_dim]),
      tgt_paddings=tf.TensorShape([batch_size, tgt_length]),
      example_keys=tf.TensorShape([batch_size]))


def PipelinedStack(layer_params: Sequence[hyperparams.Params],
                   num_partitions: int, num_micro_batches: int,
                   input_shapes: Optional[NestedMap] = None,
                   recompute: str = 'always',
                   name: str = 'stack', schedule: str = 'gpipe',
                   num_virtual_stages: int = 1) -> hyperparams.Params:
  """PipeliningLayer params over `layer_params` cut into K x V cells.

  Args:
    layer_params: e.g. TransformerLayers(...).
    num_partitions: K, the pipeline's devices.
    num_micro_batches: M.
    input_shapes: StateShapes(...) of one micro-batch: balances the cells by
      flops; None balances them by parameter count.
    recompute: the PipeliningLayer's recompute mode.
    name: the layer's name (the same name in SequentialStack gives the same
      initial weights).
    schedule: the PipeliningLayer's schedule (a name of
      schedules/registry.py's Names(), or a .csv table).
    num_virtual_stages: V stages per device (2 or more for
      'interleaved_1f1b', 2 for 'zb_v').
  """
  cost = 'params' if input_shapes is None else 'flops'
  cells = partitioner.PartitionSequentialLayers(
      layer_params, num_partitions * num_virtual_stages, cost=cost,
      input_shapes=input_shapes, num_micro_batches=num_micro_batches,
      schedule_name=schedule, num_virtual_stages=num_virtual_stages)
  return gpipe.PipeliningLayer.Params().Set(
      name=name, cell_tpl=cells, num_micro_batches=num_micro_batches,
      recompute=recompute, schedule=schedule,
      num_virtual_stages=num_virtual_stages)


def SequentialStack(layer_params: Sequence[hyperparams.Params],
                    name: str = 'stack') -> hyperparams.Params:
  """The same layers unpipelined, in one SequentialLayer."""
  return layers.SequentialLayer.Params().Set(
      name=name, sub=[p.Copy() for p in layer_params])


# ---- running the built layers one by one ----------------------------------


def StackSteps(stack: base_layer.BaseLayer, theta: NestedMap) -> List[Step]:
  """[(device or None, layer, its theta)] of a built stack, in order.

  `stack` is a PipeliningLayer whose cells are SequentialLayers (as
  PipelinedStack makes it), or a SequentialLayer.
  """
  if isinstance(stack, gpipe.PipeliningLayer):
    steps = []
    for k, (cell, device) in enumerate(zip(stack.cells, stack.devices)):
      if not isinstance(cell, layers.SequentialLayer):
        raise ValueError(
            f"StackSteps: cell '{cell.path}' is a {type(cell).__name__}; "
            'build the cells with PipelinedStack (SequentialLayers).')
      steps += [(device, cell.children[n], theta[f'cell_{k}'][n])
                for n in cell.sub_names]
    return steps
  if isinstance(stack, layers.SequentialLayer):
    return [(None, stack.children[n], theta[n]) for n in stack.sub_names]
  raise ValueError(
      f"StackSteps: '{stack.path}' is a {type(stack).__name__}; use "
      'PipelinedStack or SequentialStack params for the stack.')


def SplitAtSwitch(steps: Sequence[Step]) -> Tuple[List[Step], List[Step]]:
  """(encoder steps, steps from the EncoderDecoderSwitch on)."""
  at = [i for i, (_, layer, _) in enumerate(steps)
        if isinstance(layer, EncoderDecoderSwitch)]
  if len(at) != 1:
    raise ValueError(
        f'SplitAtSwitch: the stack has {len(at)} EncoderDecoderSwitch '
        'layers; build it from TransformerLayers(...), which has one.')
  return list(steps[:at[0]]), list(steps[at[0]:])


def RunSteps(steps: Sequence[Step], state: NestedMap) -> NestedMap:
  """Applies the layers in order, each on its partition's device."""
  for device, layer, theta in steps:
    if device is None:
      state = layer.FProp(theta, state)
    else:
      with tf.device(device):
        state = layer.FProp(theta, state)
  return state
