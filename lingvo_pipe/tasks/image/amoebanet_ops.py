"""AmoebaNet's cell genotypes and operations (Real et al. 2019).

A cell has seven hidden states: h0 and h1 are its two inputs made F
channels wide (see amoebanet.AmoebaCell), and h2 .. h6 are five pairwise
combinations, h_{2+i} = op_a(h_{in_a}) + op_b(h_{in_b}) with in_a, in_b <
2 + i. The cell's output concatenates the states listed in `concat`. In a
reduction cell (stride 2) the ops reading h0 or h1 are strided; ops reading
a later state are not.

Genotypes are those of the AmoebaNet reference implementation
(tensorflow/tpu, models/official/amoeba_net/model_specs.py). The concat
lists are the reference's hand-written ones, not "every state no op read":
AmoebaNet-D's normal cell concatenates h0 although ops read it.

Ops on an input of C channels, F = the cell's filters, s = the op's stride;
every conv has no bias and 'SAME' padding, BN has scale and offset:

  none             x if s = 1 and C = F; else ReLU, 1x1 conv (stride s), BN
  1x1              ReLU, 1x1 conv (stride s), BN
  3x3              ReLU, 1x1 conv to F/4, BN, ReLU, 3x3 conv (stride s), BN,
                   ReLU, 1x1 conv to F, BN                (the bottleneck)
  1x7_7x1          the bottleneck around: 1x7 conv (stride s across), BN,
                   ReLU, 7x1 conv (stride s down)
  separable_KxK_N  N times: ReLU, KxK depthwise-separable conv, BN (only
                   the first strided)
  dil_R_separable_KxK_N   the same with depthwise dilation R
  max_pool_KxK     KxK max pooling (stride s); if C != F: 1x1 conv, BN
  avg_pool_KxK     KxK average pooling over in-image elements, likewise

F/4 is int(F / 4); if it is 0 the bottleneck is skipped (ReLU, the inner
convs to F, BN). Drop-path (amoebanet.AmoebaCell) follows every op but
`none`.
"""

from __future__ import annotations

import re
from typing import Any, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import resnet

Combination = Tuple[Tuple[str, int], Tuple[str, int]]


class CellSpec(NamedTuple):
  """A cell genotype: ((op, input), (op, input)) per combination; concat."""
  combinations: Tuple[Combination, ...]
  concat: Tuple[int, ...]


AMOEBANET_D_NORMAL = CellSpec(
    combinations=((('1x1', 1), ('max_pool_3x3', 1)),
                  (('none', 1), ('1x7_7x1', 0)),
                  (('1x1', 0), ('1x7_7x1', 0)),
                  (('max_pool_3x3', 2), ('none', 2)),
                  (('avg_pool_3x3', 1), ('1x1', 5))),
    concat=(0, 3, 4, 6))

AMOEBANET_D_REDUCTION = CellSpec(
    combinations=((('max_pool_2x2', 0), ('max_pool_3x3', 0)),
                  (('none', 2), ('3x3', 1)),
                  (('1x7_7x1', 2), ('max_pool_3x3', 2)),
                  (('none', 3), ('max_pool_2x2', 1)),
                  (('avg_pool_3x3', 2), ('1x1', 3))),
    concat=(4, 5, 6))

AMOEBANET_B_NORMAL = CellSpec(
    combinations=((('1x1', 1), ('max_pool_3x3', 1)),
                  (('none', 1), ('separable_3x3_2', 0)),
                  (('1x1', 1), ('separable_3x3_2', 0)),
                  (('1x1', 2), ('none', 2)),
                  (('avg_pool_3x3', 1), ('1x1', 5))),
    concat=(0, 3, 4, 6))

AMOEBANET_B_REDUCTION = CellSpec(
    combinations=((('max_pool_2x2', 0), ('max_pool_3x3', 0)),
                  (('none', 2), ('3x3', 1)),
                  (('dil_2_separable_5x5_2', 2), ('max_pool_3x3', 2)),
                  (('none', 3), ('separable_3x3_2', 1)),
                  (('avg_pool_3x3', 4), ('1x1', 3))),
    concat=(5, 6))

_FIXED_OPS = ('none', '1x1', '3x3', '1x7_7x1')
_SEPARABLE = re.compile(r'^(?:dil_(\d+)_)?separable_(\d+)x(\d+)_(\d+)$')
_POOL = re.compile(r'^(max|avg)_pool_(\d+)x(\d+)$')
OP_FORMS = _FIXED_OPS + ('separable_KxK_N', 'dil_R_separable_KxK_N',
                         'max_pool_KxK', 'avg_pool_KxK')


