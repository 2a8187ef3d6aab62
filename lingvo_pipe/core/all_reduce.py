"""Summing a stage's gradient over its R mirrored copies: TF's collective ops.

With R data-parallel replicas, partition k of every pipeline has a copy
of its variables on each replica's device k (`replicas.Mirrors`). After
the stage's last backward on a device, its gradient sums are all-reduced
over the R devices that hold the copies, and every copy gets the same
sum (an A action of the schedule's table, `schedule.WithAllReduce`):

  bucket the leaves, about BUCKET_BYTES each, one dtype per bucket
  per bucket:  concat(reshape(leaf, [-1])) --CollectiveReduce(Add)-->
               split and reshape back

`CollectiveReduce` is TensorFlow's ring all-reduce (gRPC between tasks,
in-process between local devices; on GPUs the runtime may pick NCCL).
Each device sends and receives 2 (R-1)/R of the stage's bytes, whatever
R. Every copy runs the same reduction with the same keys: the group key
names the set of devices, the instance key the (pipeline, stage,
bucket, call), both the same integers in every replica's trace.

Two facts measured here decide the form (docs/DESIGN.md section 14):
the ops sit in the step's own graph (inside a `_noinline` function the
instances never meet and time out), and the first version,
`CollectiveReduce`, is used: `CollectiveReduceV2` timed out between our
single client's servers. The stage's last backward is one call, so its
sums are all there at once; buckets make the exchange quicker (24 MiB
between two servers: 34 ms in 4 MiB buckets, 44 ms whole).
"""

from __future__ import annotations

import threading
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import tensorflow as tf

# Bytes per bucket (module docstring).
BUCKET_BYTES = 4 << 20

_LOCK = threading.Lock()
_GROUP_KEYS: Dict[Tuple[str, ...], int] = {}
_INSTANCE_KEYS: Dict[Hashable, int] = {}


def GroupKey(devices: Sequence[str]) -> int:
  """The collective group of these devices (the same set, the same key)."""
  names = tuple(tf.DeviceSpec.from_string(d).to_string() for d in devices)
  with _LOCK:
    return _GROUP_KEYS.setdefault(names, len(_GROUP_KEYS) + 1)


def InstanceKey(what: Hashable) -> int:
  """The collective instance of `what`: every replica's trace asks with the
  same description and gets the same key; another description, another."""
  with _LOCK:
    return _INSTANCE_KEYS.setdefault(what, len(_INSTANCE_KEYS) + 1)


def Buckets(leaves: Sequence[Optional[tf.Tensor]],
            bucket_bytes: Optional[int] = None) -> List[List[int]]:
  """Indices of `leaves` in buckets, in order: a bucket closes when it
  reaches `bucket_bytes` (default BUCKET_BYTES) or the dtype changes. None
  leaves are left out."""
  if bucket_bytes is None:
    bucket_bytes = BUCKET_BYTES
  buckets: List[List[int]] = []
  size, dtype = 0, None
  for i, t in enumerate(leaves):
    if t is None:
      continue
    nbytes = t.shape.num_elements() * t.dtype.size
    if not buckets or size >= bucket_bytes or t.dtype != dtype:
      buckets.append([])
      size, dtype = 0, t.dtype
    buckets[-1].append(i)
    size += nbytes
  return buckets


def Sum(leaves: Sequence[Optional[tf.Tensor]], devices: Sequence[str],
        device: str, name: Hashable,
        timeout_s: float = 600.0) -> List[Optional[tf.Tensor]]:
  """Each leaf summed over `devices` (this copy's on `device`, one of them).

  `name` tells this call's collectives from every other's (the same in
  every replica). `timeout_s` > 0 bounds each wait for the other copies.
  """
  group_size = len(devices)
  if group_size == 1:
    return list(leaves)
  group_key = GroupKey(devices)
  out = list(leaves)
  with tf.device(device), tf.name_scope('all_reduce'):
    for b, idx in enumerate(Buckets(leaves)):
      parts = [leaves[i] for i in idx]
      flat = (tf.reshape(parts[0], [-1]) if len(parts) == 1 else
              tf.concat([tf.reshape(t, [-1]) for t in parts], 0))
      key = InstanceKey((name, b, tuple(tuple(t.shape.as_list())
                                        for t in parts), flat.dtype.name))
      total = tf.raw_ops.CollectiveReduce(
          input=flat, group_size=group_size, group_key=group_key,
          instance_key=key, merge_op='Add', final_op='Id',
          subdiv_offsets=[0], communication_hint='ring',
          timeout_seconds=float(timeout_s))
      sizes = [t.shape.num_elements() for t in parts]
      pieces = tf.split(total, sizes) if len(parts) > 1 else [total]
      for i, piece, t in zip(idx, pieces, parts):
        out[i] = tf.reshape(piece, t.shape)
  return out
