"""What handing a boundary tensor to the next device costs, measured once.

Between partitions k and k+1 a pipeline sends each micro-batch's output
forward and, in the backward, its gradient (the same bytes) back. On
one host's worker processes that goes through TensorFlow's gRPC runtime
(on the machine of docs/DESIGN.md section 19, about 0.7 ms per MiB); on
an accelerator through its links; between logical CPUs of one process
it is next to free. The planner adds it to the schedule (step_model's
hop_s), measured here between two of the target's devices:

  Measure(src, dst)        two devices this process can place ops on
  MeasureBetweenCores(cores)  two worker servers on this host, pinned to
                           cores[0] and cores[1] (LocalWorkers), as the
                           trainer's workers run; measured in a child
                           process, which starts and stops them; with
                           the share of each hand-off that each worker's
                           core loses to it (MeasureBusy)

For each size in SIZES, one tf.function makes a tensor of that many bytes
on `src` and sums it on `dst`; its twin makes and sums it on `dst`. The
two are called alternately, `num_runs` times each after a warm-up, and
the difference of their medians is the transfer. A line fit by least
squares through the three points gives the cost:

  seconds(bytes) = latency_s + bytes * seconds_per_byte

(each clamped at zero). The tensor is made inside the call, so no copy
of an earlier call can be reused, as the pipeline's activations cannot.
Every boundary of a K-partition split is assumed to cost the same as the
one measured (one host, one kind of link).

Data parallelism's all-reduce is measured the same way,
`what='all_reduce'` (MeasureAllReduce): variables of each total size (in
leaves of 1 MiB, as a layer's weights come) held on both devices and
summed over them by `all_reduce.PlacedSum`, the exchange of one-pass
training, against its twin that reads them without summing. That is R=2,
where each device sends P / 2 to the other's sums and gets P / 2 back;
with R copies each device sends 2 (R-1) / R P (AllReduceSeconds).

  python -m lingvo_pipe.tools.transfer_profile --cores=0,1 [--what=all_reduce]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

SIZES = (2**18, 2**21, 2**24)  # 256 KiB, 2 MiB, 16 MiB
_BFC_ENV = 'TF_CPU_ALLOCATOR_USE_BFC'
# MeasureAllReduce: float32 elements of each leaf (1 MiB).
_AR_LEAF = 2**18


@dataclasses.dataclass(frozen=True)
class TransferCost:
  """seconds(bytes) = latency_s + bytes * seconds_per_byte."""
  latency_s: float = 0.0
  seconds_per_byte: float = 0.0
  between: str = ''  # what was measured (or why not), for the report
  measured: bool = False  # False: nothing measured, hand-offs are free
  # The share of a hand-off during which the sending and the receiving
  # device lose their own work (MeasureBusy; 0 where not measured).
  sender_busy: float = 0.0
  receiver_busy: float = 0.0

  def Seconds(self, num_bytes: int) -> float:
    """Nothing crosses, nothing costs: 0 for 0 bytes, latency included."""
    if not num_bytes:
      return 0.0
    return self.latency_s + num_bytes * self.seconds_per_byte

  def __str__(self) -> str:
    busy = (f', taking {self.sender_busy:.0%} of it from the sender and '
            f'{self.receiver_busy:.0%} from the receiver'
            if self.sender_busy or self.receiver_busy else '')
    return (f'{self.latency_s * 1e3:.2f} ms + '
            f'{self.seconds_per_byte * 2**20 * 1e3:.3f} ms/MiB' + busy
            + (f' ({self.between})' if self.between else ''))

  @property
  def busy(self) -> Tuple[float, float]:
    """(sender, receiver) as schedule.Simulate's hop_busy."""
    return (self.sender_busy, self.receiver_busy)


def Fit(points: Sequence[Tuple[int, float]], between: str = ''
        ) -> TransferCost:
  """The least-squares line through (bytes, seconds), clamped at zero."""
  n = len(points)
  if n < 2 or len({b for b, _ in points}) < 2:
    raise ValueError(f'Fit needs two or more distinct sizes, got {points}.')
  mean_b = sum(b for b, _ in points) / n
  mean_s = sum(s for _, s in points) / n
  slope = (sum((b - mean_b) * (s - mean_s) for b, s in points)
           / sum((b - mean_b) ** 2 for b, _ in points))
  slope = max(slope, 0.0)
  return TransferCost(latency_s=max(mean_s - slope * mean_b, 0.0),
                      seconds_per_byte=slope, between=between, measured=True)