def _CheckOp(op: str, where: str) -> None:
  sep, pool = _SEPARABLE.match(op), _POOL.match(op)
  square = ((sep and sep.group(2) == sep.group(3)) or
            (pool and pool.group(2) == pool.group(3)))
  if op not in _FIXED_OPS and not square:
    raise ValueError(f'{where}: unknown op {op!r}; use one of {OP_FORMS} '
                     '(square K).')


def CheckCellSpec(spec: CellSpec, where: str) -> CellSpec:
  """spec as a CellSpec of tuples; ValueError (what to change) if invalid."""
  try:
    combos = tuple(((str(a[0]), int(a[1])), (str(b[0]), int(b[1])))
                   for a, b in spec[0])
    concat = tuple(int(i) for i in spec[1])
  except (TypeError, ValueError, IndexError):
    raise ValueError(
        f'{where}: cell {spec!r} must be a CellSpec(combinations=((op, '
        'input), (op, input)) pairs, concat=state indices).') from None
  if not combos or not concat:
    raise ValueError(f'{where}: the cell needs combinations and concat.')
  for i, combo in enumerate(combos):
    for op, index in combo:
      _CheckOp(op, where)
      if not 0 <= index < i + 2:
        raise ValueError(
            f'{where}: combination {i} (h{i + 2}) reads h{index}; it may '
            f'read only h0 .. h{i + 1}.')
  if any(not 0 <= i < len(combos) + 2 for i in concat):
    raise ValueError(f'{where}: concat={concat} must list states h0 .. '
                     f'h{len(combos) + 1}.')
  return CellSpec(combos, concat)


def Relu(name: str) -> hyperparams.Params:
  return layers.ActivationLayer.Params().Set(name=name, activation='RELU')


def _Conv(name: str, fh: int, fw: int, cin: int, cout: int,
          stride: Tuple[int, int]) -> hyperparams.Params:
  return layers.Conv2DLayer.Params().Set(
      name=name, filter_shape=(fh, fw, cin, cout), filter_stride=stride,
      has_bias=False, params_init=resnet.HeInit())


def _Bn(name: str, dim: int, bn_tpl: hyperparams.Params) -> hyperparams.Params:
  return bn_tpl.Copy().Set(name=name, dim=dim)


def ConvBn(filters_in: int, filters: int, bn_tpl: hyperparams.Params,
           stride: int = 1) -> List[hyperparams.Params]:
  """[1x1 conv (no bias, stride), BN] params."""
  return [_Conv('conv', 1, 1, filters_in, filters, (stride, stride)),
          _Bn('bn', filters, bn_tpl)]


def ReluConvBn(filters_in: int, filters: int, stride: int,
               bn_tpl: hyperparams.Params) -> hyperparams.Params:
  """SequentialLayer params: ReLU, 1x1 conv (no bias, stride), BN."""
  return layers.SequentialLayer.Params().Set(
      sub=[Relu('relu'), *ConvBn(filters_in, filters, bn_tpl, stride)])


def _Inner(op: str, cin: int, f: int, s: int,
           bn_tpl: hyperparams.Params) -> List[hyperparams.Params]:
  """The convs of '3x3' or '1x7_7x1' from cin to f channels."""
  if op == '3x3':
    return [_Conv('conv3x3', 3, 3, cin, f, (s, s))]
  return [_Conv('conv1x7', 1, 7, cin, f, (1, s)), _Bn('bn1x7', f, bn_tpl),
          Relu('relu1x7'), _Conv('conv7x1', 7, 1, f, f, (s, 1))]


def _Separable(match: re.Match, cin: int, f: int, s: int,
               bn_tpl: hyperparams.Params) -> List[hyperparams.Params]:
  rate, k, n = int(match.group(1) or 1), int(match.group(2)), int(
      match.group(4))
  sub = []
  for i in range(n):
    step = s if i == 0 else 1
    sub += [Relu(f'relu{i}'),
            layers.DepthwiseSeparableConv2DLayer.Params().Set(
                name=f'sep{i}', filter_shape=(k, k, cin if i == 0 else f, 1),
                output_dim=f, filter_stride=(step, step),
                dilation_rate=(rate, rate), has_bias=False,
                params_init=resnet.HeInit()),
            _Bn(f'bn{i}', f, bn_tpl)]
  return sub


