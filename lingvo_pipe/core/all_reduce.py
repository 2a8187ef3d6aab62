"""Summing a stage's gradient over its R mirrored copies.

With R data-parallel replicas, partition k of every pipeline has a copy
of its variables on each replica's device k (`replicas.Mirrors`). After
the stage's last backward on a device, its gradient sums are all-reduced
over the R devices that hold the copies, and every copy gets the same
sum (an A action of the schedule's table, `schedule.WithAllReduce`).
Each device sends 2 (R-1) / R of the stage's bytes, whatever R. Two ways
(docs/DESIGN.md section 14):

  PlacedSum   placed ops: the leaves are dealt out to the R devices
              (`Units`: whole leaves, small ones flattened together,
              large ones cut in pieces, about a quarter of a device's
              share at most, largest first to the least loaded device);
              each device adds every copy's part of its units in replica
              order (reduce-scatter) and every device takes the sums
              (all-gather); the runtime moves them with its graph
              Send/Recv. A whole leaf goes as it is: nothing flattened,
              nothing copied. It needs every replica's sums in one place
              of the trace: `Exchange` collects the replicas' traces and
              builds the sums when the last arrives. One-pass training
              (pipeline_run.PipelineRun.Train) reads them in its
              gradient, after every replica is traced.
  Sum         TensorFlow's `CollectiveReduce` (ring; on GPUs the runtime
              may pick NCCL) over buckets of about BUCKET_BYTES, one
              dtype each, each flattened into one vector per copy: each
              replica's trace emits its own, matched by keys (the group
              key names the set of devices, the instance key the
              (pipeline, stage, bucket, call)). Through FProp each
              replica's backward runs inside its own gradient call,
              which cannot wait for the others': it uses this.

Measured on two pinned CPU workers (bench/scaling replicas, part 3), the
same 24 MiB of a stack's variables cost each worker about half the CPU by
placed ops that they cost by the collective (42-45 ms against 87-96 ms on
an Intel Xeon VM). Facts that decide the collective's form: it sits in
the step's own graph (inside a `_noinline` function the instances never
meet and time out), and the first version, `CollectiveReduce`, is used:
`CollectiveReduceV2` timed out between our single client's servers.
"""

from __future__ import annotations

import dataclasses
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


# PlacedSum: a unit (what one device sums) holds at most 1 / UNIT_SHARES of
# a device's share of the bytes, so that units fall evenly on the devices;
# a leaf under SMALL_BYTES is flattened into one vector with its neighbours
# of the same dtype (fewer transfers); pieces of a leaf start on ALIGN_BYTES
# (TensorFlow then splits without copying).
UNIT_SHARES = 4
SMALL_BYTES = 64 << 10
ALIGN_BYTES = 64


@dataclasses.dataclass(frozen=True)
class Unit:
  """What one device sums for everyone (PlacedSum): whole leaves (several
  small ones as one vector), or elements [start, stop) of one flattened
  leaf."""
  owner: int
  leaves: Tuple[int, ...]
  nbytes: int
  start: int = 0
  stop: Optional[int] = None  # set for a piece of one leaf


