"""PipeliningLayer: a pipeline of stages on a list of devices.

The layer holds S cells (stages) on K devices, V = p.num_virtual_stages
stages on each (K = S / V), cell s built and run on the device its
schedule places it on (`registry.Placement`: s mod K for most, a V for
'zb_v', as listed for a table read from a file). A batch is split into M
micro-batches; each device runs its actions (forward, backward, or a
split backward's halves, of one stage on one micro-batch) in the order
of the schedule's table (`schedule.py`; `registry.Names()` lists them,
and p.schedule may name a .csv file of a table, `schedule_file.py`).

Two ways to run it:

  FProp(theta, inputs)       the differentiable forward, for evaluation,
                             decoding and callers with their own tape:
                             every forward, then in the gradient every
                             backward (GPipe's order whatever p.schedule)
  FPropWithLoss(theta, inputs, head, head_theta, batch, loss_weight)
                             one pass of training in p.schedule's order:
                             each micro-batch's loss (`head`) is computed
                             on the last device as soon as its forward
                             ends, so backwards start before all forwards
                             have run (BaseTask's training step uses it)

A backward re-computes the forward of its (s, m) just before it unless
the recompute mode keeps that stage's activations:

  recompute      stages re-computed        kept until their backward
  'always'       all                       stage inputs only
  'except_last'  all but the last          + the last stage's activations
  'never'        none                      all activations

Per device, actions run strictly in table order (control dependencies);
gradients of each stage's variables are summed over micro-batches in the
order of that stage's backwards. With the same micro-batch split the
result is bitwise that of running the cells one after the other on one
device and summing per-micro-batch gradients in that order.

Inputs, outputs and the state between stages may be any nest (e.g. a
NestedMap) of tensors of mixed dtypes; every tensor has the batch on axis
`batch_dim`. Only floating-point tensors carry gradients. With
p.fprop_dtype set (e.g. bfloat16 over float32 variables), every floating
tensor between stages, both ways, is in that dtype (`hand_off_dtype`).

Variable paths leave the cell out when every cell is a list of uniquely
named layers (as the partitioner makes them): `network/stage0_block3/w`,
whatever K, V or the schedule, so a checkpoint outlives a re-split.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import devices as devices_lib
from lingvo_pipe.core import hand_offs
from lingvo_pipe.core import pipeline_run
from lingvo_pipe.core import schedule as schedule_lib
from lingvo_pipe.core import stage_calls
from lingvo_pipe.core.schedules import registry
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
  """Pipelined stages on K devices, M micro-batches (module docstring).

  Cells are children `cell_0` .. `cell_{S-1}`, cell s built on the
  device its schedule places it on (`placement`). When every cell is a
  SequentialLayer whose sub-layers have names unique across all cells
  (as `partitioner.PartitionSequentialLayers` makes them), the cell names
  are left out of variable and seed paths: initial values, dropout masks
  and checkpoint names are then those of the same layers in one plain
  SequentialLayer named like this layer, whatever the split.

  FProp(theta, inputs) -> outputs of the last stage for the whole batch;
  `inputs` is a tensor or a nest of tensors [batch, ...].
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('cell_tpl', [],
             'Layer params of each stage, in order; S = len(cell_tpl).')
    p.Define('num_micro_batches', 1, 'M, micro-batches per mini-batch.')
    p.Define('micro_batch_size', None,
             'If set, M = batch / micro_batch_size (num_micro_batches is '
             'then ignored).')
    p.Define('batch_dim', 0, 'Batch axis of every input and output tensor.')
    p.Define('devices', None,
             'Device of each of the K pipeline devices: replica r (data '
             'parallelism, BaseTask train.num_replicas) runs stage s on '
             'devices[r * K + d], d the device the schedule places stage s '
             "on, with its own copy of the stage's variables (replica 0's "
             "are the layer's, the ones checkpointed). None: "
             'devices.DefaultDevices().')
    p.Define('recompute', 'always', f'One of {RECOMPUTE_MODES}.')
    p.Define('schedule', 'gpipe',
             'Order of the actions in training: one of '
             f'{registry.Names()} (schedules/registry.py) or the path of '
             "a table's .csv file (schedule_file.py).")
    p.Define('num_virtual_stages', 1,
             'V, stages per device, K = len(cell_tpl) / V devices; the '
             'schedule says how many it runs and where each stage goes '
             "(2 for 'zb_v'; 2 or more for 'interleaved_1f1b'). A .csv "
             'table sets K and the placement itself.')
    p.Define('split_backward', False,
             "With recompute 'never': each backward in training runs as B, "
             'the input gradient, handed to the previous stage at once, '
             'then W, the weight gradient (schedule.SplitBackwards; the '
             'same order, nothing computed twice, but each micro-batch\'s '
             'output gradients held from its B to its W). Zero-bubble '
             'schedules always split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = f"PipeliningLayer '{self.path}'"
    if not p.cell_tpl:
      raise ValueError(f'{where} has no partitions; set p.cell_tpl to a '
                       'list of layer params.')
    if p.recompute not in RECOMPUTE_MODES:
      raise ValueError(f'{where}: recompute={p.recompute!r}; use one of '
                       f'{RECOMPUTE_MODES}.')
    if p.micro_batch_size is None and p.num_micro_batches < 1:
      raise ValueError(f'{where}: num_micro_batches={p.num_micro_batches}; '
                       'use 1 or more.')
    if p.micro_batch_size is not None and p.micro_batch_size < 1:
      raise ValueError(f'{where}: micro_batch_size={p.micro_batch_size}; '
                       'use 1 or more, or None.')
    self._num_devices = _CheckSchedule(where, p)
    self._placement = registry.Placement(
        p.schedule, self._num_devices, p.num_virtual_stages)
    self._all_devices = ResolveDevices(self.path, p.devices,
                                       self._num_devices)
    unique = _SubNamesAreUnique(p.cell_tpl)
    self._cells = []
    for s, cell_p in enumerate(p.cell_tpl):
      with tf.device(self._all_devices[self._placement[s]]):
        self._cells.append(self.CreateChild(
            f'cell_{s}', cell_p, seed_name='' if unique else None,
            path_name='' if unique else None))
    if p.micro_batch_size is None:  # the table's errors, at construction
      self.Table(p.num_micro_batches)

  @property
  def devices(self) -> List[str]:
    """The K pipeline devices of the current replica (`self.replica`)."""
    return self.ReplicaDevices(self.replica)

  @property
  def stage_devices(self) -> List[str]:
    """The device of each stage in the current replica."""
    return self.StageDevices(self.replica)

  @property
  def placement(self) -> Tuple[int, ...]:
    """Stage s's device index (0..K-1) in every replica, as the schedule
    places it: the one source every part of the pipeline reads."""
    return self._placement

  def StageDevices(self, replica: int) -> List[str]:
    """The device of each stage in replica `replica` (`placement`)."""
    devices = self.ReplicaDevices(replica)
    return [devices[d] for d in self._placement]

  def ReplicaDevices(self, replica: int) -> List[str]:
    """Replica `replica`'s K pipeline devices."""
    k = self._num_devices
    if replica < 0 or (replica + 1) * k > len(self._all_devices):
      raise ValueError(
          f"PipeliningLayer '{self.path}': replica {replica} needs devices "
          f'{replica * k}..{(replica + 1) * k - 1} (K={k} per replica) but '
          f'{len(self._all_devices)} are known {self._all_devices}; list '
          f'num_replicas x {k} devices in p.devices (replica r, device d '
          'at r * K + d).')
    return list(self._all_devices[replica * k:(replica + 1) * k])

  @property
  def cells(self) -> List[base_layer.BaseLayer]:
    return list(self._cells)

  @property
  def num_partitions(self) -> int:
    """S, the number of stages (cells); K devices when V = 1."""
    return len(self._cells)

  def Table(self, num_micro_batches: int,
            training: bool = True) -> schedule_lib.Schedule:
    """The schedule's table for M micro-batches.

    `training=False`: the table FProp runs (GPipe's order over the same
    placement), whose forwards come before every backward.
    """
    p = self.params
    try:
      if not training:
        table = schedule_lib.GPipe(self._num_devices, num_micro_batches,
                                   stage_devices=self._placement)
        schedule_lib.Validate(table)
        return table
      return registry.Make(p.schedule, self._num_devices,
                           num_micro_batches, p.num_virtual_stages,
                           split_backward=p.split_backward)
    except ValueError as err:
      raise ValueError(f"PipeliningLayer '{self.path}': {err}") from None

  def NumMicroBatches(self, batch_size: Optional[int],
                      num_replicas: Optional[int] = None) -> int:
    """M for a batch of `batch_size`; raises if it does not split evenly.

    As one of R replicas (`num_replicas`, default the layer's own while
    training), the batch is this replica's slice and M is
    p.num_micro_batches / R: each replica runs micro-batches of the size
    one replica would.
    """
    num_replicas = num_replicas or self.num_replicas
    if batch_size is None:  # known when the step runs: split there
      return self.params.num_micro_batches // num_replicas
    why = MicroBatchError(self.params, batch_size, num_replicas)
    if why:
      raise ValueError(f"PipeliningLayer '{self.path}': {why}.")
    p = self.params
    if p.micro_batch_size is not None:
      return batch_size // p.micro_batch_size
    return p.num_micro_batches // num_replicas

  def _BatchSize(self, leaves: Sequence[tf.Tensor]) -> Optional[int]:
    axis = self.params.batch_dim
    sizes = set()
    for x in leaves:
      if x.shape.rank is None or x.shape.rank <= axis:
        raise ValueError(
            f"PipeliningLayer '{self.path}': input of shape {x.shape} has no "
            f'batch axis {axis}; every input needs one.')
      sizes.add(x.shape[axis])
    if None in sizes and self.params.micro_batch_size is not None:
      raise ValueError(
          f"PipeliningLayer '{self.path}' with micro_batch_size needs a "
          'static batch size; give the inputs a known shape on the batch '
          'axis or set num_micro_batches instead.')
    sizes.discard(None)
    if not sizes:
      return None
    if len(sizes) != 1:
      raise ValueError(
          f"PipeliningLayer '{self.path}': inputs disagree on the batch "
          f'size {sorted(sizes)}; they must share axis {axis}.')
    return sizes.pop()

  @property
  def hand_off_dtype(self) -> Optional[tf.DType]:
    """p.fprop_dtype (set here or inherited), or None: the dtype of every
    floating tensor a stage gets or returns, cast on the device that makes
    it (the inputs on stage 0's); None leaves them as they are."""
    return self.params.fprop_dtype

  def KeepsActivations(self, s: int) -> bool:
    """Whether stage s keeps its activations for its backward (training)."""
    mode = self.params.recompute
    if not self.training:
      return False
    return mode == 'never' or (mode == 'except_last' and
                               s == self.num_partitions - 1)

  def _Run(self, theta: NestedMap, inputs: Any
           ) -> Tuple[pipeline_run.PipelineRun, List[tf.Tensor], int]:
    leaves = [tf.convert_to_tensor(x) for x in tf.nest.flatten(inputs)]
    if not leaves:
      raise ValueError(f"PipeliningLayer '{self.path}' got no input tensors.")
    with tf.device(self.stage_devices[0]):
      leaves = hand_offs.CastFloats(leaves, self.hand_off_dtype)
    num_micro = self.NumMicroBatches(self._BatchSize(leaves))
    thetas = []
    for s, dev in enumerate(self.stage_devices):
      with tf.device(dev):
        thetas.append(theta[f'cell_{s}'].Transform(tf.convert_to_tensor))
    stages = stage_calls.Stages(
        path=self.path, cells=self.cells, device_names=self.devices,
        placement=self._placement,
        keeps_activations=[self.KeepsActivations(s)
                           for s in range(self.num_partitions)],
        batch_dim=self.params.batch_dim, hand_off_dtype=self.hand_off_dtype,
        replica=self.replica, mirrors=list(zip(*[
            self.StageDevices(r) for r in range(self.num_replicas)])))
    run = pipeline_run.PipelineRun(stages, num_micro, inputs, thetas)
    return run, leaves, num_micro

  def FProp(self, theta: NestedMap, inputs: Any) -> Any:
    run, leaves, num_micro = self._Run(theta, inputs)
    return run.Call(leaves, self.Table(num_micro, training=False))

  def FPropWithLoss(self, theta: NestedMap, inputs: Any,
                    head: pipeline_run.Head, head_theta: Any, batch: Any,
                    loss_weight: Any, normaliser: Any = None) -> NestedMap:
    """One training pass in p.schedule's order: metrics {name: (value,
    weight)}, whose 'loss' is differentiable.

    `head(head_theta, outputs, batch)` runs on the last device for each
    micro-batch: the last stage's `outputs` of it and its slice of `batch`
    (a nest split like the inputs; scalars go whole), returning metrics
    with 'loss' (BaseTask.ComputeLoss's form). `head_theta`: every
    variable the head reads (it must read no other). `loss_weight`: the
    whole batch's weight of 'loss', known before the first forward; each
    micro-batch adds loss_m x weight_m / loss_weight, so the loss is the
    head's weighted mean over the batch. The gradient of 'loss' reaches
    `inputs`, `theta` and `head_theta`; the other metrics have none.
    `normaliser` (default `loss_weight`): what loss_m x weight_m is
    divided by instead, the whole batch's weight when this is one
    replica's slice of it (replicas.py).
    """
    run, leaves, num_micro = self._Run(theta, inputs)
    return run.Train(leaves, self.Table(num_micro), head, head_theta, batch,
                     loss_weight,
                     loss_weight if normaliser is None else normaliser)

  def Describe(self, batch_size: int, num_replicas: int = 1) -> str:
    """A few lines: devices, M, schedule, recompute mode, bubble, timeline.

    Each stage's line ends with its trainable parameter count. The bubble
    is the idle share of the table run with unit forwards and backwards
    twice as long (schedule.Simulate).

    `batch_size` is one replica's; with several replicas each stage's
    line lists its device in every replica, separated by ' | '.
    """
    s_total = self.num_partitions
    m = self.NumMicroBatches(batch_size, num_replicas)
    table = self.Table(m)
    sim = schedule_lib.Simulate(table)
    where = [self.StageDevices(r) for r in range(num_replicas)]
    head = (f'R={num_replicas} replicas x ' if num_replicas > 1 else '')
    split = ' (backwards split, B then W)' if table.split_in_place else ''
    k = self._num_devices
    stages = (f'K={k} devices x V={s_total // k} stages'
              if s_total > k else f'K={s_total} partitions')
    lines = [f"PipeliningLayer '{self.path}': {head}{stages}, M={m} "
             f'micro-batches, schedule={table.name}{split}, recompute='
             f'{self.params.recompute}, bubble {sim.bubble:.1%}, in flight '
             f'at most {list(sim.peak_device_in_flight)} per device']
    lines += [f'  partition {i}: ' + ' | '.join(d[i] for d in where) +
              f' ({base_layer.NumParameters(self.cells[i]):,} parameters)'
              for i in range(s_total)]
    lines.append(schedule_lib.Timeline(table))
    return '\n'.join(lines)


def _CheckSchedule(where: str, p: Any) -> int:
  """K, the devices per replica; one-line errors for a bad schedule (its
  rules are its definition's: registry.Check)."""
  if not isinstance(p.split_backward, bool):
    raise ValueError(f'{where}: split_backward={p.split_backward!r}; use '
                     'True or False.')
  num_micro = (p.num_micro_batches if p.micro_batch_size is None else None)
  try:
    return registry.Check(p.schedule, len(p.cell_tpl), num_micro,
                          p.num_virtual_stages, p.recompute,
                          p.split_backward)
  except ValueError as err:
    raise ValueError(f'{where}: {err}') from None


def MicroBatchError(p: Any, batch_size: int,
                    num_replicas: int = 1) -> Optional[str]:
  """Why a batch of `batch_size` does not split into the micro-batches of
  PipeliningLayer params `p`, and what to change; None if it does. With
  `num_replicas` R > 1, `batch_size` is one replica's slice, which takes
  num_micro_batches / R of them."""
  if p.micro_batch_size is not None:
    if batch_size % p.micro_batch_size:
      return (f'batch size {batch_size} is not a multiple of '
              f'micro_batch_size={p.micro_batch_size}; change one of them')
    return None
  m = p.num_micro_batches
  what = f'num_micro_batches={m}'
  if num_replicas > 1:
    if m % num_replicas:
      return (f'{what} does not split over num_replicas={num_replicas} '
              f'(each replica runs M / R of them); use a multiple of '
              f'{num_replicas}')
    m //= num_replicas
    what = f'{m} micro-batches ({what} over {num_replicas} replicas)'
  if m > batch_size:
    return (f'{what} is larger than the batch size {batch_size}; use at '
            f'most {batch_size * num_replicas}')
  if batch_size % m:
    return (f'batch size {batch_size} does not split into {what} equal '
            f'parts; use a divisor of {batch_size}' +
            (f' times {num_replicas}' if num_replicas > 1 else ''))
  return None
