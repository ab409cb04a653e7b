#!/usr/bin/python3
"""mixed.py: concurrent readers and writers in the style of blogbench (seed 003).

    mixed.py READ_DIR WRITE_DIR --readers 2 --writers 2 --seconds 20 [--read-only-seconds 10]
             [--seed 3]

Blogbench itself is not packaged by Debian; this is a small stand-in that keeps what the
seed measures: reads/s of existing articles while writers add new ones.

  readers:  each picks a random file of READ_DIR (listed once, before the clock starts) and
            reads it whole with open/read(64 KiB)/close, again and again.
  writers:  each creates new files ("articles") WRITE_DIR/w<N>/a<K>.txt of 1-64 KiB of text
            (uniform; written with one write(2), closed, no fsync), and after every 4th
            article appends 1-4 KiB to one of its earlier articles (a "comment").

Phase 1 (when --read-only-seconds > 0): the readers alone. Phase 2: readers and writers
together for --seconds. Every reader and writer is a process of its own (no GIL between
them). Prints one JSON line: per phase the reads, read bytes, reads/s, read MB/s, read latency
p50/p99 (ms, whole-file open-read-close), and for phase 2 the writes (articles + comments),
writes/s, write MB/s, write latency p50/p99. Exit status 0 on success, 1 with a one-line
error otherwise.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time

TEXT = (b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 18 + b"\n" * 4)


def pct(sorted_vals, q):
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def reader(files, deadline, seed, out):
    rng = random.Random(seed)
    n = nbytes = 0
    lat = []
    while time.monotonic() < deadline:
        path = files[rng.randrange(len(files))]
        t0 = time.perf_counter()
        try:
            with open(path, "rb", buffering=0) as f:
                while True:
                    b = f.read(65536)
                    if not b:
                        break
                    nbytes += len(b)
        except OSError as e:
            out.put({"error": f"read {path}: {e}"})
            return
        lat.append(time.perf_counter() - t0)
        n += 1
    out.put({"kind": "r", "n": n, "bytes": nbytes, "lat": lat})


def writer(wdir, deadline, seed, out):
    rng = random.Random(seed)
    pool = bytes(rng.choice(TEXT) for _ in range(1 << 16)) * 2
    os.makedirs(wdir, exist_ok=True)
    n = nbytes = 0
    lat = []
    made = []
    k = 0
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            if k % 5 == 4 and made:
                path = made[rng.randrange(len(made))]
                size = rng.randint(1024, 4096)
                with open(path, "ab", buffering=0) as f:
                    f.write(pool[:size])
            else:
                path = os.path.join(wdir, f"a{k:06d}.txt")
                size = rng.randint(1024, 65536)
                off = rng.randrange(65536)
                with open(path, "wb", buffering=0) as f:
                    f.write(pool[off:off + size])
                made.append(path)
        except OSError as e:
            out.put({"error": f"write {path}: {e}"})
            return
        lat.append(time.perf_counter() - t0)
        n += 1
        nbytes += size
        k += 1
    out.put({"kind": "w", "n": n, "bytes": nbytes, "lat": lat})


def phase(files, wdir, readers, writers, seconds, seed):
    out = mp.Queue()
    t0 = time.monotonic()
    deadline = t0 + seconds
    procs = [mp.Process(target=reader, args=(files, deadline, seed * 1000 + i, out))
             for i in range(readers)]
    procs += [mp.Process(target=writer, args=(os.path.join(wdir, f"w{i}"), deadline,
                                              seed * 1000 + 500 + i, out))
              for i in range(writers)]
    for p in procs:
        p.start()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    errs = [r["error"] for r in res if "error" in r]
    if errs:
        raise RuntimeError(errs[0])
    r = {"seconds": wall}
    for kind, name in (("r", "read"), ("w", "write")):
        rs = [x for x in res if x["kind"] == kind]
        if not rs:
            continue
        lat = sorted(v for x in rs for v in x["lat"])
        n = sum(x["n"] for x in rs)
        b = sum(x["bytes"] for x in rs)
        r.update({f"{name}s": n, f"{name}_bytes": b, f"{name}s_per_s": n / wall,
                  f"{name}_mbps": b / wall / 1e6,
                  f"{name}_p50_ms": (pct(lat, 0.50) or 0) * 1e3,
                  f"{name}_p99_ms": (pct(lat, 0.99) or 0) * 1e3})
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("read_dir")
    ap.add_argument("write_dir")
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--read-only-seconds", type=float, default=0)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    try:
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(a.read_dir) for f in fs)
        if not files:
            raise RuntimeError(f"no files under {a.read_dir}")
        out = {"read_files": len(files), "readers": a.readers, "writers": a.writers}
        if a.read_only_seconds > 0:
            out["read_only"] = phase(files, a.write_dir, a.readers, 0, a.read_only_seconds,
                                     a.seed)
        out["mixed"] = phase(files, a.write_dir, a.readers, a.writers, a.seconds, a.seed + 1)
    except (OSError, RuntimeError) as e:
        print(f"mixed.py: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
