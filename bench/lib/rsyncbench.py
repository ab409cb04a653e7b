"""The `rsync` workload: `rsync -a` of a changed tree over an older copy on the store, as a
backup, a deployment or a mirror job does (issue 15: a rename over a file of the store).

For each file it updates, rsync writes `.name.XXXXXX` beside it, sets its mode and times and
renames it over `name`: a create, a write, two setattrs and a rename over an existing file,
each a store round trip or more, one file at a time. Measured per contender: the old copy is
put on the store before the mount (untimed), caches are dropped, `rsync -a SRC/ DST/` is
timed, then the time until everything is on the store (`Contender.quiesce`). What reached
the store is checked after the unmount, byte for byte, and that no temporary name is left.
"""

import os
import random
import shutil
import time
from pathlib import Path

import benchcore as R
import workloads_common as W

KEYS = ["store", "tierfs-default", "tierfs", "tierfs-wb", "rclone"]
DIRS = 10


def files_for(s) -> int:
    return 100 if s.quick else 400


def make_tree(root: Path, n: int, seed: int, age_s: float) -> None:
    """`n` files of 1-16 KiB in DIRS directories, random contents from `seed`, mtime `age_s`
    seconds ago (rsync compares size and mtime: every file differs from the other copy)."""
    shutil.rmtree(root, ignore_errors=True)
    rnd = random.Random(seed)
    t = time.time() - age_s
    for i in range(n):
        d = root / f"d{i % DIRS}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"f{i:05d}.dat"
        p.write_bytes(rnd.randbytes(rnd.randint(1024, 16384)))
        os.utime(p, (t, t))


def same_tree(a: Path, b: Path) -> str:
    """'ok', or what differs between two trees (names and bytes)."""
    def files(root: Path) -> dict:
        return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}
    fa, fb = files(a), files(b)
    if fa.keys() != fb.keys():
        extra = sorted(set(fb) - set(fa))[:3]
        missing = sorted(set(fa) - set(fb))[:3]
        return f"names differ: extra {extra}, missing {missing}"
    bad = [k for k in fa if fa[k].read_bytes() != fb[k].read_bytes()]
    return "ok" if not bad else f"{len(bad)} files differ (e.g. {bad[0]})"


def wl_rsync(s, sec):
    n = files_for(s)
    R.ensure_tools(extra=[("rsync", "rsync")])
    src = R.WORK / "rsync-src"
    make_tree(src, n, 1, 0)
    for key in KEYS:
        make_tree(s.b.backing / f"suite-rsync-{key}", n, 2, 86400)
    R.run(["sync"], 600)
    res: dict = {}

    def body(c, root):
        d = root / f"suite-rsync-{c.key}"
        s.prepare(c, warm_files=[], prime=0)
        t, _, _ = s.timed(sec, ["rsync", "-a", f"{src}/", f"{d}/"], 600 + n, cgroup=False)
        q = c.quiesce()
        res[c.key] = {"rsync_s": t, "quiesce": q}
        R.log(f"rsync {c.key}: {t:.2f} s" + (f", on the store after +{q:.1f} s"
                                              if q is not None else ""))

    s.each(sec, KEYS, body)
    for key, r in res.items():
        r["verify"] = same_tree(src, s.b.backing / f"suite-rsync-{key}")
        shutil.rmtree(s.b.backing / f"suite-rsync-{key}", ignore_errors=True)

    sec.add(f"**rsync** (`bench/lib/rsyncbench.py`): `rsync -a` of {n:,} files of 1-16 KiB in "
            f"{DIRS} directories over an older copy on the store (put there before the mount, "
            "every file different), caches dropped; timed, then the time until everything is "
            "on the store. rsync writes each file it updates to `.name.XXXXXX`, sets its mode "
            "and times and renames it over `name`. Checked on the store after the unmount: "
            "every file byte for byte, no temporary name left. " + W.emu_line(s, sec), "")
    sec.add("| contender | rsync s | on the store after +s | files/s | files/s until on the "
            "store | check |", "|---|" + "---:|" * 4 + "---|")

    def rate(k, with_q=False):
        r = res.get(k)
        if not r:
            return None
        return n / (r["rsync_s"] + ((r["quiesce"] or 0) if with_q else 0))

    for key in s.keys(KEYS):
        r = res.get(key)
        if not r:
            continue
        sec.add(f"| {s.c[key].short} | {r['rsync_s']:.2f} | {W.md(r['quiesce'], '.1f')} | "
                f"{rate(key):,.1f} | {rate(key, True):,.1f} | {r['verify']} |")
    sec.add("")
    for t in [x for x in ("tierfs", "tierfs-wb") if x in s.keys(KEYS)]:
        keys = [k for k in s.keys(KEYS) if k == t or "tierfs" not in k
                or (t == "tierfs" and k == "tierfs-default")]
        sec.metric(f"rsync -a files/s ({t})", "files/s", {k: rate(k) for k in keys}, tierfs=t)
    if "tierfs-wb" in s.keys(KEYS):
        sec.metric("rsync -a until on the store files/s (tierfs-wb)", "files/s",
                   {k: rate(k, True) for k in s.keys(KEYS)
                    if "tierfs" not in k or k == "tierfs-wb"}, tierfs="tierfs-wb")
    sec.panels += [
        {"kind": "bars", "title": f"rsync -a of {n:,} changed files", "unit": "files/s (log)",
         "log": True, "categories": ["rsync", "until on the store"],
         "series": [{"name": k, "values": [rate(k), rate(k, True)]} for k in res]},
    ]
