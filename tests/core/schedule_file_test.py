"""Tests of lingvo_pipe.core.schedule_file: tables as CSV files.

The torch files below are what torch.distributed.pipelining 2.13's
`_dump_csv` writes (compute_only format) for its ScheduleZBVZeroBubble and
ScheduleLoopedBFS at K=2, M=4: one row per rank, `<stage><F|I|W|B><mb>`,
an empty cell for an idle slot.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import schedule
from lingvo_pipe.core import schedule_file
from lingvo_pipe.core.schedules import registry

_TORCH_ZBV_K2_M4 = (
    '0F0,0F1,0F2,3F0,3I0,3W0,3F1,3I1,3W1,0F3,0I0,0W0,3F2,3I2,3W2,0I1,0W1,'
    '3F3,3I3,3W3,0I2,0W2,0I3,0W3\n'
    ',1F0,2F0,1F1,2F1,2I0,2W0,1F2,1I0,1W0,2F2,2I1,2W1,1F3,1I1,1W1,2F3,2I2,'
    '2W2,1I2,2I3,1I3,1W2,2W3,1W3\n')
_TORCH_LOOPED_BFS_K2_V2_M4 = (
    '0F0,0F1,0F2,0F3,2F0,2F1,2F2,2F3,,,2B3,2B2,2B1,2B0,0B3,0B2,0B1,0B0\n'
    ',1F0,1F1,1F2,1F3,3F0,3F1,3F2,3F3,3B3,3B2,3B1,3B0,1B3,1B2,1B1,1B0\n')


class FileTest(parameterized.TestCase):

  def _Write(self, text, name='table.csv'):
    path = os.path.join(self.create_tempdir().full_path, name)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
    return path

  @parameterized.parameters(('gpipe', 3, 4, 1), ('1f1b', 2, 5, 1),
                            ('interleaved_1f1b', 2, 4, 2), ('zb_h1', 3, 6, 1),
                            ('zb_v', 2, 4, 2), ('interleaved_zb', 2, 4, 2),
                            ('looped_bfs', 2, 3, 2), ('auto', 3, 5, 1))
  def testRoundTrip(self, name, k, m, v):
    table = registry.Make(name, k, m, v)
    path = os.path.join(self.create_tempdir().full_path, 'x.csv')
    schedule_file.Dump(table, path)
    loaded = schedule_file.Load(path)
    self.assertEqual(table.order, loaded.order)
    self.assertEqual(table.stage_devices, loaded.stage_devices)
    self.assertEqual(m, loaded.num_micro_batches)
    self.assertEqual(path, loaded.name)

  def testSplitBackwardsWrittenAsIAndW(self):
    table = registry.Make('1f1b', 2, 2, split_backward=True)
    self.assertEqual([['0F0', '0F1', '', '0I0', '0W0', '', '0I1', '0W1'],
                      ['', '1F0', '1I0', '1W0', '1F1', '1I1', '1W1']],
                     schedule_file.Cells(table))
    self.assertEqual([['0F0', '0F1', '', '0B0', '', '0B1'],
                      ['', '1F0', '1B0', '1F1', '1B1']],
                     schedule_file.Cells(registry.Make('1f1b', 2, 2)))

  def testTorchsFilesLoad(self):
    zbv = schedule_file.Load(self._Write(_TORCH_ZBV_K2_M4))
    self.assertEqual(registry.Make('zb_v', 2, 4, 2).order, zbv.order)
    self.assertEqual((0, 1, 1, 0), zbv.stage_devices)
    bfs = schedule_file.Load(self._Write(_TORCH_LOOPED_BFS_K2_V2_M4))
    self.assertEqual(registry.Make('looped_bfs', 2, 4, 2).order, bfs.order)

  def testAsALayersScheduleByPath(self):
    path = self._Write(_TORCH_ZBV_K2_M4, 'zbv.csv')
    self.assertEqual(2, registry.Check(path, 4, 4, 1, 'never'))
    self.assertEqual((0, 1, 1, 0), registry.Placement(path, 2))
    self.assertEqual(registry.Make('zb_v', 2, 4, 2).order,
                     registry.Make(path, 2, 4).order)
    for args, regex in (
        ((path, 3, 4), r'has 4 stages; give it 4 cells, not 3\.$'),
        ((path, 4, 8), r'is a table of 4 micro-batches; set '
         r'num_micro_batches=4, not 8\.$'),
        ((path, 4, 4, 1, 'always'), r"splits each backward in B and W, "
         r"which needs every stage's activations kept: set "
         r"recompute='never' \(got 'always'\)\.$")):
      with self.assertRaisesRegex(ValueError, regex):
        registry.Check(*args)

  @parameterized.named_parameters(
      ('NotAnAction', '0F0,0X1\n',
       r"row 1, cell 2 '0X1' is not an action; write "
       r'<stage><F\|B\|I\|W><micro-batch>, e\.g\. 0F1\.$'),
      ('StageOnTwoRows', '0F0,0B0\n0F1,0B1\n',
       r"row 2, cell 1 '0F1': stage 0 is already on row 1; list each "
       r"stage's actions on one row\.$"),
      ('MixedBackwards', '0F0,0F1,0B0,0I1,0W1\n',
       r"row 1, cell 4 '0I1': the table mixes whole \(B\) and split \(I\) "
       r'backwards \(first 0B0\); use one kind\.$'),
      ('WWithWholeBackward', '0F0,0B0,0W0\n',
       r"row 1, cell 3 '0W0': W goes with split backwards \(I\), not B\.$"),
      ('SplitWithoutW', '0F0,0I0\n',
       r'splits backwards \(I\) but has no W; add each W\(s, m\) after its '
       r'I\.$'),
      ('MissingStage', '1F0,1B0\n',
       r'lists no action of stage 0; every stage from 0 needs its '
       r'actions\.$'),
      ('Empty', '\n\n', r'has no rows; write one row of actions per '
       r'device\.$'),
      ('Deadlock', '0F0,0B0,0F1,0B1\n1B0,1F0,1F1,1B1\n',
       r'deadlocks: B\(stage 0, micro-batch 0\) on device 0 waits for '
       r'B\(stage 1, micro-batch 0\), which device 1 never reaches '
       r'first\.$'),
      ('Missing', '0F0,0F1,0B1\n',
       r'B\(stage 0, micro-batch 0\) is missing'),
  )
  def testBadFileOneLine(self, text, regex):
    path = self._Write(text)
    with self.assertRaisesRegex(ValueError, regex) as caught:
      schedule_file.Load(path)
    self.assertNotIn('\n', str(caught.exception))
    self.assertIn(path, str(caught.exception))

  def testMissingFile(self):
    with self.assertRaisesRegex(
        ValueError, r'^Schedule file /no/such\.csv: cannot read it '
        r'\(No such file or directory\); give a path to a \.csv table\.$'):
      registry.Lookup('/no/such.csv')

  def testDumpRefusesAnInvalidTable(self):
    table = schedule.Schedule('bad', 1, (0,), ((schedule.Action('B', 0, 0),
                                                schedule.Action('F', 0, 0)),))
    with self.assertRaisesRegex(ValueError, 'deadlocks'):
      schedule_file.Dump(table, os.path.join(
          self.create_tempdir().full_path, 'x.csv'))


if __name__ == '__main__':
  absltest.main()
