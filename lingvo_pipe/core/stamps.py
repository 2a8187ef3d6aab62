"""Runtime timestamps around each pipeline action, for the measured timeline.

Within `RecordTasks()`, every pipeline traced gets a `tf.timestamp` before
and after each of its actions (and a backward's end of re-computation), on
the action's device, so on the process that ran it. `step_trace` turns
them into the measured timeline. Outside `RecordTasks()` the graph has no
stamps at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, List, Optional, Sequence

import tensorflow as tf


@dataclasses.dataclass
class RecordedTask:
  """One action's timestamp tensors (seconds since the epoch, float64).

  `start`: its inputs and its device's previous action are done (the
  action waits for this stamp); `end`: its outputs are ready (for a
  backward d inputs and the stage's running sum of gradients, to which the
  call adds d theta); `recomputed`: a re-computing backward's
  re-computation is done, else None. `partition` is the stage.
  """
  layer: str
  device: str
  phase: str  # 'F' or 'B'
  partition: int
  micro_batch: int
  start: tf.Tensor
  end: tf.Tensor
  recomputed: Optional[tf.Tensor] = None


class TaskRecorder:
  """The actions of every pipeline built while it records (RecordTasks)."""

  def __init__(self):
    self.tasks: List[RecordedTask] = []

  def Tensors(self) -> List[tf.Tensor]:
    """Every stamp, flat: return them from the function being traced."""
    return [t for task in self.tasks for t in (
        task.start, task.end,
        task.start if task.recomputed is None else task.recomputed)]


_recorder: Optional[TaskRecorder] = None


def Current() -> Optional[TaskRecorder]:
  """The recorder in force, or None (no stamps)."""
  return _recorder


@contextlib.contextmanager
def RecordTasks() -> Iterator[TaskRecorder]:
  """Within: each pipeline built adds timestamps to its actions.

  Trace the function (its first call) inside; the stamps are tensors of
  the traced graph, in `recorder.tasks`. They add a control dependency in
  front of each action and a timestamp op after it; nothing else changes.
  """
  global _recorder
  outer, _recorder = _recorder, TaskRecorder()
  try:
    yield _recorder
  finally:
    _recorder = outer


def _StampHost(device: str) -> str:
  """The device a stamp of `device` runs on: itself, or its task's CPU."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.device_type in (None, 'CPU'):
    return device
  return spec.replace(device_type='CPU', device_index=0).to_string()


_clock_count = 0


def NewClock(device: str) -> tf.Tensor:
  """A resource handle for the stamps of `device` (see _Timestamp)."""
  global _clock_count
  _clock_count += 1
  with tf.device(_StampHost(device)):
    return tf.raw_ops.VarHandleOp(
        dtype=tf.float32, shape=[],
        shared_name=f'lingvo_pipe_clock_{_clock_count}')


def _TimestampBody(clock: tf.Tensor) -> tf.Tensor:
  del clock  # Only there to be a resource input of the call (below).
  return tf.timestamp()


# tf.function puts every stateful op without a resource input on one chain
# in program order (automatic control dependencies): bare tf.timestamp()
# stamps would make stage 1's first forward wait for stage 0's second. A
# call with a resource input it only reads is not on that chain.
_Timestamp = tf.function(_TimestampBody, autograph=False)


def Stamp(device: str, clock: tf.Tensor,
          deps: Sequence[Optional[tf.Tensor]]) -> tf.Tensor:
  """A timestamp on `device`'s host once `deps` exist.

  On an accelerator the stamp runs on the CPU of the same task, after a
  one-element copy of each dep to it: an accelerator op counts as done
  when it is queued, its value exists only once the copy can run.
  """
  deps = [d for d in deps if d is not None]
  host = _StampHost(device)
  if host != device:
    synced = []
    for d in deps:
      with tf.device(device):
        one = tf.reshape(d, [-1])[:1]
      with tf.device(host):
        synced.append(tf.identity(one))
    deps = synced
  with tf.device(host), tf.control_dependencies(deps):
    return _Timestamp(clock)
