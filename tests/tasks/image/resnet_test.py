"""Tests of the ResNet layers and builder: shapes, FPropMeta, the maths."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.tasks.image import resnet  # noqa: E402


def _Image(shape, seed=0):
  return tf.random.stateless_normal(shape, [seed, 1], dtype=tf.float64)


def _Build(p):
  return p.Copy().Set(name=p.name or 'layer', dtype=tf.float64).Instantiate()


class ResNetBlockTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('Identity', [2, 8, 8, 4], 4, 1, [2, 8, 8, 4], False),
      ('Stride2', [2, 8, 8, 4], 8, 2, [2, 4, 4, 8], True),
      ('WidthOnly', [2, 8, 8, 4], 6, 1, [2, 8, 8, 6], True),
      ('OddSize', [3, 7, 5, 2], 4, 2, [3, 4, 3, 4], True),
  )
  def testShapesMatchFPropMeta(self, in_shape, out_dim, stride, want,
                               has_shortcut):
    p = resnet.ResNetBlock.Params().Set(
        name='block', input_dim=in_shape[-1], output_dim=out_dim,
        stride=stride)
    block = _Build(p)
    self.assertEqual(has_shortcut, 'shortcut' in block.children)
    y = block.FPropDefaultTheta(_Image(in_shape))
    meta = resnet.ResNetBlock.FPropMeta(p, tf.TensorShape(in_shape))
    self.assertEqual(want, y.shape.as_list())
    self.assertEqual((tf.TensorShape(want),), tuple(meta.out_shapes))

  def testIdentityShortcutIsAdded(self):
    block = _Build(resnet.ResNetBlock.Params().Set(input_dim=3, output_dim=3))
    x = _Image([2, 5, 5, 3])
    theta = block.theta
    body = block.conv2.FProp(theta.conv2, block.conv1.FProp(theta.conv1, x))
    self.assertAllClose(tf.nn.relu(body + x), block.FProp(theta, x),
                        atol=1e-12, rtol=0)

  def testProjectionShortcut(self):
    block = _Build(resnet.ResNetBlock.Params().Set(
        input_dim=3, output_dim=5, stride=2))
    x = _Image([2, 6, 6, 3])
    theta = block.theta
    body = block.conv2.FProp(theta.conv2, block.conv1.FProp(theta.conv1, x))
    short = block.shortcut.FProp(theta.shortcut, x)
    self.assertAllClose(tf.nn.relu(body + short), block.FProp(theta, x),
                        atol=1e-12, rtol=0)
    # The shortcut is a strided 1x1 conv then BN (training: batch stats).
    conv = tf.nn.conv2d(x, theta.shortcut.conv.w, 2, 'SAME')
    mean, var = tf.nn.moments(conv, axes=[0, 1, 2])
    self.assertAllClose((conv - mean) * tf.math.rsqrt(var + 1e-3), short,
                        atol=1e-12, rtol=0)

  def testFlops(self):
    # 3x3 convs 4 -> 4 on [1, 4, 4, 4], no bias: 2 * 16 * 9 * 4 * 4 each;
    # BN 10 flops and ReLU 1 per element, add and final ReLU 2 per element.
    p = resnet.ResNetBlock.Params().Set(input_dim=4, output_dim=4)
    conv = 2 * 16 * 9 * 4 * 4
    elems = 16 * 4
    want = 2 * conv + 2 * 10 * elems + elems + 2 * elems
    self.assertEqual(want, resnet.ResNetBlock.FPropMeta(p, [1, 4, 4, 4]).flops)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'output_dim=0 must be a positive'):
      _Build(resnet.ResNetBlock.Params().Set(input_dim=3))


class SmallLayersTest(tf.test.TestCase):

  def testConvBatchNorm(self):
    p = resnet.ConvBatchNormLayer.Params().Set(
        name='cbn', filter_shape=(3, 3, 2, 4), filter_stride=(2, 2))
    layer = _Build(p)
    x = _Image([2, 6, 6, 2])
    y = layer.FPropDefaultTheta(x)
    conv = tf.nn.conv2d(x, layer.theta.conv.w, 2, 'SAME')
    mean, var = tf.nn.moments(conv, axes=[0, 1, 2])
    self.assertAllClose(tf.nn.relu((conv - mean) * tf.math.rsqrt(var + 1e-3)),
                        y, atol=1e-12, rtol=0)
    meta = resnet.ConvBatchNormLayer.FPropMeta(p, [2, 6, 6, 2])
    self.assertEqual((tf.TensorShape([2, 3, 3, 4]),), tuple(meta.out_shapes))
    self.assertEqual(2 * 72 * 9 * 2 + 11 * 72, meta.flops)
    self.assertNotIn('b', layer.theta.conv)  # no bias before BN

  def testGlobalAveragePool(self):
    p = resnet.GlobalAveragePoolLayer.Params().Set(name='pool')
    x = _Image([2, 3, 5, 4])
    y = _Build(p).FPropDefaultTheta(x)
    self.assertAllClose(np.mean(x.numpy(), axis=(1, 2)), y, atol=1e-12,
                        rtol=0)
    meta = resnet.GlobalAveragePoolLayer.FPropMeta(p, [2, 3, 5, 4])
    self.assertEqual((tf.TensorShape([2, 4]),), tuple(meta.out_shapes))
    with self.assertRaisesRegex(ValueError, 'not \\[batch, height'):
      resnet.GlobalAveragePoolLayer.FPropMeta(p, [2, 4])

  def testHeInit(self):
    p = resnet.ConvBatchNormLayer.Params().Set(
        name='cbn', filter_shape=(3, 3, 64, 64))
    w = _Build(p).theta.conv.w.numpy()
    self.assertNear(np.sqrt(2.0 / (9 * 64)), w.std(), 0.002)


class ResNetBuilderTest(tf.test.TestCase, parameterized.TestCase):

  def testNamesAndStrides(self):
    layer_ps = resnet.ResNet((2, 1), (4, 8), num_classes=3)
    self.assertEqual(['stem', 'stage0_block0', 'stage0_block1',
                      'stage1_block0', 'pool', 'logits'],
                     [p.name for p in layer_ps])
    self.assertEqual([1, 1, 2], [p.stride for p in layer_ps[1:4]])
    self.assertEqual([(4, 4), (4, 4), (4, 8)],
                     [(p.input_dim, p.output_dim) for p in layer_ps[1:4]])

  @parameterized.parameters(8, 20)
  def testEveryLayerMatchesItsFPropMeta(self, depth):
    layer_ps = resnet.ResNetCifar(depth, num_classes=7, widths=(2, 4, 4))
    self.assertLen(layer_ps, 1 + (depth - 2) // 2 + 2)
    x = _Image([2, 16, 16, 3])
    shape = x.shape
    for p in layer_ps:
      meta = p.cls.FPropMeta(p, shape)
      x = _Build(p).FPropDefaultTheta(x)
      self.assertEqual((x.shape,), tuple(meta.out_shapes), msg=p.name)
      shape = meta.out_shapes[0]
    self.assertEqual([2, 7], x.shape.as_list())

  def testNumParameters(self):
    # ResNet-20 with projection shortcuts on the two stride-2 blocks:
    # convs (no bias), BN scale and shift, the 64 x 10 classifier + bias.
    seq = layers.SequentialLayer.Params().Set(
        name='net', sub=resnet.ResNetCifar(20)).Instantiate()
    convs = 27 * 16 + 6 * 9 * 16 * 16
    convs += 9 * 16 * 32 + 5 * 9 * 32 * 32 + 16 * 32
    convs += 9 * 32 * 64 + 5 * 9 * 64 * 64 + 32 * 64
    bns = 2 * (16 * 7 + 32 * 7 + 64 * 7)
    self.assertEqual(convs + bns + 650, base_layer.NumParameters(seq))

  def testBadArguments(self):
    with self.assertRaisesRegex(ValueError, 'depth=21 must be 6n \\+ 2'):
      resnet.ResNetCifar(21)
    with self.assertRaisesRegex(ValueError, 'same non-zero length'):
      resnet.ResNet((1, 1), (4,), 10)
    with self.assertRaisesRegex(ValueError, 'num_classes=0'):
      resnet.ResNet((1,), (4,), 0)


class BottleneckTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('Identity', [2, 6, 6, 8], 2, 8, 1, [2, 6, 6, 8], False),
      ('Stride2', [2, 6, 6, 8], 4, 16, 2, [2, 3, 3, 16], True),
      ('OddSize', [1, 7, 5, 3], 2, 8, 2, [1, 4, 3, 8], True),
  )
  def testShapesMatchFPropMeta(self, in_shape, width, out_dim, stride, want,
                               has_shortcut):
    p = resnet.BottleneckBlock.Params().Set(
        name='block', input_dim=in_shape[-1], width=width,
        output_dim=out_dim, stride=stride)
    block = _Build(p)
    self.assertEqual(has_shortcut, 'shortcut' in block.children)
    y = block.FPropDefaultTheta(_Image(in_shape))
    meta = resnet.BottleneckBlock.FPropMeta(p, tf.TensorShape(in_shape))
    self.assertEqual(want, y.shape.as_list())
    self.assertEqual((tf.TensorShape(want),), tuple(meta.out_shapes))

  def testStrideIsOnTheThreeByThree(self):
    """v1.5: the 1x1 convs keep the size, the 3x3 and the shortcut halve."""
    block = _Build(resnet.BottleneckBlock.Params().Set(
        input_dim=4, width=2, output_dim=8, stride=2))
    x = _Image([2, 6, 6, 4])
    theta = block.theta
    y1 = block.conv1.FProp(theta.conv1, x)
    y2 = block.conv2.FProp(theta.conv2, y1)
    y3 = block.conv3.FProp(theta.conv3, y2)
    self.assertEqual([2, 6, 6, 2], y1.shape.as_list())
    self.assertEqual([2, 3, 3, 2], y2.shape.as_list())
    self.assertEqual((1, 1), tuple(block.conv1.params.filter_stride))
    self.assertEqual((2, 2), tuple(block.conv2.params.filter_stride))
    short = block.shortcut.FProp(theta.shortcut, x)
    self.assertAllClose(tf.nn.relu(y3 + short), block.FProp(theta, x),
                        atol=1e-12, rtol=0)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'width=0 must be a positive'):
      resnet.BottleneckBlock.Params().Set(
          name='b', input_dim=4, output_dim=8).Instantiate()


class ResNetImageNetTest(tf.test.TestCase, parameterized.TestCase):

  # Trainable parameters of ResNet-50 and -101 at 1000 classes (convs
  # without bias, BN scale and shift, a 2048 x 1000 classifier with bias),
  # as torchvision's resnet50/resnet101 count them; the paper's 25.6M and
  # 44.5M, within 1%.
  @parameterized.parameters((50, 25_557_032, 25.6e6),
                            (101, 44_549_160, 44.5e6))
  def testNumParameters(self, depth, exact, paper):
    with base_layer.VariableShapesOnly():
      net = layers.SequentialLayer.Params().Set(
          name='net', sub=resnet.ResNetImageNet(depth)).Instantiate()
      count = base_layer.NumParameters(net)
    self.assertEqual(exact, count)
    self.assertLess(abs(count - paper) / paper, 0.01)

  def testShapesAt224(self):
    shape = tf.TensorShape([2, 224, 224, 3])
    sizes = {}
    for p in resnet.ResNetImageNet(50):
      shape = tf.TensorShape(p.cls.FPropMeta(p, shape).out_shapes[0])
      sizes[p.name] = shape.as_list()
    self.assertEqual([2, 112, 112, 64], sizes['stem'])
    self.assertEqual([2, 56, 56, 64], sizes['stem_pool'])
    self.assertEqual([2, 56, 56, 256], sizes['stage0_block2'])
    self.assertEqual([2, 7, 7, 2048], sizes['stage3_block2'])
    self.assertEqual([2, 1000], sizes['logits'])

  def testTinyStepMatchesItsMeta(self):
    """A real FProp of every layer agrees with FPropMeta (small image)."""
    x = _Image([1, 32, 32, 3])
    for p in resnet.ResNetImageNet(50, num_classes=5):
      meta = p.cls.FPropMeta(p, x.shape)
      x = _Build(p).FPropDefaultTheta(x)
      self.assertEqual((x.shape,), tuple(meta.out_shapes), msg=p.name)
    self.assertEqual([1, 5], x.shape.as_list())

  def testBadDepth(self):
    with self.assertRaisesRegex(ValueError, 'depth=34; use one of'):
      resnet.ResNetImageNet(34)


if __name__ == '__main__':
  absltest.main()
