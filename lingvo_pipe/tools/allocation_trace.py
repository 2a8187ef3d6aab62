"""What a process's allocators held at their peak: tensors and chunks.

  Start(logdir)         TensorFlow's profiler on in this process
  ... run a step ...
  peaks = StopAndRead(logdir)

`StopAndRead` returns, per allocator that allocated meanwhile (on a CPU
with TF_CPU_ALLOCATOR_USE_BFC=true, 'bfc_cpu_allocator_for_gpu'; a GPU's
'GPU_0_bfc'), in bytes above what it held when tracing started:

  in_use           its peak of bytes in use: the chunks it handed out
                   (what get_memory_info's 'peak' reads)
  tensors_at_peak  the bytes the tensors asked for, at that same moment
  tensor_peak      the most the tensors asked for at any moment

A best-fit allocator (TensorFlow's BFC) gives a request a whole free
chunk unless the chunk is at least twice the request, so `in_use` can
exceed `tensors_at_peak` by up to the request again (a 1 MiB tensor seen
in a 2 MiB chunk). The planner predicts what tensors hold
(tools/step_model.py); the difference is the allocator's.

The numbers come from the profiler's allocator events (one per
allocation and per deallocation, with the bytes requested, the chunk's
bytes and the allocator's bytes in use after it), recorded at host trace
level 2.
"""

from __future__ import annotations

import glob
import os
from typing import Dict, List, Tuple

import tensorflow as tf

_EVENTS = ('MemoryAllocation', 'MemoryDeallocation')
_STATS = ('allocator_name', 'bytes_allocated', 'requested_bytes',
          'allocation_bytes')


def Start(logdir: str) -> None:
  """TensorFlow's profiler on, recording allocator events into `logdir`.

  One profiler runs per process: raises TensorFlow's error if another is
  on."""
  tf.profiler.experimental.start(
      logdir, tf.profiler.experimental.ProfilerOptions(
          host_tracer_level=2, python_tracer_level=0, device_tracer_level=0))


def StopAndRead(logdir: str) -> Dict[str, Dict[str, int]]:
  """Stops the profiler `Start` began and reads its trace in `logdir`
  (module docstring)."""
  tf.profiler.experimental.stop()
  paths = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*',
                                 '*.xplane.pb'))
  if not paths:
    raise FileNotFoundError(
        f'The profiler wrote no trace under {logdir}; was Start({logdir!r}) '
        'called in this process?')
  events: List[Tuple[int, bool, Dict]] = []
  for path in paths:
    events.extend(_Events(path))
  events.sort(key=lambda e: e[0])
  return {name: _Peak([e for e in events if e[2]['allocator_name'] == name])
          for name in sorted({e[2]['allocator_name'] for e in events})}


def _Events(path: str) -> List[Tuple[int, bool, Dict]]:
  """(time in ns, is an allocation, its stats) of each allocator event."""
  # The trace's format; tensorflow.tsl ships it with TensorFlow.
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  space = xplane_pb2.XSpace()
  with open(path, 'rb') as f:
    space.ParseFromString(f.read())
  out = []
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    stats = {k: v.name for k, v in plane.stat_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        kind = names.get(event.metadata_id)
        if kind not in _EVENTS:
          continue
        values = {}
        for stat in event.stats:
          key = stats.get(stat.metadata_id)
          if key == 'allocator_name':
            values[key] = (stats.get(stat.ref_value) or stat.str_value)
          elif key in _STATS:
            values[key] = stat.int64_value or stat.uint64_value
        if len(values) == len(_STATS):
          out.append((line.timestamp_ns + event.offset_ps // 1000,
                      kind == _EVENTS[0], values))
  return out


def _Peak(events: List[Tuple[int, bool, Dict]]) -> Dict[str, int]:
  """in_use, tensors_at_peak and tensor_peak of one allocator's events
  in time order (module docstring)."""
  _, first_is_alloc, first = events[0]
  chunk = first['allocation_bytes']
  start = first['bytes_allocated'] - (chunk if first_is_alloc else -chunk)
  in_use, tensors, at_peak, tensor_peak = start, 0, 0, 0
  for _, is_alloc, stats in events:
    tensors += stats['requested_bytes'] * (1 if is_alloc else -1)
    tensor_peak = max(tensor_peak, tensors)
    if stats['bytes_allocated'] > in_use:
      in_use, at_peak = stats['bytes_allocated'], tensors
  return {'in_use': in_use - start, 'tensors_at_peak': at_peak,
          'tensor_peak': tensor_peak}
