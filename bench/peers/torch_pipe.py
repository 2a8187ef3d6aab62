"""The bench stack in PyTorch: one worker process of a timed run.

  python -m bench.peers.torch_pipe --weights=FILE.npz --config=K,M,SCHED,RC
      --rank=R --port=P [--rounds=10] [--warmup=2]

Started by bench/peers/run.py, K processes (one per rank, each pinned to
its core by taskset), or one with K=1. Imports torch, never TensorFlow.

The model is bench/common's stack written with torch's own modules: each
layer pre-LN self-attention then a pre-LN feed-forward (ReLU), both
residual, layer norm epsilon 1e-6, every projection with a bias; its
weights and the batch come from FILE.npz (exported from our layers, so both
sides start from the same numbers). Loss: the mean of the output's
squares over the whole batch (each micro-batch's mean, the gradients
scaled by 1/M as torch's schedules do by default).

One training step: the schedule's step (ScheduleGPipe or Schedule1F1B,
gloo between the ranks) or, with K=1, forward and backward of the whole
batch; then SGD (learning rate 0.1) on each rank's parameters. RC
'always' wraps each layer of a stage in torch.utils.checkpoint (as our
recompute 'always' re-runs each stage's forward in its backward), 'never'
keeps the activations.

Rank 0 prints one JSON line: the seconds of each timed step (after
--warmup steps; every rank waits at a barrier before each step), the
first step's loss and the global norm of its gradients (before the first
update), and each rank's process CPU seconds per timed step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np


def _Args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--weights', required=True)
  parser.add_argument('--config', required=True, help='K,M,SCHED,RC')
  parser.add_argument('--rank', type=int, default=0)
  parser.add_argument('--port', type=int, default=0)
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  return parser.parse_args(argv)


def main(argv=None):
  args = _Args(sys.argv[1:] if argv is None else argv)
  k, m, sched, recompute = args.config.split(',')
  k, m = int(k), int(m)
  import torch  # pylint: disable=g-import-not-at-top
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  from torch.utils import checkpoint  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(1)
  torch.manual_seed(0)
  data = np.load(args.weights)
  meta = json.loads(str(data['meta']))
  d, heads, layers = meta['model_dim'], meta['num_heads'], meta['num_layers']

  class Layer(torch.nn.Module):
    """Pre-LN self-attention then pre-LN FFN, both residual."""

    def __init__(self, i):
      super().__init__()
      w = lambda name: torch.tensor(data[f'layer{i}/{name}'])  # noqa: E731
      self.ln1 = torch.nn.LayerNorm(d, eps=1e-6)
      self.ln2 = torch.nn.LayerNorm(d, eps=1e-6)
      self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d)
                                        for _ in range(4))
      hidden = meta['hidden_dim']
      self.ff1, self.ff2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden,
                                                                       d)
      with torch.no_grad():
        for ln, name in ((self.ln1, 'atten_ln'), (self.ln2, 'ffn_ln')):
          ln.weight.copy_(w(f'{name}/scale'))
          ln.bias.copy_(w(f'{name}/bias'))
        for lin, name in ((self.q, 'query'), (self.k, 'key'),
                          (self.v, 'value'), (self.o, 'post'),
                          (self.ff1, 'ff1'), (self.ff2, 'ff2')):
          lin.weight.copy_(w(f'{name}/w').T)
          lin.bias.copy_(w(f'{name}/b'))

    def forward(self, x):
      b, t, _ = x.shape
      y = self.ln1(x)
      split = lambda z: z.view(b, t, heads, d // heads).transpose(1, 2)  # noqa: E731
      q, kk, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
      probs = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(d // heads),
                            dim=-1)
      ctx = (probs @ v).transpose(1, 2).reshape(b, t, d)
      x = x + self.o(ctx)
      return x + self.ff2(torch.relu(self.ff1(self.ln2(x))))

  class Stage(torch.nn.Module):

    def __init__(self, first, last):
      super().__init__()
      self.layers = torch.nn.ModuleList(Layer(i) for i in range(first, last))

    def forward(self, x):
      for layer in self.layers:
        if recompute == 'always':
          x = checkpoint.checkpoint(layer, x, use_reentrant=False)
        else:
          x = layer(x)
      return x

  per = layers // k
  stage = Stage(args.rank * per, (args.rank + 1) * per)
  batch = torch.tensor(data['batch'])
  loss_fn = lambda out, target: (out * out).mean()  # noqa: E731
  sgd = torch.optim.SGD(stage.parameters(), lr=0.1)

  if k > 1:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(args.port))
    dist.init_process_group('gloo', rank=args.rank, world_size=k)
    from torch.distributed import pipelining  # pylint: disable=g-import-not-at-top
    pipe_stage = pipelining.PipelineStage(stage, args.rank, k,
                                          torch.device('cpu'))
    cls = {'gpipe': pipelining.ScheduleGPipe,
           '1f1b': pipelining.Schedule1F1B}[sched]
    schedule = cls(pipe_stage, n_microbatches=m, loss_fn=loss_fn)
    target = torch.zeros(batch.shape[0])

    def Step():
      losses = []
      if args.rank == 0:
        schedule.step(batch)
      elif args.rank == k - 1:
        schedule.step(target=target, losses=losses)
      else:
        schedule.step()
      return losses
  else:

    def Step():
      loss = loss_fn(stage(batch), None)
      loss.backward()
      return [loss]

  def SquaredNorm():
    """This rank's gradients' squared norm, summed in float64."""
    return sum(float((p.grad.double() ** 2).sum())
               for p in stage.parameters())

  def Barrier():
    if k > 1:
      dist.barrier()

  sgd.zero_grad()
  losses = Step()
  mean = float(torch.stack(losses).detach().mean()) if losses else 0.0
  sq = torch.tensor([SquaredNorm(), mean], dtype=torch.float64)
  if k > 1:
    dist.all_reduce(sq)
  first = {'loss': float(sq[1]), 'grad_norm': math.sqrt(float(sq[0]))}
  sgd.step()
  for _ in range(args.warmup - 1):
    sgd.zero_grad()
    Step()
    sgd.step()
  times = []
  cpu = time.process_time()
  for _ in range(args.rounds):
    Barrier()
    start = time.perf_counter()
    sgd.zero_grad()
    Step()
    sgd.step()
    Barrier()
    times.append(time.perf_counter() - start)
  cpu = torch.tensor([(time.process_time() - cpu) / args.rounds],
                     dtype=torch.float64)
  cpus = [torch.zeros(1, dtype=torch.float64) for _ in range(k)]
  if k > 1:
    dist.all_gather(cpus, cpu)
  else:
    cpus = [cpu]
  if args.rank == 0:
    print(json.dumps(dict(first, times=times,
                          worker_cpu=[float(c[0]) for c in cpus])),
          flush=True)
  if k > 1:
    dist.destroy_process_group()


if __name__ == '__main__':
  main()
