"""AmoebaNet-D and -B (Real et al. 2019) as a flat list of pipeline layers.

AmoebaNet is a stack of cells; each cell combines the outputs of the two
cells before it. A cell of F filters, given `cur` (the last cell's output)
and `prev` (the one before it):

  h1 = prev                       # if there is no prev (the first cell):
                                  #   cur itself, as it is
     = ReLU, factorized reduction (prev)  # if prev is larger than cur
     = ReLU, 1x1 conv, BN (prev)          # else if prev is not F wide
  h0 = ReLU, 1x1 conv, BN (cur)
  h2 .. h6: five pairwise combinations of ops (amoebanet_ops)
  out = concat of the cell's listed states, each first made the size and
        width of h6 if it is not (factorized reduction, or 1x1 conv + BN)

The network (L = num_cells normal cells, D = filters; GPipe's
AmoebaNet-D (L, D)), as the reference implementation builds it:

  layer          what                                  out channels
  stem           3x3 conv, 'VALID', BN (no ReLU);      stem_filters (32)
                 stride 2 ('imagenet') or 1 ('cifar')
  stem_cell0     reduction cell, F = D/4 ('imagenet')  3D/4 (D: 2 states)
  stem_cell1     reduction cell, F = D/2 ('imagenet')  3D/2
  stack0_cell*   L/3 normal cells, F = D               4D
  reduction0     reduction cell, F = 2D                6D
  stack1_cell*   L/3 normal cells, F = 2D              8D
  aux_head       (optional) logits from stack 1's end, training only
  reduction1     reduction cell, F = 4D                12D
  stack2_cell*   L/3 normal cells, F = 4D              16D
  head           ReLU, global average pool, dropout,   num_classes
                 fully connected

Reductions come before normal cells int(L/3) and int(2L/3) (L need not be
a multiple of 3). Between layers the state is NestedMap(prev, cur) plus
the network input's other entries (example_keys and example_steps, which
drop-path and dropout read), so the two-input structure travels between
pipeline partitions. The stem passes no prev.

Drop-path (dropout.DropPathLayer) follows every op but `none`: whole
examples of an op's output are dropped with a keep probability falling
from 1 to drop_path_keep_prob over drop_path_burn_in_steps, each mask a
hash of (example key, op path), so gradients are exact for any K and M.

The auxiliary head (Szegedy et al. 2016), in training only: ReLU, 5x5
average pool (stride 3, 'VALID'), 1x1 conv to int(128 s), BN, ReLU, conv
over the whole remaining window to int(768 s), BN, ReLU, fully connected;
s = aux_scaling (0.4). Its logits travel to the end as state.aux_logits
and the head returns NestedMap(logits, aux_logits); ImageClassifier adds
their loss with a weight.

Parameter counts at 224x224, 1000 classes, with the auxiliary head
(tests/tasks/image/amoebanet_test.py builds the shapes only): AmoebaNet-D
(18, 208) 81.8M, (18, 416) 318.3M, (18, 544) 541.0M, (36, 544) 1.054B,
(72, 512) 1.843B; GPipe's Table 1 has 82M, 318M, 542M, 1.05B, 1.8B.
AmoebaNet-B (18, 512) is 557.3M without it (GPipe's 557M ImageNet model).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import amoebanet_ops as ops
from lingvo_pipe.tasks.image import resnet

CellSpec = ops.CellSpec
STEMS = ('imagenet', 'cifar')


class AmoebaCell(base_layer.BaseLayer):
  """One normal or reduction cell (module docstring).

  FProp(theta, state): state.cur [b, h, w, cur_dim] and, unless prev_dim
  is 0, state.prev [b, h', w', prev_dim] (h' = 2h or 2h - 1 if
  reduce_prev, else h); example_keys and example_steps [b] if drop-path is
  on. Returns the state with prev = state.cur and cur = the cell output
  [b, ceil(h / s), ceil(w / s), len(concat) * filters], s = stride.
  Children: `pre_prev` (if needed), `pre_cur`, `op{i}_a` and `op{i}_b` of
  combination i, `op{i}_{a,b}_drop` (drop-path) and `align{k}`.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('spec', ops.AMOEBANET_D_NORMAL, 'The cell genotype (CellSpec).')
    p.Define('filters', 0, 'F: channels of every hidden state.')
    p.Define('stride', 1, '1 for a normal cell, 2 for a reduction cell.')
    p.Define('prev_dim', 0,
             'Channels of state.prev; 0: the cell has no prev (h1 is cur).')
    p.Define('cur_dim', 0, 'Channels of state.cur.')
    p.Define('reduce_prev', False,
             'Whether state.prev is larger than state.cur (the cell after '
             'a reduction): h1 is then its factorized reduction.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params of every BN in the cell.')
    p.Define('drop_path_keep_prob', 1.0,
             'Drop-path keep probability after the burn-in; 1: none.')
    p.Define('drop_path_burn_in_steps', 0,
             'Steps over which the drop-path keep probability falls from 1.')
    return p

  @classmethod
  def _Plan(cls, p: hyperparams.Params) -> Tuple[NestedMap, CellSpec]:
    """(children params by name, the checked spec)."""
    where = f"AmoebaCell '{p.name}'"
    for key, low in (('filters', 1), ('cur_dim', 1), ('prev_dim', 0)):
      if not isinstance(p.Get(key), int) or p.Get(key) < low:
        raise ValueError(
            f'{where}: {key}={p.Get(key)!r} must be an int >= {low}.')
    if p.stride not in (1, 2):
      raise ValueError(f'{where}: stride={p.stride!r} must be 1 or 2.')
    spec = ops.CheckCellSpec(p.spec, where)
    f, bn = p.filters, p.bn_tpl
    children = NestedMap()
    if f % 2 and p.prev_dim and p.reduce_prev:
      raise ValueError(
          f'{where}: filters={f} must be an even int for the factorized '
          'reduction of prev; choose filters D divisible by 4.')
    if p.prev_dim and p.reduce_prev:
      children.pre_prev = layers.SequentialLayer.Params().Set(sub=[
          ops.Relu('relu'),
          ops.FactorizedReduction.Params().Set(
              name='reduce', input_dim=p.prev_dim, filters=f, bn_tpl=bn)])
    elif p.prev_dim and p.prev_dim != f:
      children.pre_prev = ops.ReluConvBn(p.prev_dim, f, 1, bn)
    children.pre_cur = ops.ReluConvBn(p.cur_dim, f, 1, bn)
    dims = [f, f if p.prev_dim else p.cur_dim]
    reduced = [False, False]
    for i, combo in enumerate(spec.combinations):
      for side, (op, index) in zip('ab', combo):
        stride = p.stride if index < 2 else 1
        name = f'op{i}_{side}'
        children[name] = ops.OpParams(op, dims[index], f, stride, bn)
        if op != 'none' and p.drop_path_keep_prob < 1.0:
          children[f'{name}_drop'] = dropout.DropPathLayer.Params().Set(
              keep_prob=p.drop_path_keep_prob,
              burn_in_steps=p.drop_path_burn_in_steps)
      index = combo[0][1]
      dims.append(f)
      reduced.append(reduced[index] or (index < 2 and p.stride == 2))
    for k in spec.concat:
      if reduced[k] != reduced[-1]:
        children[f'align{k}'] = ops.FactorizedReduction.Params().Set(
            input_dim=dims[k], filters=f, bn_tpl=bn)
      elif dims[k] != f:
        children[f'align{k}'] = layers.SequentialLayer.Params().Set(
            sub=ops.ConvBn(dims[k], f, bn))
    return children, spec

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    children, self._spec = self._Plan(self.params)
    for name, child in children.items():
      self.CreateChild(name, child)

  def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
    p = self.params
    keys, steps = state.get('example_keys'), state.get('example_steps')

    def Apply(name: str, x: tf.Tensor, *args: Any) -> tf.Tensor:
      if name not in self.children:
        return x
      return self.children[name].FProp(theta[name], x, *args)

    h1 = Apply('pre_prev', state.prev) if p.prev_dim else state.cur
    hidden = [Apply('pre_cur', state.cur), h1]
    for i, combo in enumerate(self._spec.combinations):
      total = None
      for side, (_, index) in zip('ab', combo):
        name = f'op{i}_{side}'
        y = Apply(f'{name}_drop', Apply(name, hidden[index]), keys, steps)
        total = y if total is None else total + y
      hidden.append(total)
    out = NestedMap(state)
    out.prev = state.cur
    out.cur = tf.concat([Apply(f'align{k}', hidden[k])
                         for k in self._spec.concat], axis=-1)
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                state_shapes: Any) -> NestedMap:
    children, spec = cls._Plan(params)
    flops = [0]

    def Meta(name: str, shape: tf.TensorShape) -> tf.TensorShape:
      if name not in children:
        return shape
      meta = children[name].cls.FPropMeta(children[name], shape)
      flops[0] += int(meta.flops)
      return tf.TensorShape(meta.out_shapes[0])

    cur = tf.TensorShape(state_shapes['cur'])
    hidden = [Meta('pre_cur', cur),
              Meta('pre_prev', tf.TensorShape(state_shapes['prev']))
              if params.prev_dim else cur]
    for i, combo in enumerate(spec.combinations):
      shapes = [Meta(f'op{i}_{s}_drop', Meta(f'op{i}_{s}', hidden[index]))
                for s, (_, index) in zip('ab', combo)]
      if shapes[0] != shapes[1]:
        raise ValueError(
            f"AmoebaCell '{params.name}': combination {i} adds shapes "
            f'{shapes[0]} and {shapes[1]}; check reduce_prev and the '
            'input shapes.')
      flops[0] += int(shapes[0].num_elements())
      hidden.append(shapes[0])
    concat = [Meta(f'align{k}', hidden[k]) for k in spec.concat]
    out = NestedMap(state_shapes)
    out.prev = cur
    out.cur = concat[0][:-1].concatenate([sum(s[-1] for s in concat)])
    return NestedMap(flops=flops[0], out_shapes=(out,))

  @classmethod
  def OutputDim(cls, params: hyperparams.Params) -> int:
    """Channels of the cell's output, len(concat) * filters.

    Also checks the params (ValueError saying what to change).
    """
    _, spec = cls._Plan(params)
    return len(spec.concat) * params.filters


