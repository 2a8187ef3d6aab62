"""Builds a task once; trains, evaluates and decodes it (the trainer's
jobs, lingvo_pipe/trainer.py).

Training resumes from the newest checkpoint in `<logdir>/train`, with the
input's position; a stop signal ends it at a step boundary with that
step's checkpoint (core/interrupts.py); evaluators and decoders follow the
trainer's checkpoints.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from absl import logging

from lingvo_pipe.core import interrupts


class TrainingStopped(Exception):
  """Training cannot go on; the message says why and what to change."""


class Preempted(Exception):
  """A stop signal ended training at a step boundary, its checkpoint
  written; the message says so in one line."""


class Runner:
  """Builds the task once; trains, evaluates and decodes it."""

  def __init__(self, model_params: Any, logdir: str,
               follower_timeout_secs: float = 600.0):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import checkpointer  # pylint: disable=g-import-not-at-top
    self._tf = tf
    self._p = model_params
    self._logdir = logdir
    self._follower_timeout_secs = follower_timeout_secs
    self._task = model_params.task.Instantiate()
    self._state = self._task.CreateTrainState()
    self._ckpt = checkpointer.Checkpointer(
        os.path.join(logdir, 'train'), self._task.VariablesToCheckpoint(),
        max_to_keep=model_params.task.train.checkpoints_to_keep)
    self._functions: Dict[str, Callable[..., Any]] = {}
    self._writers: Dict[str, Any] = {}
    self._trace: Optional[Any] = None  # TracePipeline's StepTrace

  @property
  def task(self) -> Any:
    return self._task

  def _InitFromRules(self, rules: Any) -> str:
    """Applies init_from_checkpoint_rules to a fresh model; the report."""
    from lingvo_pipe.core import checkpointer  # pylint: disable=g-import-not-at-top
    variables = self._task.VariablesByPath()
    report = checkpointer.InitFromCheckpointRules(variables, rules)
    ema = self._state.ema
    if ema is not None:  # shadows start from the loaded values
      for path, shadow in ema.shadows.items():
        shadow.assign(variables[path])
    return report

  def ParameterLine(self) -> str:
    """'Model: N trainable parameters (bytes)'; per partition: Describe."""
    from lingvo_pipe.core import partitioner  # pylint: disable=g-import-not-at-top
    variables = [v for v in self._task.vars.Flatten() if v.trainable]
    count = sum(int(v.shape.num_elements()) for v in variables)
    size = sum(int(v.shape.num_elements()) * v.dtype.size for v in variables)
    return (f'Model: {count:,} trainable parameters '
            f'({partitioner.Bytes(size)}).')

  def _Function(self, name: str, fn: Callable[..., Any],
                spec: Optional[Any] = None) -> Callable[..., Any]:
    """`fn` as a tf.function; with `spec` (base_input_generator.StepSpec)
    traced once for every batch that fits it."""
    if name not in self._functions:
      self._functions[name] = self._tf.function(
          fn, autograph=False,
          input_signature=None if spec is None else [spec])
    return self._functions[name]

  def _Writer(self, name: str) -> Any:
    if name not in self._writers:
      self._writers[name] = self._tf.summary.create_file_writer(
          os.path.join(self._logdir, name))
    return self._writers[name]

  def _Dataset(self, dataset: str) -> Optional[Any]:
    """The tf.data.Dataset of `<dataset>_input`; None if there is none."""
    input_p = self._p.Get(f'{dataset}_input')
    if input_p is None:
      return None
    return input_p.Instantiate().GetDataset()

  def _Batches(self, dataset: str) -> Tuple[Optional[Iterator[Any]], Any]:
    """(An iterator over `<dataset>_input`'s batches, or None if there
    is none; _StepSpec of it)."""
    data = self._Dataset(dataset)
    if data is None:
      return None, None
    return iter(data), self._StepSpec(dataset, data)

  def _StepSpec(self, dataset: str, data: Any) -> Optional[Any]:
    """base_input_generator.StepSpec of `<dataset>_input`, unless
    task.train.one_trace_for_buckets is off."""
    from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
    if not self._p.task.train.one_trace_for_buckets:
      return None
    return base_input_generator.StepSpec(self._p.Get(f'{dataset}_input'),
                                         data)

  def _Pipelines(self) -> List[Any]:
    """The task's PipeliningLayers."""
    from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
    return [layer for layer in self._task.Layers()
            if isinstance(layer, gpipe.PipeliningLayer)]

  def Balance(self, layer: Any) -> str:
    """`layer.Describe` for one replica's train batch: the balance report."""
    replicas = self._p.task.train.num_replicas
    return layer.Describe(self._p.train_input.batch_size // replicas,
                          replicas)

  def WriteTimelines(self) -> List[str]:
    """pipeline_<layer>.svg in the logdir for each PipeliningLayer."""
    from lingvo_pipe.core import timeline  # pylint: disable=g-import-not-at-top
    replicas = self._p.task.train.num_replicas
    batch_size = self._p.train_input.batch_size // replicas
    written = []
    for layer in self._Pipelines():
      svg = timeline.ScheduleSvg(
          layer.Table(layer.NumMicroBatches(batch_size, replicas)),
          layer.devices,
          layer.path)
      path = os.path.join(
          self._logdir, f"pipeline_{layer.path.replace('/', '.')}.svg")
      with open(path, 'w', encoding='utf-8') as f:
        f.write(svg)
      print(self.Balance(layer), flush=True)
      written.append(path)
    return written

  def _WriteScalars(self, writer_name: str, step: int,
                    values: Dict[str, float]) -> None:
    from lingvo_pipe.core import summary  # pylint: disable=g-import-not-at-top
    with self._Writer(writer_name).as_default():
      for name, value in values.items():
        summary.Scalar(name, value, step)
    self._Writer(writer_name).flush()

  def _SummarizeStart(self, step: int) -> None:
    """At the step training starts from, as text: the params and each
    pipeline's balance; the measured timeline (TracePipeline) as a PNG."""
    from lingvo_pipe.core import summary  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import timeline_png  # pylint: disable=g-import-not-at-top
    with self._Writer('train').as_default():
      summary.Text('params.txt', self._p.ToText(), step,
                   'The final params, as in params.txt.')
      for layer in self._Pipelines():
        summary.Text(f'balance/{layer.path}', self.Balance(layer), step,
                     'Devices, micro-batches, schedule, bubble and '
                     'parameters per partition.')
      if self._trace is not None:
        summary.Image('pipeline_trace',
                      timeline_png.SvgPng(self._trace.Svg()), step,
                      self._trace.Summary())
    self._Writer('train').flush()

  # ---- training --------------------------------------------------------

  def TracePipeline(self, path: str) -> Tuple[str, str]:
    """Measures one step (step_trace.MeasureStep); writes PATH.json/.svg.

    The batch comes from a fresh copy of the training input, so training
    sees the same batches as without the trace; nothing is updated.
    """
    from lingvo_pipe.core import step_trace  # pylint: disable=g-import-not-at-top
    batch = next(iter(self._Dataset('train')))
    try:
      trace = step_trace.MeasureStep(self._task, batch)
    except ValueError as err:
      raise TrainingStopped(f'--pipeline_trace: {err} Drop the flag, or '
                            'put the model in a PipeliningLayer.') from err
    files = trace.Write(path)
    self._trace = trace  # an image summary when training starts
    print(trace.Summary(), flush=True)
    print(f'Measured timeline: {files[1]} (picture), {files[0]} (Chrome '
          'trace: open in ui.perfetto.dev or chrome://tracing).', flush=True)
    return files

  def Train(self) -> Dict[str, float]:
    """Trains to max_steps (resuming); returns the final Dev metrics."""
    from lingvo_pipe.core import progress  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.core import checkpointer  # pylint: disable=g-import-not-at-top
    tp = self._p.task.train
    dataset = self._Dataset('train')
    if dataset is None:
      raise TrainingStopped('The model has no Train() input; define it.')
    if tp.checkpoint_input:
      # Checkpoints of the trainer then also hold the input's position.
      self._ckpt = checkpointer.Checkpointer(
          self._ckpt.directory, self._task.VariablesToCheckpoint(),
          max_to_keep=tp.checkpoints_to_keep, dataset=dataset)
    try:
      restored = self._ckpt.RestoreLatest()
    except RuntimeError as err:  # checkpoints there, none fits the model
      raise TrainingStopped(str(err)) from None
    batches = self._ckpt.iterator or iter(dataset)
    step = int(self._state.global_step.numpy())
    if restored:
      where = ('input position restored' if self._ckpt.restored_input else
               'no input position restored, so the input starts over')
      print(f'Resumed from {restored} at step {step}; {where}.', flush=True)
    elif tp.init_from_checkpoint_rules:
      print(self._InitFromRules(tp.init_from_checkpoint_rules), flush=True)
    # Replicas' copies of the pipelines' variables start as replica 0's.
    self._task.SyncMirrors()
    self._SummarizeStart(step)
    train_step = self._Function('train', self._task.TrainStep,
                                self._StepSpec('train', dataset))
    bar = progress.Progress(tp.max_steps, start_step=step)
    last_time = time.monotonic()
    with interrupts.Deferred():
      try:
        step = self._TrainLoop(train_step, batches, step, bar, last_time)
      except KeyboardInterrupt:
        if not interrupts.Resumable():
          raise
        # The step in flight finished (or never started): the variables
        # and the input's position are those of the last step counted.
        raise self._SaveOnStop(
            int(self._state.global_step.numpy())) from None
    return self.Evaluate('dev', step)

  def _SaveOnStop(self, step: int) -> Preempted:
    """Writes the checkpoint of `step` (the last one finished) unless it
    is there; the Preempted to raise."""
    paths = self._ckpt.Paths()
    name = f'ckpt-{step}'
    if paths and os.path.basename(paths[0]) == name:
      done = 'kept'
    else:
      self._ckpt.Save(step)
      done = 'written'
    why = f' ({interrupts.Reason()})' if interrupts.Reason() else ''
    return Preempted(f'Preempted at step {step}{why}; checkpoint {name} '
                     f'{done}; run the same command to resume.')

  def _TrainLoop(self, train_step: Callable[..., Any],
                 batches: Iterator[Any], step: int, bar: Any,
                 last_time: float) -> int:
    """Steps from `step` to max_steps; returns the last step's number."""
    from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
    tp = self._p.task.train
    shapes = set()  # of the batches the step function was traced for
    # With length buckets every bucket's first step is noted, else from
    # the second shape on (an input whose shapes vary).
    noted = bool(base_input_generator.Buckets(self._p.train_input))
    dropped = 0
    while step < tp.max_steps:
      interrupts.RaiseIfRequested()
      batch = _Next(batches)
      dropped = max(dropped, _PopDropped(batch))
      shape = _Shape(batch)
      note = (f'first step of a batch of shape {shape[0]}' if
              (shapes or noted) and shape not in shapes else None)
      shapes.add(shape)
      traces = train_step.experimental_get_tracing_count()
      out = {k: v.numpy() for k, v in train_step(batch).items()}
      if not out['is_finite']:
        self._StopOnNonFinite(step, out)
      step = int(out['global_step'])
      now = time.monotonic()
      values = {k: float(v) for k, v in out.items()
                if k not in ('is_finite', 'global_step')}
      batch_size = shape[0][0] if shape[0] else 0
      values['examples_per_sec'] = batch_size / max(now - last_time, 1e-9)
      if note:
        note += f': {now - last_time:.1f} s' + (
            '' if traces == train_step.experimental_get_tracing_count() else
            ', traced once for every bucket' if train_step.input_signature
            else ', traced once')
      last_time = now
      bar.Update(step, batch_size, {'loss': values['loss']}, note=note)
      if step % tp.summary_interval_steps == 0 or step == tp.max_steps:
        if dropped:
          values['input/dropped_long'] = dropped
          logging.info('train input: %d pairs longer than the last length '
                       'bucket dropped so far.', dropped)
        self._WriteScalars('train', step, values)
      if step % tp.save_interval_steps == 0 or step == tp.max_steps:
        self._ckpt.Save(step)
      if (tp.eval_interval_steps and step % tp.eval_interval_steps == 0 and
          step < tp.max_steps):
        self.Evaluate('dev', step)
    return step

  def _StopOnNonFinite(self, step: int, out: Dict[str, Any]) -> None:
    paths = self._ckpt.Paths()
    kept = (f'the last good checkpoint is {paths[0]}' if paths else
            'no checkpoint was written yet')
    raise TrainingStopped(
        f"Training stopped at step {step}: loss {out['loss']}, gradient "
        f"norm {out['grad_norm']} (not finite), so this step changed "
        f'nothing and {kept}. Lower task.train.learning_rate or set '
        'task.train.clip_gradient_norm_to_value.')

  # ---- evaluation and decoding ----------------------------------------

  def Evaluate(self, dataset: str, step: int) -> Dict[str, float]:
    """Weighted means of the task's metrics over eval_steps batches."""
    batches, spec = self._Batches(dataset)
    if batches is None:
      logging.info('No %s input; skipping evaluation.', dataset)
      return {}
    eval_step = self._Function('eval', self._task.EvalStep, spec)
    totals: Dict[str, list] = {}
    for _ in range(self._p.task.train.eval_steps):
      interrupts.RaiseIfRequested()
      batch = _Next(batches, None)
      if batch is None:
        break
      _PopDropped(batch)
      for name, (value, weight) in eval_step(batch).items():
        total = totals.setdefault(name, [0.0, 0.0])
        total[0] += float(value) * float(weight)
        total[1] += float(weight)
    metrics = {name: t[0] / t[1] if t[1] else 0.0
               for name, t in totals.items()}
    self._WriteScalars(f'eval_{dataset}', step, metrics)
    print(f'eval {dataset} at step {step}: ' + '  '.join(
        f'{k} {v:.4f}' for k, v in sorted(metrics.items())), flush=True)
    return metrics

  def Decode(self, dataset: str, step: int) -> Dict[str, float]:
    """Runs Decode over eval_steps batches; returns the decoder metrics."""
    batches, _ = self._Batches(dataset)
    if batches is None:
      logging.info('No %s input; skipping decoding.', dataset)
      return {}
    # Beam search sizes its buffers by the batch: each shape its trace.
    decode_step = self._Function('decode', self._task.DecodeStep)
    metrics = self._task.CreateDecoderMetrics()
    for _ in range(self._p.task.train.eval_steps):
      interrupts.RaiseIfRequested()
      batch = _Next(batches, None)
      if batch is None:
        break
      _PopDropped(batch)
      out = self._tf.nest.map_structure(lambda t: t.numpy(),
                                        decode_step(batch))
      self._task.PostProcessDecodeOut(out, metrics)
    values = {name: float(m.value) for name, m in metrics.items()}
    self._WriteScalars(f'decode_{dataset}', step, values)
    print(f'decode {dataset} at step {step}: ' + '  '.join(
        f'{k} {v:.4f}' for k, v in sorted(values.items())), flush=True)
    line = self._task.DecodeFinalize(metrics, os.path.join(
        self._logdir, f'decoder_{dataset}', f'step_{step}'))
    if line:
      print(f'  {line}', flush=True)
    return values

  def Follow(self, job: str) -> None:
    """Evaluates or decodes each new checkpoint until max_steps."""
    from lingvo_pipe.core import checkpointer  # pylint: disable=g-import-not-at-top
    kind, dataset = job.split('_', 1)
    run = self.Evaluate if kind == 'evaler' else self.Decode
    for path in NewCheckpoints(self._tf, os.path.join(self._logdir,
                                                       'train'),
                                self._follower_timeout_secs):
      interrupts.RaiseIfRequested()
      self._ckpt.Restore(path)
      step = checkpointer.StepOf(path)
      run(dataset, step)
      if step >= self._p.task.train.max_steps:
        break


