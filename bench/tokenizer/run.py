"""Subword tokenizers side by side: TFDS SubwordTextEncoder, sentencepiece.

  .venv/bin/python -m bench.tokenizer.run [--rounds=3]
      [--vocab_sizes=8000,32000] [--json_out=FILE]

Tokenizers, each built from a corpus's train texts:
  tfds STE     tfds.deprecated.text.SubwordTextEncoder.build_from_corpus
               (pure Python; characters outside its pieces become bytes)
  spm unigram  sentencepiece trained from an in-memory iterator with
  spm bpe      subword.py's settings: byte_fallback=True,
               character_coverage=1.0, hard_vocab_limit=False

Corpora, made offline and deterministically (train -> test texts):
  synthetic  lingvo_pipe_synthetic_translation 'default', both sides:
             20000 -> 2000
  made-up    _MadeUpCorpus: 18000 -> 2000 sentences of Zipf-drawn made-up
             stems, prefixes, suffixes, accents, commas, numbers; the test
             adds stems (3 sentences in 10) and Cyrillic (1 in 20) unseen
             in train
  mock wmt   tfds.testing.mock_data, wmt14_translate/de-en 'train', both
             sides: 10000 -> 2000 random strings of a-j and (runs of)
             spaces: speed only, not language-like

Columns, medians over rounds (each round builds every tokenizer afresh, in
a rotated order, so all see the same background load):
  target, vocab  target_vocab_size asked; ids the model has
  build s        seconds to build the vocabulary from the train texts
  enc 1x1 /s     test sentences per second, one encode call per sentence
                 in Python (as a tf.data py_function would)
  enc batch /s   one call for the whole list (sentencepiece, num_threads=1;
                 the STE has no batch encode)
  pieces/sent    ids per test sentence
  unk %          test ids that are the unknown id (the STE has none)
  byte %         test ids that are single bytes. sentencepiece: characters
                 outside its pieces; the STE also spells as bytes every
                 one-byte character (ASCII) that no longer piece covers
  pieces/unseen word  ids per test word never seen in train, encoded alone
  round trip     test texts s with decode(encode(s)) == s exactly
The ratio table divides, round by round, the STE's build time by each
sentencepiece model's, and their encode speeds by the STE's; medians.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import quiet  # noqa: E402

tf = quiet.ImportTensorFlow()

from absl import logging  # noqa: E402
import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.tasks.mt import input_generator  # noqa: E402,F401
from lingvo_pipe.tasks.mt import synthetic_translation  # noqa: E402

Corpus = Tuple[List[str], List[str]]  # (train texts, test texts)
KINDS = ('tfds STE', 'spm unigram', 'spm bpe')
_MIN_SECONDS = 0.5  # each encode speed: whole passes over the test set


def _Texts(ds, keys) -> List[str]:
  return [ex[k].decode('utf-8') for ex in tfds.as_numpy(ds) for k in keys]


def SyntheticCorpus(data_dir: str) -> Corpus:
  builder = tfds.builder(synthetic_translation.NAME, data_dir=data_dir)
  with contextlib.redirect_stdout(io.StringIO()):  # tfds's progress lines
    builder.download_and_prepare()
  keys = (synthetic_translation.SOURCE_KEY, synthetic_translation.TARGET_KEY)
  return tuple(_Texts(builder.as_dataset(split=s), keys)
               for s in ('train', 'test'))


def MockWmtCorpus(data_dir: str) -> Corpus:
  """Mock examples 0-4999 -> 5000-5999 of one split (every split has the
  same mock examples)."""
  with tfds.testing.mock_data(num_examples=6000):
    texts = _Texts(tfds.load('wmt14_translate/de-en', split='train',
                             data_dir=data_dir), ('de', 'en'))
  return texts[:10000], texts[10000:]


def _MadeUpCorpus(num_train: int = 18000, num_test: int = 2000,
                  num_stems: int = 3000, num_new: int = 300,
                  seed: int = 2024) -> Corpus:
  """Sentences of Zipf-distributed made-up words (module docstring)."""
  rng = np.random.default_rng(seed)
  cons = list('bdfgklmnprstvz') + ['ch', 'sh', 'th']
  vows = list('aeiou') + ['é', 'ö', 'ai']

  def Syllable() -> str:
    s = cons[rng.integers(len(cons))] + vows[rng.integers(len(vows))]
    return s + (cons[rng.integers(len(cons))] if rng.random() < 0.3 else '')

  stems = set()
  while len(stems) < num_stems + num_new:
    stems.add(''.join(Syllable() for _ in range(rng.integers(1, 4))))
  stems = [str(s) for s in rng.permutation(sorted(stems))]
  new_stems, stems = stems[:num_new], np.array(stems[num_new:])
  prefixes, prefix_p = np.array(['', 'un', 're', 'vor']), [.85, .05, .06, .04]
  suffixes = np.array(['', 's', 'en', 'ed', 'ung', 'ik', 'ová', 'ismo',
                       'lar', 'ta'])
  suffix_p = np.array([40, 15, 10, 8, 6, 5, 4, 4, 4, 4]) / 100
  zipf = 1.0 / np.arange(1, num_stems + 1) ** 1.15

  def Sentences(count: int, test: bool) -> List[str]:
    lengths = rng.integers(4, 26, count)
    n = int(lengths.sum())
    words = [str(rng.integers(1, 2000)) if r < .02 else  # a number
             a + b + c + (',' if r < .06 else '') for a, b, c, r in zip(
                 rng.choice(prefixes, n, p=prefix_p),
                 stems[rng.choice(num_stems, n, p=zipf / zipf.sum())],
                 rng.choice(suffixes, n, p=suffix_p), rng.random(n))]
    out, start = [], 0
    for k in lengths:
      ws, start = words[start:start + k], start + k
      if test and rng.random() < 0.3:  # a stem never seen in training
        ws[rng.integers(k)] = (new_stems[rng.integers(num_new)] +
                               suffixes[rng.integers(len(suffixes))])
      if test and rng.random() < 0.05:  # letters never seen in training
        ws[rng.integers(k)] = 'жи' + new_stems[rng.integers(num_new)]
      out.append(' '.join(ws).capitalize().rstrip(',') +
                 '..?!.'[rng.integers(5)])
    return out

  return Sentences(num_train, False), Sentences(num_test, True)


def Build(kind: str, train: List[str], vocab_size: int) -> Dict:
  """The tokenizer's functions; 'seconds' is the build time."""
  start = time.perf_counter()
  if kind == 'tfds STE':
    enc = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
        iter(train), target_vocab_size=vocab_size)
    num_subwords = len(enc.subwords)  # ids: 0 pad, subwords, 256 bytes
    out = dict(encode=enc.encode, batch=None, decode=enc.decode,
               size=enc.vocab_size, unk=lambda i: False,
               byte=lambda i: i > num_subwords)
  else:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_writer=model,
        vocab_size=vocab_size, hard_vocab_limit=False,
        model_type=kind.split()[1], pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        byte_fallback=True, character_coverage=1.0,
        input_sentence_size=2_000_000, shuffle_input_sentence=True,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    out = dict(encode=sp.encode,
               batch=lambda texts: sp.encode(texts, num_threads=1),
               decode=sp.decode, size=sp.get_piece_size(),
               unk=lambda i: i == 3, byte=sp.is_byte)
  out['seconds'] = time.perf_counter() - start
  return out


