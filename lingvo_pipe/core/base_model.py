"""BaseTask: a model's layers, its loss, and the training step around it.

A task subclasses `BaseTask`, builds its layers in `__init__` and defines

  ComputePredictions(theta, input_batch) -> NestedMap
  ComputeLoss(theta, predictions, input_batch) -> (metrics, per_example)

where `metrics` maps names to (value, weight) scalar pairs and has 'loss'.
The trainer stays thin: it calls `CreateTrainState()` once, eagerly, then
runs `TrainStep` / `EvalStep` inside its own `tf.function(autograph=False)`.
One training step (all of it inside the trainer's tf.function):

  step = global_step
  batch.example_keys = dropout.ExampleKeys(step, batch_size)  # if missing
  metrics = FProp(theta, batch)                    # training mode
    (or, when OnePassTraining gives a plan, its pipeline's FPropWithLoss:
     the layers before the pipeline, then the pipeline in its schedule's
     order, each micro-batch's loss computed as its forward ends)
  grads = d metrics.loss[0] / d trainable vars
    (R = train.num_replicas > 1: data parallelism, see `replicas.py`:
     replica r runs on its slice of the batch, on its own devices and its
     own copy of every pipeline's variables; each stage's gradient is
     all-reduced over the copies as its backwards end, other variables'
     gradients are summed on their device; every copy is updated alike)
  grad_norm = global_norm(grads)                   # before clipping
  if clip > 0: grads *= clip / max(grad_norm, clip)
  lr = train.learning_rate * lr_schedule.Value(step)
  if loss and grad_norm are finite:
    optimizer.Apply(lr, grads)                     # each on its var's device
    var -= lr * weight_decay * var_before_step     # decoupled, if > 0
    ema = ema_decay * ema + (1 - ema_decay) * var  # new var, if > 0
    UpdateStats(); global_step += 1
  else:                                            # nothing changes...
    statistics accumulators are zeroed            # ...the batch is dropped

Variables without a gradient (None) are left alone. Train/eval mode is a
Python flag read while tracing: `TrainStep` traces in training mode and
`EvalStep` / `DecodeStep` in eval mode, whatever the flag was before (it is
restored afterwards). With ema_decay > 0, eval and decode read the EMA
shadows by default.

A pipelined task trains in one pass by defining `OnePassTraining(theta,
batch)`: the network (a PipeliningLayer), its inputs for the whole batch,
and a loss head that maps the network's outputs of one micro-batch to
ComputeLoss's metrics. Without it, the step differentiates FProp: every
forward, then every backward, which only GPipe's schedule allows.

The trainer splits the CPU into logical devices before building any layer,
so `NumDevicesNeeded(task_params)` works from params alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional
from typing import Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import dropout
from lingvo_pipe.core import ema as ema_lib
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import optimizer
from lingvo_pipe.core import replicas
from lingvo_pipe.core.schedules import registry
from lingvo_pipe.core.nested_map import NestedMap

Metrics = Mapping[str, Tuple[Any, Any]]
_TRAIN_OUTPUTS = ('learning_rate', 'grad_norm', 'is_finite', 'global_step')


@dataclasses.dataclass
class OnePass:
  """How a task's training step runs its pipeline in one pass.

  `network` is the PipeliningLayer, `theta` its theta and `inputs` its
  inputs for the whole batch (computed by the task from its theta, under
  the step's tape, so layers before the pipeline get their gradients).
  `head(head_theta, outputs, head_batch)` maps the network's outputs of
  one micro-batch, and that micro-batch's slice of `head_batch` (a nest,
  batch on axis 0; scalars whole), to ComputeLoss's metrics; it runs on
  the pipeline's last device and reads only `head_theta` (the variables
  of the layers after the pipeline, e.g. a tied softmax). `loss_weight`:
  the whole batch's weight of the 'loss' metric (example or token count),
  known before the first forward.
  """
  network: Any
  theta: NestedMap
  inputs: Any
  head: Callable[[NestedMap, Any, NestedMap], Metrics]
  head_theta: NestedMap
  head_batch: NestedMap
  loss_weight: Any


def NumDevicesNeeded(task_params: Any) -> int:
  """Replicas x the largest number of pipeline partitions in the params.

  Every pipeline `PipelineParams` finds (a Params whose `cell_tpl` is a
  non-empty list of Params) needs len(cell_tpl) / V devices per replica;
  the replicas are `train.num_replicas` of the task params (1 if it has
  none). At least 1.
  """
  per_replica = [_DevicesPerReplica(dict(p.IterParams()))
                 for _, p in PipelineParams(task_params)]
  return max([1] + per_replica) * NumReplicas(task_params)


def NumReplicas(task_params: Any) -> int:
  """`train.num_replicas` of task params, 1 if they do not define it."""
  train = (task_params.Get('train') if isinstance(
      task_params, hyperparams.Params) and 'train' in task_params else None)
  if isinstance(train, hyperparams.Params) and 'num_replicas' in train:
    return int(train.num_replicas)
  return 1


def _IsPipeline(fields: Mapping[str, Any]) -> bool:
  """Whether Params fields are a PipeliningLayer's: a non-empty list of
  Params in `cell_tpl`."""
  cells = fields.get('cell_tpl')
  return (isinstance(cells, (list, tuple, hyperparams.FrozenList)) and
          bool(cells) and
          all(isinstance(c, hyperparams.Params) for c in cells))


def _DevicesPerReplica(fields: Mapping[str, Any]) -> int:
  """K of a PipeliningLayer's fields, as its schedule counts it
  (len(cell_tpl) / V, or a table file's own K)."""
  return registry.Lookup(fields.get('schedule', 'gpipe')).NumDevices(
      len(fields['cell_tpl']), max(1, int(fields.get('num_virtual_stages',
                                                     1))))


def PipelineParams(task_params: Any, path: str = 'task'
                   ) -> List[Tuple[str, hyperparams.Params]]:
  """[(path, params)] of every PipeliningLayer in the params, in order.

  Walks nested Params, lists, tuples and dicts.
  Paths are dotted from `path`, as --model_params_override names them
  (a list's or dict's entry in brackets).
  """
  found = []
  if isinstance(task_params, hyperparams.Params):
    fields = dict(task_params.IterParams())
    if _IsPipeline(fields):
      found.append((path, task_params))
    for name, value in fields.items():
      found += PipelineParams(value, f'{path}.{name}')
  elif isinstance(task_params, (list, tuple, hyperparams.FrozenList)):
    for i, value in enumerate(task_params):
      found += PipelineParams(value, f'{path}[{i}]')
  elif isinstance(task_params, Mapping):
    for key, value in task_params.items():
      found += PipelineParams(value, f'{path}[{key!r}]')
  return found


def PlacePipelines(params: Any, device_names: List[str],
                   replicas: Optional[int] = None) -> int:
  """Sets `devices` of every pipeline params (`PipelineParams`) that has
  none, e.g. to the devices of a cluster's tasks (`cluster.Connect`).

  Replica r's pipeline device d goes to device r * K + d, K the devices
  its schedule runs on (len(cell_tpl) / V; the layer places each stage on
  one of them, `PipeliningLayer.placement`); `replicas` defaults to the
  task params' train.num_replicas, 1 if none. Returns how many pipelines
  were placed. A pipeline needing more devices than there are is an
  error naming both
  numbers.
  """
  if replicas is None:
    replicas = NumReplicas(params)
  placed = 0
  for _, pipeline in PipelineParams(params):
    if 'devices' not in pipeline or pipeline.devices is not None:
      continue
    k = _DevicesPerReplica(dict(pipeline.IterParams()))
    if k * replicas > len(device_names):
      raise ValueError(
          f'A pipeline has {k} partitions x {replicas} replica(s) = '
          f'{k * replicas} tasks but the cluster has '
          f'{len(device_names)}; add worker tasks or use fewer '
          'partitions or replicas.')
    pipeline.devices = list(device_names[:k * replicas])
    placed += 1
  return placed


class AverageMetric:
  """Weighted mean of scalars: Update(value, weight), then `value`."""

  def __init__(self) -> None:
    self.total = 0.0
    self.total_weight = 0.0

  def Update(self, value: float, weight: float = 1.0) -> None:
    self.total += float(value) * float(weight)
    self.total_weight += float(weight)

  @property
  def value(self) -> float:
    return self.total / self.total_weight if self.total_weight else 0.0


def _TrainParams() -> hyperparams.Params:
  p = hyperparams.Params()
  p.Define('optimizer', optimizer.Adam.Params(), 'Optimizer params.')
  p.Define('learning_rate', 1e-3, 'Base learning rate.')
  p.Define('lr_schedule', lr_schedule.Constant.Params(),
           'Schedule params; lr = learning_rate * schedule.Value(step).')
  p.Define('clip_gradient_norm_to_value', 0.0,
           'Clip gradients to this global norm; 0 = off.')
  p.Define('weight_decay', 0.0,
           'Decoupled weight decay: var -= lr * weight_decay * var on '
           'trainable vars; 0 = off.')
  p.Define('ema_decay', 0.0,
           'Keep ema = d * ema + (1 - d) * var of trainable vars; 0 = off.')
  p.Define('num_replicas', 1,
           'R, data-parallel replicas of the model: replica r takes slice '
           'r of the batch (batch / R examples) and runs each pipeline on '
           'its devices r * K .. r * K + K - 1 with its own copy of the '
           "pipeline's variables and num_micro_batches / R micro-batches "
           '(the size one replica would run: M must be a multiple of R); '
           'gradients are all-reduced across the copies. The batch size '
           'must be a multiple of R.')
  p.Define('max_steps', 1000, 'Train until global_step reaches this.')
  p.Define('save_interval_steps', 1000, 'Steps between checkpoints.')
  p.Define('summary_interval_steps', 100, 'Steps between summaries.')
  p.Define('eval_interval_steps', 1000, 'Steps between evaluations.')
  p.Define('eval_steps', 10, 'Batches per evaluation.')
  p.Define('checkpoints_to_keep', 5, 'Newest checkpoints kept on disk.')
  p.Define('init_from_checkpoint_rules', {},
           'Start a fresh run (never a resumed one) from other checkpoints '
           '(transfer learning): {checkpoint path: ([(regex, format), '
           '...], [ignore regex, ...])}. A model variable whose name (as '
           'in our checkpoints, e.g. task/network/...) matches a regex '
           '(re.match) takes the checkpoint variable named format % '
           'groups, if its shape is the same; ignored, unmatched and '
           'other-shaped variables keep their initial values. The trainer '
           'prints what was loaded and what was not.')
  p.Define('checkpoint_input', True,
           "Save the train input's position (tf.data iterator, shuffle "
           'buffer included) with each checkpoint, so a resumed run reads '
           'on where it stopped. Checkpoints grow by about the shuffle '
           'buffer (image.synthetic.ResNetTinyGPipe: 34 MB instead of 1 '
           'MB); False: variables only, a resumed run starts the input '
           'over.')
  p.Define('one_trace_for_buckets', True,
           'With length buckets (MTInput.bucket_upper_bound): trace the '
           'train and eval steps once for every bucket (batch and time '
           'axes unknown), so start-up costs about one first step; False: '
           "trace each bucket's shape at its first step, which costs that "
           'again per bucket but ran the pipelined steps about 12% '
           'faster (bench/mt_buckets): for long runs.')
  return p


class BaseTask(base_layer.BaseLayer):
  """A model with a loss; the base of every task (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.name = 'task'
    p.Define('input', None,
             'Input generator params (the model registry sets them).')
    p.Define('train', _TrainParams(), 'Training params.')
    eval_p = hyperparams.Params()
    eval_p.Define('samples_per_summary', 1000,
                  'Examples per evaluation summary.')
    p.Define('eval', eval_p, 'Evaluation params.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    tp = self.params.train
    where = f"{type(self).__name__} '{self.path}'"
    for key in ('learning_rate', 'clip_gradient_norm_to_value',
                'weight_decay'):
      if tp.Get(key) < 0:
        raise ValueError(f'{where}: train.{key}={tp.Get(key)} must be >= 0.')
    if not isinstance(tp.num_replicas, int) or tp.num_replicas < 1:
      raise ValueError(
          f'{where}: train.num_replicas={tp.num_replicas!r} must be an '
          'integer >= 1.')
    if not 0.0 <= tp.ema_decay < 1.0:
      raise ValueError(
          f'{where}: train.ema_decay={tp.ema_decay} must be in [0, 1).')
    self._optimizer = tp.optimizer.Instantiate()
    self._lr_schedule = tp.lr_schedule.Instantiate()
    self._train_state: Optional[NestedMap] = None

  # ---- what subclasses define -------------------------------------------

  def ComputePredictions(self, theta: NestedMap,
                         input_batch: NestedMap) -> NestedMap:
    raise NotImplementedError(
        f'{type(self).__name__} must implement ComputePredictions(theta, '
        'input_batch).')

  def ComputeLoss(self, theta: NestedMap, predictions: NestedMap,
                  input_batch: NestedMap) -> Tuple[Metrics, NestedMap]:
    raise NotImplementedError(
        f'{type(self).__name__} must implement ComputeLoss(theta, '
        "predictions, input_batch) -> (metrics with 'loss', per_example).")

  def FProp(self, theta: NestedMap,
            input_batch: NestedMap) -> Tuple[Metrics, NestedMap]:
    """ComputePredictions, then ComputeLoss: (metrics, per_example)."""
    predictions = self.ComputePredictions(theta, input_batch)
    return self.ComputeLoss(theta, predictions, input_batch)

  def OnePassTraining(self, theta: NestedMap,
                      input_batch: NestedMap) -> Optional[OnePass]:
    """How the training step runs the task's pipeline in one pass (OnePass),
    or None: the step then differentiates FProp, which needs GPipe's order.

    Called in training mode inside the step, with the batch FProp would
    get; it must compute the layers before the pipeline (they are part of
    the step) and no more.
    """
    del theta, input_batch
    return None

  def Decode(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
    raise NotImplementedError(
        f'{type(self).__name__} has no Decode(theta, input_batch); '
        'implement it to run the decoder.')

  def CreateDecoderMetrics(self) -> Dict[str, Any]:
    """{name: metric with Update(value, weight) and .value}; default {}."""
    return {}

  def PostProcessDecodeOut(self, decode_out: Dict[str, Any],
                           metrics: Dict[str, Any]) -> None:
    """Updates `metrics` from one batch of Decode output (numpy)."""
    del decode_out, metrics

  def DecodeFinalize(self, metrics: Dict[str, Any],
                     path_prefix: str) -> Optional[str]:
    """After a decoding pass: write what was decoded to files starting with
    path_prefix (in the logdir) and return one line for the console, or
    None. The default writes nothing."""
    del metrics, path_prefix
    return None

  @classmethod
  def NumDevicesNeededFromParams(cls, task_params: hyperparams.Params) -> int:
    return NumDevicesNeeded(task_params)

  def NumDevicesNeeded(self) -> int:
    """Devices this task's pipelines need (max partitions, at least 1)."""
    return NumDevicesNeeded(self.params)

  # ---- state --------------------------------------------------------------

  def _TrainableVariables(self) -> List[Tuple[str, tf.Variable]]:
    return sorted((path, v) for path, v in self.VariablesByPath().items()
                  if v.trainable)

  def CreateTrainState(self) -> NestedMap:
    """Creates the optimizer slots, global_step and EMA shadows, eagerly.

    Each slot and shadow is on its variable's device; global_step (int64)
    on the current device. Idempotent: returns the existing state.

    Returns:
      NestedMap(optimizer, lr_schedule, global_step, ema, mirrors,
      mirror_optimizers): ema is an ema.ExponentialMovingAverage of the
      trainable vars, or None if train.ema_decay is 0; with R =
      train.num_replicas > 1, mirrors are replicas 1 .. R-1's copies of
      the pipelines' variables (replicas.Mirrors), updated by
      mirror_optimizers[r - 1], else None and [].
    """
    if self._train_state is not None:
      return self._train_state
    if not tf.executing_eagerly():
      raise RuntimeError(
          f"Task '{self.path}': CreateTrainState must run eagerly, before "
          'tracing the train step.')
    trainable = dict(self._TrainableVariables())
    self._optimizer.CreateSlots(trainable)
    ema = None
    if self.params.train.ema_decay > 0:
      ema = ema_lib.ExponentialMovingAverage(self.params.train.ema_decay)
      ema.CreateShadows(trainable)
    mirrors, mirror_optimizers = None, []
    num_replicas = self.params.train.num_replicas
    if num_replicas > 1:
      mirrors = replicas.Mirrors(self, num_replicas)
      for r in range(1, num_replicas):
        mirror_optimizers.append(self.params.train.optimizer.Instantiate())
        mirror_optimizers[-1].CreateSlots(mirrors.CopiesByPath(r))
    self._train_state = NestedMap(
        optimizer=self._optimizer, lr_schedule=self._lr_schedule,
        global_step=tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                name='global_step'),
        ema=ema, mirrors=mirrors, mirror_optimizers=mirror_optimizers)
    return self._train_state

  def SyncMirrors(self) -> None:
    """Sets replicas 1 .. R-1's copies of the pipelines' variables, and
    their optimizer slots, from replica 0's (after a restore). Eager."""
    state = self._train_state
    if state is None or state.mirrors is None:
      return
    state.mirrors.Sync()
    slots = state.optimizer.SlotVariables()
    for opt in state.mirror_optimizers:
      for name, var in opt.SlotVariables().items():
        var.assign(slots[name].read_value())

  @property
  def train_state(self) -> Optional[NestedMap]:
    """What CreateTrainState made, or None before it ran."""
    return self._train_state

  def _State(self, caller: str) -> NestedMap:
    if self._train_state is None:
      raise RuntimeError(
          f"Task '{self.path}': call CreateTrainState() eagerly before "
          f'{caller}.')
    return self._train_state

  def VariablesToCheckpoint(self) -> Dict[str, tf.Variable]:
    """{name: variable}: model vars by path, slots, global_step, EMA.

    Slots are '<var path>/<slot>', EMA shadows '<var path>/ema'; before
    CreateTrainState only the model's variables.
    """
    out = dict(self.VariablesByPath())
    extra = {}
    if self._train_state is not None:
      state = self._train_state
      extra.update(state.optimizer.SlotVariables())
      extra['global_step'] = state.global_step
      if state.ema is not None:
        extra.update({f'{path}/ema': v
                      for path, v in state.ema.shadows.items()})
    for name, var in extra.items():
      if name in out:
        raise ValueError(
            f"Task '{self.path}': checkpoint name {name!r} is used twice; "
            'rename the layer or variable that clashes with it.')
      out[name] = var
    return out

  def EvalTheta(self, use_ema: Optional[bool] = None) -> NestedMap:
    """theta, with EMA shadows for trainable vars if `use_ema`.

    use_ema=None means: if train.ema_decay > 0 and the state exists.
    """
    ema = self._train_state.ema if self._train_state is not None else None
    if use_ema is None:
      use_ema = ema is not None
    if not use_ema:
      return self.theta
    if ema is None:
      raise ValueError(
          f"Task '{self.path}': use_ema=True needs train.ema_decay > 0 and "
          'CreateTrainState().')
    return ema.Substitute(self.theta)

  # ---- steps ---------------------------------------------------------------

  @contextlib.contextmanager
  def _Mode(self, training: bool) -> Iterator[None]:
    saved = [(layer, layer.training) for layer in self.Layers()]
    self.SetTraining(training)
    try:
      yield
    finally:
      for layer, value in saved:
        layer.training = value

  def _WithExampleKeys(self, input_batch: NestedMap,
                       step: Any) -> NestedMap:
    batch = NestedMap(input_batch)
    if 'example_keys' in batch:
      return batch
    for leaf in tf.nest.flatten(batch):
      leaf = tf.convert_to_tensor(leaf)
      if leaf.shape.rank:
        size = leaf.shape[0]
        if size is None:
          size = tf.shape(leaf, out_type=tf.int64)[0]
        batch.example_keys = dropout.ExampleKeys(
            step, size, seed=self.params.random_seed)
        return batch
    raise ValueError(
        f"Task '{self.path}': the input batch has no tensor with a batch "
        'axis; cannot make example_keys.')

  def _CheckMetrics(self, metrics: Metrics) -> NestedMap:
    if not isinstance(metrics, Mapping) or 'loss' not in metrics:
      raise ValueError(
          f"{type(self).__name__}.ComputeLoss must return metrics with a "
          f"'loss' entry, got {metrics!r}.")
    out = NestedMap()
    for name, pair in metrics.items():
      if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(
            f'{type(self).__name__}.ComputeLoss: metric {name!r} must be a '
            f'(value, weight) pair, got {pair!r}.')
      out[name] = (tf.convert_to_tensor(pair[0]),
                   tf.convert_to_tensor(pair[1]))
    return out

  def TrainStep(self, input_batch: NestedMap) -> NestedMap:
    """One training step (module docstring); call inside a tf.function.

    Returns:
      NestedMap of scalars: each metric's value, learning_rate (float32,
      used at this step), grad_norm (before clipping), is_finite (bool:
      False means nothing was updated) and global_step (after the step).
    """
    state = self._State('TrainStep')
    tp = self.params.train
    with self._Mode(training=True):
      step = state.global_step.read_value()
      batch = self._WithExampleKeys(input_batch, step)
      variables = [v for _, v in self._TrainableVariables()]
      metrics, grads, copies = self._LossAndGradients(batch, variables)
    loss = metrics.loss[0]
    grads, grad_norm, scale = _ClipByGlobalNorm(
        grads, variables, tp.clip_gradient_norm_to_value)
    # Every copy's gradient is its variable's, so one norm and one scale.
    copies = [[(_Scale(g, scale, c), c) for g, c in pairs]
              for pairs in copies]
    lr = tf.constant(tp.learning_rate, tf.float32) * self._lr_schedule.Value(
        step)
    is_finite = tf.logical_and(tf.reduce_all(tf.math.is_finite(loss)),
                               tf.math.is_finite(grad_norm))
    done = tf.cond(
        is_finite,
        lambda: self._ApplyUpdates(state, lr, grads, variables, is_finite,
                                   copies),
        lambda: self._DropStats(is_finite))
    out = NestedMap({name: pair[0] for name, pair in metrics.items()})
    out.learning_rate = lr
    out.grad_norm = grad_norm
    out.is_finite = done
    with tf.control_dependencies([done]):
      out.global_step = state.global_step.read_value()
    return out

  def _TrainFProp(self, thetas: List[NestedMap], batches: List[NestedMap]
                  ) -> NestedMap:
    """Training metrics of R replicas (one per theta and batch slice): one
    pass if the task has a plan, else FProp. Each replica runs with
    SetReplica(r, R); with one pass, each replica's loss is divided by the
    whole batch's weight and the replicas' losses add up."""
    num = len(thetas)

    @contextlib.contextmanager
    def Replica(r: int) -> Iterator[None]:
      self.SetReplica(r, num)
      try:
        if num == 1:
          yield
        else:
          with tf.name_scope(f'replica_{r}'):
            yield
      finally:
        self.SetReplica(0, 1)

    plans = []
    for r, (theta, batch) in enumerate(zip(thetas, batches)):
      with Replica(r):
        plans.append(self.OnePassTraining(theta, batch))
    per = []
    if any(plan is None for plan in plans):
      self._CheckGPipeOnly()
      for r, (theta, batch) in enumerate(zip(thetas, batches)):
        with Replica(r):
          per.append(self._Checked(self.FProp(theta, batch)[0]))
      return per[0] if num == 1 else replicas.CombineMetrics(per)
    total = plans[0].loss_weight
    if num > 1:
      total = tf.add_n([tf.cast(p.loss_weight, tf.float64) for p in plans])
    for r, plan in enumerate(plans):
      with Replica(r):
        per.append(self._Checked(plan.network.FPropWithLoss(
            plan.theta, plan.inputs, plan.head, plan.head_theta,
            plan.head_batch, plan.loss_weight, normaliser=total)))
    return (per[0] if num == 1 else
            replicas.CombineMetrics(per, summed=('loss',)))

  def _CheckGPipeOnly(self) -> None:
    for layer in self.Layers():
      name = getattr(layer.params, 'schedule', None)
      if 'cell_tpl' in layer.params and name not in (None, 'gpipe'):
        raise ValueError(
            f"{type(self).__name__}: pipeline '{layer.path}' has schedule "
            f"{name!r}, which trains in one pass; define OnePassTraining("
            "theta, batch) in the task (base_model.OnePass), or use "
            "schedule 'gpipe'.")

  def _Checked(self, metrics: Metrics) -> NestedMap:
    metrics = self._CheckMetrics(metrics)
    clash = [k for k in _TRAIN_OUTPUTS if k in metrics]
    if clash:
      raise ValueError(
          f'{type(self).__name__}.ComputeLoss: metric names {clash} are '
          'reserved for TrainStep outputs; rename them.')
    return metrics

  def _LossAndGradients(
      self, batch: NestedMap, variables: List[tf.Variable]
  ) -> Tuple[NestedMap, List[Any], List[List[Tuple[Any, tf.Variable]]]]:
    """(metrics, d loss / d each variable, [[(gradient, copy)] of replica
    r's copies, r = 1 .. R-1]), over train.num_replicas (replicas.py)."""
    num_replicas = self.params.train.num_replicas
    if num_replicas == 1:
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(variables)
        metrics = self._TrainFProp([self.theta], [batch])
      return metrics, tape.gradient(metrics.loss[0], variables), []
    mirrors = self._State('a step of train.num_replicas > 1').mirrors
    slices = replicas.SplitBatch(batch, num_replicas, f"Task '{self.path}'")
    watched, thetas = [], []
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      for r in range(num_replicas):
        theta, reads = replicas.ReadAll(mirrors.Substitute(self.theta, r))
        mine = [reads.get(id(mirrors.Copy(v, r))) for v in variables]
        tape.watch([t for t in mine if t is not None])
        watched.append(mine)
        thetas.append(theta)
      metrics = self._TrainFProp(thetas, slices)
    flat = [t for mine in watched for t in mine if t is not None]
    grads = iter(tape.gradient(metrics.loss[0], flat))
    per_replica = [[None if t is None else next(grads) for t in mine]
                   for mine in watched]
    # A mirrored variable's copies each hold the all-reduced gradient;
    # the others' gradients are summed over the replicas.
    single = [v not in mirrors for v in variables]
    summed = replicas.SumGradients(
        [[g if one else None for g, one in zip(grads_r, single)]
         for grads_r in per_replica], variables)
    out = [g_sum if one else g_0 for g_sum, g_0, one in
           zip(summed, per_replica[0], single)]
    copies = [[(g, mirrors.Copy(v, r)) for g, v, one in
               zip(per_replica[r], variables, single)
               if not one and g is not None]
              for r in range(1, num_replicas)]
    return metrics, out, copies

  def Gradients(self, input_batch: NestedMap
                ) -> Tuple[NestedMap, Dict[str, Any]]:
    """(metrics, {path: d loss / d var}) of one training step, no update.

    What TrainStep computes before clipping (training mode, example keys
    of the current step, every replica); statistics accumulators are left
    as they were. Call inside a tf.function.
    """
    step = self._StepOrZero()
    with self._Mode(training=True), self.NoStatUpdates():
      batch = self._WithExampleKeys(input_batch, step)
      named = self._TrainableVariables()
      metrics, grads, copies = self._LossAndGradients(
          batch, [v for _, v in named])
      # The copies' all-reduces must run for replica 0's to end.
      with tf.control_dependencies([g for pairs in copies for g, _ in pairs]):
        grads = [None if g is None else tf.identity(g) for g in grads]
    return metrics, {path: g for (path, _), g in zip(named, grads)}

  def _ApplyUpdates(self, state: NestedMap, lr: tf.Tensor,
                    grads: List[Any],
                    variables: List[tf.Variable],
                    is_finite: tf.Tensor,
                    copies: List[List[Tuple[Any, tf.Variable]]]
                    ) -> tf.Tensor:
    tp = self.params.train
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    decays = []
    if tp.weight_decay > 0:
      for _, var in pairs + [p for pairs_r in copies for p in pairs_r]:
        with tf.device(var.device):
          scale = tf.cast(lr, var.dtype) * tf.constant(tp.weight_decay,
                                                       var.dtype)
          decays.append((var, scale * var.read_value()))
    ops = state.optimizer.Apply(lr, pairs)
    for opt, pairs_r in zip(state.mirror_optimizers, copies):
      ops += opt.Apply(lr, pairs_r)
    with tf.control_dependencies(ops):
      for var, delta in decays:
        with tf.device(var.device):
          ops.append(var.assign_sub(delta, read_value=False))
    if state.ema is not None:
      with tf.control_dependencies(ops):
        ops += state.ema.Update()
    ops += self.UpdateStats()
    ops.append(state.global_step.assign_add(1, read_value=False))
    with tf.control_dependencies(ops):
      return tf.identity(is_finite)

  def _DropStats(self, is_finite: tf.Tensor) -> tf.Tensor:
    ops = [a.assign(tf.zeros_like(a), read_value=False)
           for a in self.accumulators.Flatten()]
    with tf.control_dependencies(ops):
      return tf.identity(is_finite)

  def EvalStep(self, input_batch: NestedMap,
               use_ema: Optional[bool] = None) -> NestedMap:
    """Metrics {name: (value, weight)} in eval mode (see EvalTheta)."""
    with self._Mode(training=False), self.NoStatUpdates():
      batch = self._WithExampleKeys(input_batch, self._StepOrZero())
      metrics, _ = self.FProp(self.EvalTheta(use_ema), batch)
      return self._CheckMetrics(metrics)

  def DecodeStep(self, input_batch: NestedMap,
                 use_ema: Optional[bool] = None) -> NestedMap:
    """Decode(theta, input_batch) in eval mode (see EvalTheta)."""
    with self._Mode(training=False), self.NoStatUpdates():
      batch = self._WithExampleKeys(input_batch, self._StepOrZero())
      return self.Decode(self.EvalTheta(use_ema), batch)

  def _StepOrZero(self) -> tf.Tensor:
    if self._train_state is None:
      return tf.constant(0, tf.int64)
    return self._train_state.global_step.read_value()


