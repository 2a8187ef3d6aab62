"""image_files.Problem against TensorFlow's decoder, on files TF encodes.

Every kind of folder_testlib's files (RGB and grey JPEGs, RGB, grey and
RGBA PNGs), whole and cut at 40 places each: Problem says a file is whole
exactly when tf.image.decode_image (as TFDS's ImageFolder decodes) reads
it.
"""

import struct
import zlib

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.tasks.image import image_files
from tests import folder_testlib


def _Decodes(data):
  try:
    tf.image.decode_image(data, channels=3)
  except tf.errors.OpError:
    return False
  return True


def _File(kind):
  return folder_testlib.Encoded(folder_testlib.Pattern(kind % 3, kind),
                                kind)[1]


class ImageFilesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(range(5))
  def testWholeExactlyWhenTensorFlowDecodesIt(self, kind):
    data = _File(kind)
    self.assertIsNone(image_files.Problem(data))
    self.assertIsNone(image_files.Problem(data + b'appended' * 8))
    cuts = sorted({1 + i * (len(data) - 1) // 40 for i in range(40)})
    for cut in cuts:
      problem = image_files.Problem(data[:cut])
      self.assertEqual(problem is None, _Decodes(data[:cut]), (cut, problem))
      self.assertIsNotNone(problem, cut)

  def testWhy(self):
    jpeg, png = _File(0), _File(1)
    self.assertEqual("not a JPEG or PNG file: it starts with b'GIF89a\\x01"
                     "\\x00'", image_files.Problem(b'GIF89a\x01\x00\x01'))
    self.assertEqual('cut short: no end of image (FF D9) after its scan',
                     image_files.Problem(jpeg[:-2]))
    self.assertEqual('cut short: it ends before its first scan',
                     image_files.Problem(jpeg[:4]))
    self.assertEqual('cut short: no IEND chunk', image_files.Problem(png[:-12]))
    broken = bytearray(png)
    broken[-20] ^= 1  # inside the last IDAT chunk
    self.assertEqual("its b'IDAT' chunk has a wrong CRC",
                     image_files.Problem(bytes(broken)))
    self.assertFalse(_Decodes(bytes(broken)))
    # A PNG of 0 rows: a valid CRC, a header TF refuses too.
    zero = bytearray(png)
    zero[20:24] = struct.pack('>I', 0)
    zero[29:33] = struct.pack('>I', zlib.crc32(zero[12:29]))
    self.assertRegex(image_files.Problem(bytes(zero)),
                     r'^its header \(IHDR\) is not valid')
    self.assertFalse(_Decodes(bytes(zero)))


if __name__ == '__main__':
  absltest.main()
