#!/usr/bin/env python3
"""dataset_record.py: records of the cifar-lmdb format (version 3) for the bats tests.

  dataset_record.py make OUT LABEL NBYTES SPLIT INDEX
                                            write one record value to OUT: int32 LE label,
                                            the CRC-32C of split name + NUL, index (int64 LE),
                                            label and pixels, NBYTES pixels 0x40
  dataset_record.py make2 OUT LABEL NBYTES  the same as version 2 wrote it (CRC of label
                                            and pixels only)
  mdb_dump -n -s SPLIT FILE | dataset_record.py records SPLIT
                                            print "label hexpixels" per record; exit 1 naming
                                            the first record whose CRC-32C does not match
  dataset_record.py meta-crc JSON-FILE      print the 8 hex digits stored as meta/dataset.crc32c
"""
import struct
import sys


def crc32c(data, c=0xffffffff):
    for x in data:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
    return c ^ 0xffffffff


def covered(split, index, lab, px):
    return split.encode() + b'\0' + struct.pack('<q', int(index)) + lab + px


def make(out, label, nbytes, split=None, index=None):
    lab, px = struct.pack('<i', int(label)), b'\x40' * int(nbytes)
    body = covered(split, index, lab, px) if split is not None else lab + px
    with open(out, 'wb') as f:
        f.write(lab + struct.pack('<I', crc32c(body)) + px)


def parse_dump(lines, split):
    """(label, pixel bytes) of each record of `mdb_dump -n -s SPLIT` output (version 3);
    exits 1 naming the first record whose CRC-32C does not match."""
    lines = [l.strip() for l in lines if l.startswith(' ')]
    for k, v in zip(lines[0::2], lines[1::2]):
        b, key = bytes.fromhex(v), bytes.fromhex(k).decode()
        if int.from_bytes(b[4:8], 'little') != crc32c(covered(split, int(key), b[:4], b[8:])):
            sys.exit('record %s: checksum mismatch' % key)
        yield int.from_bytes(b[:4], 'little', signed=True), b[8:]


def records(split):
    for label, pixels in parse_dump(sys.stdin, split):
        print(label, pixels.hex())


if __name__ == '__main__':
    if len(sys.argv) == 7 and sys.argv[1] == 'make':
        make(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == 'make2':
        make(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == 'records':
        records(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == 'meta-crc':
        print('%08x' % crc32c(open(sys.argv[2], 'rb').read()))
    else:
        sys.exit(__doc__)
