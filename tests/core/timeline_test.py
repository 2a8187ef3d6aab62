"""timeline: the schedule picture has one box per task, in the right place."""

import re
import xml.etree.ElementTree as ET

from absl.testing import absltest

from lingvo_pipe.core import schedule
from lingvo_pipe.core import timeline


class TimelineTest(absltest.TestCase):

  def testOneBoxPerTaskAtItsTickAndDevice(self):
    svg = timeline.ScheduleSvg(3, 4, ['/gpu:0', '/gpu:1', '/gpu:2'], 'enc')
    root = ET.fromstring(svg)  # well-formed XML
    ns = '{http://www.w3.org/2000/svg}'
    labels = [t.text for t in root.iter(ns + 'text')]
    self.assertIn('enc  K=3 partitions, M=4 micro-batches, bubble 33.3%',
                  labels)
    boxes = [r for r in root.iter(ns + 'rect') if r.get('fill') != '#eeeeee']
    tasks = schedule.GPipeSchedule(3, 4)
    self.assertLen(boxes, len(tasks))
    for box, task in zip(boxes, tasks):
      self.assertEqual(int(box.get('x')), 190 + task.tick * 34 + 1)
      self.assertEqual(int(box.get('y')), 48 + task.partition * 26)
      self.assertEqual(box.get('fill'),
                       '#4a90d9' if task.phase == 'F' else '#e8913a')
    self.assertEqual(labels.count('F0'), 3)
    self.assertEqual(len([x for x in labels if re.fullmatch('B[0-3]', x)]),
                     12)

  def testDeviceNamesAreShortAndEscaped(self):
    svg = timeline.ScheduleSvg(1, 1, ['<cpu&0>'])
    self.assertIn('0: &lt;cpu&amp;0&gt;', svg)
    ET.fromstring(svg)
    self.assertEqual(timeline.ShortDeviceName(
        '/job:localhost/replica:0/task:0/device:CPU:3'), 'CPU:3')
    self.assertEqual(timeline.ShortDeviceName(
        '/job:worker/replica:0/task:1/device:CPU:0'), 'worker/task:1 CPU:0')

  def testOneDeviceNamePerPartition(self):
    with self.assertRaisesRegex(ValueError, 'got 1 device names for 2'):
      timeline.ScheduleSvg(2, 4, ['/cpu:0'])


if __name__ == '__main__':
  absltest.main()
