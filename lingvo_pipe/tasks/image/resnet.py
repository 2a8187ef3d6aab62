"""ResNet (He et al. 2016) as a flat list of layers for the partitioner.

`ResNet(...)` returns layer params, each one pipeline-sized layer with a
unique name and an exact FPropMeta, ready for
`partitioner.PartitionSequentialLayers`. The network is the CIFAR ResNet of
the paper (section 4.2), with basic blocks of two 3x3 convolutions:

  layer               computes                         shape
  stem                3x3 conv, BN, ReLU               [b, h, w, c] ->
                                                         [b, h, w, w_0]
  stage{s}_block{j}   ResNetBlock; the first block of  -> [b, h / 2^s,
                      stage s > 0 has stride 2             w / 2^s, w_s]
  pool                global average pool              -> [b, w_last]
  logits              fully connected                  -> [b, num_classes]

The network takes the image tensor (ImageClassifier's network_input
'image') and returns logits. `ResNetCifar(depth)` is the paper's depth
6n + 2 family (ResNet-20, 32, 44, 56, 110): three stages of n blocks,
widths 16, 32, 64.

Convolutions have no bias (each is followed by BatchNorm) and start from
He et al.'s initialisation, Normal(0, sqrt(2 / fan_in)).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import normalization
from lingvo_pipe.core.nested_map import NestedMap


def HeInit() -> hyperparams.Params:
  """Normal(0, sqrt(2 / fan_in)): He et al. (2015) for ReLU networks."""
  return base_layer.WeightInit.GaussianSqrtFanIn(math.sqrt(2.0))


class ConvBatchNormLayer(base_layer.BaseLayer):
  """y = activation(BN(conv2d(x))), NHWC, convolution without bias.

  x [batch, height, width, in] -> y [batch, out_h, out_w, out]. Children:
  `conv` (Conv2DLayer) and `bn` (BatchNormLayer over the out channels).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('filter_shape', (3, 3, 0, 0),
             'Filter shape [height, width, in_channels, out_channels].')
    p.Define('filter_stride', (1, 1), 'Strides [height, width].')
    p.Define('padding', 'SAME', "Of the convolution: 'SAME' or 'VALID'.")
    p.Define('activation', 'RELU', 'Activation after BN, e.g. RELU or NONE.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params; dim is set to out_channels.')
    return p

  @classmethod
  def _ChildParams(cls, p: hyperparams.Params) -> List[hyperparams.Params]:
    conv = layers.Conv2DLayer.Params().Set(
        name='conv', filter_shape=p.filter_shape,
        filter_stride=p.filter_stride, padding=p.padding, has_bias=False,
        params_init=HeInit())
    bn = p.bn_tpl.Copy().Set(name='bn', dim=p.filter_shape[3])
    act = layers.ActivationLayer.Params().Set(name='act',
                                              activation=p.activation)
    return [conv, bn, act]

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    conv, bn, act = self._ChildParams(self.params)
    self.CreateChild('conv', conv)
    self.CreateChild('bn', bn)
    layers.CheckActivation(act.activation,
                           f"ConvBatchNormLayer '{self.path}'")

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    y = self.conv.FProp(theta.conv, inputs)
    y = self.bn.FProp(theta.bn, y)
    return layers.Activation(self.params.activation, y)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    return layers.SequentialLayer.FPropMeta(
        layers.SequentialLayer.Params().Set(sub=cls._ChildParams(params)),
        input_shape)


class _ResidualBlock(base_layer.BaseLayer):
  """y = relu(body(x) + shortcut(x)); body: the convs `_BODY` in order.

  Subclasses define Params and `_ChildParams` (children by name; a
  `shortcut` child only when the shape changes).
  """

  _BODY: Tuple[str, ...] = ()

  @classmethod
  def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
    raise NotImplementedError

  @classmethod
  def _Check(cls, p: hyperparams.Params, keys: Sequence[str]) -> None:
    for key in keys:
      value = p.Get(key)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{cls.__name__} '{p.name}': {key}={value!r} must be a "
            'positive int.')

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    for name, child in self._ChildParams(self.params).items():
      self.CreateChild(name, child)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    y = inputs
    for name in self._BODY:
      y = self.children[name].FProp(theta[name], y)
    if 'shortcut' in self.children:
      shortcut = self.shortcut.FProp(theta.shortcut, inputs)
    else:
      shortcut = inputs
    return tf.nn.relu(y + shortcut)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    children = cls._ChildParams(params)
    shape = tf.TensorShape(input_shape)
    flops, out = 0, shape
    for name in cls._BODY:
      meta = children[name].cls.FPropMeta(children[name], out)
      flops += meta.flops
      out = tf.TensorShape(meta.out_shapes[0])
    if 'shortcut' in children:
      flops += children.shortcut.cls.FPropMeta(children.shortcut,
                                               shape).flops
    flops += 2 * base_layer.MetaNumElements(out, cls.__name__)  # add, relu
    return NestedMap(flops=flops, out_shapes=(out,))


