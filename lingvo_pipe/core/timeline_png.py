"""The timeline pictures as PNG: their SVG drawn into pixels.

TensorBoard's image summaries hold PNG or JPEG, and the timelines are SVG
(`timeline.ScheduleSvg`, `step_trace.StepTrace.Svg`). `SvgPng(svg)` draws
the few elements those SVGs use into a numpy array and encodes it with
`tf.io.encode_png`: the same picture, no imaging library.

  element  drawn as
  rect     a filled box (x, y, width, height; "100%": the picture), its
           stroke as a 1-pixel border when the box is 3 pixels or more
  line     a 1-pixel line from (x1, y1) to (x2, y2) in its stroke colour
  text     6 x 13 pixel characters (X11 misc-fixed 6x13, public domain)
           whatever the font size, baseline at y, text-anchor start,
           middle or end; characters outside ASCII as '?'
  others   (title: a tooltip) not drawn

Colours are #rrggbb, white or black; the background is white.
"""

from __future__ import annotations

from typing import Optional, Tuple
from xml.etree import ElementTree

import numpy as np
import tensorflow as tf

# Rows of 6 pixels, one base64 digit each (bit 5 the leftmost pixel), 13
# per character, for ASCII 32 (' ') to 126 ('~'); the baseline is under
# row 10.
_FONT_DATA = (
    'AAAAAAAAAAAAAAAIIIIIIIAIAAAAUUUAAAAAAAAAAAUU+U+UUAAAAAIeoocKK8IAAAASqUEI'
    'QUqkAAAAAQooQomkaAAAAIIIAAAAAAAAAEIIQQQQQIIEAAQIIEEEEEIIQAAAIqcqIAAAAAAA'
    'AAAII+IIAAAAAAAAAAAAAMIQAAAAAAA+AAAAAAAAAAAAAAAIcIAAACCEEIQQggAAAAIUiiii'
    'iUIAAAAIYoIIIII+AAAAciiCEIQg+AAAA+CEIcCCicAAAAEEMUUk+EEAAAA+ggsyCCicAAAA'
    'cigg8iiicAAAA+CEEIIQQQAAAAciiiciiicAAAAciiieCCicAAAAAAIcIAAIcIAAAAAIcIAA'
    'MIQAAACEIQgQIECAAAAAAA+AA+AAAAAAgQIECEIQgAAAAciiCEIIAIAAAAciimqqsgeAAAAI'
    'Uiii+iiiAAAA8SSScSSS8AAAAcigggggicAAAA8SSSSSSS8AAAA+ggg8ggg+AAAA+ggg8ggg'
    'gAAAAcigggmiicAAAAiiii+iiiiAAAAcIIIIIIIcAAAAOEEEEEEkYAAAAiikowokiiAAAAgg'
    'gggggg+AAAAii2qqiiiiAAAAiyyqqmmiiAAAAciiiiiiicAAAA8iii8ggggAAAAciiiiiiqc'
    'CAAA8iii8okiiAAAAciggcCCicAAAA+IIIIIIIIAAAAiiiiiiiicAAAAiiiiUUUIIAAAAiii'
    'iqqqqUAAAAiiUUIUUiiAAAAiiUUIIIIIAAAA+CEEIQQg+AAAcQQQQQQQQQcAAAggQQIEECCA'
    'AAcEEEEEEEEEcAAAIUiAAAAAAAAAAAAAAAAAAA+AAIEAAAAAAAAAAAAAAAcCeimaAAAAggg8'
    'iiii8AAAAAAAciggicAAAACCCeiiiieAAAAAAAci+gicAAAAMSQQ8QQQQAAAAAAAciiieCic'
    'AAgggsyiiiiAAAAAIAYIIIIcAAAAAEAMEEEEkkYAAgggkowokiAAAAYIIIIIIIcAAAAAAA0q'
    'qqqiAAAAAAAsyiiiiAAAAAAAciiiicAAAAAAA8iii8gggAAAAAeiiieCCCAAAAAsyggggAAA'
    'AAAAciYEicAAAAAQQ8QQQSMAAAAAAAiiiimaAAAAAAAiiiUUIAAAAAAAiiqqqUAAAAAAAiUI'
    'IUiAAAAAAAiiimaCicAAAAA+EIQg+AAAGIIIIwIIIIGAAAIIIIIIIIIAAAwIIIIGIIIIwAAA'
    'SqkAAAAAAAA'
)
_B64 = ('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/')
CHAR_W, CHAR_H, _ASCENT = 6, 13, 11
_GLYPHS = np.array(
    [[(_B64.index(c) >> (5 - x)) & 1 for x in range(CHAR_W)]
     for c in _FONT_DATA], bool).reshape(-1, CHAR_H, CHAR_W)