def Units(leaves: Sequence[Optional[tf.Tensor]], num_devices: int
          ) -> List[Unit]:
  """The leaves' sums dealt out to `num_devices` owners, by their shapes
  and dtypes only (every replica's plan is the same): units in leaf order,
  each given, largest first, to the owner with the fewest bytes so far."""
  present = [(i, t) for i, t in enumerate(leaves) if t is not None]
  sizes = {i: t.shape.num_elements() * t.dtype.size for i, t in present}
  total = sum(sizes.values())
  cap = max(total // (UNIT_SHARES * num_devices), ALIGN_BYTES)
  small = min(SMALL_BYTES, cap)
  made: List[Tuple[Tuple[int, ...], int, int, Optional[int]]] = []
  group: List[int] = []
  group_bytes = 0
  for i, t in present:
    if group and (leaves[group[0]].dtype != t.dtype or sizes[i] >= small
                  or group_bytes >= cap):
      made.append((tuple(group), group_bytes, 0, None))
      group, group_bytes = [], 0
    if sizes[i] < small:
      group.append(i)
      group_bytes += sizes[i]
    elif sizes[i] <= cap:
      made.append(((i,), sizes[i], 0, None))
    else:
      n = t.shape.num_elements()
      step = max(ALIGN_BYTES // t.dtype.size, 1)
      per = -(-n // -(-sizes[i] // cap))  # elements a piece, rounded up
      per = -(-per // step) * step
      for a in range(0, n, per):
        b = min(a + per, n)
        made.append(((i,), (b - a) * t.dtype.size, a, b))
  if group:
    made.append((tuple(group), group_bytes, 0, None))
  load = [0] * num_devices
  owners = [0] * len(made)
  for u in sorted(range(len(made)), key=lambda u: -made[u][1]):
    owners[u] = min(range(num_devices), key=lambda d: load[d])
    load[owners[u]] += made[u][1]
  return [Unit(owner, *unit) for owner, unit in zip(owners, made)]


def PlacedSum(copies: Sequence[Sequence[Optional[tf.Tensor]]],
              devices: Sequence[str]) -> List[List[Optional[tf.Tensor]]]:
  """Each leaf summed over its R copies (copy r's leaves on devices[r]),
  as placed ops: the leaves are dealt out in units (`Units`); the owner
  of a unit receives every copy's part and adds them in replica order
  (reduce-scatter), and every device takes the owners' sums (all-gather).
  Each device sends about 2 (R-1) / R of the bytes, as a ring does, in two
  steps; the runtime moves whole tensors with its graph Send/Recv, and a
  leaf no larger than a unit is neither flattened nor copied. Every
  copy's result holds the same bits."""
  r_count = len(copies)
  out = [list(leaves) for leaves in copies]
  if r_count == 1:
    return out
  units = Units(copies[0], r_count)
  with tf.name_scope('all_reduce'):
    parts: List[List[tf.Tensor]] = []
    for r, leaves in enumerate(copies):
      with tf.device(devices[r]):
        parts.append(_UnitParts(leaves, units))
    sums = []
    for u, unit in enumerate(units):
      with tf.device(devices[unit.owner]):
        acc = parts[0][u]
        for r in range(1, r_count):
          acc = acc + parts[r][u]
        sums.append(acc)
    for r in range(r_count):
      with tf.device(devices[r]):
        _FromUnits(sums, units, copies[0], out[r])
  return out


def _UnitParts(leaves: Sequence[Optional[tf.Tensor]],
               units: Sequence[Unit]) -> List[tf.Tensor]:
  """One copy's tensor of each unit."""
  lengths: Dict[int, List[int]] = {}
  for unit in units:
    if unit.stop is not None:
      lengths.setdefault(unit.leaves[0], []).append(unit.stop - unit.start)
  pieces = {i: iter(tf.split(tf.reshape(leaves[i], [-1]), n))
            for i, n in lengths.items()}
  out = []
  for unit in units:
    if unit.stop is not None:
      out.append(next(pieces[unit.leaves[0]]))
    elif len(unit.leaves) == 1:
      out.append(leaves[unit.leaves[0]])
    else:
      out.append(_Flat([leaves[i] for i in unit.leaves]))
  return out


def _FromUnits(sums: Sequence[tf.Tensor], units: Sequence[Unit],
               shapes_of: Sequence[Optional[tf.Tensor]],
               out: List[Optional[tf.Tensor]]) -> None:
  """The units' sums back into `out`'s leaves, on the current device."""
  pieces: Dict[int, List[tf.Tensor]] = {}
  for total, unit in zip(sums, units):
    if unit.stop is not None:
      pieces.setdefault(unit.leaves[0], []).append(total)
      continue
    if len(unit.leaves) == 1:
      out[unit.leaves[0]] = tf.identity(total)
      continue
    shapes = [shapes_of[i].shape for i in unit.leaves]
    for i, piece in zip(unit.leaves, _Unflat(total, shapes)):
      out[i] = piece
  for i, parts in pieces.items():
    out[i] = tf.reshape(tf.concat(parts, 0), shapes_of[i].shape)


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