class ResNetBlock(_ResidualBlock):
  """The basic residual block: two 3x3 conv-BN, plus a shortcut.

    y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))

  x [batch, h, w, input_dim] -> y [batch, h / s, w / s, output_dim] with
  s = stride ('SAME' padding rounds up). conv1 has the stride. The
  shortcut is x itself when the shape is kept, else a 1x1 conv with the
  stride followed by BN (the paper's projection shortcut, option B).
  Children: `conv1`, `conv2`, and `shortcut` if there is a projection.
  """

  _BODY = ('conv1', 'conv2')

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of the input.')
    p.Define('output_dim', 0, 'Channels of the output.')
    p.Define('stride', 1, 'Stride of the first conv and the shortcut.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params of every BN in the block.')
    return p

  @classmethod
  def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
    cls._Check(p, ('input_dim', 'output_dim', 'stride'))
    conv = ConvBatchNormLayer.Params().Set(bn_tpl=p.bn_tpl)
    s = (p.stride, p.stride)
    children = NestedMap(
        conv1=conv.Copy().Set(
            name='conv1', filter_shape=(3, 3, p.input_dim, p.output_dim),
            filter_stride=s),
        conv2=conv.Copy().Set(
            name='conv2', filter_shape=(3, 3, p.output_dim, p.output_dim),
            activation='NONE'))
    if p.stride != 1 or p.input_dim != p.output_dim:
      children.shortcut = conv.Copy().Set(
          name='shortcut', filter_shape=(1, 1, p.input_dim, p.output_dim),
          filter_stride=s, activation='NONE')
    return children


class BottleneckBlock(_ResidualBlock):
  """The bottleneck block of ResNet-50 and deeper, v1.5 (stride on the 3x3).

    y = relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))

  conv1 is 1x1 to `width` channels, conv2 3x3 with the stride, conv3 1x1
  to 4 x width (`output_dim`). In v1 the stride was on conv1; v1.5 moves it
  to the 3x3, which every ResNet-50 result since (and GPipe's) uses. The
  shortcut is x when the shape is kept, else a 1x1 conv with the stride
  and BN. x [b, h, w, input_dim] -> y [b, h / s, w / s, output_dim].
  Children: `conv1`, `conv2`, `conv3`, and `shortcut` if projected.
  """

  _BODY = ('conv1', 'conv2', 'conv3')

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Channels of the input.')
    p.Define('width', 0, 'Channels of the 1x1 and 3x3 convolutions.')
    p.Define('output_dim', 0, 'Channels of the output (4 x width in ResNet).')
    p.Define('stride', 1, 'Stride of the 3x3 conv and the shortcut.')
    p.Define('bn_tpl', normalization.BatchNormLayer.Params(),
             'BatchNorm params of every BN in the block.')
    return p

  @classmethod
  def _ChildParams(cls, p: hyperparams.Params) -> NestedMap:
    cls._Check(p, ('input_dim', 'width', 'output_dim', 'stride'))
    conv = ConvBatchNormLayer.Params().Set(bn_tpl=p.bn_tpl)
    s = (p.stride, p.stride)
    children = NestedMap(
        conv1=conv.Copy().Set(name='conv1',
                              filter_shape=(1, 1, p.input_dim, p.width)),
        conv2=conv.Copy().Set(name='conv2',
                              filter_shape=(3, 3, p.width, p.width),
                              filter_stride=s),
        conv3=conv.Copy().Set(name='conv3',
                              filter_shape=(1, 1, p.width, p.output_dim),
                              activation='NONE'))
    if p.stride != 1 or p.input_dim != p.output_dim:
      children.shortcut = conv.Copy().Set(
          name='shortcut', filter_shape=(1, 1, p.input_dim, p.output_dim),
          filter_stride=s, activation='NONE')
    return children


class GlobalAveragePoolLayer(base_layer.BaseLayer):
  """Mean over height and width: x [batch, h, w, c] -> y [batch, c]."""

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    del theta  # no variables
    if inputs.shape.rank != 4:
      raise ValueError(
          f"GlobalAveragePoolLayer '{self.path}': input shape "
          f'{inputs.shape} is not [batch, height, width, channels].')
    return tf.reduce_mean(inputs, axis=[1, 2])

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> NestedMap:
    del params  # nothing to configure
    shape = tf.TensorShape(input_shape)
    if shape.rank != 4:
      raise ValueError(
          f'{cls.__name__}.FPropMeta: input shape {shape} is not [batch, '
          'height, width, channels].')
    return NestedMap(flops=base_layer.MetaNumElements(shape, cls.__name__),
                     out_shapes=(tf.TensorShape([shape[0], shape[3]]),))


