"""TranslateFolderInput on folders of sentence pairs the test writes.

The trainer's side (the languages and vocabulary of a run, the errors as
the console's last line) is tests/trainer_folder_test.py.
"""

import os

from absl.testing import absltest
import tensorflow as tf

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.mt import folder_input
from tests import folder_testlib

_WHO = "TranslateFolderInput 'train': "


class TranslateFolderInputTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self._root = self.create_tempdir().full_path
    folder_testlib.WritePairs(self._root, {'train': 12, 'test': 4})

  def _Params(self, **kwargs):
    vocab = os.path.join(self.create_tempdir().full_path, 'vocab.txt')
    return folder_input.TranslateFolderInput.Params().Set(
        name='train', data_dir=self._root, split='train', batch_size=4,
        max_length=8, vocab_file=vocab, seed=1).Set(**kwargs)

  def _Error(self, p):
    with self.assertRaises(base_input_generator.DataError) as caught:
      p.Instantiate()
    return str(caught.exception)

  def _Write(self, name, text):
    with open(os.path.join(self._root, name), 'w', encoding='utf-8') as f:
      f.write(text)

  def testThePairsInTheFoundDirection(self):
    inp = self._Params(shuffle_buffer_size=0).Instantiate()
    self.assertEqual(('de', 'en'), (inp.params.source_key,
                                    inp.params.target_key))
    batch = next(iter(inp.GetDataset()))
    self.assertTrue(os.path.exists(inp.params.vocab_file))
    self.assertEqual(
        [folder_testlib.Sentence('de', i).encode() for i in range(4)],
        inp.tokenizer.Decode(batch.src.ids).numpy().tolist())
    self.assertEqual(
        [folder_testlib.Sentence('en', i).encode() for i in range(4)],
        inp.tokenizer.Decode(batch.tgt.labels).numpy().tolist())
    back = self._Params(source_key='en').Instantiate().params
    self.assertEqual(('en', 'de'), (back.source_key, back.target_key))

  def testFillFromDataFollowsTheTrainInput(self):
    p = model_registry.GetParams('mt.folder.TransformerTinyFolder')
    for input_p in (p.train_input, p.dev_input, p.test_input):
      input_p.data_dir = self._root
      input_p.batch_size = 4
    p.train_input.target_key = 'de'
    for input_p in (p.train_input, p.dev_input, p.test_input):
      folder_input.TranslateFolderInput.FillFromData(input_p, p)
      self.assertEqual(('en', 'de'), (input_p.source_key, input_p.target_key))

  def testLanguagesMustBeKnown(self):
    folder_testlib.WritePairs(self._root, {'train': 12}, languages=('fr',))
    self.assertEqual(
        _WHO + f'{self._root} has files of 3 languages (de, en, fr), so '
        "source and target are not known; set p.source_key and p.target_key "
        "(e.g. 'de' and 'en').", self._Error(self._Params()))
    self.assertEqual(
        _WHO + f'no file {self._root}/fr.test.txt (split \'test\', de -> '
        f'fr); add it, aligned line by line with {self._root}/de.test.txt, '
        'or change p.split.',
        self._Error(self._Params(split='test', source_key='de',
                                 target_key='fr')))
    self.assertEqual(
        _WHO + "source_key and target_key are both 'de'; set two languages.",
        self._Error(self._Params(source_key='de', target_key='de')))

  def testErrors(self):
    root = self._root
    self.assertEqual(
        _WHO + f'{root}/de.test.txt has 4 lines, fewer than one batch of 8; '
        'add sentence pairs or lower the batch size (p.batch_size).',
        self._Error(self._Params(split='test', batch_size=8)))
    self._Write('en.test.txt', 'one\ntwo\n')
    self.assertEqual(
        _WHO + f'{root}/de.test.txt has 4 lines but {root}/en.test.txt has 2; '
        "the languages of split 'test' must be aligned line by line.",
        self._Error(self._Params()))
    self._Write('en.test.txt', '')
    self.assertEqual(
        _WHO + f'{root}/en.test.txt is empty; add its sentences, one a line.',
        self._Error(self._Params()))
    with open(os.path.join(root, 'en.test.txt'), 'wb') as f:
      f.write(b'one\ntw\xf6\n')
    self.assertEqual(
        _WHO + f'{root}/en.test.txt is not UTF-8 text (byte 6); convert it '
        'to UTF-8.', self._Error(self._Params()))
    os.remove(os.path.join(root, 'en.test.txt'))
    self.assertEqual(
        _WHO + f"no file {root}/en.test.txt (split 'test', de -> en); add it, "
        f'aligned line by line with {root}/de.test.txt, or change p.split.',
        self._Error(self._Params(split='test')))
    self._Write('en.train.tsv', 'one\n')
    self.assertEqual(
        _WHO + f'{root}/en.train.tsv and {root}/en.train.txt are both '
        "language 'en' of split 'train'; keep one.",
        self._Error(self._Params()))
    self._Write('README.md', 'my pairs')
    self.assertEqual(
        _WHO + f'{root}/README.md is not a file named <lang>.<split>.txt; '
        f"move it out of {root} (TFDS's TranslateFolder reads every entry "
        'there).', self._Error(self._Params()))
    self.assertEqual(
        _WHO + f'data_dir {root}/nope is not a folder; pass --data_dir=ROOT '
        '(p.data_dir), a folder of ROOT/<lang>.<split>.txt files.',
        self._Error(self._Params(data_dir=root + '/nope')))

  def testTheVocabularyGoesOutsideTheFolder(self):
    with self.assertRaisesRegex(
        ValueError, r"^TranslateFolderInput 'train': p.vocab_file is None; "
        r'set a path outside data_dir \(the trainer sets '
        r'<logdir>/vocab.txt\)\.$'):
      self._Params(vocab_file=None).Instantiate().GetDataset()
    with self.assertRaisesRegex(FileNotFoundError, 'pass --data_dir=ROOT'):
      self._Params(data_dir=None).Instantiate()


if __name__ == '__main__':
  absltest.main()