def _PerSecond(fn: Callable[[], object], count: int) -> float:
  passes, start = 0, time.perf_counter()
  while time.perf_counter() - start < _MIN_SECONDS:
    fn()
    passes += 1
  return passes * count / (time.perf_counter() - start)


def UnseenWords(corpus: Corpus) -> List[str]:
  """Test words (split at spaces) never seen in train, with repeats."""
  seen = {w for s in corpus[0] for w in s.split()}
  return [w for s in corpus[1] for w in s.split() if w not in seen]


def Measure(kind: str, corpus: Corpus, vocab_size: int) -> Dict:
  """One round's numbers of one tokenizer on one corpus (see columns)."""
  train, test = corpus
  unseen = UnseenWords(corpus)
  tok = Build(kind, train, vocab_size)
  encode = tok['encode']
  one = _PerSecond(lambda: [encode(s) for s in test], len(test))
  batch = tok['batch']
  batched = _PerSecond(lambda: batch(test), len(test)) if batch else None
  ids = [encode(s) for s in test]
  flat = [i for row in ids for i in row]
  return dict(vocab=tok['size'], build_s=tok['seconds'], enc_1x1=one,
              enc_batch=batched, pieces=len(flat) / len(test),
              unk=100 * sum(map(tok['unk'], flat)) / len(flat),
              byte=100 * sum(map(tok['byte'], flat)) / len(flat),
              unseen=(statistics.mean(len(encode(w)) for w in unseen)
                      if unseen else None),
              round_trip=sum(tok['decode'](r) == s
                             for r, s in zip(ids, test)))