def ResNet(num_blocks: Sequence[int], widths: Sequence[int],
           num_classes: int, input_channels: int = 3,
           stem_width: Optional[int] = None,
           bn_decay: float = 0.99) -> List[hyperparams.Params]:
  """The layers of a ResNet (module docstring), in order.

  Args:
    num_blocks: blocks per stage, e.g. (3, 3, 3) for ResNet-20.
    widths: channels per stage, one per entry of num_blocks.
    num_classes: outputs of the logits layer.
    input_channels: channels of the input image.
    stem_width: channels of the stem conv; None means widths[0].
    bn_decay: moving-average decay of every BatchNorm.

  Returns:
    Layer params named stem, stage{s}_block{j}, pool, logits.
  """
  num_blocks, widths = list(num_blocks), list(widths)
  if (not num_blocks or len(num_blocks) != len(widths) or
      not all(isinstance(n, int) and n > 0 for n in num_blocks + widths)):
    raise ValueError(
        f'ResNet: num_blocks={num_blocks} and widths={widths} must be lists '
        'of positive ints of the same non-zero length.')
  if not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f'ResNet: num_classes={num_classes!r} must be >= 1.')
  bn = normalization.BatchNormLayer.Params().Set(decay=bn_decay)
  stem_width = stem_width or widths[0]
  out = [ConvBatchNormLayer.Params().Set(
      name='stem', filter_shape=(3, 3, input_channels, stem_width),
      bn_tpl=bn)]
  channels = stem_width
  for s, (n, width) in enumerate(zip(num_blocks, widths)):
    for j in range(n):
      out.append(ResNetBlock.Params().Set(
          name=f'stage{s}_block{j}', input_dim=channels, output_dim=width,
          stride=2 if s > 0 and j == 0 else 1, bn_tpl=bn))
      channels = width
  out.append(GlobalAveragePoolLayer.Params().Set(name='pool'))
  out.append(layers.ProjectionLayer.Params().Set(
      name='logits', input_dim=channels, output_dim=num_classes))
  return out


def ResNetCifar(depth: int, num_classes: int = 10,
                widths: Sequence[int] = (16, 32, 64),
                **kwargs: Any) -> List[hyperparams.Params]:
  """ResNet-`depth` for CIFAR: depth = 6n + 2, n blocks in each of 3 stages.

  Extra keyword arguments go to `ResNet`.
  """
  if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
    raise ValueError(
        f'ResNetCifar: depth={depth!r} must be 6n + 2 with n >= 1 (8, 14, '
        '20, 32, 44, 56, 110, ...).')
  n = (depth - 2) // 6
  return ResNet([n] * 3, widths, num_classes, **kwargs)


# Bottleneck blocks per stage of the ImageNet ResNets (He et al. 2016,
# Table 1).
IMAGENET_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def ResNetImageNet(depth: int, num_classes: int = 1000,
                   input_channels: int = 3, bn_decay: float = 0.9,
                   num_blocks: Optional[Sequence[int]] = None,
                   base_width: int = 64) -> List[hyperparams.Params]:
  """ResNet-50/101/152 v1.5 for ImageNet-size images.

  stem (7x7 conv of 64, stride 2, BN, ReLU), stem_pool (3x3 max pool,
  stride 2), four stages of BottleneckBlocks of widths 64, 128, 256, 512
  (outputs 4x; the first block of stages 1-3 has stride 2), pool, logits.
  ResNet-50 has 25,557,032 trainable parameters at 1000 classes and
  ResNet-101 44,549,160 (checked in resnet_test). `num_blocks` (blocks
  per stage) and `base_width` (64) change the sizes, e.g. for tests.
  """
  if num_blocks is None:
    if depth not in IMAGENET_DEPTHS:
      raise ValueError(
          f'ResNetImageNet: depth={depth!r}; use one of '
          f'{sorted(IMAGENET_DEPTHS)}.')
    num_blocks = IMAGENET_DEPTHS[depth]
  num_blocks = list(num_blocks)
  if not num_blocks or not all(isinstance(n, int) and n > 0
                               for n in num_blocks + [base_width]):
    raise ValueError(
        f'ResNetImageNet: num_blocks={num_blocks} and base_width='
        f'{base_width!r} must be positive ints.')
  if not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(
        f'ResNetImageNet: num_classes={num_classes!r} must be >= 1.')
  bn = normalization.BatchNormLayer.Params().Set(decay=bn_decay)
  out = [
      ConvBatchNormLayer.Params().Set(
          name='stem', filter_shape=(7, 7, input_channels, base_width),
          filter_stride=(2, 2), bn_tpl=bn),
      layers.PoolingLayer.Params().Set(
          name='stem_pool', pooling_type='MAX', window_shape=(3, 3),
          window_stride=(2, 2))]
  channels = base_width
  for s, n in enumerate(num_blocks):
    width = base_width * 2 ** s
    for j in range(n):
      out.append(BottleneckBlock.Params().Set(
          name=f'stage{s}_block{j}', input_dim=channels, width=width,
          output_dim=4 * width, stride=2 if s > 0 and j == 0 else 1,
          bn_tpl=bn))
      channels = 4 * width
  out.append(GlobalAveragePoolLayer.Params().Set(name='pool'))
  out.append(layers.ProjectionLayer.Params().Set(
      name='logits', input_dim=channels, output_dim=num_classes))
  return out
