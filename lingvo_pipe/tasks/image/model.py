"""ImageClassifier: an image network, softmax cross-entropy and accuracy.

The network is any layer (typically a PipeliningLayer made by
`GPipeNetworkParams` from the flat layer lists of `resnet.py` or
`amoebanet.py`) mapping images to logits. What it is given depends on
p.network_input:

  'image'           the image tensor [b, h, w, c]
  'image_and_keys'  NestedMap(image=[b, h, w, c], example_keys=[b] int64,
                    example_steps=[b] int64): for networks with dropout or
                    drop-path (the keys make the masks, see core/dropout.py;
                    example_steps is the training step of every example, for
                    drop-path's schedule); every layer passes them on

The image is cast to the network's fprop dtype. The network returns logits
[b, num_classes], or NestedMap(logits, aux_logits) when it has an
auxiliary classifier (AmoebaNet's, in training). Input batches are
NestedMap(image [b, h, w, c], label [b] int), as ImageClassificationInput
makes them; BaseTask adds example_keys.

Metrics, each (value, number of examples):

  loss            mean softmax cross-entropy (with label smoothing), plus
                  aux_loss_weight times aux_loss if there are aux_logits
  aux_loss        the auxiliary logits' cross-entropy (only with them)
  accuracy        fraction of examples whose top class is the label
  top5_accuracy   fraction whose label is among the 5 top classes (only if
                  num_classes > 5)

Decode returns the predicted class and the label of each example; the
decoder metrics (`CreateDecoderMetrics`, `PostProcessDecodeOut`) are the
accuracy and top-5 accuracy over everything decoded.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_model
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core import partitioner
from lingvo_pipe.core.nested_map import NestedMap

NETWORK_INPUTS = ('image', 'image_and_keys')
_TOP_K = 5


def GPipeNetworkParams(layer_params: Sequence[hyperparams.Params],
                       num_partitions: int, num_micro_batches: int,
                       micro_batch_input_shapes: Any,
                       recompute: str = 'always',
                       cost: partitioner.Cost = 'flops',
                       schedule: str = 'gpipe',
                       num_virtual_stages: int = 1) -> hyperparams.Params:
  """PipeliningLayer params of `layer_params` split into balanced cells.

  Args:
    layer_params: the network as a flat list of uniquely named layers.
    num_partitions: K, the number of pipeline devices.
    num_micro_batches: M.
    micro_batch_input_shapes: the first layer's input shapes for one
      micro-batch (see partitioner.PartitionWithReport's input_shapes).
    recompute: the PipeliningLayer's recompute mode.
    cost: how to balance the cells (partitioner.COSTS or one number per
      layer); 'flops' by default.
    schedule: the PipeliningLayer's schedule (a name of
      schedules/registry.py's Names(), or a .csv table).
    num_virtual_stages: V stages per device: K x V cells, placed by the
      schedule (2 or more for 'interleaved_1f1b', 2 for 'zb_v').
  """
  cells = partitioner.PartitionSequentialLayers(
      layer_params, num_partitions * num_virtual_stages, cost=cost,
      input_shapes=micro_batch_input_shapes,
      num_micro_batches=num_micro_batches, schedule_name=schedule,
      num_virtual_stages=num_virtual_stages)
  return gpipe.PipeliningLayer.Params().Set(
      cell_tpl=cells, num_micro_batches=num_micro_batches,
      recompute=recompute, schedule=schedule,
      num_virtual_stages=num_virtual_stages)


class ImageClassifier(base_model.BaseTask):
  """Classifies images with p.network (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('network', None,
             'Layer params of the network: input as network_input says, '
             'output logits [batch, num_classes].')
    p.Define('network_input', 'image', f'One of {NETWORK_INPUTS}.')
    p.Define('num_classes', 10, 'Number of classes.')
    p.Define('label_smoothing', 0.0,
             'Label smoothing of the cross-entropy, in [0, 1).')
    p.Define('aux_loss_weight', 0.4,
             'Weight of the auxiliary logits\' loss, if the network returns '
             'them.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"ImageClassifier '{self.path}'"
    if p.network is None:
      raise ValueError(f'{where}: set p.network to the layer params of the '
                       'network.')
    if p.network_input not in NETWORK_INPUTS:
      raise ValueError(f'{where}: network_input={p.network_input!r}; use '
                       f'one of {NETWORK_INPUTS}.')
    if not isinstance(p.num_classes, int) or p.num_classes < 2:
      raise ValueError(f'{where}: num_classes={p.num_classes!r} must be an '
                       'int >= 2.')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{where}: label_smoothing={p.label_smoothing} must '
                       'be in [0, 1).')
    self.CreateChild('network', p.network)

  def _NetworkInputs(self, theta: NestedMap, input_batch: NestedMap) -> Any:
    """What the network gets (module docstring: p.network_input)."""
    del theta  # No variables before the network.
    p = self.params
    image = tf.cast(input_batch.image, self.network.fprop_dtype)
    if p.network_input == 'image':
      return image
    inputs = NestedMap(image=image)
    if 'example_keys' in input_batch:
      keys = input_batch.example_keys
      inputs.example_keys = keys
      inputs.example_steps = tf.fill(tf.shape(keys), self._StepOrZero())
    return inputs

  def _Predictions(self, out: Any, batch_size: Any) -> NestedMap:
    """The network's output as NestedMap(logits, maybe aux_logits)."""
    p = self.params
    predictions = NestedMap(out) if isinstance(out, dict) else NestedMap(
        logits=out)
    want = [batch_size, p.num_classes]
    for name, logits in sorted(predictions.items()):
      if name not in ('logits', 'aux_logits') or not isinstance(
          logits, tf.Tensor) or not logits.shape.is_compatible_with(want):
        got = getattr(logits, 'shape', type(logits).__name__)
        raise ValueError(
            f"ImageClassifier '{self.path}': the network returned {name} "
            f'{got}; expected logits of shape {want} (num_classes='
            f'{p.num_classes}), and maybe aux_logits of the same shape.')
    if 'logits' not in predictions:
      raise ValueError(
          f"ImageClassifier '{self.path}': the network returned "
          f'{sorted(predictions)}, no logits.')
    return predictions

  def ComputePredictions(self, theta: NestedMap,
                         input_batch: NestedMap) -> NestedMap:
    """NestedMap(logits=[b, num_classes], maybe aux_logits) of the images."""
    out = self.network.FProp(theta.network,
                             self._NetworkInputs(theta, input_batch))
    return self._Predictions(out, input_batch.image.shape[0])

  def OnePassTraining(self, theta: NestedMap, input_batch: NestedMap
                      ) -> Optional[base_model.OnePass]:
    """A pipelined network trains in one pass; its head is ComputeLoss."""
    if not isinstance(self.network, gpipe.PipeliningLayer):
      return None

    def Head(head_theta: NestedMap, out: Any, batch: NestedMap
             ) -> base_model.Metrics:
      predictions = self._Predictions(out, batch.label.shape[0])
      return self.ComputeLoss(head_theta, predictions, batch)[0]

    labels = NestedMap(label=input_batch.label)
    return base_model.OnePass(
        network=self.network, theta=theta.network,
        inputs=self._NetworkInputs(theta, input_batch), head=Head,
        head_theta=NestedMap(), head_batch=labels,
        loss_weight=tf.cast(tf.size(input_batch.label), tf.float32))

  def _Scores(self, logits: tf.Tensor,
              labels: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(correct, top5_correct): bool [b] each."""
    labels = tf.cast(labels, tf.int32)
    correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                       labels)
    k = min(_TOP_K, self.params.num_classes)
    _, top = tf.math.top_k(logits, k=k)
    top5 = tf.reduce_any(tf.equal(top, labels[:, tf.newaxis]), axis=-1)
    return correct, top5

  def ComputeLoss(self, theta: NestedMap, predictions: NestedMap,
                  input_batch: NestedMap
                  ) -> Tuple[base_model.Metrics, NestedMap]:
    """Metrics (module docstring) and NestedMap(loss, correct) per example."""
    del theta  # no variables of its own
    p = self.params
    logits = predictions.logits
    xent = layers.SoftmaxCrossEntropy(
        logits, class_ids=tf.cast(input_batch.label, tf.int32),
        label_smoothing=p.label_smoothing)
    correct, top5 = self._Scores(logits, input_batch.label)
    dtype = xent.avg_loss.dtype
    n = xent.total_weight
    loss = xent.avg_loss
    metrics = {'accuracy': (tf.reduce_mean(tf.cast(correct, dtype)), n)}
    if 'aux_logits' in predictions:
      aux = layers.SoftmaxCrossEntropy(
          predictions.aux_logits,
          class_ids=tf.cast(input_batch.label, tf.int32),
          label_smoothing=p.label_smoothing)
      metrics['aux_loss'] = (aux.avg_loss, n)
      loss += tf.cast(p.aux_loss_weight, dtype) * aux.avg_loss
    metrics['loss'] = (loss, n)
    if p.num_classes > _TOP_K:
      metrics['top5_accuracy'] = (tf.reduce_mean(tf.cast(top5, dtype)), n)
    per_example = NestedMap(loss=xent.per_example_loss, correct=correct)
    return metrics, per_example

  def Decode(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
    """NestedMap(predicted, label: int32 [b]; correct, top5_correct: bool)."""
    logits = self.ComputePredictions(theta, input_batch).logits
    correct, top5 = self._Scores(logits, input_batch.label)
    return NestedMap(
        predicted=tf.argmax(logits, axis=-1, output_type=tf.int32),
        label=tf.cast(input_batch.label, tf.int32),
        correct=correct, top5_correct=top5)

  def CreateDecoderMetrics(self) -> Dict[str, Any]:
    metrics = {'accuracy': base_model.AverageMetric()}
    if self.params.num_classes > _TOP_K:
      metrics['top5_accuracy'] = base_model.AverageMetric()
    return metrics

  def PostProcessDecodeOut(self, decode_out: Dict[str, Any],
                           metrics: Dict[str, Any]) -> None:
    """Adds one decoded batch to the accuracy metrics."""
    correct = np.asarray(decode_out['correct'], dtype=np.float64)
    if not correct.size:
      return
    metrics['accuracy'].Update(correct.mean(), correct.size)
    if 'top5_accuracy' in metrics:
      top5 = np.asarray(decode_out['top5_correct'], dtype=np.float64)
      metrics['top5_accuracy'].Update(top5.mean(), top5.size)
