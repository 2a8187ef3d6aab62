"""AmoebaNet-D (Real et al. 2019) as a flat list of pipeline-sized layers.

AmoebaNet lives in the NASNet search space: the network is a stack of
cells, and each cell combines the outputs of the two cells before it. A
cell of F filters with inputs `prev` (the cell before last) and `cur` (the
last cell):

  h0 = ReLU, 1x1 conv, BN (prev)  # F channels; stride 2 if prev is bigger
  h1 = ReLU, 1x1 conv, BN (cur)   # F channels
  for i in 2..6:                  # five pairwise combinations
    h_i = op_a(h_{in_a}) + op_b(h_{in_b})     # in_a, in_b < i
  out = concat of every h_i (i >= 2) that no combination used as input

A reduction cell applies its ops to h0 and h1 with stride 2, so `out` has
half the height and width. The network (CIFAR layout; L normal cells in
three stacks of L/3, filters doubling at each reduction):

  layer                 state out (NestedMap)
  stem                  3x3 conv, BN: prev = cur = x
  stem_reduction{i}     optional reduction cells (ImageNet-like stem)
  stack0_cell{j}        L/3 normal cells of D filters
  reduction0            reduction cell of 2D filters
  stack1_cell{j}        L/3 normal cells of 2D filters
  reduction1            reduction cell of 4D filters
  stack2_cell{j}        L/3 normal cells of 4D filters
  head                  ReLU, global average pool, dropout, fully
                        connected: logits [b, num_classes]

(L, D) follow GPipe (Huang et al. 2019), Table 1. With our cells and an
ImageNet setup (1000 classes, stem conv of 32 filters with stride 2, two
stem reduction cells), (18, 208), (18, 416), (18, 544) and (36, 544) have
104M, 407M, 693M and 1.26B parameters: 1.2-1.3 times Table 1's 82M, 318M,
542M and 1.05B.

Between layers the state is NestedMap(prev=[b, h', w', c'], cur=[b, h,
w, c]) plus any other entries of the network's input (example_keys, which
the head's dropout reads), so the two-input cell structure travels between
pipeline partitions; each cell returns NestedMap(prev=cur, cur=new).

About the genotype. The op set is the paper's (separable 3x3/5x5/7x7
convolutions, 3x3 max and average pooling, identity, 1x7-then-7x1
convolution, 1x1 and 3x3 convolutions). We could not check the exact
AmoebaNet-D wiring (which ops feed which hidden state) against a primary
source, so NORMAL_CELL and REDUCTION_CELL below are our own wiring within
that space, not a reproduction of the published cells; pass your own
genotype to `AmoebaNetD` to use another (conv_3x3 is there for that; our
cells leave it out, being heavy in parameters). Not implemented: the
auxiliary head and drop-path of the paper's training recipe.

Ops, each [b, h, w, F] -> [b, h / s, w / s, F] for stride s:

  identity        x; with stride 2: ReLU, 1x1 conv stride 2, BN
  sep_conv_KxK    (ReLU, separable KxK conv, BN) twice; the first strided
  max_pool_3x3    3x3 max pooling, 'SAME'
  avg_pool_3x3    3x3 average pooling, 'SAME'
  conv_1x7_7x1    ReLU, 1x7 conv, 7x1 conv, BN
  conv_1x1        ReLU, 1x1 conv, BN
  conv_3x3        ReLU, 3x3 conv, BN
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import resnet

OPS = ('identity', 'sep_conv_3x3', 'sep_conv_5x5', 'sep_conv_7x7',
       'max_pool_3x3', 'avg_pool_3x3', 'conv_1x7_7x1', 'conv_1x1',
       'conv_3x3')

# Five combinations ((op_a, input_a), (op_b, input_b)); h_{2+i} is the sum.
Genotype = Sequence[Tuple[Tuple[str, int], Tuple[str, int]]]

# Our wiring (see the module docstring); concat: h4, h5, h6 (3F channels).
# Normal cells hold most of the parameters, so they use only separable
# convolutions and one 1x1: about 13 F^2 parameters each.
NORMAL_CELL: Genotype = (
    (('max_pool_3x3', 0), ('conv_1x1', 0)),
    (('identity', 1), ('sep_conv_7x7', 0)),
    (('sep_conv_3x3', 0), ('avg_pool_3x3', 1)),
    (('identity', 2), ('sep_conv_5x5', 1)),
    (('avg_pool_3x3', 3), ('sep_conv_3x3', 1)),
)

# Concat: h5, h6 (2F channels).
REDUCTION_CELL: Genotype = (
    (('max_pool_3x3', 0), ('sep_conv_7x7', 1)),
    (('avg_pool_3x3', 1), ('sep_conv_5x5', 0)),
    (('conv_1x7_7x1', 0), ('max_pool_3x3', 1)),
    (('identity', 2), ('sep_conv_3x3', 3)),
    (('avg_pool_3x3', 2), ('conv_1x1', 4)),
)


def _Relu(name: str) -> hyperparams.Params:
  return layers.ActivationLayer.Params().Set(name=name, activation='RELU')


def _Conv(name: str, fh: int, fw: int, cin: int, cout: int,
          stride: Tuple[int, int]) -> hyperparams.Params:
  return layers.Conv2DLayer.Params().Set(
      name=name, filter_shape=(fh, fw, cin, cout), filter_stride=stride,
      has_bias=False, params_init=resnet.HeInit())


def _Bn(name: str, dim: int, bn_tpl: hyperparams.Params) -> hyperparams.Params:
  return bn_tpl.Copy().Set(name=name, dim=dim)


def ReluConvBn(filters_in: int, filters: int, stride: int,
               bn_tpl: hyperparams.Params,
               kernel: int = 1) -> hyperparams.Params:
  """SequentialLayer params: ReLU, KxK conv (no bias), BN."""
  return layers.SequentialLayer.Params().Set(sub=[
      _Relu('relu'),
      _Conv('conv', kernel, kernel, filters_in, filters, (stride, stride)),
      _Bn('bn', filters, bn_tpl)])


def OpParams(op: str, filters: int, stride: int,
             bn_tpl: Optional[hyperparams.Params] = None
             ) -> hyperparams.Params:
  """SequentialLayer params of one op (module docstring) on F channels."""
  bn_tpl = bn_tpl or normalization.BatchNormLayer.Params()
  f, s = filters, stride
  seq = layers.SequentialLayer.Params()
  if op == 'identity':
    return ReluConvBn(f, f, s, bn_tpl) if s > 1 else seq
  if op.startswith('sep_conv_'):
    k = int(op[-1])
    sub = []
    for i, step in enumerate((s, 1)):
      sub += [_Relu(f'relu{i}'),
              layers.DepthwiseSeparableConv2DLayer.Params().Set(
                  name=f'sep{i}', filter_shape=(k, k, f, 1), output_dim=f,
                  filter_stride=(step, step), has_bias=False,
                  params_init=resnet.HeInit()),
              _Bn(f'bn{i}', f, bn_tpl)]
    return seq.Set(sub=sub)
  if op in ('max_pool_3x3', 'avg_pool_3x3'):
    return seq.Set(sub=[layers.PoolingLayer.Params().Set(
        name='pool', pooling_type=op[:3].upper(), window_shape=(3, 3),
        window_stride=(s, s))])
  if op == 'conv_1x7_7x1':
    return seq.Set(sub=[_Relu('relu'), _Conv('conv1x7', 1, 7, f, f, (1, s)),
                        _Conv('conv7x1', 7, 1, f, f, (s, 1)),
                        _Bn('bn', f, bn_tpl)])
  if op in ('conv_1x1', 'conv_3x3'):
    return ReluConvBn(f, f, s, bn_tpl, kernel=int(op[-1]))
  raise ValueError(f'AmoebaNet: unknown op {op!r}; use one of {OPS}.')


def CheckGenotype(genotype: Genotype, where: str) -> List[int]:
  """Raises ValueError unless valid; returns the concatenated states."""
  try:
    combos = [((str(a[0]), int(a[1])), (str(b[0]), int(b[1])))
              for a, b in genotype]
  except (TypeError, ValueError, IndexError):
    raise ValueError(
        f'{where}: genotype {genotype!r} must be a list of '
        '((op, input), (op, input)) pairs.') from None
  if not combos:
    raise ValueError(f'{where}: the genotype has no combinations.')
  used = set()
  for i, combo in enumerate(combos):
    for op, index in combo:
      if op not in OPS:
        raise ValueError(f'{where}: unknown op {op!r}; use one of {OPS}.')
      if not 0 <= index < i + 2:
        raise ValueError(
            f'{where}: combination {i} (h{i + 2}) reads h{index}; it may '
            f'read only h0 .. h{i + 1}.')
      used.add(index)
  return [i for i in range(2, len(combos) + 2) if i not in used]


class AmoebaCell(base_layer.BaseLayer):
  """One normal or reduction cell (module docstring).

  FProp(theta, state): state.prev [b, h', w', prev_dim] and state.cur [b,
  h, w, cur_dim], where h' = 2h if reduce_prev, else h' = h; other entries
  of state are passed through. Returns the state with prev = state.cur and
  cur = the new cell output [b, h / s, w / s, len(concat) * filters], s =
  stride. Children: `pre_prev`, `pre_cur`, and `op{i}_a`, `op{i}_b` of
  combination i.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('genotype', NORMAL_CELL,
             'Five ((op, input), (op, input)) combinations.')
    p.Define('filters', 0, 'F: channels of every hidden state.')
    p.Define('stride', 1, '1 for a normal cell, 2 for a reduction cell.')
    p.Define('prev_dim', 0, 'Channels of state.prev.')
    p.Define('cur_dim', 0, 'Channels of state.cur.')
    p.Define('reduce_prev', False,
             'Whether state.prev has twice the height and width of '
             'state.cur (the cell after a reduction).')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params of every BN in the cell.')
    return p

  @classmethod
  def _Plan(cls, p: hyperparams.Params) -> Tuple[NestedMap, List[int]]:
    """(children params by name, concatenated hidden states)."""
    where = f"AmoebaCell '{p.name}'"
    for key in ('filters', 'prev_dim', 'cur_dim'):
      if not isinstance(p.Get(key), int) or p.Get(key) <= 0:
        raise ValueError(
            f'{where}: {key}={p.Get(key)!r} must be a positive int.')
    if p.stride not in (1, 2):
      raise ValueError(f'{where}: stride={p.stride!r} must be 1 or 2.')
    concat = CheckGenotype(p.genotype, where)
    f = p.filters
    children = NestedMap(
        pre_prev=ReluConvBn(p.prev_dim, f, 2 if p.reduce_prev else 1,
                            p.bn_tpl),
        pre_cur=ReluConvBn(p.cur_dim, f, 1, p.bn_tpl))
    for i, combo in enumerate(p.genotype):
      for side, (op, index) in zip('ab', combo):
        stride = p.stride if index < 2 else 1
        children[f'op{i}_{side}'] = OpParams(op, f, stride, p.bn_tpl)
    return children, concat

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    children, self._concat = self._Plan(self.params)
    for name, child in children.items():
      self.CreateChild(name, child)

  def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
    p = self.params
    hidden = [self.pre_prev.FProp(theta.pre_prev, state.prev),
              self.pre_cur.FProp(theta.pre_cur, state.cur)]
    for i, combo in enumerate(p.genotype):
      total = None
      for side, (_, index) in zip('ab', combo):
        name = f'op{i}_{side}'
        y = self.children[name].FProp(theta[name], hidden[index])
        total = y if total is None else total + y
      hidden.append(total)
    out = NestedMap(state)
    out.prev = state.cur
    out.cur = tf.concat([hidden[i] for i in self._concat], axis=-1)
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                state_shapes: Any) -> NestedMap:
    children, concat = cls._Plan(params)

    def Meta(name: str, shape: tf.TensorShape) -> Tuple[int, Any]:
      meta = children[name].cls.FPropMeta(children[name], shape)
      return int(meta.flops), tf.TensorShape(meta.out_shapes[0])

    flops = 0
    hidden = []
    for name, key in (('pre_prev', 'prev'), ('pre_cur', 'cur')):
      f, shape = Meta(name, tf.TensorShape(state_shapes[key]))
      flops += f
      hidden.append(shape)
    for i, combo in enumerate(params.genotype):
      shapes = []
      for side, (_, index) in zip('ab', combo):
        f, shape = Meta(f'op{i}_{side}', hidden[index])
        flops += f
        shapes.append(shape)
      if shapes[0] != shapes[1]:
        raise ValueError(
            f"AmoebaCell '{params.name}': combination {i} adds shapes "
            f'{shapes[0]} and {shapes[1]}; check reduce_prev and the '
            'input shapes.')
      flops += int(shapes[0].num_elements())
      hidden.append(shapes[0])
    first = hidden[concat[0]]
    out_shape = first[:-1].concatenate([first[-1] * len(concat)])
    out = NestedMap(state_shapes)
    out.prev = tf.TensorShape(state_shapes['cur'])
    out.cur = out_shape
    return NestedMap(flops=flops, out_shapes=(out,))

  @classmethod
  def OutputDim(cls, params: hyperparams.Params) -> int:
    """Channels of the cell's output, len(concat) * filters."""
    return len(CheckGenotype(params.genotype, 'AmoebaCell')) * params.filters


