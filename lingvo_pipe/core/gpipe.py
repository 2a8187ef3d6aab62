"""PipeliningLayer: GPipe over a list of partitions on a list of devices.

The layer holds K cells (partitions), cell k built and run on device k. Its
FProp splits the batch into M micro-batches, runs F(k, m) for every
partition and micro-batch in the GPipe order (`schedule.py`) and returns
the full-batch output of the last partition. It is differentiable: the
gradient runs B(k, m) in reverse order, each on its partition's device,
re-computing the forward of (k, m) just before its backward unless the
recompute mode keeps that partition's activations:

  recompute      partitions re-computed    activations kept until backward
  'always'       all                       partition inputs only
  'except_last'  all but the last          + the last partition's
  'never'        none                      all

Per device, tasks run strictly in schedule order (control dependencies),
and gradients of each partition's variables are summed over micro-batches
in backward order, m = M-1 down to 0. With the same micro-batch split the
result is bitwise that of running the cells one after the other on one
device and summing per-micro-batch gradients in that order.

Inputs, outputs and the state between partitions may be any nest (e.g. a
NestedMap) of tensors of mixed dtypes; every tensor has the batch on axis
`batch_dim`. Only floating-point tensors carry gradients.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import devices as devices_lib
from lingvo_pipe.core import pipeline_run
from lingvo_pipe.core import schedule
from lingvo_pipe.core.nested_map import NestedMap

RECOMPUTE_MODES = ('always', 'except_last', 'never')


def _Matches(wanted: tf.DeviceSpec, have: tf.DeviceSpec) -> bool:
  for field in ('job', 'replica', 'task', 'device_type', 'device_index'):
    w = getattr(wanted, field)
    if w is not None and w != getattr(have, field):
      return False
  return True


def ResolveDevices(path: str, wanted: Optional[Sequence[str]],
                   num_partitions: int) -> List[str]:
  """Full names of the devices of every replica; clear errors otherwise.

  Replica r's partition k runs on device r * K + k. With `wanted` None,
  every default device is listed (replica 0 takes the first K); else every
  device of `wanted`, which must name at least K.
  """
  if wanted is None:
    found = devices_lib.DefaultDevices()
    if len(found) < num_partitions:
      raise ValueError(
          f"PipeliningLayer '{path}' has {num_partitions} partitions but "
          f'only {len(found)} device(s) {found}; set p.devices, or call '
          f'devices.SplitCpu({num_partitions}) before TensorFlow starts.')
    return found
  wanted = list(wanted)
  if len(wanted) < num_partitions:
    raise ValueError(
        f"PipeliningLayer '{path}' has {num_partitions} partitions but "
        f'p.devices lists {len(wanted)}: {wanted}; give one device per '
        'partition.')
  known = [d.name for d in tf.config.list_logical_devices()]
  resolved = []
  for i, name in enumerate(wanted):
    spec = tf.DeviceSpec.from_string(name)
    hits = [d for d in known
            if _Matches(spec, tf.DeviceSpec.from_string(d))]
    if not hits:
      replica = i // num_partitions
      whose = f'partition {i % num_partitions}' + (
          f' of replica {replica}' if replica else '')
      raise ValueError(
          f"PipeliningLayer '{path}': device {name!r} of {whose} is not "
          f"one of this runtime's devices {known}; fix p.devices.")
    resolved.append(hits[0])
  return resolved


def _SubNamesAreUnique(cell_tpl: Sequence[Any]) -> bool:
  """True if every cell is a list of named sub-layers, no name twice."""
  names = []
  for cell_p in cell_tpl:
    if 'sub' not in cell_p:
      return False
    names += [sub.name for sub in cell_p.sub]
  return all(names) and len(set(names)) == len(names)


class PipeliningLayer(base_layer.BaseLayer):
  """GPipe: K partitions on K devices, M micro-batches (module docstring).

  Cells are children `cell_0` .. `cell_{K-1}`, cell k built on device k.
  When every cell is a SequentialLayer whose sub-layers have names unique
  across all cells (as `partitioner.PartitionSequentialLayers` makes
  them), the cell names are left out of the seed paths: initial values
  and dropout masks are then those of the same layers in one plain
  SequentialLayer named like this layer, whatever K.

  FProp(theta, inputs) -> outputs of the last partition for the whole
  batch; `inputs` is a tensor or a nest of tensors [batch, ...].
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('cell_tpl', [],
             'Layer params of each partition, in order; K = len(cell_tpl).')
    p.Define('num_micro_batches', 1, 'M, micro-batches per mini-batch.')
    p.Define('micro_batch_size', None,
             'If set, M = batch / micro_batch_size (num_micro_batches is '
             'then ignored).')
    p.Define('batch_dim', 0, 'Batch axis of every input and output tensor.')
    p.Define('devices', None,
             'Device of each partition: replica r (data parallelism, '
             'BaseTask train.num_replicas) runs partition k on devices[r * '
             'K + k], and the variables live on replica 0\'s. None: '
             'devices.DefaultDevices().')
    p.Define('recompute', 'always', f'One of {RECOMPUTE_MODES}.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not p.cell_tpl:
      raise ValueError(
          f"PipeliningLayer '{self.path}' has no partitions; set "
          'p.cell_tpl to a list of layer params.')
    if p.recompute not in RECOMPUTE_MODES:
      raise ValueError(
          f"PipeliningLayer '{self.path}': recompute={p.recompute!r}; use "
          f'one of {RECOMPUTE_MODES}.')
    if p.micro_batch_size is None and p.num_micro_batches < 1:
      raise ValueError(
          f"PipeliningLayer '{self.path}': num_micro_batches="
          f'{p.num_micro_batches}; use 1 or more.')
    if p.micro_batch_size is not None and p.micro_batch_size < 1:
      raise ValueError(
          f"PipeliningLayer '{self.path}': micro_batch_size="
          f'{p.micro_batch_size}; use 1 or more, or None.')
    self._all_devices = ResolveDevices(self.path, p.devices,
                                       len(p.cell_tpl))
    seed_name = '' if _SubNamesAreUnique(p.cell_tpl) else None
    self._cells = []
    for k, cell_p in enumerate(p.cell_tpl):
      with tf.device(self._all_devices[k]):
        self._cells.append(
            self.CreateChild(f'cell_{k}', cell_p, seed_name=seed_name))

  @property
  def devices(self) -> List[str]:
    """The partitions' devices for the current replica (`self.replica`)."""
    return self.ReplicaDevices(self.replica)

  def ReplicaDevices(self, replica: int) -> List[str]:
    """Replica `replica`'s device of each partition."""
    k = self.num_partitions
    if replica < 0 or (replica + 1) * k > len(self._all_devices):
      raise ValueError(
          f"PipeliningLayer '{self.path}': replica {replica} of {k} "
          f'partitions needs devices {replica * k}..{(replica + 1) * k - 1}'
          f' but {len(self._all_devices)} are known '
          f'{self._all_devices}; list num_replicas x {k} devices in '
          'p.devices (replica r, partition k on device r * K + k).')
    return list(self._all_devices[replica * k:(replica + 1) * k])

  @property
  def cells(self) -> List[base_layer.BaseLayer]:
    return list(self._cells)

  @property
  def num_partitions(self) -> int:
    return len(self._cells)

  def NumMicroBatches(self, batch_size: int) -> int:
    """M for a batch of `batch_size`; raises if it does not split evenly."""
    p = self.params
    if p.micro_batch_size is not None:
      if batch_size % p.micro_batch_size:
        raise ValueError(
            f"PipeliningLayer '{self.path}': batch size {batch_size} is not "
            f'a multiple of micro_batch_size={p.micro_batch_size}; change '
            'one of them.')
      return batch_size // p.micro_batch_size
    m = p.num_micro_batches
    if m > batch_size:
      raise ValueError(
          f"PipeliningLayer '{self.path}': num_micro_batches={m} is larger "
          f'than the batch size {batch_size}; use at most {batch_size}.')
    if batch_size % m:
      raise ValueError(
          f"PipeliningLayer '{self.path}': batch size {batch_size} does not "
          f'split into num_micro_batches={m} equal parts; use a divisor '
          f'of {batch_size}.')
    return m

  def _BatchSize(self, leaves: Sequence[tf.Tensor]) -> int:
    axis = self.params.batch_dim
    sizes = set()
    for x in leaves:
      if x.shape.rank is None or x.shape.rank <= axis:
        raise ValueError(
            f"PipeliningLayer '{self.path}': input of shape {x.shape} has no "
            f'batch axis {axis}; every input needs one.')
      sizes.add(x.shape[axis])
    if None in sizes:
      raise ValueError(
          f"PipeliningLayer '{self.path}' needs a static batch size; give "
          'the inputs a known shape on the batch axis.')
    if len(sizes) != 1:
      raise ValueError(
          f"PipeliningLayer '{self.path}': inputs disagree on the batch "
          f'size {sorted(sizes)}; they must share axis {axis}.')
    return sizes.pop()

  def _KeepsActivations(self, k: int) -> bool:
    mode = self.params.recompute
    if not self.training:
      return False
    return mode == 'never' or (mode == 'except_last' and
                               k == self.num_partitions - 1)

  def FProp(self, theta: NestedMap, inputs: Any) -> Any:
    leaves = [tf.convert_to_tensor(x) for x in tf.nest.flatten(inputs)]
    if not leaves:
      raise ValueError(f"PipeliningLayer '{self.path}' got no input tensors.")
    num_micro = self.NumMicroBatches(self._BatchSize(leaves))
    devices = self.devices
    thetas = []
    for k, dev in enumerate(devices):
      with tf.device(dev):
        thetas.append(theta[f'cell_{k}'].Transform(tf.convert_to_tensor))
    run = pipeline_run.PipelineRun(
        layer=self, num_micro_batches=num_micro, in_structure=inputs,
        thetas=thetas, devices=devices)
    return run.Call(leaves)

  def Describe(self, batch_size: int, num_replicas: int = 1) -> str:
    """A few lines: devices, M, recompute mode, bubble and the timeline.

    Each partition's line ends with its trainable parameter count.

    `batch_size` is one replica's; with several replicas each partition's
    line lists its device in every replica, separated by ' | '.
    """
    k = self.num_partitions
    m = self.NumMicroBatches(batch_size)
    where = [self.ReplicaDevices(r) for r in range(num_replicas)]
    head = (f'R={num_replicas} replicas x ' if num_replicas > 1 else '')
    lines = [f"PipeliningLayer '{self.path}': {head}K={k} partitions, M={m} "
             f'micro-batches, recompute={self.params.recompute}, bubble '
             f'{schedule.BubbleFraction(k, m):.1%}']
    lines += [f'  partition {i}: ' + ' | '.join(d[i] for d in where) +
              f' ({base_layer.NumParameters(self.cells[i]):,} parameters)'
              for i in range(k)]
    lines.append(schedule.Timeline(k, m))
    return '\n'.join(lines)
