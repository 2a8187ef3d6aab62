"""Splits a flat list of layers into K balanced pipeline partitions.

`PartitionSequentialLayers(layers, K, cost, input_shapes)` returns K
`SequentialLayer` params, cell k holding a contiguous run of `layers` in
order, ready for `PipeliningLayer.Params().Set(cell_tpl=...)`. The split
minimises the cost of the most expensive partition (the pipeline runs at
the pace of its slowest stage). Per-layer costs:

  cost        measured as                          needs input_shapes
  'flops'     FPropMeta flops, shapes propagated   yes
  'params'    trainable scalars per layer          no
  'time'      median seconds of a forward pass     yes
  [numbers]   given by the caller, one per layer   no (for memory only)

Every layer gets a name unique across all cells (`layer_{i}` if its name is
empty), so `PipeliningLayer` seeds them like one plain `SequentialLayer`
of the same name: re-partitioning keeps the initial weights.

`PartitionWithReport` also returns a `BalanceReport`: per partition its
layers, cost, parameters and activation memory, with the bubble of the
schedule's table run with these costs (`schedule.Simulate`: partition k's
cost its forward, twice that its backward, so an imbalance shows as idle
time) and the imbalance of the split; `print(report)` shows it as a table.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from absl import logging
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers as layers_lib
from lingvo_pipe.core import schedule
from lingvo_pipe.core.schedules import registry

COSTS = ('flops', 'params', 'time')

Cost = Union[str, Sequence[float]]


# ---- the split -----------------------------------------------------------


class NoFeasibleSplit(ValueError):
  """No split into the asked number of parts satisfies `fits`."""


def MinMaxPartition(costs: Sequence[float], num_partitions: int,
                    fits: Optional[Callable[[int, int], bool]] = None,
                    part_fits: Optional[Callable[[int, int, int], bool]] = None
                    ) -> List[int]:
  """Boundaries of the contiguous split minimising the largest part cost.

  Returns [0 = b_0 < b_1 < ... < b_K = n]: part k is costs[b_k:b_{k+1}],
  never empty. With `fits`, only parts costs[s:e] with fits(s, e) true are
  allowed (e.g. a part's memory under a budget); `part_fits(k, s, e)` is
  the same told the part's index k (a pipeline stage's memory depends on
  its place in the schedule). Raises NoFeasibleSplit if no split of K
  parts has every part fitting. Exact, by dynamic programming over
  suffixes (the part starting at s with p parts left is part K - p):

    best[p][s] = least possible max part cost of splitting costs[s:] into
                 p non-empty contiguous parts (that fit)
    best[0][n] = 0,   best[0][s] = inf  for s < n
    best[p][s] = min over s < e <= n-p+1 with fits(s, e) of
                 max(sum(costs[s:e]), best[p-1][e])

  With C* = best[K][0], the boundaries are then chosen left to right, each
  the earliest that keeps the split optimal (deterministic ties):

    s = 0
    for p = K .. 1:
      e = min{e > s : sum(costs[s:e]) <= C* and best[p-1][e] <= C*}
      s = e                                   # boundary b_{K-p+1}

    costs 4 2 3 3 1 5, K=3:  4 2 | 3 3 | 1 5        -> 6 6 6, C* = 6
    costs 1 1 1 1 1,   K=2:  1 1 | 1 1 1  (not 1 1 1 | 1 1)  -> C* = 3

  Costs must be >= 0, so a running sum only grows: the inner loop stops
  once it reaches the best value found. O(K n^2) time at worst, O(K n)
  memory. Part sums are accumulated left to right, like `sum(costs[s:e])`.
  """
  n = len(costs)
  if not 1 <= num_partitions <= n:
    raise ValueError(
        f'MinMaxPartition: num_partitions={num_partitions} must be in '
        f'[1, {n}] for {n} costs.')
  if part_fits is None:
    part_fits = (lambda k, s, e: True) if fits is None else (
        lambda k, s, e: fits(s, e))
  best = [[math.inf] * n + [0]]
  for p in range(1, num_partitions + 1):
    row = [math.inf] * (n + 1)
    for s in range(n - p + 1):
      run = 0
      for e in range(s + 1, n - p + 2):
        run += costs[e - 1]
        if run >= row[s]:
          break
        if part_fits(num_partitions - p, s, e):
          row[s] = min(row[s], max(run, best[p - 1][e]))
    best.append(row)
  target = best[num_partitions][0]
  if target == math.inf:
    raise NoFeasibleSplit(
        f'MinMaxPartition: no split into {num_partitions} parts has every '
        'part fitting; use more parts or relax the constraint.')
  bounds = [0]
  for p in range(num_partitions, 0, -1):
    s, run = bounds[-1], 0
    for e in range(s + 1, n - p + 2):
      run += costs[e - 1]
      if (run <= target and best[p - 1][e] <= target and
          part_fits(num_partitions - p, s, e)):
        bounds.append(e)
        break
  return bounds


# ---- the report ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartitionStats:
  """One partition (pipeline cell) of a split.

  Attributes:
    layer_names: names of its layers, in order.
    layer_costs: cost of each of those layers.
    cost: sum of layer_costs.
    num_params: trainable scalars of its layers.
    activation_bytes: sum of the sizes of its layers' outputs for one
      micro-batch of the given input shapes; None if the shapes are unknown.
  """
  layer_names: Tuple[str, ...]
  layer_costs: Tuple[float, ...]
  cost: float
  num_params: int
  activation_bytes: Optional[int]


@dataclasses.dataclass(frozen=True)
class BalanceReport:
  """How balanced a split is; `str(report)` is a table.

  Attributes:
    cost_name: 'flops', 'params', 'time' (seconds) or 'user' (given costs).
    num_micro_batches: M, for the bubble fraction.
    partitions: one PartitionStats per partition (stage), in pipeline order.
    schedule_name: the schedule (registry.Names(), or a .csv table), for
      the bubble.
    num_virtual_stages: V, stages per device: the partitions run on
      K = partitions / V devices, placed as the schedule places them.
  """
  cost_name: str
  num_micro_batches: int
  partitions: Tuple[PartitionStats, ...]
  schedule_name: str = 'gpipe'
  num_virtual_stages: int = 1

  @property
  def num_partitions(self) -> int:
    return len(self.partitions)

  @property
  def num_devices(self) -> int:
    """K (partitions / V, or a table file's own)."""
    return registry.Lookup(self.schedule_name).NumDevices(
        self.num_partitions, self.num_virtual_stages)

  def Table(self) -> schedule.Schedule:
    """The schedule's table for these partitions and M (registry.Make)."""
    return _Table(self.schedule_name, self.num_partitions,
                  self.num_micro_batches, self.num_virtual_stages)

  @property
  def costs(self) -> List[float]:
    return [part.cost for part in self.partitions]

  @property
  def total_cost(self) -> float:
    return sum(self.costs)

  @property
  def bubble_fraction(self) -> float:
    """Idle share of the devices: the table simulated with each
    partition's cost as its forward and twice that as its backward."""
    costs = self.costs
    return schedule.Simulate(self.Table(), costs,
                             [2 * c for c in costs]).bubble

  @property
  def imbalance(self) -> float:
    """max / mean partition cost: 1.0 is a perfect balance."""
    mean = self.total_cost / self.num_partitions
    return max(self.costs) / mean if mean > 0 else 1.0

  def __str__(self) -> str:
    k, s_total = self.num_devices, self.num_partitions
    shape = (f'K={k} devices x V={s_total // k} stages' if s_total > k else
             f'K={s_total} partitions')
    head = (f'Pipeline balance by {self.cost_name}: {shape}, '
            f'M={self.num_micro_batches} micro-batches, bubble '
            f'{self.bubble_fraction:.1%} ({self.schedule_name}, backward = 2 x '
            f'forward), imbalance (max/mean) {self.imbalance:.3f}')
    fmt = _CostFormat(self.cost_name)
    total = self.total_cost
    rows = [('cell', 'layers', '#', f'cost ({self.cost_name})', 'share',
             'params', 'activations')]
    for k, part in enumerate(self.partitions):
      names = part.layer_names
      span = names[0] if len(names) == 1 else f'{names[0]} .. {names[-1]}'
      act = part.activation_bytes
      rows.append((str(k), span, str(len(names)), fmt(part.cost),
                   f'{part.cost / total:.1%}' if total > 0 else '-',
                   _Count(part.num_params),
                   '-' if act is None else Bytes(act)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head]
    for row in rows:  # text columns left-aligned, numbers right-aligned
      cells = [c.ljust(w) if i < 2 else c.rjust(w)
               for i, (c, w) in enumerate(zip(row, widths))]
      lines.append('  ' + '  '.join(cells).rstrip())
    lines.append('  activations: output bytes of a cell\'s layers for one '
                 'micro-batch')
    return '\n'.join(lines)


def _Table(schedule_name: str, num_partitions: int, num_micro_batches: int,
           num_virtual_stages: int) -> schedule.Schedule:
  """registry.Make's table of S = num_partitions stages (its rules:
  registry.Check)."""
  k = registry.Check(schedule_name, num_partitions, num_micro_batches,
                     num_virtual_stages)
  return registry.Make(schedule_name, k, num_micro_batches,
                       num_virtual_stages)


def _Count(x: float) -> str:
  """1234567 -> '1.23 M'."""
  for unit in ('', ' k', ' M', ' G', ' T'):
    if abs(x) < 1000:
      return f'{x:.0f}{unit}' if not unit else f'{x:.3g}{unit}'
    x /= 1000
  return f'{x:.3g} P'


def Bytes(x: int) -> str:
  """2048 -> '2.00 KiB'."""
  if x < 1024:
    return f'{x} B'
  for unit in ('KiB', 'MiB', 'GiB', 'TiB'):
    x /= 1024
    if x < 1024 or unit == 'TiB':
      break
  return f'{x:.2f} {unit}'


def _CostFormat(cost_name: str) -> Callable[[float], str]:
  if cost_name == 'time':
    return lambda s: f'{s * 1e3:.3f} ms'
  if cost_name == 'user':
    return lambda c: f'{c:.4g}'
  return _Count


# ---- shapes --------------------------------------------------------------


def _IsShape(x: Any) -> bool:
  """A shape leaf: TensorShape, TensorSpec, or a list/tuple of dims."""
  if isinstance(x, (tf.TensorShape, tf.TensorSpec)):
    return True
  return isinstance(x, (list, tuple)) and all(
      d is None or isinstance(d, int) for d in x)


def MapShapes(fn: Callable[[Any], Any], x: Any) -> Any:
  """Applies `fn` to every shape leaf of a nest of dicts, lists, tuples."""
  if _IsShape(x):
    return fn(x)
  if isinstance(x, dict):
    return type(x)((k, MapShapes(fn, v)) for k, v in x.items())
  if isinstance(x, (list, tuple)):
    return type(x)(MapShapes(fn, v) for v in x)
  raise TypeError(
      f'Expected shapes (TensorShape, TensorSpec, list of dims) in a nest '
      f'of NestedMaps, lists and tuples; got {x!r}.')


def InputArgs(input_shapes: Any) -> Tuple[Any, ...]:
  """The first layer's positional inputs: a tuple of shape nests."""
  if isinstance(input_shapes, tuple) and not _IsShape(input_shapes):
    return input_shapes
  return (input_shapes,)


def _LeafBytes(leaf: Any, dtype: tf.DType) -> Optional[int]:
  if isinstance(leaf, tf.TensorSpec):
    leaf, dtype = leaf.shape, leaf.dtype
  n = tf.TensorShape(leaf).num_elements()
  return None if n is None else int(n) * tf.as_dtype(dtype).size


def _OutBytes(out_shapes: Any, dtype: tf.DType) -> Optional[int]:
  sizes = []
  MapShapes(lambda s: sizes.append(_LeafBytes(s, dtype)), out_shapes)
  return None if None in sizes else sum(sizes)


def LayerDtype(p: hyperparams.Params, default: tf.DType) -> tf.DType:
  return p.fprop_dtype or p.dtype or default


# ---- per-layer costs -----------------------------------------------------


def NamedCopies(layers: Sequence[hyperparams.Params]
                 ) -> List[hyperparams.Params]:
  """Copies of `layers`, each named (`layer_{i}` if empty), names unique."""
  copies = [p.Copy() for p in layers]
  seen = {}
  for i, p in enumerate(copies):
    if not p.name:
      p.name = f'layer_{i}'
    if p.name in seen:
      raise ValueError(
          f'PartitionSequentialLayers: layers {seen[p.name]} and {i} are '
          f'both named {p.name!r}; give every layer a unique name (an empty '
          "name becomes 'layer_{i}').")
    seen[p.name] = i
  return copies


def _Metas(layer_ps: Sequence[hyperparams.Params], args: Tuple[Any, ...],
           strict: bool) -> List[Any]:
  """FPropMeta of each layer, layer i fed the out_shapes of layer i-1.

  If not strict, a layer without FPropMeta ends the chain: it and the
  layers after it get None.
  """
  args = MapShapes(
      lambda s: s.shape if isinstance(s, tf.TensorSpec) else
      tf.TensorShape(s), args)
  metas = []
  for i, p in enumerate(layer_ps):
    try:
      meta = p.cls.FPropMeta(p, *args)
    except NotImplementedError as e:
      if not strict:
        return metas + [None] * (len(layer_ps) - i)
      raise NotImplementedError(
          f"PartitionSequentialLayers: layer {i} '{p.name}': {e}") from None
    except (ValueError, TypeError) as e:
      raise ValueError(
          f"PartitionSequentialLayers: layer {i} '{p.name}' "
          f'({p.cls.__name__}): FPropMeta failed on input shapes {args}: '
          f'{e}') from e
    metas.append(meta)
    args = tuple(meta.out_shapes)
  return metas


def _MetaBytes(layer_ps: Sequence[hyperparams.Params], metas: List[Any],
               dtype: tf.DType) -> List[Optional[int]]:
  return [None if m is None else _OutBytes(tuple(m.out_shapes),
                                           LayerDtype(p, dtype))
          for p, m in zip(layer_ps, metas)]


def _ParamCounts(layer_ps: Sequence[hyperparams.Params]) -> List[int]:
  """Trainable scalars of each layer, from variable shapes only.

  No initial value is computed, so this costs neither time nor memory for
  the weights whatever the layer's size.
  """
  with base_layer.VariableShapesOnly():
    return [base_layer.NumParameters(p.Instantiate()) for p in layer_ps]


def RandomInputs(args: Tuple[Any, ...], dtype: tf.DType) -> Any:
  """Tensors of the given shapes: floats uniform in [0, 1), others zero."""
  count = [0]

  def Make(leaf: Any) -> tf.Tensor:
    spec = (leaf if isinstance(leaf, tf.TensorSpec)
            else tf.TensorSpec(leaf, dtype))
    if not spec.shape.is_fully_defined():
      raise ValueError(
          f"PartitionSequentialLayers: cost='time' needs fully defined "
          f'input shapes, got {spec.shape}.')
    if not spec.dtype.is_floating:
      return tf.zeros(spec.shape, spec.dtype)
    count[0] += 1
    return tf.random.stateless_uniform(spec.shape, [0, count[0]],
                                       dtype=spec.dtype)

  return MapShapes(Make, args)


def MedianSeconds(fn: Callable[..., Any], args: Tuple[Any, ...],
                  num_runs: int) -> Tuple[float, Any]:
  """(median seconds of fn(*args) over num_runs after a warm-up, its result).

  The warm-up call traces a tf.function; devices are synchronised after
  every call, so an accelerator's queued work is counted.
  """
  out = fn(*args)
  tf.test.experimental.sync_devices()
  times = []
  for _ in range(num_runs):
    start = time.perf_counter()
    fn(*args)
    tf.test.experimental.sync_devices()
    times.append(time.perf_counter() - start)
  return statistics.median(times), out


def _TimeLayer(p: hyperparams.Params, args: Tuple[Any, ...],
               num_runs: int) -> Tuple[float, Any]:
  """(median seconds of FProp after a warm-up, the outputs)."""
  layer = p.Instantiate()
  fprop = tf.function(lambda *a: layer.FProp(layer.theta, *a),
                      autograph=False)
  return MedianSeconds(fprop, args, num_runs)


def _MeasureTimes(layer_ps: Sequence[hyperparams.Params],
                  args: Tuple[Any, ...], dtype: tf.DType,
                  num_runs: int) -> Tuple[List[float], List[int]]:
  """Seconds and output bytes of each layer, fed its predecessor's output.

  Layers are built one at a time on the current device (wrap the call in
  `tf.device(...)` to time an accelerator) and dropped after timing.
  """
  args = RandomInputs(args, LayerDtype(layer_ps[0], dtype))
  times, sizes = [], []
  for p in layer_ps:
    q = p.Copy()
    if q.dtype is None:
      q.dtype = dtype
    seconds, out = _TimeLayer(q, args, num_runs)
    times.append(seconds)
    sizes.append(sum(int(t.shape.num_elements()) * t.dtype.size
                     for t in tf.nest.flatten(out)))
    args = out if isinstance(out, tuple) else (out,)
  return times, sizes


def _UserCosts(costs: Sequence[float], num_layers: int) -> List[float]:
  costs = list(costs)
  if len(costs) != num_layers:
    raise ValueError(
        f'PartitionSequentialLayers: got {len(costs)} costs for '
        f'{num_layers} layers; give one cost per layer.')
  for i, c in enumerate(costs):
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (
        0 <= c < math.inf):
      raise ValueError(
          f'PartitionSequentialLayers: cost {i} is {c!r}; every cost must '
          'be a finite number >= 0.')
  return costs


def _LayerCosts(layer_ps: Sequence[hyperparams.Params], cost: Cost,
                input_shapes: Any, dtype: tf.DType, num_params: List[int],
                num_runs: int) -> Tuple[str, List[float], List[Any]]:
  """(cost name, cost of each layer, output bytes of each layer or None)."""
  n = len(layer_ps)
  if not isinstance(cost, str):
    name, costs = 'user', _UserCosts(cost, n)
  elif cost not in COSTS:
    raise ValueError(
        f'PartitionSequentialLayers: unknown cost={cost!r}; use one of '
        f'{", ".join(repr(c) for c in COSTS)}, or a list of one number '
        'per layer.')
  else:
    name, costs = cost, num_params
  if input_shapes is None:
    if name in ('flops', 'time'):
      raise ValueError(
          f"PartitionSequentialLayers: cost='{name}' needs input_shapes, "
          'the shapes of the first layer\'s inputs for one micro-batch '
          "(e.g. (tf.TensorShape([8, 512]),)); pass them or use "
          "cost='params'.")
    return name, costs, [None] * n
  args = InputArgs(input_shapes)
  if name == 'time':
    costs, sizes = _MeasureTimes(layer_ps, args, dtype, num_runs)
    return name, costs, sizes
  metas = _Metas(layer_ps, args, strict=name == 'flops')
  if name == 'flops':
    costs = [int(m.flops) for m in metas]
  return name, costs, _MetaBytes(layer_ps, metas, dtype)


# ---- the API -------------------------------------------------------------


def PartitionWithReport(
    layers: Sequence[hyperparams.Params],
    num_partitions: int,
    cost: Cost = 'flops',
    input_shapes: Any = None,
    num_micro_batches: int = 1,
    dtype: tf.DType = tf.float32,
    num_timing_runs: int = 5,
    schedule_name: str = 'gpipe',
    num_virtual_stages: int = 1,
) -> Tuple[List[hyperparams.Params], BalanceReport]:
  """Balanced cells for a PipeliningLayer, and a report of the balance.

  Args:
    layers: layer params, applied in order. They are copied, not changed;
      an empty name becomes `layer_{i}`; names must be unique.
    num_partitions: K, between 1 and len(layers).
    cost: 'flops', 'params', 'time' (module docstring), or one number >= 0
      per layer.
    input_shapes: the first layer's inputs for one micro-batch: a shape
      (TensorShape, TensorSpec or list of dims), a NestedMap of shapes, or
      a tuple of those for several positional inputs. Needed by 'flops' and
      'time'; with other costs it only fills in the activation memory.
      A TensorSpec's dtype is used for 'time' (others get the layer dtype).
    num_micro_batches: M, for the report's bubble fraction.
    dtype: dtype of layers whose params leave it None (they inherit it from
      the pipeline): for 'time' and the activation memory.
    num_timing_runs: timed runs per layer for 'time', after one warm-up.
    schedule_name: the PipeliningLayer's p.schedule, for the report's bubble.
    num_virtual_stages: its p.num_virtual_stages (V): the K partitions
      then run on K / V devices, placed by the schedule.

  Returns:
    (cells, report): K `SequentialLayer` params named `cell_{k}`, cell k's
    `sub` a contiguous slice of the named layer copies; a BalanceReport.
  """
  if num_micro_batches < 1:
    raise ValueError(
        f'PartitionSequentialLayers: num_micro_batches={num_micro_batches}; '
        'use 1 or more.')
  layer_ps = NamedCopies(layers)
  n = len(layer_ps)
  if num_partitions < 1 or num_partitions > n:
    raise ValueError(
        f'PartitionSequentialLayers: num_partitions={num_partitions} but '
        f'there are {n} layers; use between 1 and {n} partitions.')
  try:  # the schedule's errors before any measuring
    _Table(schedule_name, num_partitions, num_micro_batches,
           num_virtual_stages)
  except ValueError as err:
    raise ValueError(f'PartitionSequentialLayers: {err}') from None
  num_params = _ParamCounts(layer_ps)
  name, costs, sizes = _LayerCosts(layer_ps, cost, input_shapes, dtype,
                                   num_params, num_timing_runs)
  bounds = MinMaxPartition(costs, num_partitions)
  parts = []
  for a, b in zip(bounds, bounds[1:]):
    part_sizes = sizes[a:b]
    parts.append(PartitionStats(
        layer_names=tuple(p.name for p in layer_ps[a:b]),
        layer_costs=tuple(costs[a:b]), cost=sum(costs[a:b]),
        num_params=sum(num_params[a:b]),
        activation_bytes=None if None in part_sizes else sum(part_sizes)))
  return Cells(layer_ps, bounds), BalanceReport(
      name, num_micro_batches, tuple(parts), schedule_name,
      num_virtual_stages)


def Cells(layer_ps: Sequence[hyperparams.Params], bounds: Sequence[int],
          prefix: str = 'cell') -> List[hyperparams.Params]:
  """The split `bounds` (MinMaxPartition's form) of named layer params
  (NamedCopies') as `SequentialLayer` params named `{prefix}_{k}`."""
  return [layers_lib.SequentialLayer.Params().Set(
      name=f'{prefix}_{k}', sub=layer_ps[a:b])
          for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def PartitionSequentialLayers(
    layers: Sequence[hyperparams.Params],
    num_partitions: int,
    cost: Cost = 'flops',
    input_shapes: Any = None,
    num_micro_batches: int = 1,
    dtype: tf.DType = tf.float32,
    num_timing_runs: int = 5,
    verbose: bool = True,
    schedule_name: str = 'gpipe',
    num_virtual_stages: int = 1,
) -> List[hyperparams.Params]:
  """K balanced `SequentialLayer` cells; logs the balance if verbose.

  The Lingvo-compatible entry point: see `PartitionWithReport` for the
  arguments. Use the result as `PipeliningLayer.Params().Set(cell_tpl=...)`.
  """
  cells, report = PartitionWithReport(
      layers, num_partitions, cost=cost, input_shapes=input_shapes,
      num_micro_batches=num_micro_batches, dtype=dtype,
      num_timing_runs=num_timing_runs, schedule_name=schedule_name,
      num_virtual_stages=num_virtual_stages)
  if verbose:
    logging.info('%s', report)
  return cells
