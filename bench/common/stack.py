"""The benchmarked model: a Transformer encoder stack, plain or pipelined.

A configuration (`Setup`) is one way to run the same L layers:

  kind        what runs                                         devices
  'plain'     SequentialLayer of the L layers, whole batch      CPU:0
  'loop'      the same SequentialLayer on M micro-batches in    CPU:0
              a Python loop, one tape (micro-batching in plain
              TF, no pipeline)
  'pipe'      PipeliningLayer, K x V cells of L/(KV) layers,    CPU:0..K-1
              M micro-batches, one recompute mode, one schedule
              (V stages per device with 'interleaved_1f1b')

Every model is named 'model' with layers 'layer0' .. 'layer{L-1}', so all
of them start from the same weights (seed paths do not depend on K).
`Stack.halves` writes each layer as its two residual sub-layers,
'layer{i}_atten' and 'layer{i}_ffn': the same function in 2L layers (other
initial weights), for tables with more stages than layers.

One training step (`StepFunction`) is a `tf.function(autograph=False)`:
forward, loss = mean(vec ** 2), and the gradient of every variable (the
pipeline in one pass, `FPropWithLoss`, as the trainer runs it); it
returns the loss and the gradients (no update, so every step does the same
work on the same weights). `TrainStepFunction` is the trainer's step
instead: the same loss, then an SGD update of each variable on its own
device, and only the loss comes back (`TrainStep`, for any model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import (Any, Callable, Iterator, List, Optional, Sequence, Tuple,
                    TypeVar)

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import optimizer
from lingvo_pipe.core import schedule
from lingvo_pipe.core import transformer_layers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core.schedules import registry


@dataclasses.dataclass(frozen=True)
class Stack:
  """Shape of the model and of its input batch."""
  num_layers: int = 8
  model_dim: int = 256
  hidden_dim: int = 1024
  num_heads: int = 4
  seq_len: int = 64
  batch: int = 32
  # The layers' fprop_dtype: 'bfloat16' computes and hands off in it over
  # float32 variables (the loss is float32 either way).
  dtype: str = 'float32'
  # Each encoder layer as its two residual sub-layers (self-attention,
  # feed-forward), one layer each: the same model in twice as many
  # layers, for a table of more stages than encoder layers.
  halves: bool = False

  def Describe(self) -> str:
    halves = (f' as {2 * self.num_layers} sub-layers' if self.halves
              else '')
    return (f'{self.num_layers} TransformerEncoderLayers{halves}, '
            f'd={self.model_dim}, ff={self.hidden_dim}, {self.num_heads} '
            f'heads, seq {self.seq_len}, batch {self.batch}, {self.dtype}, '
            'dropout 0')


@dataclasses.dataclass(frozen=True)
class Setup:
  """One way to run the stack (module docstring)."""
  kind: str  # 'plain', 'loop' or 'pipe'
  k: int = 1
  m: int = 1
  recompute: Optional[str] = None
  schedule: str = 'gpipe'
  v: int = 1  # stages per device
  split: bool = False  # PipeliningLayer.split_backward (recompute 'never')

  @property
  def label(self) -> str:
    if self.kind == 'plain':
      return 'unpipelined'
    if self.kind == 'loop':
      return f'plain loop M={self.m}'
    sched = '' if self.schedule == 'gpipe' else f' {self.schedule}'
    virtual = f' V={self.v}' if self.v > 1 else ''
    split = ' split' if self.split else ''
    return f'K={self.k}{virtual} M={self.m} {self.recompute}{sched}{split}'

  def ToText(self) -> str:
    return (f'{self.kind},{self.k},{self.m},{self.recompute or ""},'
            f'{self.schedule},{self.v}' + (',split' if self.split else ''))

  @classmethod
  def FromText(cls, text: str) -> 'Setup':
    """'kind,K,M,recompute[,schedule,V[,split]]'."""
    fields = text.split(',')
    kind, k, m, recompute = fields[:4]
    schedule = fields[4] if len(fields) > 4 else 'gpipe'
    v = int(fields[5]) if len(fields) > 5 else 1
    split = len(fields) > 6 and fields[6] == 'split'
    return cls(kind, int(k), int(m), recompute or None, schedule, v, split)


class SelfAttentionHalf(transformer_layers.TransformerAttentionLayer):
  """An encoder layer's first residual sub-layer on the stack's NestedMap:
  vec -> vec + SelfAttention(LN(vec), paddings)."""

  def FProp(self, theta: NestedMap,  # pylint: disable=arguments-differ
            inputs: NestedMap) -> NestedMap:
    out = NestedMap(inputs)
    out.vec, _ = super().FProp(theta, inputs.vec, inputs.paddings,
                               example_keys=inputs.get('example_keys'))
    return out


class FeedForwardHalf(transformer_layers.TransformerFeedForwardLayer):
  """An encoder layer's second residual sub-layer on the stack's
  NestedMap: vec -> vec + FFN(LN(vec))."""

  def FProp(self, theta: NestedMap,  # pylint: disable=arguments-differ
            inputs: NestedMap) -> NestedMap:
    out = NestedMap(inputs)
    out.vec = super().FProp(theta, inputs.vec,
                            example_keys=inputs.get('example_keys'))
    return out


def _LayerParams(stack: Stack) -> List[hyperparams.Params]:
  """'layer0' .. : the encoder layers, or with `halves` each one's two
  sub-layers ('layer0_atten', 'layer0_ffn', ...)."""
  if not stack.halves:
    return [transformer_layers.TransformerEncoderLayer.Params().Set(
        name=f'layer{i}', model_dim=stack.model_dim,
        hidden_dim=stack.hidden_dim, num_heads=stack.num_heads)
            for i in range(stack.num_layers)]
  out = []
  for i in range(stack.num_layers):
    out += [SelfAttentionHalf.Params().Set(
        name=f'layer{i}_atten', input_dim=stack.model_dim,
        num_heads=stack.num_heads),
            FeedForwardHalf.Params().Set(
                name=f'layer{i}_ffn', input_dim=stack.model_dim,
                hidden_dim=stack.hidden_dim)]
  return out


def BuildModel(stack: Stack, setup: Setup,
               devices: List[str]) -> base_layer.BaseLayer:
  """The layer of `setup`, variables on their devices."""
  layer_ps = _LayerParams(stack)
  fprop = None if stack.dtype == 'float32' else tf.as_dtype(stack.dtype)
  if setup.kind in ('plain', 'loop'):
    with tf.device(devices[0]):
      return layers.SequentialLayer.Params().Set(
          name='model', sub=layer_ps, fprop_dtype=fprop).Instantiate()
  stages = setup.k * setup.v
  if len(layer_ps) % stages:
    raise ValueError(f'{len(layer_ps)} layers do not split into '
                     f'K x V={stages} equal stages; change K or V.')
  n = len(layer_ps) // stages
  cells = [layers.SequentialLayer.Params().Set(sub=layer_ps[i:i + n])
           for i in range(0, len(layer_ps), n)]
  return gpipe.PipeliningLayer.Params().Set(
      name='model', cell_tpl=cells, num_micro_batches=setup.m,
      recompute=setup.recompute, devices=devices[:setup.k],
      schedule=setup.schedule, num_virtual_stages=setup.v,
      split_backward=setup.split, fprop_dtype=fprop).Instantiate()


def Inputs(stack: Stack) -> NestedMap:
  """A fixed random batch: vec [b, t, d] ~ N(0, 1) in the stack's dtype,
  no padding."""
  shape = [stack.batch, stack.seq_len, stack.model_dim]
  vec = tf.random.stateless_normal(shape, [1, 2])
  return NestedMap(vec=tf.cast(vec, stack.dtype),
                   paddings=tf.zeros(shape[:2]))


def Ideal(setup: Setup) -> float:
  """The setup's throughput against one device, from its schedule's table
  with equal stages: forward 1, backward 2 (B and W 1 each when split),
  free hand-offs (schedule.Simulate). GPipe and 1F1B: K M / (M + K - 1)."""
  if setup.kind != 'pipe':
    return 1.0
  table = registry.Make(setup.schedule, setup.k, setup.m, setup.v,
                        split_backward=setup.split)
  stages = setup.k * setup.v
  forward = [1.0 / (stages * setup.m)] * stages
  if table.split_backward:
    sim = schedule.Simulate(table, forward, forward, weight_s=forward)
  else:
    sim = schedule.Simulate(table, forward, [2 * f for f in forward])
  return 3.0 / sim.step


def _Vec(out: Any) -> tf.Tensor:
  """The output that is scored: its vec when it is a NestedMap."""
  return out.vec if isinstance(out, dict) else out


def _MeanSquareHead(head_theta: NestedMap, out: Any,
                    batch: NestedMap) -> dict:
  """The loss head of one micro-batch: mean(vec ** 2), weighed by rows,
  in float32 at least."""
  del head_theta, batch
  vec = base_layer.AtLeastFloat32(_Vec(out))
  rows = tf.constant(vec.shape[0], vec.dtype)
  return {'loss': (tf.reduce_mean(tf.square(vec)), rows)}


def MeanSquareLoss(layer: base_layer.BaseLayer, inputs: Any) -> tf.Tensor:
  """mean(vec ** 2) of the layer's output on the whole batch; a pipeline
  trains in one pass (FPropWithLoss), as the trainer runs it."""
  if not isinstance(layer, gpipe.PipeliningLayer):
    vec = _Vec(layer.FPropDefaultTheta(inputs))
    return tf.reduce_mean(tf.square(base_layer.AtLeastFloat32(vec)))
  first = tf.nest.flatten(inputs)[0]
  rows = tf.constant(first.shape[layer.params.batch_dim], tf.float32)
  metrics = layer.FPropWithLoss(layer.theta, inputs, _MeanSquareHead,
                                NestedMap(), NestedMap(), rows)
  return metrics.loss[0]


def Loss(layer: base_layer.BaseLayer, setup: Setup,
         inputs: NestedMap) -> tf.Tensor:
  """mean(vec ** 2) of the model's output (MeanSquareLoss); 'loop' runs
  the micro-batches in a Python loop."""
  if setup.kind != 'loop':
    return MeanSquareLoss(layer, inputs)
  vec = base_layer.AtLeastFloat32(_Forward(layer, setup, inputs))
  return tf.reduce_mean(tf.square(vec))


def _Forward(layer: base_layer.BaseLayer, setup: Setup,
             inputs: NestedMap) -> tf.Tensor:
  """The 'loop' setup's output: the micro-batches one after the other."""
  keys = sorted(inputs)
  parts = zip(*[tf.split(inputs[key], setup.m) for key in keys])
  outs = [layer.FPropDefaultTheta(NestedMap(zip(keys, part))).vec
          for part in parts]
  return tf.concat(outs, 0)


