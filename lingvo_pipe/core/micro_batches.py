"""A batch's leaves split into micro-batches on a device, and joined back."""

from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

Leaves = List[Optional[tf.Tensor]]


def Split(leaves: Leaves, num: int, axis: int, device: str
           ) -> Dict[int, Leaves]:
  """[leaf] -> {micro-batch: [leaf]}; a None leaf stays None, a scalar
  goes whole to every micro-batch."""
  with tf.device(device), tf.name_scope('split'):
    parts = [[x] * num if x is None or not x.shape.rank else
             tf.split(x, num, axis=axis) for x in leaves]
  return {m: [p[m] for p in parts] for m in range(num)}


def Concat(per_micro: Dict[int, Leaves], axis: int, device: str) -> Leaves:
  """{micro-batch: [leaf]} -> [leaf], None where a leaf has no values."""
  out = []
  rows = [per_micro[m] for m in sorted(per_micro)]
  with tf.device(device), tf.name_scope('concat'):
    for i in range(len(rows[0])):
      column = [row[i] for row in rows]
      out.append(None if any(c is None for c in column) else
                 tf.concat(column, axis=axis))
  return out