def _Image(inputs: Any) -> Tuple[Any, NestedMap]:
  """(image, other entries) of a NestedMap(image=...) or an image."""
  if isinstance(inputs, dict):
    rest = NestedMap(inputs)
    image = rest.pop('image')
    return image, rest
  return inputs, NestedMap()


class AmoebaStem(base_layer.BaseLayer):
  """3x3 conv (no bias, 'VALID') and BN, no ReLU; starts the state.

  FProp(theta, inputs): inputs is NestedMap(image [b, h, w, c], ...) or
  the image tensor. Returns NestedMap(cur=[b, (h - 3) // s + 1, ...,
  filters], ...) keeping inputs' other entries (example_keys).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 3, 'Channels of the image.')
    p.Define('filters', 32, 'Channels of the stem output.')
    p.Define('stride', 1, 'Stride of the conv.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params.')
    return p

  @classmethod
  def _ConvParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    return resnet.ConvBatchNormLayer.Params().Set(
        name='conv', filter_shape=(3, 3, p.input_dim, p.filters),
        filter_stride=(p.stride, p.stride), padding='VALID',
        activation='NONE', bn_tpl=p.bn_tpl)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('conv', self._ConvParams(self.params))

  def FProp(self, theta: NestedMap, inputs: Any) -> NestedMap:
    image, out = _Image(inputs)
    out.cur = self.conv.FProp(theta.conv, image)
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shapes: Any) -> NestedMap:
    image, out = _Image(input_shapes)
    conv = cls._ConvParams(params)
    meta = conv.cls.FPropMeta(conv, tf.TensorShape(image))
    out.cur = tf.TensorShape(meta.out_shapes[0])
    return NestedMap(flops=meta.flops, out_shapes=(out,))


class AmoebaAuxHead(base_layer.BaseLayer):
  """The auxiliary classifier (module docstring), in training only.

  FProp(theta, state): state.cur [b, h, w, input_dim] with (h, w) =
  input_size. In training returns the state plus aux_logits [b,
  num_classes]; in eval, the state unchanged. FPropMeta describes training.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of state.cur.')
    p.Define('input_size', (0, 0), 'Height and width of state.cur.')
    p.Define('num_classes', 0, 'Number of classes.')
    p.Define('scaling', 0.4, 'Width factor of the two convs (128, 768).')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params.')
    return p

  @classmethod
  def _Children(cls, p: hyperparams.Params) -> List[hyperparams.Params]:
    h, w = p.input_size
    if min(h, w) < 5:
      raise ValueError(
          f"AmoebaAuxHead '{p.name}': its input is {h}x{w}, smaller than "
          'its 5x5 pooling; use larger images or no auxiliary head.')
    c1, c2 = int(128 * p.scaling), int(768 * p.scaling)
    kh, kw = (h - 5) // 3 + 1, (w - 5) // 3 + 1
    conv = resnet.ConvBatchNormLayer.Params().Set(bn_tpl=p.bn_tpl)
    return [
        layers.PoolingLayer.Params().Set(
            name='pool', pooling_type='AVG', window_shape=(5, 5),
            window_stride=(3, 3), padding='VALID'),
        conv.Copy().Set(name='proj', filter_shape=(1, 1, p.input_dim, c1)),
        conv.Copy().Set(name='conv', filter_shape=(kh, kw, c1, c2),
                        padding='VALID'),
        layers.ProjectionLayer.Params().Set(
            name='logits', input_dim=c2, output_dim=p.num_classes)]

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    for child in self._Children(self.params):
      self.CreateChild(child.name, child)

  def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
    if not self.training:
      return state
    x = self.pool.FProp(theta.pool, tf.nn.relu(state.cur))
    x = self.conv.FProp(theta.conv, self.proj.FProp(theta.proj, x))
    out = NestedMap(state)
    out.aux_logits = self.logits.FProp(theta.logits, x[:, 0, 0, :])
    return out

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                state_shapes: Any) -> NestedMap:
    pool, proj, conv, logits = cls._Children(params)
    shape = tf.TensorShape(state_shapes['cur'])
    flops = 0
    for child in (pool, proj, conv):
      meta = child.cls.FPropMeta(child, shape)
      flops += int(meta.flops)
      shape = tf.TensorShape(meta.out_shapes[0])
    meta = logits.cls.FPropMeta(logits, tf.TensorShape([shape[0], shape[3]]))
    out = NestedMap(state_shapes)
    out.aux_logits = tf.TensorShape(meta.out_shapes[0])
    return NestedMap(flops=flops + int(meta.flops), out_shapes=(out,))


