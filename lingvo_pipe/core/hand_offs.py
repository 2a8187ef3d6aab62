"""What the stages of a pipeline send each other: in which dtype, and
which tensors a traced step hands from one device to another."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import stage_function


def CastFloats(leaves: Sequence[Optional[tf.Tensor]],
               dtype: Optional[tf.DType]) -> List[Optional[tf.Tensor]]:
  """Floating leaves in `dtype` (the pipeline's hand_off_dtype); others,
  and every leaf when `dtype` is None, as they are."""
  if dtype is None:
    return list(leaves)
  return [tf.cast(t, dtype) if t is not None and t.dtype.is_floating
          else t for t in leaves]


class HandOff(NamedTuple):
  """A tensor a stage function's call on device `src` sends to one on
  `dst` (canonical device names)."""
  tensor: tf.Tensor
  src: str
  dst: str


def CanonicalDevice(name: str) -> str:
  return tf.DeviceSpec.from_string(name).to_string()


def HandOffs(graph: Any, devices: Sequence[str]) -> List[HandOff]:
  """The tensors pipeline stages hand each other in a traced `graph`.

  Every output of a stage function's call on one of `devices` that a call
  on another of them reads: activations forward, their gradients back.
  Each counts once per receiving device, as the runtime sends it (a
  re-computing backward reads its forward's input again). Variables'
  gradients and other ops are left out.
  """
  names = {CanonicalDevice(d) for d in devices}
  found: Dict[Tuple[str, str], HandOff] = {}
  for op in graph.get_operations():
    dst = CanonicalDevice(op.device)
    if op.type not in stage_function.CALLS or dst not in names:
      continue
    for t in op.inputs:
      src = CanonicalDevice(t.op.device)
      if t.op.type in stage_function.CALLS and src in names and src != dst:
        found.setdefault((t.name, dst), HandOff(t, src, dst))
  return list(found.values())
