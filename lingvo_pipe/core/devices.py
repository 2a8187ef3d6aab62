"""Finding and making the devices a pipeline runs on.

On a machine without accelerators the CPU can be split into N logical
devices (`/device:CPU:0` .. `/device:CPU:N-1`). They share the process's
thread pools, so they model placement, not speed (docs/DESIGN.md).
"""

from __future__ import annotations

from typing import List

import tensorflow as tf


def SplitCpu(num_devices: int) -> List[str]:
  """Makes at least `num_devices` logical CPUs; returns their names.

  Must run before TensorFlow initialises its runtime (before the first op).
  Calling it again with the same or a smaller number is harmless.
  """
  if num_devices < 1:
    raise ValueError(f'SplitCpu needs num_devices >= 1, got {num_devices}.')
  cpu = tf.config.list_physical_devices('CPU')[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current is None or len(current) < num_devices:
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
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