# (loss, gradients) for StepFunction, (loss,) for TrainStep: the loss first.
StepFn = Callable[[NestedMap], Tuple[Any, ...]]
_T = TypeVar('_T')


def Rotations(items: Sequence[_T], rounds: int) -> Iterator[_T]:
  """Every item once per round, starting one further along each round.

  The benchmarks' interleaving: a change of machine load during a run
  hits every item alike.
  """
  for r in range(rounds):
    for i in range(len(items)):
      yield items[(r + i) % len(items)]


def StepFunction(layer: base_layer.BaseLayer, setup: Setup,
                 device: str) -> StepFn:
  """tf.function: inputs -> (loss, gradient of every variable)."""
  variables = layer.vars.Flatten()
  # The plain models run on one device; the pipeline places its own ops
  # (the loss then runs where its input is).
  scope = None if setup.kind == 'pipe' else device

  def Step(inputs: NestedMap) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    with tf.device(scope):
      with tf.GradientTape() as tape:
        loss = Loss(layer, setup, inputs)
      return loss, tape.gradient(loss, variables)

  return tf.function(Step, autograph=False)


LEARNING_RATE = 1e-3  # TrainStep's: small, a timed step hardly moves values


def TrainStep(layer: base_layer.BaseLayer,
              loss_fn: Callable[[Any], tf.Tensor],
              scope: Optional[str] = None) -> StepFn:
  """tf.function: inputs -> (loss,), a step as the trainer runs it.

  loss = loss_fn(inputs) under `scope` (a device, or None for the ops'
  own), every variable's gradient, and an SGD update of each
  variable on its own device; the loss comes back after the updates.
  Returning the gradients instead (StepFunction) makes each one a send
  to the client on a worker after its last task: AmoebaNet-D K=1 M=1 on
  a worker spent 79-133 ms a step outside its tasks that way, 19-28 ms
  with this step (docs/DESIGN.md section 18). A trainer never does that.
  """
  variables = layer.vars.Flatten()
  sgd = optimizer.SGD.Params().Set(name='sgd').Instantiate()
  sgd.CreateSlots(variables)

  def Step(inputs: Any) -> Tuple[tf.Tensor]:
    with tf.device(scope):
      with tf.GradientTape() as tape:
        loss = loss_fn(inputs)
      grads = tape.gradient(loss, variables)
    with tf.control_dependencies(sgd.Apply(LEARNING_RATE,
                                           list(zip(grads, variables)))):
      return (tf.identity(loss),)

  return tf.function(Step, autograph=False)