def OpParams(op: str, input_dim: int, filters: int, stride: int,
             bn_tpl: Optional[hyperparams.Params] = None
             ) -> hyperparams.Params:
  """SequentialLayer params of one op (module docstring).

  [b, h, w, input_dim] -> [b, ceil(h / stride), ceil(w / stride), filters].
  """
  _CheckOp(op, 'AmoebaNet OpParams')
  bn_tpl = bn_tpl or normalization.BatchNormLayer.Params()
  cin, f, s = input_dim, filters, stride
  seq = layers.SequentialLayer.Params()
  if op == 'none':
    return seq if s == 1 and cin == f else ReluConvBn(cin, f, s, bn_tpl)
  if op == '1x1':
    return ReluConvBn(cin, f, s, bn_tpl)
  if op in ('3x3', '1x7_7x1'):
    r = f // 4
    if r < 1:
      return seq.Set(sub=[Relu('relu'), *_Inner(op, cin, f, s, bn_tpl),
                          _Bn('bn', f, bn_tpl)])
    return seq.Set(sub=[
        Relu('pre_relu'), _Conv('pre_1x1', 1, 1, cin, r, (1, 1)),
        _Bn('pre_bn', r, bn_tpl), Relu('relu'),
        *_Inner(op, r, r, s, bn_tpl), _Bn('bn', r, bn_tpl),
        Relu('post_relu'), _Conv('post_1x1', 1, 1, r, f, (1, 1)),
        _Bn('post_bn', f, bn_tpl)])
  sep = _SEPARABLE.match(op)
  if sep:
    return seq.Set(sub=_Separable(sep, cin, f, s, bn_tpl))
  pool = _POOL.match(op)
  k = int(pool.group(2))
  sub = [layers.PoolingLayer.Params().Set(
      name='pool', pooling_type=pool.group(1).upper(), window_shape=(k, k),
      window_stride=(s, s))]
  if cin != f:
    sub += ConvBn(cin, f, bn_tpl)
  return seq.Set(sub=sub)


def IsIdentity(op: str, input_dim: int, filters: int, stride: int) -> bool:
  """Whether the op is the identity (then it also gets no drop-path)."""
  return op == 'none' and stride == 1 and input_dim == filters


class FactorizedReduction(base_layer.BaseLayer):
  """Halves height and width without dropping positions; no ReLU.

  x [b, h, w, input_dim] -> [b, ceil(h / 2), ceil(w / 2), filters]:
    a = conv1x1(x[:, 0::2, 0::2])          # even rows and columns
    b = conv1x1(pad(x)[:, 1::2, 1::2])     # odd ones (zeros past the edge)
    y = BN(concat(a, b))                   # filters / 2 channels each
  Children: `conv_even`, `conv_odd`, `bn`.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of the input.')
    p.Define('filters', 0, 'Channels of the output; even.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params.')
    return p

  @classmethod
  def _Children(cls, p: hyperparams.Params) -> List[hyperparams.Params]:
    if not isinstance(p.filters, int) or p.filters < 2 or p.filters % 2:
      raise ValueError(
          f"FactorizedReduction '{p.name}': filters={p.filters!r} must be "
          'an even int >= 2; choose filters D divisible by 4.')
    half = p.filters // 2
    return [_Conv('conv_even', 1, 1, p.input_dim, half, (1, 1)),
            _Conv('conv_odd', 1, 1, p.input_dim, half, (1, 1)),
            _Bn('bn', p.filters, p.bn_tpl)]

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    for child in self._Children(self.params):
      self.CreateChild(child.name, child)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    even = inputs[:, ::2, ::2, :]
    odd = tf.pad(inputs, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1::2, 1::2, :]
    y = tf.concat([self.conv_even.FProp(theta.conv_even, even),
                   self.conv_odd.FProp(theta.conv_odd, odd)], axis=-1)
    return self.bn.FProp(theta.bn, y)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    conv, _, bn = cls._Children(params)
    b, h, w, _ = tf.TensorShape(input_shape).as_list()
    half = tf.TensorShape([b, -(-h // 2), -(-w // 2), params.input_dim])
    conv_meta = conv.cls.FPropMeta(conv, half)
    out = half[:-1].concatenate([params.filters])
    bn_meta = bn.cls.FPropMeta(bn, out)
    return NestedMap(flops=2 * conv_meta.flops + bn_meta.flops,
                     out_shapes=(out,))

