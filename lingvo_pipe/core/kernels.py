"""Matmuls and convolutions whose gradients hold only their results.

`MatmulLastDim` (x [..., i] @ w), `RowsMatmul` (a projection's weight
gradient), `PointwiseConv` (1x1) and `Conv2D` (k x k). On a CPU, TF's
einsum and convolution backprop kernels hold large scratch buffers or run
slowly (docs/DESIGN.md sections 11 and 27); these functions express
the same products as 2-D MatMuls and forward convolutions with exact
gradients. `layers` builds its projections and convolutions on them.
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf


def MatmulLastDim(x: tf.Tensor, w: tf.Tensor,
                  transpose_w: bool = False) -> tf.Tensor:
  """x [..., i] @ w [i, o] -> [..., o] (w [o, i] if transpose_w).

  x's leading dimensions are flattened into rows, so the forward and both
  gradients are each one 2-D MatMul: the gradient of w is [i, rows] @
  [rows, o]. TF's own einsum gradient for a broadcast ('...') operand
  builds the [rows, i, o] outer products and then sums them: a
  [4, 64, 512] input through two 512 x 512 projections peaked at 1026 MiB
  and took 849 ms per step, against 2.5 MiB and 15 ms with this function
  (bench/projection, docs/DESIGN.md section 11). And on a CPU TF's Einsum
  op is 1.3-2x slower than the MatMul it stands for, even forward: with it
  here, AmoebaNet-D's 1x1 convolutions made a whole step 1.3-1.5x slower
  (docs/DESIGN.md section 11).
  """
  w = tf.convert_to_tensor(w)
  i, o = (w.shape[1], w.shape[0]) if transpose_w else (w.shape[0],
                                                       w.shape[1])
  x = tf.convert_to_tensor(x)
  # The reshape to rows would not notice a wrong last dimension whose size
  # divides x's: check it (at run time when it is not static).
  if x.shape.rank is not None and x.shape[-1] is not None:
    if x.shape[-1] != i:
      raise ValueError(
          f'MatmulLastDim: x has shape {x.shape}, w {w.shape}'
          f'{" (transposed)" if transpose_w else ""}; x\'s last dimension '
          f'must be {i}.')
  elif x.shape.rank is not None:
    x = tf.ensure_shape(x, x.shape[:-1].concatenate([i]))

  @tf.custom_gradient
  def Matmul(x, w):
    def Grad(dy: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
      dx = _Unrows(tf.matmul(_Rows(dy, o), w, transpose_b=not transpose_w),
                   x, i)
      dw = RowsMatmul(dy, x) if transpose_w else RowsMatmul(x, dy)
      return dx, dw

    return _Unrows(tf.matmul(_Rows(x, i), w, transpose_b=transpose_w),
                   x, o), Grad

  return Matmul(x, w)


def _Rows(t: tf.Tensor, last: Optional[int] = None) -> tf.Tensor:
  """t [..., last] as [rows, last]; last defaults to t's own."""
  if last is None:
    last = t.shape[-1] if t.shape[-1] is not None else tf.shape(t)[-1]
  return tf.reshape(t, [-1, last])


def _Unrows(rows: tf.Tensor, like: tf.Tensor, last: int) -> tf.Tensor:
  """rows [n, last] as like's leading dimensions + [last]."""
  lead = like.shape[:-1]
  if lead.is_fully_defined():
    return tf.reshape(rows, lead.as_list() + [last])
  return tf.reshape(rows, tf.concat([tf.shape(like)[:-1], [last]], 0))


