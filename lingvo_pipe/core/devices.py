"""Finding and making the devices a pipeline runs on.

On a machine without accelerators the CPU can be split into N logical
devices (`/device:CPU:0` .. `/device:CPU:N-1`). They share the process's
thread pools; by default each op then gets cores / N intra-op threads, so
that N partitions working at once use the cores side by side instead of
fighting over all of them (docs/DESIGN.md section 12).
"""

from __future__ import annotations

import os
from typing import List

import tensorflow as tf

from lingvo_pipe.core import stage_function


def NumCores() -> int:
  """CPU cores this process may run on."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def SplitCpu(num_devices: int, share_cores: bool = True) -> List[str]:
  """Makes at least `num_devices` logical CPUs; returns their names.

  Must run before TensorFlow initialises its runtime (before the first op).
  Calling it again with the same or a smaller number is harmless.

  With `share_cores` (and more than one device), each op gets
  max(1, cores // num_devices) intra-op threads, unless the intra-op
  thread count was set before (tf.config.threading): K partitions that
  run at once then each use their share of the cores. On 2 cores a step
  of 2 partitions and 8 micro-batches took about 20% less time
  (docs/DESIGN.md section 12).
  """
  if num_devices < 1:
    raise ValueError(f'SplitCpu needs num_devices >= 1, got {num_devices}.')
  stage_function.ShareCallBodies()
  cpu = tf.config.list_physical_devices('CPU')[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current is None or len(current) < num_devices:
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
      if (share_cores and num_devices > 1 and
          tf.config.threading.get_intra_op_parallelism_threads() == 0):
        tf.config.threading.set_intra_op_parallelism_threads(
            max(1, NumCores() // num_devices))
    except RuntimeError:
      have = len(tf.config.list_logical_devices('CPU'))
      if have < num_devices:
        raise RuntimeError(
            f'The TensorFlow runtime already started with {have} logical '
            f'CPU(s); call devices.SplitCpu({num_devices}) before running '
            'any TensorFlow op.') from None
  return LogicalDevices('CPU')[:max(num_devices, 1)]


def LogicalDevices(device_type: str) -> List[str]:
  """Full names of the logical devices of one type, e.g. 'GPU'."""
  return [d.name for d in tf.config.list_logical_devices(device_type)]


def DefaultDevices() -> List[str]:
  """Accelerators if any (TPU, then GPU), else the logical CPUs."""
  for kind in ('TPU', 'GPU', 'CPU'):
    found = LogicalDevices(kind)
    if found:
      return found
  raise RuntimeError('TensorFlow lists no devices at all.')