class AmoebaHead(base_layer.BaseLayer):
  """ReLU, global average pool, dropout, fully connected: the logits.

  FProp(theta, state): state.cur [b, h, w, input_dim]; dropout (if
  keep_prob < 1, in training) reads state.example_keys. Returns logits
  [b, num_classes], or NestedMap(logits, aux_logits) if the state has
  aux_logits (the auxiliary head ran).
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

  def FProp(self, theta: NestedMap, state: NestedMap) -> Any:
    x = tf.reduce_mean(tf.nn.relu(state.cur), axis=[1, 2])
    x = self.dropout.FProp(theta.dropout, x, state.get('example_keys'))
    logits = self.logits.FProp(theta.logits, x)
    if 'aux_logits' in state:
      return NestedMap(logits=logits, aux_logits=state.aux_logits)
    return logits

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
    out = meta.out_shapes
    if 'aux_logits' in state_shapes:
      out = (NestedMap(logits=meta.out_shapes[0],
                       aux_logits=state_shapes['aux_logits']),)
    return NestedMap(flops=flops + meta.flops, out_shapes=out)


def AmoebaNet(num_cells: int, filters: int, num_classes: int, *,
              normal_cell: CellSpec = ops.AMOEBANET_D_NORMAL,
              reduction_cell: CellSpec = ops.AMOEBANET_D_REDUCTION,
              stem: str = 'imagenet',
              input_channels: int = 3,
              stem_filters: int = 32,
              keep_prob: float = 1.0,
              drop_path_keep_prob: float = 1.0,
              drop_path_burn_in_steps: int = 0,
              aux_head: bool = False,
              aux_scaling: float = 0.4,
              image_size: Optional[int] = None,
              bn_decay: float = 0.99,
              bn_epsilon: float = 1e-3) -> List[hyperparams.Params]:
  """The layers of AmoebaNet (L, D) (module docstring), in order.

  Args:
    num_cells: L, normal cells in all (>= 3).
    filters: D, the filters F of the first stack's normal cells.
    num_classes: outputs of the head.
    normal_cell: genotype of the normal cells (AmoebaNet-D's by default).
    reduction_cell: genotype of the reduction cells.
    stem: 'imagenet' (stride-2 conv, two reduction cells) or 'cifar'
      (stride-1 conv).
    input_channels: channels of the image.
    stem_filters: channels of the stem conv.
    keep_prob: dropout keep probability before the logits.
    drop_path_keep_prob: drop-path keep probability after the burn-in.
    drop_path_burn_in_steps: steps over which it falls from 1.
    aux_head: whether to add the auxiliary head (needs image_size).
    aux_scaling: width factor of the auxiliary head.
    image_size: height (= width) of the images; needed by the aux head.
    bn_decay: moving-average decay of every BatchNorm.
    bn_epsilon: variance epsilon of every BatchNorm.

  Returns:
    Layer params named stem, stem_cell{i}, stack{s}_cell{j}, reduction{r},
    aux_head, head.
  """
  where = 'AmoebaNet'
  if not isinstance(num_cells, int) or num_cells < 3:
    raise ValueError(f'{where}: num_cells={num_cells!r} (L) must be an int '
                     '>= 3 (three stacks of normal cells).')
  if not isinstance(filters, int) or filters < 1:
    raise ValueError(f'{where}: filters={filters!r} (D) must be an int >= 1.')
  if stem not in STEMS:
    raise ValueError(f'{where}: stem={stem!r}; use one of {STEMS}.')
  if aux_head and not (isinstance(image_size, int) and image_size > 0):
    raise ValueError(f'{where}: aux_head=True needs image_size (an int), '
                     f'got {image_size!r}.')
  normal = ops.CheckCellSpec(normal_cell, f'{where} normal_cell')
  reduction = ops.CheckCellSpec(reduction_cell, f'{where} reduction_cell')
  bn = normalization.BatchNormLayer.Params().Set(decay=bn_decay,
                                                 epsilon=bn_epsilon)
  stride = 2 if stem == 'imagenet' else 1
  out = [AmoebaStem.Params().Set(name='stem', input_dim=input_channels,
                                 filters=stem_filters, stride=stride,
                                 bn_tpl=bn)]
  size = None if image_size is None else (image_size - 3) // stride + 1
  # (channels, whether a stride-2 layer made it) of the last two outputs.
  outputs: List[Optional[Tuple[int, bool]]] = [None, (stem_filters, False)]

  def Add(name: str, spec: CellSpec, f: int, cell_stride: int) -> None:
    nonlocal size
    prev, (cur_dim, cur_reduced) = outputs[-2], outputs[-1]
    cell = AmoebaCell.Params().Set(
        name=name, spec=spec, filters=f, stride=cell_stride,
        prev_dim=prev[0] if prev else 0, cur_dim=cur_dim,
        reduce_prev=bool(prev) and cur_reduced, bn_tpl=bn,
        drop_path_keep_prob=drop_path_keep_prob,
        drop_path_burn_in_steps=drop_path_burn_in_steps)
    out.append(cell)
    outputs.append((AmoebaCell.OutputDim(cell), cell_stride == 2))
    if size is not None and cell_stride == 2:
      size = -(-size // 2)

  num_stem_cells = 2 if stem == 'imagenet' else 0
  for i in range(num_stem_cells):
    Add(f'stem_cell{i}', reduction, int(filters * 2.0**(i - num_stem_cells)),
        2)
  reductions = [num_cells // 3, 2 * num_cells // 3]
  stack, first = 0, 0
  for c in range(num_cells):
    if c in reductions:
      Add(f'reduction{stack}', reduction, filters * 2**(stack + 1), 2)
      stack, first = stack + 1, c
    Add(f'stack{stack}_cell{c - first}', normal, filters * 2**stack, 1)
    if aux_head and c == reductions[1] - 1:
      if size < 5:
        raise ValueError(
            f'{where}: the auxiliary head\'s input is {size}x{size} at '
            f'image_size={image_size}, smaller than its 5x5 pooling; use '
            'larger images or aux_head=False.')
      out.append(AmoebaAuxHead.Params().Set(
          name='aux_head', input_dim=outputs[-1][0], input_size=(size, size),
          num_classes=num_classes, scaling=aux_scaling, bn_tpl=bn))
  out.append(AmoebaHead.Params().Set(
      name='head', input_dim=outputs[-1][0], num_classes=num_classes,
      keep_prob=keep_prob))
  return out


def AmoebaNetD(num_cells: int, filters: int, num_classes: int,
               **kwargs: Any) -> List[hyperparams.Params]:
  """AmoebaNet-D (L, D) = (num_cells, filters); kwargs as AmoebaNet's."""
  kwargs.setdefault('normal_cell', ops.AMOEBANET_D_NORMAL)
  kwargs.setdefault('reduction_cell', ops.AMOEBANET_D_REDUCTION)
  return AmoebaNet(num_cells, filters, num_classes, **kwargs)


def AmoebaNetB(num_cells: int, filters: int, num_classes: int,
               **kwargs: Any) -> List[hyperparams.Params]:
  """AmoebaNet-B (L, D) = (num_cells, filters); kwargs as AmoebaNet's."""
  kwargs.setdefault('normal_cell', ops.AMOEBANET_B_NORMAL)
  kwargs.setdefault('reduction_cell', ops.AMOEBANET_B_REDUCTION)
  return AmoebaNet(num_cells, filters, num_classes, **kwargs)
