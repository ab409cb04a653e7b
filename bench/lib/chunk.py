#!/usr/bin/python3
"""chunk.py: one large sequential write, timed phase by phase (seed 001, PxFS "fastwrite").

    chunk.py PATH SIZE [--bs 512K] [--buffer 64M] [--seed N] [--hash]

Opens PATH with O_CREAT|O_TRUNC|O_WRONLY (mode 0644), writes SIZE bytes with write(2) calls of
--bs bytes (default 512 KiB, the block size of the seed's `dd bs=524288`), fsyncs, closes, and
times open / write / fsync / close separately (time.perf_counter around each system call, the
write phase around the whole loop). The data comes from a buffer of --buffer bytes (default
64 MiB, at most SIZE) of pseudo-random, incompressible bytes (random.Random(seed).randbytes),
filled before the file is opened and written out cyclically, so generating data is not timed.

Prints one JSON line on stdout:
  {"path", "size", "bs", "buffer", "seed", "open_s", "write_s", "fsync_s", "close_s",
   "total_s", "write_mbps", "total_mbps", "writes", "sha256"}
MB = 10^6 bytes. total_s is the sum of the four phases; write_mbps = size / write_s,
total_mbps = size / total_s. With --hash, sha256 is the digest of the SIZE bytes written (computed
after the timed part; null without --hash), so the caller can check what reached the store.
Exit status 0 on success, 1 with a one-line error on stderr otherwise.
"""

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time


def parse_size(s: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", s.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (want e.g. 512K, 2G)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def chunks(buf: memoryview, size: int, bs: int):
    """Yields SIZE bytes as views of at most bs bytes, cycling through buf."""
    off, left, n = 0, size, len(buf)
    while left > 0:
        k = min(bs, left, n - off)
        yield buf[off:off + k]
        off = (off + k) % n
        left -= k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("size", type=parse_size)
    ap.add_argument("--bs", type=parse_size, default=512 << 10)
    ap.add_argument("--buffer", type=parse_size, default=64 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hash", action="store_true", help="print the sha256 of the data written")
    a = ap.parse_args()
    if a.bs <= 0 or a.size < 0:
        ap.error("--bs must be > 0 and SIZE >= 0")
    # The buffer is a multiple of bs so every write(2) is exactly bs bytes (except the last).
    nbuf = max(a.bs, min(a.buffer, a.size) // a.bs * a.bs)
    buf = memoryview(random.Random(a.seed).randbytes(nbuf))

    writes = 0
    try:
        t0 = time.perf_counter()
        fd = os.open(a.path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        t1 = time.perf_counter()
        for piece in chunks(buf, a.size, a.bs):
            while len(piece):
                n = os.write(fd, piece)
                writes += 1
                piece = piece[n:]
        t2 = time.perf_counter()
        os.fsync(fd)
        t3 = time.perf_counter()
        os.close(fd)
        t4 = time.perf_counter()
    except OSError as e:
        print(f"chunk.py: {a.path}: {e} (after {writes} writes)", file=sys.stderr)
        return 1

    digest = None
    if a.hash:
        h = hashlib.sha256()
        for piece in chunks(buf, a.size, 8 << 20):
            h.update(piece)
        digest = h.hexdigest()
    total = t4 - t0
    print(json.dumps({
        "path": a.path, "size": a.size, "bs": a.bs, "buffer": nbuf, "seed": a.seed,
        "open_s": t1 - t0, "write_s": t2 - t1, "fsync_s": t3 - t2, "close_s": t4 - t3,
        "total_s": total,
        "write_mbps": a.size / (t2 - t1) / 1e6 if t2 > t1 else None,
        "total_mbps": a.size / total / 1e6 if total > 0 else None,
        "writes": writes, "sha256": digest,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
