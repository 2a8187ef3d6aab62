"""The pipeline of a registered model, as a flat layer list to plan.

`FromRegistry('image.synthetic.AmoebaNetTinyGPipe')` finds the model's
PipeliningLayer params in its task params (`ImageClassifier.network`,
`TransformerMT.stack`, or any other field), flattens its cells (each a
SequentialLayer of named layers, as partitioner.PartitionSequentialLayers
makes them) back into the layer list, and takes the input shapes of one
micro-batch from the model's params class: its `MicroBatchInputShapes()`
(params/image/classifier_base.py, params/mt/base.py) gives them for the
model's own micro-batch, and `InputShapes(b)` puts micro-batch size b on
the pipeline's batch axis. The batch is the train input's batch_size per
replica, or with length buckets that of the bucket holding the most tokens
(base_input_generator.LargestBucket), for which MicroBatchInputShapes
gives the shapes; `MicroBatchInputShapes((bound, batch))` gives each
bucket's (`ModelPipeline.buckets`, the planner's per-bucket report).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers as layers_lib
from lingvo_pipe.core import model_registry
from lingvo_pipe.core import partitioner


@dataclasses.dataclass
class ModelPipeline:
  """What the planner needs of a model's pipeline."""
  name: str
  layers: List[hyperparams.Params]
  batch_size: int
  num_partitions: int
  num_micro_batches: int
  recompute: str
  micro_batch_shapes: Any  # input shapes for batch / num_micro_batches
  batch_dim: int = 0
  optimizer: Optional[hyperparams.Params] = None
  # Whether the step differentiates the pipeline's input: the first
  # partition leaves that gradient out for inputs made from no variable
  # (pipeline_run). The model's params class says so with
  # PIPELINE_INPUT_GRADIENT; True where it does not.
  input_gradient: bool = True
  # Data-parallel replicas (task.train.num_replicas): the batch and the
  # micro-batches above are one replica's.
  num_replicas: int = 1
  # With length buckets: (bound, batch per replica, input shapes of one
  # micro-batch) of each; the fields above are for the one holding the
  # most tokens.
  buckets: List[Tuple[int, int, Any]] = dataclasses.field(
      default_factory=list)

  def InputShapes(self, micro_batch_size: int, bucket: int = -1) -> Any:
    """The first layer's input shapes for a micro-batch of that size (of
    length bucket `bucket`, an index into `buckets`, if given)."""
    axis = self.batch_dim
    shapes = (self.micro_batch_shapes if bucket < 0 else
              self.buckets[bucket][2])

    def Resize(shape: Any) -> Any:
      spec = shape if isinstance(shape, tf.TensorSpec) else None
      dims = (spec.shape if spec else tf.TensorShape(shape)).as_list()
      dims[axis] = micro_batch_size
      return (tf.TensorSpec(dims, spec.dtype) if spec
              else tf.TensorShape(dims))

    return partitioner.MapShapes(Resize, shapes)


def _FindPipelines(p: Any, path: str) -> List[tuple]:
  """(path, params) of every PipeliningLayer params below `p`."""
  found = []
  if isinstance(p, hyperparams.InstantiableParams) and isinstance(
      p.cls, type) and issubclass(p.cls, gpipe.PipeliningLayer):
    return [(path, p)]
  if isinstance(p, hyperparams.Params):
    for name, value in p.IterParams():
      found += _FindPipelines(value, f'{path}.{name}' if path else name)
  elif isinstance(p, (list, tuple)):
    for i, value in enumerate(p):
      found += _FindPipelines(value, f'{path}[{i}]')
  return found


def FlattenCells(cells: List[hyperparams.Params]) -> List[hyperparams.Params]:
  """The layers of SequentialLayer cells, in order; other cells as is."""
  out = []
  for cell in cells:
    if (isinstance(cell.cls, type) and
        issubclass(cell.cls, layers_lib.SequentialLayer)):
      out += [sub.Copy() for sub in cell.sub]
    else:
      out.append(cell.Copy())
  return out


def FromRegistry(name: str, override_text: str = '') -> ModelPipeline:
  """The pipeline of registered model `name` (module docstring)."""
  p = model_registry.GetParams(name)
  if override_text:
    p.FromText(override_text)
  pipelines = _FindPipelines(p.task, 'task')
  if not pipelines:
    raise ValueError(
        f"Model '{name}' has no PipeliningLayer in its task params; put its "
        'network in one (e.g. model.GPipeNetworkParams) to plan it.')
  if len(pipelines) > 1:
    raise ValueError(
        f"Model '{name}' has {len(pipelines)} PipeliningLayers "
        f'({", ".join(path for path, _ in pipelines)}); the planner plans '
        'one: keep one pipeline per model.')
  pipe_p = pipelines[0][1]
  model = model_registry.GetClass(name)()
  shapes_fn = getattr(model, 'MicroBatchInputShapes', None)
  if shapes_fn is None:
    raise ValueError(
        f"Model '{name}' does not give its pipeline's input shapes; define "
        'MicroBatchInputShapes() on its params class (as params/image/'
        'classifier_base.py does).')
  train_input = p.Get('train_input')
  if train_input is None:
    raise ValueError(f"Model '{name}' has no Train() input; define it, the "
                     'planner takes the batch size from it.')
  replicas = p.task.train.num_replicas
  # With length buckets: the bucket holding the most tokens, as the
  # model's MicroBatchInputShapes (params/mt/base.py).
  largest = base_input_generator.LargestBucket(train_input)
  batch = (largest[1] if largest else train_input.batch_size) // replicas
  micro = pipe_p.micro_batch_size
  buckets = [(bound, size // replicas, shapes_fn((bound, size)))
             for bound, size in base_input_generator.Buckets(train_input)]
  return ModelPipeline(
      name=name, layers=FlattenCells(pipe_p.cell_tpl),
      batch_size=batch, num_partitions=len(pipe_p.cell_tpl),
      num_micro_batches=batch // micro if micro else
      pipe_p.num_micro_batches // replicas,  # each replica runs M / R
      recompute=pipe_p.recompute,
      micro_batch_shapes=shapes_fn(largest) if largest else shapes_fn(),
      batch_dim=pipe_p.batch_dim, optimizer=p.task.train.optimizer,
      input_gradient=bool(getattr(model, 'PIPELINE_INPUT_GRADIENT', True)),
      num_replicas=replicas, buckets=buckets)