def _Scale(grad: Any, scale: Optional[tf.Tensor], var: tf.Variable) -> Any:
  """grad * scale on var's device; grad itself if scale is None."""
  if scale is None:
    return grad
  with tf.device(var.device):
    return tf.convert_to_tensor(grad) * tf.cast(scale, grad.dtype)


def _ClipByGlobalNorm(grads: List[Any], variables: List[tf.Variable],
                      clip_norm: float
                      ) -> Tuple[List[Any], tf.Tensor, Optional[tf.Tensor]]:
  """Dense grads, scaled by clip / max(norm, clip) if clip > 0; the norm;
  the scale (None without clipping).

  Each gradient's square sum and scaling run on its variable's device. The
  norm is float64 if any gradient is, else float32.
  """
  dense, squares = [], []
  wide = any(g is not None and g.dtype == tf.float64 for g in grads)
  norm_dtype = tf.float64 if wide else tf.float32
  for g, v in zip(grads, variables):
    if g is not None:
      with tf.device(v.device):
        g = tf.convert_to_tensor(g)
        squares.append(tf.cast(tf.reduce_sum(tf.square(g)), norm_dtype))
    dense.append(g)
  norm = tf.sqrt(tf.add_n(squares)) if squares else tf.zeros([], norm_dtype)
  if clip_norm <= 0:
    return dense, norm, None
  clip = tf.constant(clip_norm, norm_dtype)
  scale = clip / tf.maximum(norm, clip)
  clipped = [None if g is None else _Scale(g, scale, v)
             for g, v in zip(dense, variables)]
  return clipped, norm, scale