def _Next(batches: Iterator[Any], *default: Any) -> Any:
  """next(batches); an input that stops on a pair longer than its last
  length bucket (MTInput's long_sentences='error') as TrainingStopped of
  its message alone."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  try:
    return next(batches, *default)
  except tf.errors.InvalidArgumentError as err:
    found = re.search(
        r'\[([^\[\]]*)\] \[(\d+)\] \[([^\[\]]*' +
        re.escape(base_input_generator.LONG_PAIR_ERROR) + r'[^\[\]]*)\]',
        ' '.join(str(err.message).split()))
    if not found:
      raise
    raise TrainingStopped(' '.join(found.groups()).replace("\\'", "'")
                          ) from None


def _PopDropped(batch: Any) -> int:
  """Takes the input's count of dropped long pairs out of `batch` (the
  model does not see it); the count, 0 without one."""
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  dropped = batch.pop(base_input_generator.DROPPED_LONG, None)
  return 0 if dropped is None else int(max(dropped.numpy(), default=0))


def _Shape(batch: Any) -> Tuple[Tuple[int, ...], ...]:
  """The shapes of `batch`'s leaves, by path."""
  return tuple(tuple(leaf.shape) for _, leaf in
               sorted(batch.FlattenItems(), key=lambda kv: kv[0]))


def NewCheckpoints(tf: Any, directory: str,
                    timeout_secs: float) -> Iterator[str]:
  """Yields each new latest checkpoint in `directory` until none comes for
  `timeout_secs`; waits in Python, where Ctrl-C stops it at once."""
  last, deadline = None, time.monotonic() + timeout_secs
  while True:
    path = tf.train.latest_checkpoint(directory)
    if path and path != last:
      last = path
      yield path
      deadline = time.monotonic() + timeout_secs
    elif time.monotonic() > deadline:
      return
    else:
      time.sleep(1)
