#!/usr/bin/env python3
"""png_write.py: write 8-bit pixels as a PNG (zlib and struct only) for the bats tests.

  png_write.py OUT W H C HEXPIXELS [MODE]

HEXPIXELS: H*W*C bytes, HWC (a record's pixels as dataset_record.py prints them), C 1 or 3.
MODE changes them first: up2 (each pixel 2x2: a 2W x 2H image), gray (channel 0 only:
a gray image), gray3 (channel 0 copied to all three: RGB with R = G = B).
"""
import struct
import sys
import zlib


def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))


def png(w, h, c, px):
    rows = b''.join(b'\x00' + px[y * w * c:(y + 1) * w * c] for y in range(h))
    ihdr = struct.pack('>IIBBBBB', w, h, 8, 2 if c == 3 else 0, 0, 0, 0)
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(rows)) + \
        chunk(b'IEND', b'')


def transform(w, h, c, px, mode):
    if mode == 'up2':
        out = bytearray()
        for y in range(2 * h):
            for x in range(2 * w):
                i = ((y // 2) * w + x // 2) * c
                out += px[i:i + c]
        return 2 * w, 2 * h, c, bytes(out)
    if mode in ('gray', 'gray3'):
        red = bytes(px[i] for i in range(0, len(px), c))
        return (w, h, 1, red) if mode == 'gray' else (w, h, 3, bytes(v for r in red for v in (r, r, r)))
    return w, h, c, px


if __name__ == '__main__':
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    out, w, h, c, hexpx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    w, h, c, px = transform(w, h, c, bytes.fromhex(hexpx), sys.argv[6] if len(sys.argv) == 7 else '')
    with open(out, 'wb') as f:
        f.write(png(w, h, c, px))
