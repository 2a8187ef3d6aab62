"""Summing a stage's gradient over its R mirrored copies.

With R data-parallel replicas, partition k of every pipeline has a copy
of its variables on each replica's device k (`replicas.Mirrors`). After
the stage's last backward on a device, its gradient sums are all-reduced
over the R devices that hold the copies, and every copy gets the same
sum (an A action of the schedule's table, `schedule.WithAllReduce`).
Leaves go in buckets of about BUCKET_BYTES, one dtype each, each bucket
flattened into one vector per copy. Each device sends 2 (R-1) / R of the
stage's bytes, whatever R. Two ways (docs/DESIGN.md section 14):

  PlacedSum   placed ops: chunk c of every copy's vector goes to device c
              and is added there in replica order (reduce-scatter); every
              device gathers the R sums (all-gather); the runtime moves
              them with its graph Send/Recv. It needs every replica's
              sums in one place of the trace: `Exchange` collects the
              replicas' traces and builds the sums when the last arrives.
              One-pass training (pipeline_run.PipelineRun.Train) reads
              them in its gradient, after every replica is traced.
  Sum         TensorFlow's `CollectiveReduce` (ring; on GPUs the runtime
              may pick NCCL): each replica's trace emits its own, matched
              by keys (the group key names the set of devices, the
              instance key the (pipeline, stage, bucket, call)). Through
              FProp each replica's backward runs inside its own gradient
              call, which cannot wait for the others': it uses this.

Measured on two pinned CPU workers (bench/scaling replicas, part 3), the
same 24 MiB cost each worker 20-25 ms of CPU by placed ops and 40-50 ms
by the collective. Facts that decide the collective's form: it sits in
the step's own graph (inside a `_noinline` function the instances never
meet and time out), and the first version, `CollectiveReduce`, is used:
`CollectiveReduceV2` timed out between our single client's servers.
"""

from __future__ import annotations

import threading
import weakref
from typing import (Any, Callable, Dict, Hashable, List, Optional, Sequence,
                    Tuple)

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
      flat = _Flat(parts)
      key = InstanceKey((name, b, tuple(tuple(t.shape.as_list())
                                        for t in parts), flat.dtype.name))
      total = tf.raw_ops.CollectiveReduce(
          input=flat, group_size=group_size, group_key=group_key,
          instance_key=key, merge_op='Add', final_op='Id',
          subdiv_offsets=[0], communication_hint='ring',
          timeout_seconds=float(timeout_s))
      for i, piece in zip(idx, _Unflat(total, [t.shape for t in parts])):
        out[i] = piece
  return out


def _Flat(leaves: Sequence[tf.Tensor]) -> tf.Tensor:
  """One bucket's leaves as one vector."""
  if len(leaves) == 1:
    return tf.reshape(leaves[0], [-1])
  return tf.concat([tf.reshape(t, [-1]) for t in leaves], 0)


def _Unflat(flat: tf.Tensor, shapes: Sequence[tf.TensorShape]
            ) -> List[tf.Tensor]:
  """_Flat undone: the vector back in leaves of these shapes."""
  pieces = (tf.split(flat, [s.num_elements() for s in shapes])
            if len(shapes) > 1 else [flat])
  return [tf.reshape(p, s) for p, s in zip(pieces, shapes)]


def PlacedSum(copies: Sequence[Sequence[Optional[tf.Tensor]]],
              devices: Sequence[str]) -> List[List[Optional[tf.Tensor]]]:
  """Each leaf summed over its R copies (copy r's leaves on devices[r]),
  as placed ops: per bucket, chunk c of every copy goes to devices[c] and
  is summed there in replica order (reduce-scatter), and every device
  gathers the R sums (all-gather). Each device sends 2 (R-1) / R of the
  bytes, as a ring does, in two steps; the runtime moves them with its
  graph Send/Recv. Every copy's result holds the same bits."""
  r_count = len(copies)
  out = [list(leaves) for leaves in copies]
  if r_count == 1:
    return out
  with tf.name_scope('all_reduce'):
    for idx in Buckets(copies[0]):
      shapes = [copies[0][i].shape for i in idx]
      total = sum(s.num_elements() for s in shapes)
      chunks = [total // r_count + (c < total % r_count)
                for c in range(r_count)]
      parts = []
      for r, leaves in enumerate(copies):
        with tf.device(devices[r]):
          parts.append(tf.split(_Flat([leaves[i] for i in idx]), chunks))
      sums = []
      for c in range(r_count):
        with tf.device(devices[c]):
          acc = parts[0][c]
          for r in range(1, r_count):
            acc = acc + parts[r][c]
          sums.append(acc)
      for r in range(r_count):
        with tf.device(devices[r]):
          for i, piece in zip(idx, _Unflat(tf.concat(sums, 0), shapes)):
            out[r][i] = piece
  return out


class Exchange:
  """One trace's all-reduce of a stage's sums by placed ops (PlacedSum),
  whose R replicas are traced one after another: each replica registers
  its sums (`Add`); when the last one does, the sums are built for all,
  and each replica's `done` callback gets its result. Every replica's
  sums are needed in one place of the trace, which a collective, matched
  by keys, does not need."""

  def __init__(self, num_replicas: int, devices: Sequence[str]):
    self._devices = list(devices)
    self._num = num_replicas
    self._leaves: Dict[int, List[Optional[tf.Tensor]]] = {}
    self._done: Dict[int, Callable[[List[Optional[tf.Tensor]]], None]] = {}
    self.results: Dict[int, List[Optional[tf.Tensor]]] = {}

  def Add(self, replica: int, leaves: Sequence[Optional[tf.Tensor]],
          done: Callable[[List[Optional[tf.Tensor]]], None]) -> None:
    if replica in self._leaves:
      raise ValueError(f'replica {replica} added its sums twice')
    self._leaves[replica] = list(leaves)
    self._done[replica] = done
    if len(self._leaves) == self._num:
      sums = PlacedSum([self._leaves[r] for r in range(self._num)],
                       self._devices)
      for r in range(self._num):
        self.results[r] = sums[r]
        self._done[r](sums[r])


# Per traced graph (weakly: a graph's exchanges go with it).
_EXCHANGES: 'weakref.WeakKeyDictionary[Any, Dict[Hashable, Exchange]]' = (
    weakref.WeakKeyDictionary())


def ExchangeOf(graph: Any, key: Hashable, num_replicas: int,
               devices: Sequence[str]) -> Exchange:
  """The Exchange of `key` in `graph`, the trace every replica's sums are
  in, made by the first replica that asks."""
  with _LOCK:
    mine = _EXCHANGES.setdefault(graph, {})
    if key not in mine:
      mine[key] = Exchange(num_replicas, devices)
    return mine[key]