def Measure(src: str, dst: str, sizes: Sequence[int] = SIZES,
            num_runs: int = 7) -> TransferCost:
  """The cost of moving a tensor from device `src` to `dst` (module
  docstring), in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def Fn(make_on: str):
    def Call(value, n):
      with tf.device(make_on):
        x = tf.fill(n, value)
      with tf.device(dst):
        return tf.reduce_sum(x)
    return tf.function(Call, autograph=False)

  remote, local = Fn(src), Fn(dst)
  value = tf.constant(1.0)

  def Call(fn):
    return lambda size: fn(value, tf.constant([size // 4]))  # float32s
  return Fit(_Points(Call(remote), Call(local), sizes, num_runs),
             between=f'{src} -> {dst}')


def MeasureBusy(src: str, dst: str, num_runs: int = 15, size: int = 2**21,
                count: int = 16) -> Tuple[float, float]:
  """(sender, receiver): the share of a hand-off from `src` to `dst`
  during which each device's own work stops (worker processes copy the
  bytes on their cores; a GPU's copy engines would not).

  A chain of matrix products runs on one device, beside either `count`
  tensors of `size` bytes made on `src` and each read on `dst` (the
  hand-offs), or the same tensors made and read on `src` (the twin: the
  same making, and the same neighbour busy, without hand-offs). What the
  hand-offs add to the chain, over what they cost alone (hand-offs less
  twin), is that device's share, clamped to [0, 1]. The chain is sized
  to last about three times the hand-offs, so that it spans them.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n = tf.constant([size // 4])  # float32s
  value = tf.constant(1.0)

  def Hand(read_on: str):
    def Call(value, n):
      outs = []
      for i in range(count):
        with tf.device(src):
          x = tf.fill(n, value + float(i))
        with tf.device(read_on):
          outs.append(x[0])  # the whole tensor crosses to be read
      with tf.device(read_on):
        return tf.add_n(outs)
    return Call

  def Chain(on: str, steps: int):
    def Call(value):
      with tf.device(on):
        a = tf.fill([256, 256], value * 1e-3)
        x = a
        for _ in range(steps):
          x = tf.tanh(tf.matmul(x, a))
        return tf.reduce_sum(x)
    return Call

  def Medians(*fns) -> List[float]:
    return _Medians([lambda fn=fn: tf.nest.map_structure(
        lambda t: t.numpy(), fn(value, n)) for fn in fns], num_runs)

  hand = tf.function(Hand(dst), autograph=False)
  twin = tf.function(Hand(src), autograph=False)
  probe = tf.function(lambda v, n: Chain(dst, 20)(v), autograph=False)
  hand_s, twin_s, probe_s = Medians(hand, twin, probe)
  hop = hand_s - twin_s
  if hop <= 0:
    return (0.0, 0.0)
  steps = max(int(20 * 3 * hand_s / probe_s), 20)
  shares = []
  for on in (src, dst):
    beside = [tf.function(
        lambda v, n, c=Chain(on, steps), h=Hand(read_on): (c(v), h(v, n)),
        autograph=False) for read_on in (dst, src)]
    with_hops, without = Medians(*beside)
    shares.append(min(max((with_hops - without) / hop, 0.0), 1.0))
  return shares[0], shares[1]


def _Medians(calls: Sequence[Callable[[], Any]], num_runs: int
             ) -> List[float]:
  """Each call's median seconds, the calls made in turn `num_runs` times
  each after a warm-up."""
  times: List[List[float]] = [[] for _ in calls]
  for _ in range(num_runs + 1):  # the first of each is a warm-up
    for call, out in zip(calls, times):
      start = time.perf_counter()
      call()
      out.append(time.perf_counter() - start)
  return [statistics.median(t[1:]) for t in times]


def _Points(measured: Callable[[int], Any], twin: Callable[[int], Any],
            sizes: Sequence[int], num_runs: int) -> List[Tuple[int, float]]:
  """(size, median seconds of measured(size) less twin(size)'s), the two
  called alternately `num_runs` times each after a warm-up."""
  points = []
  for size in sizes:
    measured_s, twin_s = _Medians([lambda: measured(size).numpy(),
                                   lambda: twin(size).numpy()], num_runs)
    points.append((size, measured_s - twin_s))
  return points


def MeasureAllReduce(devices: Sequence[str], sizes: Sequence[int] = SIZES,
                     num_runs: int = 7) -> TransferCost:
  """What summing variables of each total size over two devices costs,
  both copies getting the sums (module docstring), in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import all_reduce  # pylint: disable=g-import-not-at-top
  pair = list(devices)[:2]

  # Per size, each device's copy of the leaves: float32 variables of at
  # most 1 MiB, as a layer's weights come. Not tensors filled inside the
  # call: summed as whole leaves, those measured almost nothing.
  copies = {}
  for size in sizes:
    lengths = [min(_AR_LEAF, size // 4 - a)
               for a in range(0, size // 4, _AR_LEAF)]
    copies[size] = []
    for r, d in enumerate(pair):
      with tf.device(d):
        copies[size].append([tf.Variable(tf.fill([n], float(r + 1)))
                             for n in lengths])

  def Fn(exchange: bool):
    # `size` is a Python int: one trace per size.
    def Call(size):
      made = []
      for d, mine in zip(pair, copies[size]):
        with tf.device(d):
          made.append([tf.identity(v) for v in mine])
      if exchange:
        made = all_reduce.PlacedSum(made, pair)
      totals = []
      for leaves, d in zip(made, pair):
        with tf.device(d):
          totals.append(tf.add_n([tf.reduce_sum(x) for x in leaves]))
      with tf.device(pair[0]):
        return tf.add_n(totals)
    return tf.function(Call, autograph=False)

  summed, alone = Fn(True), Fn(False)
  return Fit(_Points(summed, alone, sizes, num_runs),
             between=f'all-reduce over {pair[0]} and {pair[1]}')


def AllReduceSeconds(cost: TransferCost, param_bytes: int,
                     num_replicas: int) -> float:
  """The all-reduce of `param_bytes` over `num_replicas` copies, from
  `cost` measured over two (module docstring): 0 for one copy."""
  r = num_replicas
  if r < 2 or not param_bytes:
    return 0.0
  return (cost.latency_s * (r - 1) +
          cost.seconds_per_byte * param_bytes * 2 * (r - 1) / r)


def MeasureBetweenCores(cores: Sequence[int], num_runs: int = 7,
                        timeout: float = 600.0,
                        what: str = 'transfer') -> TransferCost:
  """The cost between two worker servers pinned to cores[0] and cores[1]
  (module docstring) of a hand-off (`what='transfer'`) or of an
  all-reduce (`'all_reduce'`); a zero cost for fewer than two cores."""
  cores = list(cores)
  if len(cores) < 2:
    return TransferCost(between='one device: nothing crosses')
  env = dict(os.environ)
  env.pop(_BFC_ENV, None)  # the workers run with TF's default allocator
  command = [sys.executable, '-m', 'lingvo_pipe.tools.transfer_profile',
             f'--cores={cores[0]},{cores[1]}', f'--num_runs={num_runs}',
             f'--what={what}']
  try:
    child = subprocess.run(command, capture_output=True, text=True,
                           timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    raise TimeoutError(
        f'measuring the transfer between cores {cores[:2]} took over '
        f'{timeout:.0f} s; check that worker servers can start here '
        '(python -m lingvo_pipe.tools.transfer_profile '
        f'--cores={cores[0]},{cores[1]}).') from None
  if child.returncode:
    tail = child.stderr.strip().splitlines()[-1:] or ['no output']
    raise RuntimeError(
        f'measuring the transfer between cores {cores[:2]} failed '
        f'(exit code {child.returncode}): {tail[0]}')
  return TransferCost(**json.loads(child.stdout.strip().splitlines()[-1]))


def _OnWorkers(cores: List[int], num_runs: int,
               what: str = 'transfer') -> TransferCost:
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import local_workers  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix='transfer_') as logs:
    with local_workers.LocalWorkers(2, logs, cores=cores) as workers:
      names = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
      if what == 'all_reduce':
        cost = MeasureAllReduce(names[:2], num_runs=num_runs)
      else:
        cost = Measure(names[0], names[1], num_runs=num_runs)
        sender, receiver = MeasureBusy(names[0], names[1], 2 * num_runs + 1)
        cost = dataclasses.replace(cost, sender_busy=sender,
                                   receiver_busy=receiver)
  kind = 'all-reduce over ' if what == 'all_reduce' else ''
  return dataclasses.replace(
      cost, between=f'{kind}worker servers on cores {cores[0]} and '
      f'{cores[1]}')


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(
      prog='python -m lingvo_pipe.tools.transfer_profile',
      description=__doc__.split('\n')[0])
  parser.add_argument('--cores', required=True,
                      help='Two cores of this host, e.g. 0,1: the cost '
                      'between worker servers pinned to them.')
  parser.add_argument('--num_runs', type=int, default=7)
  parser.add_argument('--what', default='transfer',
                      choices=['transfer', 'all_reduce'],
                      help='A hand-off from one worker to the other, or '
                      'the all-reduce of a tensor over both.')
  args = parser.parse_args(argv)
  try:
    cores = [int(c) for c in args.cores.split(',')]
  except ValueError:
    parser.error(f'--cores={args.cores}: give two core numbers, e.g. 0,1.')
  if len(cores) != 2 or cores[0] == cores[1]:
    parser.error(f'--cores={args.cores}: give two distinct cores, e.g. 0,1.')
  if args.num_runs < 1:
    parser.error(f'--num_runs={args.num_runs}: give at least 1.')
  # The planner runs pinned to one core (as a worker); this child inherits
  # that, but its workers need both cores: widen before they are placed.
  try:
    os.sched_setaffinity(0, set(cores))
  except OSError as err:
    parser.error(f'--cores={args.cores}: this process cannot run on those '
                 f'cores ({err}); give cores of this machine.')
  from lingvo_pipe.core import quiet  # pylint: disable=g-import-not-at-top
  quiet.ImportTensorFlow()
  cost = _OnWorkers(cores, args.num_runs, args.what)
  print(f'{args.what}: {cost}', file=sys.stderr)
  print(json.dumps(dataclasses.asdict(cost)), flush=True)


if __name__ == '__main__':
  main()
