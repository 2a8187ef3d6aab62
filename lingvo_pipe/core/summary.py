"""TensorBoard summaries (scalars, text, images) without tensorboard.

TF 2.21 no longer installs TensorBoard, and `tf.summary.scalar`, `text`
and `image` live in it. The core op `tf.summary.write` with each plugin's
metadata writes the same events as they do: TensorBoard (installed
wherever you view the logs) shows them on its Scalars, Text and Images
dashboards. The metadata also carries the data class, as TensorBoard's
own writers set it (its loaders infer it from the plugin name otherwise).

  plugin    tensor                                    data class
  scalars   float32 []                                SCALAR
  text      string [] (Markdown)                      TENSOR
  images    string [3]: width, height, PNG bytes      BLOB_SEQUENCE
"""

from __future__ import annotations

import struct
from typing import Tuple

import tensorflow as tf

from tensorflow.core.framework import summary_pb2


def _Metadata(plugin: str, data_class: int,
              description: str = '') -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin),
      summary_description=description, data_class=data_class)


_SCALAR = _Metadata('scalars', summary_pb2.DATA_CLASS_SCALAR)


def Scalar(name: str, value: float, step: int) -> bool:
  """Writes one scalar to the default summary writer; True if written."""
  return tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                          metadata=_SCALAR)


def Text(name: str, text: str, step: int, description: str = '') -> bool:
  """Writes `text` as it is (a Markdown code block: TensorBoard keeps its
  lines and spaces) to the default summary writer; True if written."""
  block = '\n'.join('    ' + line for line in text.rstrip('\n').split('\n'))
  return tf.summary.write(
      name, tf.constant(block), step=step,
      metadata=_Metadata('text', summary_pb2.DATA_CLASS_TENSOR, description))


def Image(name: str, png: bytes, step: int, description: str = '') -> bool:
  """Writes one PNG image to the default summary writer; True if written."""
  width, height = PngSize(png)
  return tf.summary.write(
      name, tf.constant([str(width), str(height), png]), step=step,
      metadata=_Metadata('images', summary_pb2.DATA_CLASS_BLOB_SEQUENCE,
                         description))


def PngSize(png: bytes) -> Tuple[int, int]:
  """(width, height) from a PNG's header."""
  if png[:8] != b'\x89PNG\r\n\x1a\n' or png[12:16] != b'IHDR':
    raise ValueError(f'summary.Image got {png[:16]!r}..., not a PNG; encode '
                     'the picture with tf.io.encode_png.')
  return struct.unpack('>II', png[16:24])