def TrainStepFunction(layer: base_layer.BaseLayer, setup: Setup,
                      device: str) -> StepFn:
  """StepFunction's forward and loss, stepped as TrainStep does."""
  scope = None if setup.kind == 'pipe' else device
  return TrainStep(layer, lambda inputs: Loss(layer, setup, inputs), scope)


@dataclasses.dataclass
class Prepared:
  """A step function traced and warmed up, with what that took."""
  fn: StepFn
  concrete: Any  # the traced ConcreteFunction
  trace: float  # seconds of get_concrete_function
  first: float  # seconds of the first call (graph optimisation, one step)


def Prepare(fn: StepFn, inputs: NestedMap, warmup: int) -> Prepared:
  """Traces `fn`, then runs `warmup` steps, the first call being one."""
  start = time.perf_counter()
  concrete = fn.get_concrete_function(inputs)
  traced = time.perf_counter()
  fn(inputs)[0].numpy()
  first = time.perf_counter()
  for _ in range(warmup - 1):
    fn(inputs)[0].numpy()
  return Prepared(fn, concrete, traced - start, first - traced)


def ChildArgs(description: str,
              steps: int) -> Tuple[Stack, Setup, int]:
  """(stack, setup, steps) from the command line of a measuring child.

  Flags: --setup=kind,K,M,recompute, --stack='{JSON of Stack fields}',
  --steps (default `steps`).
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('--setup', required=True, help='kind,K,M,recompute')
  parser.add_argument('--stack', default='{}', help='Stack fields, JSON.')
  parser.add_argument('--steps', type=int, default=steps)
  args = parser.parse_args()
  return (Stack(**json.loads(args.stack)), Setup.FromText(args.setup),
          args.steps)