def PointwiseConv(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """A 1x1 convolution of stride 1, x [..., in] and w [1, 1, in, out], as
  `MatmulLastDim`. TF's CPU filter-gradient kernel holds a scratch buffer
  of up to 32 MiB whatever the batch (13 MiB for 4 images of 16x16x64); the
  matmul's gradient holds only its result (docs/DESIGN.md section 27)."""
  return MatmulLastDim(x, tf.reshape(w, w.shape[2:]))


def Conv2D(x: tf.Tensor, w: tf.Tensor, strides: Tuple[int, int],
           padding: str) -> tf.Tensor:
  """tf.nn.conv2d(x, w, [1, *strides, 1], padding), NHWC, padding 'SAME'
  or 'VALID'.

  On a CPU both gradients avoid TF's backprop kernels, which hold a
  scratch buffer of 8-32 MiB whatever the batch (docs/DESIGN.md section
  27): the input's gradient is a forward convolution of the output
  gradient (`_ConvInputGradient`), and the filter's is im2col (the input's
  patches, `tf.image.extract_patches`, times the output gradient, one
  matmul) when the patches take at most 8 MiB, TF's kernel above that.
  Under a GPU or TPU scope the convolution and both gradients are TF's.
  """
  sh, sw = strides
  kh, kw = w.shape[0], w.shape[1]
  if _ScopeDeviceType() != 'CPU' or not x.shape.is_fully_defined():
    return tf.nn.conv2d(x, w, [1, sh, sw, 1], padding)
  im2col = (x.shape.num_elements() * kh * kw * x.dtype.size // (sh * sw) <=
            _IM2COL_MAX_BYTES)

  @tf.custom_gradient
  def Conv(x, w):
    y = tf.nn.conv2d(x, w, [1, sh, sw, 1], padding)

    def Grad(dy: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
      dy = tf.ensure_shape(dy, y.shape)
      dx = _ConvInputGradient(dy, w, x.shape, strides, padding)
      if not im2col:
        return dx, tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=tf.shape(w), out_backprop=dy,
            strides=[1, sh, sw, 1], padding=padding)
      # The patches depend on x alone: without this edge the executor may
      # build them as soon as x exists, long before dy, and hold them
      # (naive AmoebaNet-D, D=32: 130 MiB without it, 108-111 with it).
      with tf.control_dependencies([dy]):
        patches = tf.image.extract_patches(
            x, [1, kh, kw, 1], [1, sh, sw, 1], [1, 1, 1, 1], padding)
      return dx, tf.reshape(RowsMatmul(patches, dy), tf.shape(w))

    return y, Grad

  return Conv(x, tf.convert_to_tensor(w))


def _ConvInputGradient(dy: tf.Tensor, w: tf.Tensor, x_shape: tf.TensorShape,
                       strides: Tuple[int, int], padding: str) -> tf.Tensor:
  """d(input) of tf.nn.conv2d(x, w, strides, padding) as a forward
  convolution: dy, with stride - 1 zeros between its rows and columns,
  correlated with w turned 180 degrees and its channels swapped, padded so
  that each input position meets the outputs it fed (static shapes)."""
  kh, kw = w.shape[0], w.shape[1]
  sh, sw = strides
  _, oh, ow, c = dy.shape
  if sh > 1 or sw > 1:
    spread = tf.pad(tf.reshape(dy, [-1, oh, 1, ow, 1, c]),
                    [[0, 0], [0, 0], [0, sh - 1], [0, 0], [0, sw - 1],
                     [0, 0]])
    dy = tf.reshape(spread, [-1, oh * sh, ow * sw, c])
    dy = dy[:, :(oh - 1) * sh + 1, :(ow - 1) * sw + 1, :]
  pads = [[0, 0]]
  for size, k, s, out in ((x_shape[1], kh, sh, oh), (x_shape[2], kw, sw, ow)):
    # The forward's padding before the first input row (or column).
    before = max((out - 1) * s + k - size, 0) // 2 if padding == 'SAME' else 0
    pads.append([k - 1 - before, size + before - (out - 1) * s - 1])
  pads.append([0, 0])
  turned = tf.transpose(tf.reverse(w, [0, 1]), [0, 1, 3, 2])
  return tf.nn.conv2d(dy, turned, 1, pads)


# Conv2D's im2col filter gradient up to this many bytes of patches: the
# smallest scratch measured of TF's CPU kernel (docs/DESIGN.md section 27).
_IM2COL_MAX_BYTES = 8 * 2**20


def _ScopeDeviceType() -> str:
  """'CPU', 'GPU' or 'TPU': where an op made here runs (the device scope;
  without one, the first accelerator the process sees, else the CPU)."""
  where = tf.DeviceSpec.from_string(tf.zeros([]).device or '').device_type
  if where:
    return where.upper()
  for kind in ('TPU', 'GPU'):
    if tf.config.list_logical_devices(kind):
      return kind
  return 'CPU'


def RowsMatmul(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """a [..., p], b [..., q] -> [p, q]: sum over all rows of a^T b, as one
  flat matmul (the weight gradient of a projection over [..., p])."""
  return tf.matmul(_Rows(a), _Rows(b), transpose_a=True)
