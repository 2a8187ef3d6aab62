"""Corpus BLEU with sacreBLEU (Post 2018), on detokenised text.

sacreBLEU tokenises hypotheses and references itself (13a, as WMT does), so
a score here compares with published ones; its signature says exactly how
it was made. We add sentences as text and ask for the corpus score:

  metric = SacreBleuMetric()
  metric.Add('the cat sat .', 'the cat sat on the mat .')
  metric.value      # corpus BLEU, 0-100 (0 with no sentences)
  metric.signature  # 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|...'

sacrebleu is a dependency because BLEU is only comparable when computed the
way the field computes it (its tokenisation and brevity penalty); our own
implementation of the formula on ids was not (README).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import sacrebleu


class SacreBleuMetric:
  """Corpus BLEU of the sentences added so far (module docstring)."""

  def __init__(self, tokenize: str = '13a') -> None:
    self._bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
    self._hyps: List[str] = []
    self._refs: List[str] = []
    self._srcs: List[str] = []
    self._orders: List[int] = []

  def Add(self, hyp: str, ref: str, src: str = '',
          order: Optional[int] = None) -> None:
    """One hypothesis, its reference (and source), as detokenised text;
    `order`, its place in the input (Texts sorts by it), else as added."""
    self._hyps.append(hyp)
    self._refs.append(ref)
    self._srcs.append(src)
    self._orders.append(len(self._orders) if order is None else order)

  @property
  def value(self) -> float:
    if not self._hyps:
      return 0.0
    return float(self._bleu.corpus_score(self._hyps, [self._refs]).score)

  @property
  def signature(self) -> str:
    # sacreBLEU knows the number of references only after a score.
    self._bleu.corpus_score(self._hyps or [''], [self._refs or ['']])
    return str(self._bleu.get_signature())

  @property
  def total_weight(self) -> int:
    """Number of sentences."""
    return len(self._hyps)

  def Texts(self) -> Tuple[List[str], List[str], List[str]]:
    """(sources, hypotheses, references) in the input's order (Add's
    `order`), else as added."""
    rank = sorted(range(len(self._orders)), key=self._orders.__getitem__)
    return tuple([texts[i] for i in rank]
                 for texts in (self._srcs, self._hyps, self._refs))
