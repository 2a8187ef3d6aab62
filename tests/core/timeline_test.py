"""timeline: the picture of a table has one box per action, where the
simulation runs it (forward 1, backward 2), on its device's row."""

import xml.etree.ElementTree as ET

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import schedule
from lingvo_pipe.core.schedules import registry
from lingvo_pipe.core import timeline

_NS = '{http://www.w3.org/2000/svg}'
_UNIT, _LEFT, _TOP, _ROW = 36, 190, 48, 26
F, B = 'F', 'B'


def _Table(name, stage_devices, order, m):
  return schedule.Schedule(name, m, tuple(stage_devices), tuple(
      tuple(schedule.Action(p, s, mb) for p, s, mb in row) for row in order))


# 1F1B, K=2, M=3, written out; (start, end) of each action with forwards 1
# and backwards 2, worked by hand:
#   dev 0 | F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2
#   dev 1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  .
ONE_F_ONE_B = _Table('1f1b', [0, 1], [
    [(F, 0, 0), (F, 0, 1), (B, 0, 0), (F, 0, 2), (B, 0, 1), (B, 0, 2)],
    [(F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 1, 2), (B, 1, 2)]], 3)
ONE_F_ONE_B_TIMES = [
    [(0, 1), (1, 2), (4, 6), (6, 7), (7, 9), (10, 12)],
    [(1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10)]]

# Interleaved 1F1B, K=2, V=2 (stages 0, 2 on device 0; 1, 3 on 1), M=2,
# times worked by hand: device 0 idles over [4, 6) while B(3, 0) runs,
# then B(2, 0) over [6, 8), idles until B(3, 1) ends at 9, ...
INTERLEAVED = _Table('interleaved_1f1b', [0, 1, 0, 1], [
    [(F, 0, 0), (F, 0, 1), (F, 2, 0), (F, 2, 1), (B, 2, 0), (B, 2, 1),
     (B, 0, 0), (B, 0, 1)],
    [(F, 1, 0), (F, 1, 1), (F, 3, 0), (B, 3, 0), (F, 3, 1), (B, 3, 1),
     (B, 1, 0), (B, 1, 1)]], 2)
INTERLEAVED_TIMES = [
    [(0, 1), (1, 2), (2, 3), (3, 4), (6, 8), (9, 11), (11, 13), (13, 15)],
    [(1, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 9), (9, 11), (11, 13)]]


def _Boxes(svg):
  root = ET.fromstring(svg)  # well-formed XML
  rects = [r for r in root.iter(_NS + 'rect')
           if r.get('fill') != timeline.IDLE_COLOR]
  texts = [t for t in root.iter(_NS + 'text')]
  return rects, texts


class TimelineTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('1f1b', ONE_F_ONE_B, ONE_F_ONE_B_TIMES, False,
       '1f1b schedule, K=2 partitions, M=3 micro-batches, bubble 25.0%'),
      ('interleaved', INTERLEAVED, INTERLEAVED_TIMES, True,
       'interleaved_1f1b schedule, K=2 devices x V=2 stages, M=2 '
       'micro-batches, bubble 20.0%'))
  def testOneBoxPerActionWhereTheSimulationRunsIt(self, table, times, multi,
                                                   heading):
    schedule.Validate(table)
    svg = timeline.ScheduleSvg(table, ['/gpu:0', '/gpu:1'], 'enc')
    rects, texts = _Boxes(svg)
    self.assertEqual(texts[0].text, 'enc  ' + heading)
    labels = texts[3:]  # after the heading and the two device names
    self.assertLen(rects, sum(len(row) for row in table.order))
    sim = schedule.Simulate(table)
    boxes = iter(zip(rects, labels))
    for d, row in enumerate(table.order):
      for a, (start, end) in zip(row, times[d]):
        self.assertEqual(sim.times[a], (start, end), a)
        rect, label = next(boxes)
        self.assertEqual(float(rect.get('x')), _LEFT + start * _UNIT + 1)
        self.assertEqual(float(rect.get('width')), (end - start) * _UNIT - 2)
        self.assertEqual(int(rect.get('y')), _TOP + d * _ROW)
        self.assertEqual(rect.get('fill'), timeline.PHASE_COLORS[a.phase])
        self.assertEqual(label.text, f'{a.phase}{a.micro_batch}' + (
            f's{a.stage}' if multi else ''))
        self.assertEqual(float(label.get('x')),
                         _LEFT + (start + end) / 2 * _UNIT)

  def testTheRowsSpanTheSimulatedStep(self):
    svg = timeline.ScheduleSvg(ONE_F_ONE_B, ['/cpu:0', '/cpu:1'])
    root = ET.fromstring(svg)
    idle = [r for r in root.iter(_NS + 'rect')
            if r.get('fill') == timeline.IDLE_COLOR]
    self.assertLen(idle, 2)
    for r in idle:
      self.assertEqual(float(r.get('width')), 12 * _UNIT)
    self.assertIn('>1f1b schedule, K=2 partitions', svg)

  def testDeviceNamesAreShortAndEscaped(self):
    svg = timeline.ScheduleSvg(registry.Make('gpipe', 1, 1), ['<cpu&0>'])
    self.assertIn('0: &lt;cpu&amp;0&gt;', svg)
    ET.fromstring(svg)
    self.assertEqual(timeline.ShortDeviceName(
        '/job:localhost/replica:0/task:0/device:CPU:3'), 'CPU:3')
    self.assertEqual(timeline.ShortDeviceName(
        '/job:worker/replica:0/task:1/device:CPU:0'), 'worker/task:1 CPU:0')

  def testOneDeviceNamePerDevice(self):
    with self.assertRaisesRegex(
        ValueError, 'got 1 device names for a table of 2 devices; pass one '
        'per device'):
      timeline.ScheduleSvg(registry.Make('interleaved_1f1b', 2, 4, 2),
                           ['/cpu:0'])


if __name__ == '__main__':
  absltest.main()
