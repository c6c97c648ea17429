#!/usr/bin/env python3
"""dataset_record.py: records of the cifar-lmdb format (version 2) for the bats tests.

  dataset_record.py make OUT LABEL NBYTES   write one record value to OUT: int32 LE label,
                                            the CRC-32C of label and pixels, NBYTES pixels 0x40
  mdb_dump -n -s SPLIT FILE | dataset_record.py records
                                            print "label hexpixels" per record; exit 1 naming
                                            the first record whose CRC-32C does not match
"""
import struct
import sys


def crc32c(data, c=0xffffffff):
    for x in data:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
    return c ^ 0xffffffff


def make(out, label, nbytes):
    lab, px = struct.pack('<i', int(label)), b'\x40' * int(nbytes)
    with open(out, 'wb') as f:
        f.write(lab + struct.pack('<I', crc32c(lab + px)) + px)


def parse_dump(lines):
    """(label, pixel bytes) of each record of `mdb_dump -n -s SPLIT` output; exits 1
    naming the first record whose CRC-32C does not match."""
    lines = [l.strip() for l in lines if l.startswith(' ')]
    for k, v in zip(lines[0::2], lines[1::2]):
        b = bytes.fromhex(v)
        if int.from_bytes(b[4:8], 'little') != crc32c(b[:4] + b[8:]):
            sys.exit('record %s: checksum mismatch' % bytes.fromhex(k).decode())
        yield int.from_bytes(b[:4], 'little', signed=True), b[8:]


def records():
    for label, pixels in parse_dump(sys.stdin):
        print(label, pixels.hex())


if __name__ == '__main__':
    if len(sys.argv) == 5 and sys.argv[1] == 'make':
        make(*sys.argv[2:])
    elif len(sys.argv) == 2 and sys.argv[1] == 'records':
        records()
    else:
        sys.exit(__doc__)
