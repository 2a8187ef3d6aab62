"""timeline_png: the PNG is the SVG's picture, box by box, in its colours."""

import xml.etree.ElementTree as ET

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.core.schedules import registry
from lingvo_pipe.core import step_trace
from lingvo_pipe.core import timeline
from lingvo_pipe.core import timeline_png

_NS = '{http://www.w3.org/2000/svg}'
_CPU = '/job:localhost/replica:0/task:0/device:CPU:{}'

# 'A' of the 6 x 13 font, written out; its baseline is under row 10.
_A = ['......',
      '......',
      '..#...',
      '.#.#..',
      '#...#.',
      '#...#.',
      '#...#.',
      '#####.',
      '#...#.',
      '#...#.',
      '#...#.',
      '......',
      '......']


def _Rgb(colour):
  return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _Probes(svg):
  """(x, y, colour): a pixel inside each task's box, below its label,
  with the box's fill; the re-computation's box where it covers B's."""
  root = ET.fromstring(svg)
  out = []
  for rect in root.iter(_NS + 'rect'):
    fill = rect.get('fill')
    if fill not in timeline.PHASE_COLORS.values() or rect.find(
        _NS + 'title') is None:
      continue
    x, y = float(rect.get('x')), float(rect.get('y'))
    w, h = float(rect.get('width')), float(rect.get('height'))
    out.append((round(x + w - 2), round(y + h - 3), _Rgb(fill)))
  return out


def _Trace():
  """K=2, M=2 GPipe, by hand (ms): F on [0, 2) then the Bs, re-computed."""
  tasks = []
  for d in range(2):
    for m in range(2):
      start = (d + m) * 1e-3
      tasks.append(step_trace.MeasuredTask(
          'task/network', _CPU.format(d), 'F', d, m, start, start + 1e-3))
  for d in (1, 0):
    for m in range(2):
      start = (4 + (1 - d) * 2 + m * 2) * 1e-3
      tasks.append(step_trace.MeasuredTask(
          'task/network', _CPU.format(d), 'B', d, m, start, start + 2e-3,
          recomputed=start + 0.5e-3))
  return step_trace.StepTrace(tasks, {'this process': 'one clock'})


class TimelinePngTest(absltest.TestCase):

  def testDrawsTheFontsLetters(self):
    canvas = np.full((20, 10, 3), 255, np.uint8)
    timeline_png.DrawText(canvas, 2, 12, 'A', (0, 0, 0))
    drawn = [''.join('#' if canvas[y, x, 0] == 0 else '.'
                     for x in range(2, 8)) for y in range(1, 14)]
    self.assertEqual(drawn, _A)
    self.assertEqual(int((canvas == 0).all(-1).sum()),
                     sum(row.count('#') for row in _A))

  def testCentresAndEndsText(self):
    canvas = np.full((20, 40, 3), 255, np.uint8)
    timeline_png.DrawText(canvas, 20, 12, '||', (0, 0, 0), 'middle')
    columns = np.nonzero((canvas == 0).all(-1).any(0))[0]
    self.assertEqual(list(columns), [16, 22])  # '|' is column 2 of 6
    canvas[:] = 255
    timeline_png.DrawText(canvas, 20, 12, '|', (0, 0, 0), 'end')
    self.assertEqual(list(np.nonzero((canvas == 0).all(-1).any(0))[0]), [16])

  def testTheMeasuredTimelinesBoxesInTheirColours(self):
    trace = _Trace()
    svg = trace.Svg()
    picture = timeline_png.SvgArray(svg)
    root = ET.fromstring(svg)
    self.assertEqual(picture.shape, (int(root.get('height')),
                                     int(root.get('width')), 3))
    probes = _Probes(svg)
    self.assertLen(probes, 8)  # 4 forwards, 4 backwards
    for x, y, colour in probes:
      self.assertEqual(tuple(picture[y, x]), colour, (x, y))
    # The text is drawn: the heading's row has black pixels.
    self.assertTrue((picture[5:25] == 0).all(-1).any())

  def testTheTablesPictureHasEveryBoxAndTheIdleTime(self):
    table = registry.Make('1f1b', 2, 3)
    svg = timeline.ScheduleSvg(table, [_CPU.format(0), _CPU.format(1)])
    picture = timeline_png.SvgArray(svg)
    colours = {tuple(c) for c in picture.reshape(-1, 3)}
    for colour in list(timeline.PHASE_COLORS.values())[:2] + [
        timeline.IDLE_COLOR]:
      self.assertIn(_Rgb(colour), colours)
    blue = (picture == _Rgb(timeline.PHASE_COLORS['F'])).all(-1)
    self.assertEqual(int(blue.any(1).sum()), 2 * 24)  # 2 rows, 24 high

  def testPngDecodesToTheArray(self):
    svg = _Trace().Svg()
    png = timeline_png.SvgPng(svg)
    self.assertEqual(png[:8], b'\x89PNG\r\n\x1a\n')
    np.testing.assert_array_equal(tf.io.decode_png(png).numpy(),
                                  timeline_png.SvgArray(svg))

  def testAnUnknownColourSaysWhatItTakes(self):
    with self.assertRaisesRegex(ValueError, r"colour 'red'; use #rrggbb"):
      timeline_png.SvgArray(
          '<svg width="4" height="4"><rect width="2" height="2" fill="red"/>'
          '</svg>')


if __name__ == '__main__':
  absltest.main()
