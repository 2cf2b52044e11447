"""A block's bytes as the store keeps them: a 16-byte header, then the data.

    magic "TXLB" | crc32 of the data (u32, little-endian) | length of the data (u64) | data

A write cut short (a crash, a full disk, a copy interrupted by hand) or damaged later fails the length or the
checksum on read, and is reported as such: a block is never read back as a memory it is not.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"TXLB"
_HEADER = struct.Struct("<4sIQ")
HEADER_BYTES = _HEADER.size


class DamagedBlock(ValueError):
    """A stored block whose bytes are not what was written (cut short or damaged)."""


def encode(data: bytes) -> bytes:
    return _HEADER.pack(MAGIC, zlib.crc32(data), len(data)) + data


def decode(raw: bytes) -> bytes:
    """The data of a stored block; DamagedBlock if its header, length or checksum does not hold."""
    if len(raw) < HEADER_BYTES:
        raise DamagedBlock(f"{len(raw)} bytes, shorter than a block's header")
    magic, crc, length = _HEADER.unpack_from(raw)
    data = raw[HEADER_BYTES:]
    if magic != MAGIC:
        raise DamagedBlock("not a block (wrong magic)")
    if len(data) != length:
        raise DamagedBlock(f"{len(data)} bytes of data where {length} were written")
    if zlib.crc32(data) != crc:
        raise DamagedBlock("its checksum does not match its data")
    return data