def _Table(runs: Dict, corpora: Dict[str, Corpus]) -> List[Dict]:
  """Prints the medians' table; returns its rows."""
  print('| corpus | tokenizer | target | vocab | build s | enc 1x1 /s | '
        'enc batch /s | pieces/sent | unk % | byte % | pieces/unseen word '
        '| round trip |')
  print('|---|---|---|---|---|---|---|---|---|---|---|---|')
  rows = []
  for (c, v, k), ms in runs.items():
    m = {key: None if ms[0][key] is None else
         statistics.median(x[key] for x in ms) for key in ms[0]}
    rows.append(dict(corpus=c, tokenizer=k, target=v, **m))
    batch = 'n/a' if m['enc_batch'] is None else f'{m["enc_batch"]:,.0f}'
    unseen = 'n/a' if m['unseen'] is None else f'{m["unseen"]:.2f}'
    print(f'| {c} | {k} | {v} | {m["vocab"]:.0f} | {m["build_s"]:.2f} | '
          f'{m["enc_1x1"]:,.0f} | {batch} | {m["pieces"]:.2f} | '
          f'{m["unk"]:.2f} | {m["byte"]:.2f} | {unseen} | '
          f'{m["round_trip"]:.0f}/{len(corpora[c][1])} |')
  return rows


def _Ratios(runs: Dict, cases: List[Tuple[str, int]]) -> List[Dict]:
  """Prints the per-round ratios' medians; returns them."""
  print('| corpus | target | sentencepiece | STE build / its build | '
        'its enc 1x1 / STE enc 1x1 |')
  print('|---|---|---|---|---|')
  ratios = []
  for c, v in cases:
    ste = runs[(c, v, KINDS[0])]
    for k in KINDS[1:]:
      pairs = list(zip(ste, runs[(c, v, k)]))
      build = statistics.median(a['build_s'] / b['build_s'] for a, b in pairs)
      enc = statistics.median(b['enc_1x1'] / a['enc_1x1'] for a, b in pairs)
      ratios.append(dict(corpus=c, target=v, tokenizer=k, build_ratio=build,
                         encode_ratio=enc))
      print(f'| {c} | {v} | {k} | {build:.0f}x | {enc:.1f}x |')
  return ratios


def Main() -> None:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--vocab_sizes', default='8000,32000',
                      help='targets for the made-up corpus (others: 8000)')
  parser.add_argument('--json_out', default='')
  args = parser.parse_args()
  logging.set_verbosity(logging.ERROR)
  tfds.disable_progress_bar()
  begin = time.time()
  with tempfile.TemporaryDirectory() as data_dir:
    corpora = {'synthetic': SyntheticCorpus(data_dir),
               'made-up': _MadeUpCorpus(), 'mock wmt': MockWmtCorpus(data_dir)}
  cases = ([('synthetic', 8000)] + [('made-up', int(v)) for v in
                                    args.vocab_sizes.split(',')] +
           [('mock wmt', 8000)])
  runs = {(c, v, k): [] for c, v in cases for k in KINDS}
  for r in range(args.rounds):
    for c, v in cases:
      for i in range(len(KINDS)):
        k = KINDS[(i + r) % len(KINDS)]
        runs[(c, v, k)].append(Measure(k, corpora[c], v))
  print(f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}; '
        f'{args.rounds} rounds; tensorflow {tf.__version__}, '
        f'tensorflow-datasets {tfds.__version__}, sentencepiece '
        f'{spm.__version__}, Python {platform.python_version()}; nproc '
        f'{os.cpu_count()}, load {os.getloadavg()[0]:.2f}.')
  for name, (train, test) in corpora.items():
    words = sum(len(s.split()) for s in test)
    print(f'- {name}: {len(train)} train texts, {len(test)} test texts, '
          f'{100 * len(UnseenWords((train, test))) / words:.1f}% of test '
          'words unseen in train')
  print()
  rows = _Table(runs, corpora)
  print()
  ratios = _Ratios(runs, cases)
  print(f'\nTotal {time.time() - begin:.0f} s.')
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(dict(rows=rows, ratios=ratios, raw=[
          dict(corpus=c, target=v, tokenizer=k, rounds=ms)
          for (c, v, k), ms in runs.items()]), f, indent=1)


if __name__ == '__main__':
  Main()