def _Image(inputs: Any) -> Tuple[Any, NestedMap]:
  """(image, other entries) of a NestedMap(image=...) or an image."""
  if isinstance(inputs, dict):
    rest = NestedMap(inputs)
    image = rest.pop('image')
    return image, rest
  return inputs, NestedMap()


class AmoebaStem(base_layer.BaseLayer):
  """3x3 conv (no bias) and BN; starts the two-input state.

  FProp(theta, inputs): inputs is NestedMap(image [b, h, w, c], ...) or
  the image tensor. Returns NestedMap(prev=x, cur=x, ...) with x [b, h /
  s, w / s, filters]; other entries of inputs (example_keys) are kept.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 3, 'Channels of the image.')
    p.Define('filters', 0, 'Channels of the stem output.')
    p.Define('stride', 1, 'Stride of the conv.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params.')
    return p

  @classmethod
  def _ConvParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    return resnet.ConvBatchNormLayer.Params().Set(
        name='conv', filter_shape=(3, 3, p.input_dim, p.filters),
        filter_stride=(p.stride, p.stride), activation='NONE',
        bn_tpl=p.bn_tpl)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('conv', self._ConvParams(self.params))

  def FProp(self, theta: NestedMap, inputs: Any) -> NestedMap:
    image, out = _Image(inputs)
    x = self.conv.FProp(theta.conv, image)
    out.prev = x
    out.cur = x
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shapes: Any) -> NestedMap:
    image, out = _Image(input_shapes)
    conv = cls._ConvParams(params)
    meta = conv.cls.FPropMeta(conv, tf.TensorShape(image))
    out.prev = out.cur = tf.TensorShape(meta.out_shapes[0])
    return NestedMap(flops=meta.flops, out_shapes=(out,))


class AmoebaHead(base_layer.BaseLayer):
  """ReLU, global average pool, dropout, fully connected: the logits.

  FProp(theta, state): state.cur [b, h, w, input_dim]; dropout (if
  keep_prob < 1, in training) reads state.example_keys. Returns logits
  [b, num_classes].
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of state.cur.')
    p.Define('num_classes', 0, 'Number of classes.')
    p.Define('keep_prob', 1.0, 'Dropout keep probability before the logits.')
    return p

  @classmethod
  def _LogitsParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    return layers.ProjectionLayer.Params().Set(
        name='logits', input_dim=p.input_dim, output_dim=p.num_classes)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('dropout', dropout.DropoutLayer.Params().Set(
        keep_prob=self.params.keep_prob))
    self.CreateChild('logits', self._LogitsParams(self.params))

  def FProp(self, theta: NestedMap, state: NestedMap) -> tf.Tensor:
    x = tf.reduce_mean(tf.nn.relu(state.cur), axis=[1, 2])
    x = self.dropout.FProp(theta.dropout, x, state.get('example_keys'))
    return self.logits.FProp(theta.logits, x)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                state_shapes: Any) -> NestedMap:
    shape = tf.TensorShape(state_shapes['cur'])
    if shape.rank != 4 or not shape.is_fully_defined():
      raise ValueError(
          f'{cls.__name__}.FPropMeta: state.cur shape {shape} is not a '
          'fully defined [batch, height, width, channels].')
    pooled = tf.TensorShape([shape[0], shape[3]])
    logits = cls._LogitsParams(params)
    meta = logits.cls.FPropMeta(logits, pooled)
    flops = 2 * shape.num_elements() + 10 * pooled.num_elements()
    return NestedMap(flops=flops + meta.flops, out_shapes=meta.out_shapes)


