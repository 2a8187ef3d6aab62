"""The pipeline test model, shared by gpipe_test and gpipe_one_pass_test.

A stack of NUM_LAYERS blocks over a NestedMap state of mixed dtypes:
`vec` (float64 [b, d], transformed), `skip` (float64 [b, d], carried and
mixed in), `example_keys` (int64 [b], for dropout); as a plain sequential
reference, or as a PipeliningLayer of any schedule. Both share seed paths,
so they start from identical weights.
"""

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap

DIM = 3
BATCH = 8
NUM_LAYERS = 4


class Block(base_layer.BaseLayer):
  """state.vec <- tanh(dropout(state.vec) @ w + b) + 0.5 * state.skip.

  FProp(theta, NestedMap(vec [b, d], skip [b, d], example_keys [b] int64)); an
  optional BatchNorm follows the projection. Counts its executions in
  `calls` when counting is on (a stateful op, so it runs every time).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', DIM, 'Width.')
    p.Define('keep_prob', 1.0, 'Dropout keep probability.')
    p.Define('batch_norm', False, 'Whether to add a BatchNorm.')
    p.Define('count_calls', False, 'Whether to count executions.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('proj', layers.ProjectionLayer.Params().Set(
        input_dim=p.dim, output_dim=p.dim))
    self.CreateChild('drop', dropout.DropoutLayer.Params().Set(
        keep_prob=p.keep_prob))
    if p.batch_norm:
      self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(
          dim=p.dim, decay=0.5))
    if p.count_calls:
      self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

  def FProp(self, theta, state):
    h = self.drop.FProp(theta.drop, state.vec, state.example_keys)
    h = self.proj.FProp(theta.proj, h)
    if self.params.batch_norm:
      h = self.bn.FProp(theta.bn, h)
    if self.params.count_calls:
      self.calls.assign_add(1)
    return NestedMap(vec=tf.tanh(h) + 0.5 * state.skip, skip=state.skip,
                     example_keys=state.example_keys)


def LayerParams(**kwargs):
  return [Block.Params().Set(name=f'block{i}', dtype=tf.float64, **kwargs)
          for i in range(NUM_LAYERS)]


def Reference(**kwargs):
  return layers.SequentialLayer.Params().Set(
      name='model', dtype=tf.float64, sub=LayerParams(**kwargs)
  ).Instantiate()


def Pipeline(k, m, recompute, schedule='gpipe', v=1, split_backward=False,
             **kwargs):
  """K devices x V stages per device over the NUM_LAYERS blocks."""
  layer_ps = LayerParams(**kwargs)
  num_stages = k * v
  bounds = [round(i * NUM_LAYERS / num_stages) for i in range(num_stages + 1)]
  cells = [layers.SequentialLayer.Params().Set(sub=layer_ps[a:b])
           for a, b in zip(bounds, bounds[1:])]
  return gpipe.PipeliningLayer.Params().Set(
      name='model', dtype=tf.float64, cell_tpl=cells, num_micro_batches=m,
      recompute=recompute, schedule=schedule, num_virtual_stages=v,
      split_backward=split_backward).Instantiate()


def Split(inputs, m):
  """`inputs` (a flat NestedMap) as m micro-batches, in order."""
  return [NestedMap(zip(sorted(inputs), t)) for t in zip(*[
      tf.split(inputs[key], m) for key in sorted(inputs)])]


def Inputs(step=7):
  x = tf.random.stateless_normal([BATCH, DIM], [1, 2], dtype=tf.float64)
  skip = tf.random.stateless_normal([BATCH, DIM], [3, 4], dtype=tf.float64)
  return NestedMap(vec=x, skip=skip,
                   example_keys=dropout.ExampleKeys(step, BATCH))


def BlockVars(layer):
  """block name -> {var path below the block: variable}, for both models."""
  found = {}
  for var in layer.vars.Flatten():
    parts = var.name.split(':')[0].split('/')
    block = next(p for p in parts if p.startswith('block'))
    rest = '/'.join(parts[parts.index(block) + 1:])
    found.setdefault(block, {})[rest] = var
  return found


def PairedVariables(pipe, ref):
  pv, rv = BlockVars(pipe), BlockVars(ref)
  assert sorted(pv) == sorted(rv), (sorted(pv), sorted(rv))
  return [(pv[b][n], rv[b][n]) for b in sorted(rv) for n in sorted(rv[b])]


def Function(fn):
  return tf.function(fn, autograph=False)


def FullBatchMoments(pipe, inputs, m):
  """BatchNorm input of each block over the whole batch, in numpy."""
  moments = {}
  state = inputs
  blocks = [b for cell in pipe.cells for b in cell.sub_layers]
  parts = [NestedMap(zip(sorted(state), t)) for t in zip(*[
      tf.split(state[key], m) for key in sorted(state)])]
  for block in blocks:
    theta = block.theta
    with block.NoStatUpdates():
      hs = [block.proj.FProp(theta.proj, p.vec) for p in parts]
      parts = [block.FProp(theta, p) for p in parts]
    h = np.concatenate([x.numpy() for x in hs])
    moments[block.bn] = (h.mean(0), h.var(0))
  return moments
