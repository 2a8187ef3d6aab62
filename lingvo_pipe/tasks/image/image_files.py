"""Whether a file's bytes are a whole JPEG or PNG image, without decoding.

  Problem(data) -> None if whole, else why not ('cut short: ...')

Pure Python (struct, zlib): the trainer checks a folder before it sets up
its devices, when no TensorFlow op may run yet. What is checked:

  JPEG (ITU T.81)  starts with SOI (FF D8 FF); every marker segment before
                   the first scan lies inside the file; a frame header
                   (SOFn) gives a non-zero height and width; an EOI
                   (FF D9) follows the scan (a file cut short has none;
                   data after the EOI, as phones append, is allowed).
  PNG              the 8-byte signature; every chunk lies inside the file
                   and its CRC is right; IHDR comes first with a non-zero
                   size; the IDAT data inflates to its end (zlib's adler32
                   checks it), to height x (1 + row bytes) bytes when not
                   interlaced; IEND ends the chunks.

Not checked: the JPEG's entropy-coded data (a decoder reads past most
damage there, and so does TensorFlow's).
"""

from __future__ import annotations

import struct
import zlib
from typing import Optional

JPEG_SIGNATURE = b'\xff\xd8\xff'
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# SOFn markers: C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_SOS, _EOI = 0xDA, b'\xff\xd9'
# PNG colour type -> channels.
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def Problem(data: bytes) -> Optional[str]:
  """None if `data` is a whole JPEG or PNG file, else why not."""
  if data.startswith(JPEG_SIGNATURE):
    return _JpegProblem(data)
  if data.startswith(PNG_SIGNATURE):
    return _PngProblem(data)
  return f'not a JPEG or PNG file: it starts with {data[:8]!r}'


def _JpegProblem(data: bytes) -> Optional[str]:
  pos, size = 2, None
  while True:
    while pos < len(data) and data[pos] == 0xFF:  # fill bytes
      pos += 1
    if pos + 2 >= len(data):
      return 'cut short: it ends before its first scan'
    marker = data[pos]
    (length,) = struct.unpack('>H', data[pos + 1:pos + 3])
    if length < 2 or pos + 1 + length > len(data):
      return f'cut short: its marker FF {marker:02X} runs past the end'
    if marker in _SOF and length >= 8:
      size = struct.unpack('>HH', data[pos + 4:pos + 8])
    if marker == _SOS:
      break
    pos += 1 + length
  if size is None or 0 in size:
    return 'its frame header (SOF) is missing or gives no size'
  if data.find(_EOI, pos) < 0:
    return 'cut short: no end of image (FF D9) after its scan'
  return None


def _PngProblem(data: bytes) -> Optional[str]:
  pos, header, inflate, inflated = len(PNG_SIGNATURE), None, None, 0
  while pos + 12 <= len(data):
    length, kind = struct.unpack('>I4s', data[pos:pos + 8])
    end = pos + 12 + length
    if end > len(data):
      return f'cut short: its {kind!r} chunk runs past the end'
    body = data[pos + 8:end - 4]
    (crc,) = struct.unpack('>I', data[end - 4:end])
    if zlib.crc32(kind + body) != crc:
      return f'its {kind!r} chunk has a wrong CRC'
    if header is None and kind != b'IHDR':
      return 'its first chunk is not IHDR'
    if kind == b'IHDR':
      header = struct.unpack('>IIBBBBB', body[:13])
      if 0 in header[:2] or header[3] not in _CHANNELS:
        return f'its header (IHDR) is not valid: {header}'
      inflate = zlib.decompressobj()
    elif kind == b'IDAT':
      try:
        inflated += len(inflate.decompress(body))
      except zlib.error as err:
        return f'its image data does not inflate ({err})'
    elif kind == b'IEND':
      return _PngEnd(header, inflate, inflated)
    pos = end
  return 'cut short: no IEND chunk'


def _PngEnd(header: tuple, inflate: zlib.Decompress,
            inflated: int) -> Optional[str]:
  """The image data's end: complete, and of the header's size."""
  if not inflate.eof:
    return 'its image data ends early'
  width, height, depth, colour, _, _, interlace = header
  row = (width * depth * _CHANNELS[colour] + 7) // 8
  if not interlace and inflated != height * (1 + row):
    return (f'its image data is {inflated} bytes, not the {height * (1 + row)}'
            f' of {width}x{height}')
  return None
