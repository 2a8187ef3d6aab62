"""A minute-long tour: train a small pipelined model and watch the loss fall.

  python -m lingvo_pipe.demo

Splits the CPU into 2 logical devices, builds a 4-block Transformer encoder
stack as a PipeliningLayer with 2 partitions and 4 micro-batches, and fits
it to a fixed random teacher network with plain SGD, printing the loss and
the pipeline's schedule.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags

from lingvo_pipe.core import quiet

# Before any module that imports TensorFlow: its start-up lines stay off
# the console (quiet.py).
quiet.ImportTensorFlow()

from lingvo_pipe.core import devices  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer('steps', 60, 'Training steps.')


def _Main(argv) -> None:
  del argv
  devices.SplitCpu(2)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import layers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import transformer_layers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.nested_map import NestedMap  # pylint: disable=g-import-not-at-top

  dim, batch, length = 32, 16, 8
  blocks = [transformer_layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=dim, hidden_dim=4 * dim, num_heads=4)
            for i in range(4)]
  cells = [layers.SequentialLayer.Params().Set(sub=blocks[:2]),
           layers.SequentialLayer.Params().Set(sub=blocks[2:])]
  model = gpipe.PipeliningLayer.Params().Set(
      name='demo', cell_tpl=cells, num_micro_batches=4).Instantiate()
  print(model.Describe(batch))

  teacher = tf.random.stateless_normal([dim, dim], [7, 7]) / dim**0.5
  variables = model.vars.Flatten()
  trainable = [v for v in variables if v.trainable]

  @tf.function(autograph=False)
  def Step(step):
    x = tf.random.stateless_normal([batch, length, dim], [step, 1])
    target = tf.tanh(tf.einsum('btd,de->bte', x, teacher))
    inputs = NestedMap(vec=x, paddings=tf.zeros([batch, length]))
    with tf.GradientTape() as tape:
      out = model.FPropDefaultTheta(inputs)
      loss = tf.reduce_mean(tf.square(out.vec - target))
    grads = tape.gradient(loss, trainable)
    for v, g in zip(trainable, grads):
      v.assign_sub(0.05 * g)
    return loss

  start = time.time()
  losses = []
  for step in range(FLAGS.steps):
    losses.append(float(Step(tf.constant(step, tf.int64))))
    if step % 10 == 0 or step == FLAGS.steps - 1:
      print(f'step {step:4d}  loss {losses[-1]:.4f}  '
            f'({time.time() - start:.1f} s)')
  first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
  print(f'mean loss of the first 5 steps {first:.4f}, of the last 5 '
        f'{last:.4f}: {"falling" if last < first else "NOT falling"}')


def main() -> None:
  app.run(_Main)


if __name__ == '__main__':
  main()