_NAMED = {'white': (255, 255, 255), 'black': (0, 0, 0)}

Rgb = Tuple[int, int, int]


def Colour(text: Optional[str]) -> Optional[Rgb]:
  """(r, g, b) of '#rrggbb', 'white' or 'black'; None for none."""
  if text is None or text == 'none':
    return None
  if text in _NAMED:
    return _NAMED[text]
  if len(text) == 7 and text[0] == '#':
    return tuple(int(text[i:i + 2], 16) for i in (1, 3, 5))
  raise ValueError(f'timeline_png: colour {text!r}; use #rrggbb, white or '
                   'black.')


def DrawText(canvas: np.ndarray, x: float, y: float, text: str,
             colour: Rgb, anchor: str = 'start') -> None:
  """`text` with its baseline at y, starting, centred or ending at x."""
  width = CHAR_W * len(text)
  left = round(x - {'start': 0, 'middle': width / 2, 'end': width}[anchor])
  top = round(y) - _ASCENT
  for i, char in enumerate(text):
    code = ord(char) - 32
    glyph = _GLYPHS[code if 0 <= code < len(_GLYPHS) else ord('?') - 32]
    _Paint(canvas, left + i * CHAR_W, top, glyph, colour)


def _Paint(canvas: np.ndarray, left: int, top: int, mask: np.ndarray,
           colour: Rgb) -> None:
  """Sets the pixels of `mask` placed at (left, top), clipped."""
  h, w = canvas.shape[:2]
  y0, x0 = max(top, 0), max(left, 0)
  y1, x1 = min(top + mask.shape[0], h), min(left + mask.shape[1], w)
  if y0 < y1 and x0 < x1:
    part = mask[y0 - top:y1 - top, x0 - left:x1 - left]
    canvas[y0:y1, x0:x1][part] = colour


def _Box(canvas: np.ndarray, x: float, y: float, w: float, h: float,
         colour: Rgb) -> Tuple[int, int, int, int]:
  """Fills the box; its pixel bounds (x0, y0, x1, y1), at least 1 x 1."""
  x0, y0 = round(x), round(y)
  x1, y1 = max(round(x + w), x0 + 1), max(round(y + h), y0 + 1)
  _Paint(canvas, x0, y0, np.ones((y1 - y0, x1 - x0), bool), colour)
  return x0, y0, x1, y1


def _Rect(canvas: np.ndarray, el: ElementTree.Element) -> None:
  h, w = canvas.shape[:2]
  def Size(name, whole):
    value = el.get(name, '0')
    return whole if value == '100%' else float(value)
  fill, stroke = Colour(el.get('fill', 'black')), Colour(el.get('stroke'))
  x, y = float(el.get('x', 0)), float(el.get('y', 0))
  if fill is not None:
    x0, y0, x1, y1 = _Box(canvas, x, y, Size('width', w), Size('height', h),
                          fill)
    if stroke is not None and min(x1 - x0, y1 - y0) >= 3:
      border = np.ones((y1 - y0, x1 - x0), bool)
      border[1:-1, 1:-1] = False
      _Paint(canvas, x0, y0, border, stroke)


def _Line(canvas: np.ndarray, el: ElementTree.Element) -> None:
  colour = Colour(el.get('stroke', 'black'))
  x1, y1, x2, y2 = (float(el.get(k, 0)) for k in ('x1', 'y1', 'x2', 'y2'))
  n = int(max(abs(x2 - x1), abs(y2 - y1))) + 1
  for t in np.linspace(0.0, 1.0, n):
    _Box(canvas, x1 + t * (x2 - x1), y1 + t * (y2 - y1), 1, 1, colour)


def SvgArray(svg: str) -> np.ndarray:
  """The SVG (module docstring) as a [height, width, 3] uint8 array."""
  root = ElementTree.fromstring(svg)
  canvas = np.full((round(float(root.get('height'))),
                    round(float(root.get('width'))), 3), 255, np.uint8)
  for el in root.iter():
    tag = el.tag.rsplit('}', 1)[-1]
    if tag == 'rect':
      _Rect(canvas, el)
    elif tag == 'line':
      _Line(canvas, el)
    elif tag == 'text':
      DrawText(canvas, float(el.get('x', 0)), float(el.get('y', 0)),
               ''.join(el.itertext()), Colour(el.get('fill', 'black')),
               el.get('text-anchor', 'start'))
  return canvas


def SvgPng(svg: str) -> bytes:
  """The SVG (module docstring) as PNG bytes."""
  return tf.io.encode_png(SvgArray(svg)).numpy()
