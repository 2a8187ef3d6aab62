"""TensorBoard scalars without the tensorboard package.

TF 2.21 no longer installs TensorBoard, and `tf.summary.scalar` lives in
it. The core op `tf.summary.write` with the scalar plugin's metadata writes
the same event: TensorBoard (installed wherever you view the logs) shows it
as a scalar chart.
"""

from __future__ import annotations

import tensorflow as tf

from tensorflow.core.framework import summary_pb2

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name='scalars'))


def Scalar(name: str, value: float, step: int) -> bool:
  """Writes one scalar to the default summary writer; True if written."""
  return tf.summary.write(
      name, tf.constant(value, tf.float32), step=step,
      metadata=_SCALAR_METADATA)