def AmoebaNetD(num_cells: int, filters: int, num_classes: int, *,
               input_channels: int = 3,
               stem_filters: Optional[int] = None,
               stem_stride: int = 1,
               num_stem_reduction_cells: int = 0,
               keep_prob: float = 1.0,
               normal_cell: Genotype = NORMAL_CELL,
               reduction_cell: Genotype = REDUCTION_CELL,
               bn_decay: float = 0.99) -> List[hyperparams.Params]:
  """The layers of AmoebaNet-D (L, D) (module docstring), in order.

  Args:
    num_cells: L, normal cells in all; a multiple of 3 (three stacks).
    filters: D, filters of the first stack (doubled at each reduction).
    num_classes: outputs of the head.
    input_channels: channels of the image.
    stem_filters: channels of the stem conv; None means D.
    stem_stride: stride of the stem conv (2 for large images).
    num_stem_reduction_cells: reduction cells after the stem conv, of D / 4,
      D / 2, ... filters (2 for ImageNet-size images; 0 for CIFAR).
    keep_prob: dropout keep probability in the head.
    normal_cell: genotype of the normal cells.
    reduction_cell: genotype of the reduction cells.
    bn_decay: moving-average decay of every BatchNorm.

  Returns:
    Layer params named stem, stem_reduction{i}, stack{s}_cell{j},
    reduction{r}, head.
  """
  if not isinstance(num_cells, int) or num_cells < 3 or num_cells % 3:
    raise ValueError(
        f'AmoebaNetD: num_cells={num_cells!r} (L) must be a positive '
        'multiple of 3: three stacks of L / 3 normal cells.')
  if not isinstance(filters, int) or filters < 1:
    raise ValueError(f'AmoebaNetD: filters={filters!r} (D) must be >= 1.')
  n_stem = num_stem_reduction_cells
  if filters % (2 ** n_stem):
    raise ValueError(
        f'AmoebaNetD: filters={filters} must be divisible by '
        f'2^num_stem_reduction_cells = {2 ** n_stem}.')
  CheckGenotype(normal_cell, 'AmoebaNetD normal_cell')
  CheckGenotype(reduction_cell, 'AmoebaNetD reduction_cell')
  bn = normalization.BatchNormLayer.Params().Set(decay=bn_decay)
  stem_filters = stem_filters or filters
  out = [AmoebaStem.Params().Set(
      name='stem', input_dim=input_channels, filters=stem_filters,
      stride=stem_stride, bn_tpl=bn)]
  # Channels of prev and cur, and whether cur was just reduced.
  dims = [stem_filters, stem_filters]
  reduced = False

  def Add(name: str, genotype: Genotype, f: int, stride: int) -> None:
    nonlocal reduced
    cell = AmoebaCell.Params().Set(
        name=name, genotype=genotype, filters=f, stride=stride,
        prev_dim=dims[0], cur_dim=dims[1], reduce_prev=reduced, bn_tpl=bn)
    out.append(cell)
    dims[:] = [dims[1], AmoebaCell.OutputDim(cell)]
    reduced = stride == 2

  for i in range(n_stem):
    Add(f'stem_reduction{i}', reduction_cell,
        filters // 2 ** (n_stem - i), 2)
  for s in range(3):
    if s:
      Add(f'reduction{s - 1}', reduction_cell, filters * 2 ** s, 2)
    for j in range(num_cells // 3):
      Add(f'stack{s}_cell{j}', normal_cell, filters * 2 ** s, 1)
  out.append(AmoebaHead.Params().Set(
      name='head', input_dim=dims[1], num_classes=num_classes,
      keep_prob=keep_prob))
  return out
