"""Corpus BLEU-4 (Papineni et al. 2002) over token sequences, one reference.

For n = 1..N (N = 4), summed over every sentence of the corpus:

  matches_n = sum over hyp n-grams g of min(count_hyp(g), count_ref(g))
  totals_n  = number of n-grams in the hypothesis  (max(0, len - n + 1))
  p_n = matches_n / totals_n

  c = total hypothesis length, r = total reference length
  BP = 1 if c > r else exp(1 - r / c)          (0 if c = 0)
  BLEU = 100 * BP * exp(sum_n log(p_n) / N)     (0 if any p_n = 0)

No smoothing and no tokenisation: tokens are whatever the caller passes
(ids or words), compared for equality. Counts are summed over the corpus
before dividing, so corpus BLEU is not the mean of sentence BLEUs.

  CorpusBleu([['a', 'b', 'c', 'd']], [['a', 'b', 'c', 'd']])   # 100.0
  metric = CorpusBleuMetric(); metric.AddSentence(hyp, ref); metric.value
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Hashable, List, Sequence, Tuple

Tokens = Sequence[Hashable]


def NGramCounts(tokens: Tokens, n: int) -> collections.Counter:
  """{n-gram tuple: count} of one token sequence."""
  tokens = list(tokens)
  return collections.Counter(
      tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


@dataclasses.dataclass
class BleuStats:
  """Sufficient statistics of BLEU; add them up over sentences."""
  matches: List[int]
  totals: List[int]
  hyp_length: int = 0
  ref_length: int = 0

  @classmethod
  def Zero(cls, max_order: int = 4) -> 'BleuStats':
    return cls([0] * max_order, [0] * max_order)

  def __add__(self, other: 'BleuStats') -> 'BleuStats':
    if len(self.matches) != len(other.matches):
      raise ValueError(
          f'BleuStats: cannot add max_order {len(self.matches)} and '
          f'{len(other.matches)}.')
    return BleuStats(
        [a + b for a, b in zip(self.matches, other.matches)],
        [a + b for a, b in zip(self.totals, other.totals)],
        self.hyp_length + other.hyp_length,
        self.ref_length + other.ref_length)


def SentenceStats(hyp: Tokens, ref: Tokens, max_order: int = 4) -> BleuStats:
  """Clipped n-gram matches and totals of one hypothesis and reference."""
  if max_order < 1:
    raise ValueError(f'BLEU: max_order={max_order} must be >= 1.')
  matches, totals = [], []
  for n in range(1, max_order + 1):
    hyp_counts = NGramCounts(hyp, n)
    ref_counts = NGramCounts(ref, n)
    matches.append(sum(min(c, ref_counts[g]) for g, c in hyp_counts.items()))
    totals.append(max(0, len(hyp) - n + 1))
  return BleuStats(matches, totals, len(hyp), len(ref))


def BrevityPenalty(hyp_length: int, ref_length: int) -> float:
  """1 if c > r, else exp(1 - r / c); 0 for an empty hypothesis."""
  if hyp_length == 0:
    return 0.0
  if hyp_length > ref_length:
    return 1.0
  return math.exp(1.0 - ref_length / hyp_length)


def BleuFromStats(stats: BleuStats) -> float:
  """BLEU in [0, 100] from summed statistics (module docstring)."""
  if any(m == 0 for m in stats.matches) or any(t == 0 for t in stats.totals):
    return 0.0
  order = len(stats.matches)
  log_mean = sum(math.log(m / t)
                 for m, t in zip(stats.matches, stats.totals)) / order
  bp = BrevityPenalty(stats.hyp_length, stats.ref_length)
  return 100.0 * bp * math.exp(log_mean)


def CorpusBleu(hyps: Sequence[Tokens], refs: Sequence[Tokens],
               max_order: int = 4) -> float:
  """Corpus BLEU of hypotheses against one reference each, in [0, 100]."""
  if len(hyps) != len(refs):
    raise ValueError(
        f'CorpusBleu: {len(hyps)} hypotheses but {len(refs)} references; '
        'give one reference per hypothesis.')
  stats = BleuStats.Zero(max_order)
  for hyp, ref in zip(hyps, refs):
    stats += SentenceStats(hyp, ref, max_order)
  return BleuFromStats(stats)


class CorpusBleuMetric:
  """Corpus BLEU accumulated over decoded batches; `value` in [0, 100].

  A decoder metric: `AddSentence(hyp, ref)` per decoded sentence (it takes
  token sequences, not the (value, weight) of AverageMetric.Update), then
  `value` is the BLEU of everything added so far.
  """

  def __init__(self, max_order: int = 4) -> None:
    self.stats = BleuStats.Zero(max_order)
    self._max_order = max_order
    self.num_sentences = 0

  def AddSentence(self, hyp: Tokens, ref: Tokens) -> None:
    self.stats += SentenceStats(hyp, ref, self._max_order)
    self.num_sentences += 1

  @property
  def value(self) -> float:
    return BleuFromStats(self.stats)

  def Summary(self) -> Tuple[float, List[float], float]:
    """(BLEU, [p_1 .. p_N], brevity penalty) for logs."""
    s = self.stats
    precisions = [m / t if t else 0.0 for m, t in zip(s.matches, s.totals)]
    return self.value, precisions, BrevityPenalty(s.hyp_length, s.ref_length)
