"""Times Lingvo 0.14.2's GPipe on the benchmark stack (run by run.py).

Runs under a Python that has lingvo==0.14.2 installed (its own venv, never
the project's). Lingvo's compiled ops need glibc 2.38, so `lingvo.core.ops`
is replaced by an empty module before Lingvo is imported; GPipe and the
Transformer layers used here do not call them. Lingvo is TF1 graph mode:
one Session, one train op per configuration.

  python lingvo_step.py --config=seq|K,M --steps=10 --warmup=2

prints one JSON line: {"config": ..., "times": [seconds per step, ...]}.
"""

import argparse
import json
import os
import sys
import time
import types

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


def _StubLingvoOps():
  """An empty `lingvo.core.ops` whose pure-Python submodules still load."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec('lingvo.core')
  stub = types.ModuleType('lingvo.core.ops')
  stub.__path__ = [os.path.join(spec.submodule_search_locations[0], 'ops')]

  def Missing(name):
    raise AttributeError(f'lingvo.core.ops.{name} is stubbed out here.')

  stub.__getattr__ = Missing
  sys.modules['lingvo.core.ops'] = stub


_StubLingvoOps()

import lingvo.compat as tf  # noqa: E402
import tensorflow.compat.v1 as tf1  # noqa: E402
from lingvo.core import base_layer  # noqa: E402
from lingvo.core import cluster_factory  # noqa: E402
from lingvo.core import gpipe  # noqa: E402
from lingvo.core import layers_with_attention  # noqa: E402
from lingvo.core import py_utils  # noqa: E402


class EncoderCell(base_layer.BaseLayer):
  """One Lingvo TransformerLayer as a GPipe cell: (vec, paddings) -> same.

  vec [t, b, d] (time-major, as Lingvo's Transformer), paddings [t, b].
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 256, 'Model dimension.')
    p.Define('hidden_dim', 1024, 'Feed-forward hidden dimension.')
    p.Define('num_heads', 4, 'Attention heads.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    tp = layers_with_attention.TransformerLayer.Params().Set(
        name='tr', source_dim=p.model_dim)
    tp.tr_atten_tpl.num_attention_heads = p.num_heads
    tp.tr_fflayer_tpl.hidden_dim = p.hidden_dim
    self.CreateChild('tr', tp)

  def FProp(self, theta, vec, paddings):
    out, _ = self.tr.FProp(theta.tr, vec, paddings)
    return out, paddings

  @classmethod
  def FPropMeta(cls, p, vec, paddings):
    t, b, d = vec.as_list() if hasattr(vec, 'as_list') else vec
    flops = 2 * t * b * d * (4 * d + 2 * p.hidden_dim) + 4 * b * t * t * d
    return py_utils.NestedMap(flops=flops, out_shapes=(vec, paddings))


def _Cells(args, layer_range, name):
  return gpipe.FeatureExtractionLayer.Params().Set(name=name, sub=[
      EncoderCell.Params().Set(
          name=f'layer{i}', model_dim=args.model_dim,
          hidden_dim=args.hidden_dim, num_heads=args.num_heads)
      for i in layer_range])


def _Model(args, k, m):
  n = args.num_layers
  cells = [_Cells(args, range(i * n // k, (i + 1) * n // k), f'cell{i}')
           for i in range(k)]
  return gpipe.PipeliningLayer.Params().Set(
      name='model', cell_tpl=cells, num_micro_batches=m,
      batch_dim=1).Instantiate()


def _TrainOp(args):
  """Graph of one step: loss and the gradient of every variable."""
  py_utils.GetOrCreateGlobalStepVar()  # GPipe seeds micro-batches by it.
  shape = [args.seq_len, args.batch, args.model_dim]
  vec = tf.random.stateless_normal(shape, [1, 2])
  paddings = tf.zeros(shape[:2])
  if args.config == 'seq':
    model = _Cells(args, range(args.num_layers), 'model').Instantiate()
  else:
    k, m = (int(v) for v in args.config.split(','))
    model = _Model(args, k, m)
  out = model.FProp(model.theta, vec, paddings)
  loss = tf.reduce_mean(tf.square(out[0]))
  variables = model.vars.Flatten()
  grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
  return tf.group(loss, *grads)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--config', default='seq')
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  for name, value in (('num_layers', 8), ('model_dim', 256),
                      ('hidden_dim', 1024), ('num_heads', 4),
                      ('seq_len', 64), ('batch', 32)):
    parser.add_argument(f'--{name}', type=int, default=value)
  args = parser.parse_args()
  k = 1 if args.config == 'seq' else int(args.config.split(',')[0])
  config = tf1.ConfigProto(device_count={'CPU': 2})
  cluster = cluster_factory.ForTestingWorker(cpus=k, split_size=k)
  cluster.params.enable_asserts = False  # its assert op is a compiled op
  with tf1.Graph().as_default(), cluster:
    train_op = _TrainOp(args)
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      for _ in range(args.warmup):
        sess.run(train_op)
      times = []
      for _ in range(args.steps):
        start = time.perf_counter()
        sess.run(train_op)
        times.append(time.perf_counter() - start)
  print(json.dumps({'config': args.config, 'times': times}))


if __name__ == '__main__':
  main()
