"""Small folders of a user's own data, written by the folder tests.

WriteImages: real JPEG and PNG files (RGB, grey and RGBA, of a few sizes)
in ImageFolder's layout, ROOT/<split>/<class>/; each class has a pattern
of its own. WritePairs: aligned sentences in TranslateFolder's layout,
ROOT/<lang>.<split>.txt.
"""

import os

import numpy as np
import tensorflow as tf

CLASSES = ('checks', 'rows', 'stripes')
_DIGITS = {
    'de': 'null eins zwei drei vier fuenf sechs sieben acht neun'.split(),
    'en': 'zero one two three four five six seven eight nine'.split(),
    'fr': 'zero un deux trois quatre cinq six sept huit neuf'.split(),
}


def Pattern(label: int, index: int) -> np.ndarray:
  """uint8 [h, w, 3]: class `label`'s pattern, `index` varying its size
  and noise (checks, horizontal or vertical stripes of 4 pixels)."""
  h, w = 20 + 4 * (index % 3), 24 + 2 * (index % 2)
  rows = (np.arange(h)[:, None] // 4) % 2 * np.ones([1, w], np.int64)
  cols = (np.arange(w)[None, :] // 4) % 2 * np.ones([h, 1], np.int64)
  bright = [rows ^ cols, rows, cols][label % 3]
  noise = np.random.RandomState(index).randint(0, 40, [h, w, 3])
  return (bright[..., None] * 180 + noise).astype(np.uint8)


def Encoded(image: np.ndarray, index: int) -> tuple:
  """(file extension, bytes) by index: an RGB JPEG, an RGB PNG, a grey PNG
  (upper-case .PNG), a grey JPEG (.jpeg) or an RGBA PNG."""
  kind = index % 5
  if kind == 0:
    return '.jpg', tf.io.encode_jpeg(image).numpy()
  if kind == 1:
    return '.png', tf.io.encode_png(image).numpy()
  if kind == 2:
    return '.PNG', tf.io.encode_png(image[..., :1]).numpy()
  if kind == 3:
    return '.jpeg', tf.io.encode_jpeg(image[..., :1]).numpy()
  alpha = np.full(image.shape[:2] + (1,), 255, np.uint8)
  return '.png', tf.io.encode_png(np.concatenate([image, alpha], -1)).numpy()


def WriteImages(root: str, per_class: dict, classes=CLASSES) -> None:
  """ROOT/<split>/<class>/<i>.<ext>: per_class[split] images of each
  class, every kind of Encoded's."""
  for split, n in per_class.items():
    for label, name in enumerate(classes):
      folder = os.path.join(root, split, name)
      os.makedirs(folder, exist_ok=True)
      for i in range(n):
        ext, data = Encoded(Pattern(label, i), i)
        with open(os.path.join(folder, f'{i}{ext}'), 'wb') as f:
          f.write(data)


def Sentence(lang: str, i: int) -> str:
  """The digits of 7i + 3 in words of `lang`: 'drei', 'eins null', ..."""
  return ' '.join(_DIGITS[lang][int(d)] for d in str(7 * i + 3))


def WritePairs(root: str, lines: dict, languages=('de', 'en')) -> None:
  """ROOT/<lang>.<split>.txt with lines[split] aligned sentences."""
  os.makedirs(root, exist_ok=True)
  for split, n in lines.items():
    for lang in languages:
      with open(os.path.join(root, f'{lang}.{split}.txt'), 'w',
                encoding='utf-8') as f:
        f.writelines(Sentence(lang, i) + '\n' for i in range(n))
