#!/usr/bin/env python3
"""Deterministic generators for the large-file and sparse benchmark trees (stdlib only).

  gen_files.py large  DIR COUNT SIZE_BYTES SEED
      COUNT files DIR/large-<i>.bin of SIZE_BYTES pseudo-random (incompressible) bytes each.
  gen_files.py sparse DIR APPARENT_BYTES DATA_BYTES SEED
      DIR/sparse.img: APPARENT_BYTES apparent size, about DATA_BYTES of pseudo-random data in
      extents of 4 KiB .. 8 MiB at 4 KiB-aligned scattered offsets, plus one 4 KiB extent at the
      very end (data-at-end); everything else is holes.  DIR/hole-only.img: 64 MiB of holes only.
      DIR/hole-at-end.img: 1 MiB of data followed by 63 MiB of hole.

The byte streams come from random.Random(SEED), so the same arguments always produce the same
bytes on any machine with the same CPython major version (Random.randbytes is stable).
"""
import os
import random
import sys

CHUNK = 16 << 20
BLOCK = 4096


def write_random(f, rng, n):
    while n > 0:
        k = min(n, CHUNK)
        f.write(rng.randbytes(k))
        n -= k


def large(d, count, size, seed):
    os.makedirs(d, exist_ok=True)
    for i in range(count):
        rng = random.Random(f"{seed}-large-{i}")
        with open(os.path.join(d, f"large-{i}.bin"), "wb") as f:
            write_random(f, rng, size)


def sparse(d, apparent, data, seed):
    os.makedirs(d, exist_ok=True)
    rng = random.Random(f"{seed}-sparse")
    blocks = apparent // BLOCK
    extents = []
    total = 0
    while total < data:
        length = min(rng.choice([1, 2, 16, 64, 256, 1024, 2048]) * BLOCK, data - total)
        length = max(BLOCK, length - length % BLOCK)
        start = rng.randrange(0, blocks - length // BLOCK - 1) * BLOCK
        extents.append((start, length))
        total += length
    extents.sort()
    path = os.path.join(d, "sparse.img")
    with open(path, "wb") as f:
        f.truncate(apparent)
        for start, length in extents:
            f.seek(start)
            write_random(f, rng, length)
        f.seek(apparent - BLOCK)
        write_random(f, rng, BLOCK)
    with open(os.path.join(d, "hole-only.img"), "wb") as f:
        f.truncate(64 << 20)
    with open(os.path.join(d, "hole-at-end.img"), "wb") as f:
        write_random(f, rng, 1 << 20)
        f.truncate(64 << 20)


def main(argv):
    if len(argv) != 6 or argv[1] not in ("large", "sparse"):
        sys.exit(__doc__)
    kind, d, a, b, seed = argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5]
    (large if kind == "large" else sparse)(d, a, b, seed)


if __name__ == "__main__":
    main(sys.argv)
