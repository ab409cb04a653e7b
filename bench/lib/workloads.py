"""The workloads of the benchmark suite (issue 6; `concurrency` is issue 5 point 3).

Each is `def wl_NAME(s: Suite, sec: Section)`, registered in WORKLOADS, and fills `sec`:
markdown (`sec.add`), summary metrics (`sec.metric`, higher is better), plot panels
(`sec.panels`), commands (`s.timed` logs them). Sizes come from `Params` (full / --quick) and
each section states them. Contenders that do not apply are put in `sec.skipped` with why.
"""

import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import benchcore as R
import contenders as C
import testdata as T

LIB = Path(__file__).resolve().parent
MIXED = LIB / "mixed.py"
READ_SAME = "the read path does not depend on the write mode: tierfs write-back reads " \
            "exactly as write-through, so it is run only in the workloads that write"
# tierfs-default (no -o) runs on the sshfs profile only (Suite.keys drops it elsewhere).
READERS = ["local", "store", "tierfs-default", "tierfs", "rclone", "bindfs"]
WRITERS = ["local", "store", "tierfs-default", "tierfs", "tierfs-wb", "rclone", "bindfs"]
CACHED = ["tierfs-default", "tierfs", "rclone", "bindfs", "local"]
NOT_A_CACHE = "not a cache: every read pays the emulated store, nothing is 'cached' to share " \
              "memory with"


@dataclass
class Params:
    md5_size: int
    md5_passes: int
    grep_files: int
    grep_seed: int
    fio_size: int
    fio_runtime: int
    fio_ramp: int
    fio_write: int
    write_size: int
    untar_files: int
    mixed_s: float
    mixed_ro_s: float
    mem_file: int
    hog_bytes: int
    hog_target_s: float
    conc_file: int
    conc_runtime: int
    seqcold_size: int
    dirstat_files: int
    dirstat_size: int
    dirstat_reps: int


def params(s) -> Params:
    a, q, M = s.args, s.quick, s.M
    # The sshfs profile (a real network store, ~40-70 MB/s and ~10 ms per small file cold)
    # runs smaller: a 1 GiB fio file, which is also the cold/warm sequential file, and a 2,000
    # file grep tree, so md5 + grep + fio + dirstat fit in ~20 min.
    net = s.profile == "sshfs"
    avail = meminfo("MemAvailable")
    if a.hog_bytes:
        hog = R.parse_size(a.hog_bytes)
    elif q:
        hog = min(2 << 30, avail // 8)  # quick: a modest hog (shared development machine)
    else:
        # full: what is available minus room for tierfs's RAM tier, the reader and 2 GiB.
        hog = max(1 << 30, avail - 2 * M - (2 << 30))
    return Params(
        md5_size=R.parse_size(a.md5_size) if a.md5_size else 2 * M,
        md5_passes=a.md5_passes,
        grep_files=a.grep_files or (500 if q else 2_000 if net else 5_000),
        grep_seed=a.grep_seed,
        fio_size=R.parse_size(a.size) if a.size else
        ((256 << 20) if q and net else (512 << 20) if q else (1 << 30) if net else (2 << 30)),
        fio_runtime=a.fio_runtime or (3 if q else 10),
        fio_ramp=1 if q else 2,
        fio_write=(128 << 20) if q else (1 << 30),
        write_size=(256 << 20) if q else (2 << 30),
        untar_files=a.untar_files or (500 if q else 2000),
        mixed_s=6 if q else 20,
        mixed_ro_s=3 if q else 10,
        mem_file=M // 2,
        hog_bytes=hog,
        hog_target_s=6 if q else 20,
        conc_file=max(32 << 20, M // 4),
        conc_runtime=2 if q else 5,
        seqcold_size=(256 << 20) if q else (1 << 30),  # the issue's 1 GiB; == fio_size on sshfs
        dirstat_files=1000,
        dirstat_size=4096,
        dirstat_reps=1 if q else 3,  # a 1,000-file pass is ~0.1-0.3 s: noisy alone
    )


def size_tag(n: int) -> str:
    """4G / 512M: the names bench/run's other workloads give their test files."""
    return f"{n >> 30}G" if n % (1 << 30) == 0 else f"{n >> 20}M"


def meminfo(key: str) -> int:
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def md(v, spec=",.0f", unit="") -> str:
    return R.na(v, spec, unit)


def hb(v) -> str:
    return R.hbytes(v)


def median(vals):
    v = sorted(x for x in vals if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def emu_line(s, sec) -> str:
    if sec.profile == "sshfs":
        return (f"Store: **{sec.emulation or s.b.emulation}** (profile `sshfs`: a real sshfs "
                "mount, no emulator, bench/lib/sshstore.py; *store read* = bytes the relay "
                "carried from the server, i.e. the ssh stream with its protocol overhead). "
                f"Link: {sec.store_details}. `tierfs-default` runs with tierfs's own defaults "
                "(no `-o`: its default `ram.max`, SSD-tier and metadata-cache settings), so what "
                "this section says relative to `ram.max` holds for `tierfs` only.")
    return f"Emulation: slowfs **{s.b.emulation or sec.emulation}** (profile `{sec.profile}`)."


BACKING_KEYS = ("read_bytes", "lookup", "getattr", "readdir", "open", "read")


def backing_delta(c, t0, t1) -> Optional[dict]:
    """What a tierfs contender asked of its store between two `tierfs stats --json`
    snapshots (the `backing` counters); None for other contenders."""
    if not isinstance(c, C.Tierfs) or t1 is None:
        return None
    return {k: R.jdiff(t0, t1, f"backing.{k}") if t0 is not None else R.jget(t1, f"backing.{k}")
            for k in BACKING_KEYS}


def backing_text(phases: list) -> str:
    """`[(label, backing_delta)]` as one line: read bytes, then request counts per phase."""
    out = []
    for label, d in phases:
        if not d:
            out.append(f"{label}: n/a")
            continue
        out.append(f"{label}: **{hb(d.get('read_bytes'))}** read, "
                   + ", ".join(f"{k} {md(d.get(k))}" for k in BACKING_KEYS[1:]))
    return "; ".join(out)


def cached_md5(f: Path) -> str:
    side = f.with_name(f.name + ".md5")
    if side.exists() and side.stat().st_mtime >= f.stat().st_mtime:
        return side.read_text().split()[0]
    v = R.run(["md5sum", f], max(300, f.stat().st_size / 50e6)).stdout.split()[0]
    side.write_text(v + "\n")
    return v


def fill_through(s, sec, c, path: Path, size: int, fill0: Optional[int] = None) -> list:
    """Reads `path` through the contender until its cache holds it (tierfs: ssd.fill_bytes
    >= 95% of the file or 2 passes; others: one pass). Untimed for the result, reported."""
    out = []
    # what the SSD tier held before (another file read earlier on the same mount); `fill0`:
    # counted from before an earlier read of this same file
    if fill0 is None:
        fill0 = R.jget(c.stats(), "ssd.fill_bytes") or 0
    for i in (1, 2):
        s.prepare(c, warm_files=[s.b.backing / path.name], prime=0)
        dt, _, sl = s.timed(sec, ["dd", f"if={path}", "of=/dev/null", "bs=1M"],
                            max(600, size / 5e6))
        s.served(sec, c.key, read=size)
        st = c.stats()
        fill = R.jget(st, "ssd.fill_bytes")
        out.append({"pass": i, "mbps": size / dt / 1e6, "slow": sl.get("bytes_read"),
                    "fill": fill})
        if not isinstance(c, C.Tierfs) or fill is None or fill - fill0 >= 0.95 * size:
            break
    return out


# ---------------------------------------------------------------------------------------------
# 1. md5 loop (seed 002)

def wl_md5(s, sec):
    P = params(s)
    size, passes = P.md5_size, P.md5_passes
    f = s.b.test_file(f"md5-{size_tag(size)}.bin", size)
    ref = cached_md5(f)
    sec.skipped["tierfs-wb"] = READ_SAME
    res: dict = {}

    def body(c, root):
        s.prepare(c, warm_files=[f], prime=size)
        s.cg.reset_peak()
        out = []
        for k in range(1, passes + 1):
            t0 = c.stats()
            dt, p, sl = s.timed(sec, ["md5sum", root / f.name], max(900, size / 1e6))
            t1 = c.stats()
            got = (p.stdout or "?").split()[0]
            out.append({"pass": k, "s": dt, "mbps": size / dt / 1e6,
                        "slow": sl.get("bytes_read"), "ok": got == ref,
                        "ram_hit": R.jdiff(t0, t1, "ram.hit_bytes"),
                        "ssd_hit": R.jdiff(t0, t1, "ssd.hit_bytes")})
            s.served(sec, c.key, read=size)
            R.log(f"md5 {c.key} pass {k}: {size / dt / 1e6:.1f} MB/s, store served "
                  f"{hb(sl.get('bytes_read'))}" + ("" if got == ref else " MD5 MISMATCH"))
        res[c.key] = {"passes": out, "cg": s.cg.peak()}

    s.each(sec, READERS, body)

    sec.add(f"`md5sum` of `{f.name}` ({R.human(size)}, random) {passes} times back to back on "
            f"each contender: a file twice the memory budget (tierfs `ram.max` = "
            f"{R.human(s.M)}; the reader runs in a memory cgroup of {R.human(s.cg.limit)}, so "
            "neither its page cache nor tierfs's RAM tier can hold the file). Caches dropped "
            "once before pass 1, not between passes. Fresh mount, empty cache dir per "
            "contender. " + emu_line(s, sec), "")
    sec.add("| contender | " + " | ".join(f"pass {k} MB/s" for k in range(1, passes + 1))
            + f" | median 2-{passes} | store read pass 1 / passes 2-{passes} | md5 |",
            "|---|" + "---:|" * (passes + 2) + "---|")
    for key in READERS:
        r = res.get(key)
        if not r:
            continue
        ps = r["passes"]
        med = median([p["mbps"] for p in ps[1:]])
        later = sum((p["slow"] or 0) for p in ps[1:])
        sec.add(f"| {s.c[key].short} | " + " | ".join(f"{p['mbps']:,.0f}" for p in ps)
                + " |" * (passes - len(ps)) + f" | **{md(med)}** | {hb(ps[0]['slow'])} / "
                f"{hb(later)} | {'ok' if all(p['ok'] for p in ps) else 'MISMATCH'} |")
        r["median"] = med
    sec.add("")
    for key in ("tierfs-default", "tierfs"):
        ps = (res.get(key) or {}).get("passes") or []
        if ps:
            sec.add(f"{key} per pass: RAM tier hits " + ", ".join(hb(p['ram_hit']) for p in ps)
                    + "; SSD tier hits " + ", ".join(hb(p['ssd_hit']) for p in ps) + ".", "")
    sec.add("bindfs reads the local file through the page cache of its own process, which is "
            "not in the reader's memory cgroup (so from pass 2 on it may serve from RAM); rclone "
            "reads its cache file the same way; tierfs's SSD tier and the local-disk reader "
            "(in the cgroup) do not get that help. Reader cgroup peak per contender: "
            + "; ".join(f"{k}: {v['cg']}" for k, v in res.items()) + ".", "")
    sec.metric("md5 loop: pass 1 (cold) MB/s", "MB/s",
               {k: v["passes"][0]["mbps"] for k, v in res.items() if v["passes"]})
    sec.metric(f"md5 loop: steady MB/s (median of passes 2-{passes})", "MB/s",
               {k: v.get("median") for k, v in res.items()})
    sec.panels.append({"kind": "lines", "title": f"md5sum loop, {R.human(size)} file, "
                       f"ram.max {R.human(s.M)}", "unit": "MB/s", "xlabel": "pass",
                       "x": list(range(1, passes + 1)), "log": True,
                       "series": [{"name": k, "values": [p["mbps"] for p in v["passes"]]}
                                  for k, v in res.items()]})


# ---------------------------------------------------------------------------------------------
# 2. small-file grep (seed 000)

def grep_run(s, sec, c, root, tree, man, label) -> dict:
    cmd = ["grep", "-r", "-l", T.GREP_MARKER.decode(), str(root / tree.name)]
    t0 = c.stats()
    dt, p, sl = s.timed(sec, cmd, 300 + man["files"] * 0.1, ok_rc=(0, 1, 2))
    backing = backing_delta(c, t0, c.stats())
    found = len((p.stdout or "").splitlines())
    errs = [ln for ln in (p.stderr or "").splitlines() if ln.startswith("grep:")]
    s.served(sec, c.key, read=man["bytes"])
    r = {"s": dt, "files_s": man["files"] / dt, "mbps": man["bytes"] / dt / 1e6,
         "slow": sl.get("bytes_read"), "slow_meta": sl.get("meta_ops"),
         "ok": found == man["markers"] and not errs, "errors": len(errs),
         "first_error": errs[0] if errs else "", "backing": backing}
    R.log(f"grep {c.key} {label}: {r['files_s']:,.0f} files/s ({dt:.1f} s), store served "
          f"{hb(r['slow'])}" + ("" if r["ok"] else f", {found} matches, {len(errs)} errors"))
    return r


def wl_grep(s, sec):
    P = params(s)
    tree, man = T.make_grep_tree(s.b.backing, P.grep_files, P.grep_seed)
    sec.skipped["tierfs-wb"] = READ_SAME
    res: dict = {}

    def body(c, root):
        r = res.setdefault(c.key, {})
        s.prepare(c, warm_dirs=[tree], prime=man["bytes"])
        r["cold"] = grep_run(s, sec, c, root, tree, man, "cold")
        if c.key == "store" and s.profile != "sshfs":
            return  # slowfs caches nothing: warm and remount cost what cold costs
        r["warm"] = grep_run(s, sec, c, root, tree, man, "warm")
        r["mount_s"] = s.remount(sec, c)
        s.prepare(c, warm_dirs=[tree], prime=man["bytes"])
        r["remount"] = grep_run(s, sec, c, root, tree, man, "remount")

    s.each(sec, READERS, body)
    ttl = [o for o in s.tierfs_opts if o.startswith("meta.")]
    sec.add(f"`grep -r -l {T.GREP_MARKER.decode()}` over `{tree.name}`: **{man['files']:,} "
            f"files** of 1-64 KiB of text (uniform, {R.human(man['bytes'])}), "
            f"{man['dirs']:,} leaf directories {man['depth']} levels deep, 25 files each, from "
            f"`random.Random({P.grep_seed})`; every 1000th file holds the marker "
            f"({man['markers']} matches expected). Scaled from the issue's 100k files so the "
            "suite fits its time budget (a cold pass over the emulated HDD costs ~10-12 ms per "
            "file; the 100k tree is in `bench/run --workload ssd`). "
            "**cold**: fresh mount, empty cache, caches dropped; **warm**: the same again at "
            "once; **remount**: unmount, `drop_caches`, mount on the same cache dir (local disk: "
            "caches dropped only; bindfs: a plain remount). tierfs: "
            f"`{','.join(ttl)}`; rclone: `--dir-cache-time 1h --attr-timeout 1h`. "
            + emu_line(s, sec), "")
    sec.add("| contender | cold files/s | warm files/s | remount files/s | store read cold / "
            "warm / remount | remount took | matches |", "|---|---:|---:|---:|---:|---:|---|")
    for key in READERS:
        r = res.get(key)
        if not r or "cold" not in r:
            continue
        g = [r.get(k) for k in ("cold", "warm", "remount")]
        cells = [f"{x['files_s']:,.0f}" if x else "-" for x in g]
        if key == "store" and not r.get("warm"):
            cells[1] = cells[2] = "= cold (no cache)"
        ok = all(x["ok"] for x in g if x)
        errs = sum(x["errors"] for x in g if x)
        sec.add(f"| {s.c[key].short} | " + " | ".join(cells) + " | "
                + " / ".join(hb(x["slow"]) if x else "-" for x in g)
                + f" | {md(r.get('mount_s'), '.2f', ' s')} | "
                + ("ok" if ok else f"WRONG ({errs} errors)") + " |")
    sec.add("")
    if s.profile == "sshfs" and "store" in res:
        sec.add("The store (sshfs) keeps the kernel's page cache and sshfs's own attribute and "
                "directory caches, so it is measured warm too; its *remount* is a new sshfs "
                "mount (the server stays).", "")
    for key in READERS:
        r = res.get(key) or {}
        if isinstance(s.c[key], C.Tierfs) and r.get("cold"):
            sec.add(f"{key} asked the store (`tierfs stats --json` backing counters per "
                    "phase): " + backing_text([(ph, (r.get(ph) or {}).get("backing"))
                                               for ph in ("cold", "warm", "remount")]) + ".",
                    "")
    for m_, k in (("cold", "cold"), ("warm", "warm"), ("after remount", "remount")):
        vals = {key: (r.get(k) or {}).get("files_s") for key, r in res.items()}
        if k != "cold" and "store" in res and not res["store"].get(k):
            vals["store"] = (res["store"].get("cold") or {}).get("files_s")
        sec.metric(f"grep -r {man['files']:,} files: {m_} files/s", "files/s", vals)
    sec.panels.append({"kind": "bars", "title": f"grep -r, {man['files']:,} files",
                       "unit": "files/s (log)", "log": True,
                       "categories": ["cold", "warm", "remount"],
                       "series": [{"name": k, "values": [
                           ((r.get(x) or r.get("cold") if k == "store" else r.get(x))
                            or {}).get("files_s") for x in ("cold", "warm", "remount")]}
                                  for k, r in res.items()]})


# ---------------------------------------------------------------------------------------------
# 3. fio

FIO_JOBS = [
    ("seq", "seq read 1 MiB QD16", ["--rw=read", "--bs=1M", "--iodepth=16"]),
    ("rand1", "rand read 4 KiB QD1", ["--rw=randread", "--bs=4k", "--iodepth=1",
                                      "--norandommap", "--randrepeat=0"]),
    ("rand32", "rand read 4 KiB QD32", ["--rw=randread", "--bs=4k", "--iodepth=32",
                                        "--norandommap", "--randrepeat=0"]),
]


def fio_parse(p, kind="read") -> dict:
    try:
        j = json.loads(p.stdout[p.stdout.index("{"):])
        jb = j["jobs"][0]
        if jb.get("error"):
            raise ValueError(f"fio job error {jb['error']}")
        d = jb[kind]
        if not d.get("io_bytes"):
            raise ValueError("fio did no I/O")
        # Total latency (submission + completion): with libaio on FUSE the read happens
        # inside io_submit, so completion latency alone would show microseconds.
        pct = (d.get("lat_ns") or {}).get("percentile") or \
            (d.get("clat_ns") or {}).get("percentile") or {}
        return {"ok": True, "mbps": d["bw_bytes"] / 1e6, "iops": d["iops"],
                "p50_us": pct.get("50.000000", 0) / 1000 or None,
                "p99_us": pct.get("99.000000", 0) / 1000 or None,
                "io_bytes": d["io_bytes"]}
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return {"ok": False, "error": f"fio failed (rc={p.returncode}): "
                                      f"{(p.stderr or '').strip()[-300:] or e}"}


def wl_fio(s, sec):
    P = params(s)
    f = s.b.test_file(f"seqread-{size_tag(P.fio_size)}.bin", P.fio_size)
    res: dict = {}

    fs = s.b.test_file(f"seqread-{size_tag(P.seqcold_size)}.bin", P.seqcold_size) \
        if s.profile == "sshfs" else None

    def body(c, root):
        r = res.setdefault(c.key, {})
        path = root / f.name
        fill0 = R.jget(c.stats(), "ssd.fill_bytes")
        if fs is not None and c.key in SEQCOLD:
            # right after the fresh mount: empty cache, a new sshfs mount under it
            for phase in ("cold", "warm"):
                s.prepare(c, warm_files=[fs], prime=P.seqcold_size)
                r[f"seq{phase}"] = seq_whole(s, sec, c, root / fs.name, P.seqcold_size, phase)
        if c.key != "tierfs-wb":
            if c.caches:
                r["fill"] = fill_through(s, sec, c, path, P.fio_size,
                                         fill0 if fs == f else None)
            for key, _, job in FIO_JOBS:
                # O_DIRECT readers allocate no page cache: priming (FUSE-NOTES lesson 8) only
                # matters for bindfs, which reads the local file through the page cache.
                s.prepare(c, warm_files=[f], prime=P.fio_size if c.key == "bindfs" else 0)
                cmd = ["fio", f"--name={key}", "--filename=" + str(path).replace(":", "\\:"),
                       "--ioengine=libaio", "--direct=1", "--readonly", *job,
                       "--lat_percentiles=1",
                       f"--ramp_time={P.fio_ramp}", f"--runtime={P.fio_runtime}",
                       "--time_based", "--output-format=json"]
                _, p, sl = s.timed(sec, cmd, P.fio_runtime + P.fio_ramp + 300)
                x = fio_parse(p)
                x["slow"] = sl.get("bytes_read")
                if x["ok"]:
                    s.served(sec, c.key, read=x["io_bytes"])
                    R.log(f"fio {c.key} {key}: {x['mbps']:,.1f} MB/s, {x['iops']:,.0f} IOPS")
                else:
                    R.log(f"fio {c.key} {key}: {x['error']}")
                r[key] = x
        if c.key in WRITERS:
            d = root / f"suite-fio-{c.key}"
            shutil.rmtree(s.b.backing / f"suite-fio-{c.key}", ignore_errors=True)
            os.makedirs(d, exist_ok=True)
            s.prepare(c, prime=T.WRITE_PRIME_FACTOR * P.fio_write)
            cmd = ["fio", "--name=write", "--filename=" + str(d / "w.bin").replace(":", "\\:"),
                   "--rw=write", "--bs=1M", f"--size={P.fio_write}", "--ioengine=psync",
                   "--fallocate=none", "--end_fsync=1", "--output-format=json"]
            dt, p, sl = s.timed(sec, cmd, max(600, P.fio_write / 2e6), cgroup=False)
            x = fio_parse(p, "write")
            q = c.quiesce()
            x.update({"wall": dt, "quiesce": q, "slow_w": sl.get("bytes_written")})
            if x["ok"]:
                s.served(sec, c.key, write=P.fio_write)
                x["durable_mbps"] = P.fio_write / (dt + (q or 0)) / 1e6
                R.log(f"fio {c.key} write: {x['mbps']:,.1f} MB/s, on the store after "
                      f"{dt + (q or 0):.1f} s")
            r["write"] = x
            try:
                os.unlink(d / "w.bin")
            except OSError:
                pass

    s.each(sec, WRITERS, body)
    for key in WRITERS:
        shutil.rmtree(s.b.backing / f"suite-fio-{key}", ignore_errors=True)

    sec.add(f"fio on `{f.name}` ({R.human(P.fio_size)}, random; larger than tierfs's RAM tier "
            f"of {R.human(s.M)}, so tierfs serves it from its SSD tier), libaio, `--direct=1` "
            f"at the reader, {P.fio_ramp} s ramp + {P.fio_runtime} s per job, page cache "
            "dropped before each job. tierfs and rclone read the file through the mount first "
            "until their cache holds it (tierfs: `ssd.fill_bytes` >= 95%). Write: "
            f"{R.human(P.fio_write)} sequential 1 MiB `write(2)`s (psync, buffered) and "
            "`fsync` at the end (`--end_fsync=1`), to a new file; *on the store* adds the time "
            "until tierfs write-back had nothing dirty / rclone had no upload pending "
            "(polled). Latencies: fio total latency percentiles (`--lat_percentiles=1`: "
            "submission + completion; with libaio on FUSE the read runs inside `io_submit`). " + emu_line(s, sec), "")
    sec.add("| contender | seq 1 MiB QD16 MB/s | p50 / p99 us | 4 KiB QD1 IOPS | p50 / p99 us "
            "| 4 KiB QD32 IOPS | p50 / p99 us | store read | write MB/s | on the store after "
            "| MB/s incl. upload/flush |", "|---|" + "---:|" * 10)
    for key in WRITERS:
        r = res.get(key)
        if not r:
            continue

        def cell(x, what):
            if not x:
                return "-", "-"
            if not x.get("ok"):
                return "failed", "-"
            v = f"{x['mbps']:,.0f}" if what == "mbps" else f"{x['iops']:,.0f}"
            return v, f"{md(x['p50_us'])} / {md(x['p99_us'])}"

        cs = [cell(r.get("seq"), "mbps"), cell(r.get("rand1"), "iops"),
              cell(r.get("rand32"), "iops")]
        w = r.get("write") or {}
        slow = sum((r.get(k) or {}).get("slow") or 0 for k in ("seq", "rand1", "rand32"))
        sec.add(f"| {s.c[key].short} | " + " | ".join(f"{a} | {b}" for a, b in cs)
                + f" | {hb(slow) if key != 'tierfs-wb' else '-'} | "
                + (f"{w['mbps']:,.0f}" if w.get("ok") else "failed" if w else "-") + " | "
                + (f"{w['wall'] + (w['quiesce'] or 0):.1f} s" if w.get("ok") else "-") + " | "
                + (f"{w['durable_mbps']:,.0f}" if w.get("ok") else "-") + " |")
    sec.add("")
    for key in ("tierfs-default", "tierfs", "rclone"):
        fl = (res.get(key) or {}).get("fill")
        if fl:
            sec.add(f"- {key} fill: " + "; ".join(
                f"pass {x['pass']} {x['mbps']:,.0f} MB/s, store served {hb(x['slow'])}"
                + (f", ssd.fill_bytes {x['fill']:,}" if x["fill"] is not None else "")
                for x in fl))
    sec.add("- bindfs clears O_DIRECT and reads through the page cache (dropped before each "
            "job); the local disk row is O_DIRECT on ext4: the device.", "")

    def val(key, job, fld):
        x = (res.get(key) or {}).get(job) or {}
        return x.get(fld) if x.get("ok") else None

    for job, label, _ in FIO_JOBS:
        fld = "mbps" if job == "seq" else "iops"
        sec.metric(f"fio {label} {'MB/s' if fld == 'mbps' else 'IOPS'}", fld,
                   {k: val(k, job, fld) for k in READERS})
    for t in [x for x in ("tierfs", "tierfs-wb") if x in s.keys(WRITERS)]:
        keys = [k for k in s.keys(WRITERS) if k == t or "tierfs" not in k
                or (t == "tierfs" and k == "tierfs-default")]
        sec.metric(f"fio seq write 1 MiB + fsync MB/s ({t})", "MB/s",
                   {k: val(k, "write", "mbps") for k in keys}, tierfs=t)
        sec.metric(f"fio seq write until on the store MB/s ({t})", "MB/s",
                   {k: val(k, "write", "durable_mbps") for k in keys}, tierfs=t)
    if fs is not None:
        seqcold_report(s, sec, res, fs, P)
    sec.panels += [
        {"kind": "bars", "title": "fio reads (SSD tier warm)", "unit": "MB/s / IOPS (log)",
         "log": True, "categories": ["seq 1M QD16 MB/s", "4K QD1 IOPS", "4K QD32 IOPS"],
         "series": [{"name": k, "values": [val(k, "seq", "mbps"), val(k, "rand1", "iops"),
                                           val(k, "rand32", "iops")]}
                    for k in READERS if k in res]},
        {"kind": "bars", "title": "fio 4 KiB random read latency (p50, p99)", "unit": "us (log)",
         "log": True, "categories": ["QD1 p50", "QD1 p99", "QD32 p50", "QD32 p99"],
         "series": [{"name": k, "values": [val(k, "rand1", "p50_us"), val(k, "rand1", "p99_us"),
                                           val(k, "rand32", "p50_us"),
                                           val(k, "rand32", "p99_us")]}
                    for k in READERS if k in res]},
        {"kind": "bars", "title": f"fio sequential write {R.human(P.fio_write)}", "unit": "MB/s",
         "log": True, "categories": ["write+fsync", "incl. upload/flush"],
         "series": [{"name": k, "values": [val(k, "write", "mbps"),
                                           val(k, "write", "durable_mbps")]}
                    for k in WRITERS if k in res]},
    ]


# Cold and warm sequential read of a whole file (the sshfs profile's fio section): the issue's
# "cold sequential read of a 1 GiB file (fio, 1 MiB blocks) through tierfs >= 0.9x the store's
# own" and "warm sequential after drop_caches >= 3x rclone", in the same run.

SEQCOLD = ["store", "tierfs-default", "tierfs", "rclone"]
SEQCOLD_TARGETS = [  # (phase, tierfs key, peer key, target ratio)
    ("cold", "tierfs-default", "store", 0.9), ("cold", "tierfs", "store", 0.9),
    ("warm", "tierfs-default", "rclone", 3.0), ("warm", "tierfs", "rclone", 3.0)]


def seq_whole(s, sec, c, path: Path, size: int, phase: str) -> dict:
    """fio reading the whole file once, 1 MiB psync reads, buffered (as cp or cat would)."""
    cmd = ["fio", f"--name=seq{phase}", "--filename=" + str(path).replace(":", "\\:"),
           "--rw=read", "--bs=1M", "--ioengine=psync", "--direct=0", f"--size={size}",
           "--readonly", "--output-format=json"]
    t0 = c.stats()
    dt, p, sl = s.timed(sec, cmd, max(600, size / 2e6))
    x = fio_parse(p)
    x.update(slow=sl.get("bytes_read"), wall=dt, backing=backing_delta(c, t0, c.stats()))
    if x["ok"]:
        s.served(sec, c.key, read=x["io_bytes"])
        R.log(f"fio {c.key} sequential {phase}: {x['mbps']:,.1f} MB/s, store served "
              f"{hb(x['slow'])}")
    else:
        R.log(f"fio {c.key} sequential {phase}: {x['error']}")
    return x


def seqcold_report(s, sec, res, fs: Path, P) -> None:
    def v(key, phase):
        x = (res.get(key) or {}).get(f"seq{phase}") or {}
        return x.get("mbps") if x.get("ok") else None

    sec.add(f"**Sequential read of a whole file, cold and warm** (`{fs.name}`, "
            f"{R.human(P.seqcold_size)}, random): fio `--rw=read --bs=1M --ioengine=psync "
            f"--direct=0 --size={P.seqcold_size}` (buffered, as `cp` would read, in the reader "
            "cgroup), first thing after each contender's fresh mount (empty cache, a new sshfs "
            "mount under it): **cold**; then `sync; echo 3 > /proc/sys/vm/drop_caches` (no "
            "remount) and the same again: **warm** (tierfs: its RAM/SSD tiers; rclone: its "
            "cache file; the store: sshfs fetches it again).", "")
    sec.add("| contender | cold MB/s | warm MB/s (after drop_caches) | store read cold / warm "
            "| tierfs store reads cold / warm |", "|---|---:|---:|---:|---|")
    for key in SEQCOLD:
        r = res.get(key)
        if not r or "seqcold" not in r:
            continue
        cold, warm = r.get("seqcold") or {}, r.get("seqwarm") or {}
        bk = [(x.get("backing") or {}).get("read_bytes") if x.get("backing") else None
              for x in (cold, warm)]
        sec.add(f"| {s.c[key].short} | {md(v(key, 'cold'), ',.1f')} | "
                f"{md(v(key, 'warm'), ',.1f')} | {hb(cold.get('slow'))} / {hb(warm.get('slow'))}"
                " | " + (" / ".join(hb(b) for b in bk) if cold.get("backing") else "-") + " |")
    sec.add("")
    sec.add("| target (same run) | measured | ratio | verdict |", "|---|---|---:|---|")
    for phase, t, peer, target in SEQCOLD_TARGETS:
        a, b = v(t, phase), v(peer, phase)
        ratio = a / b if a and b else None
        sec.add(f"| {phase} sequential read: {t} / {peer} >= {target:g}x | {t} {md(a, ',.1f')}"
                f" MB/s, {peer} {md(b, ',.1f')} MB/s | "
                + (f"**{R.rx(ratio)}**" if ratio else "n/a") + " | "
                + ("n/a" if ratio is None else "PASS" if ratio >= target else "FAIL") + " |")
    sec.add("")
    sec.metric(f"fio cold sequential read {R.human(P.seqcold_size)} MB/s", "MB/s",
               {k: v(k, "cold") for k in SEQCOLD if k in res})
    sec.metric(f"fio warm sequential read {R.human(P.seqcold_size)} after drop_caches MB/s",
               "MB/s", {k: v(k, "warm") for k in SEQCOLD if k in res})
    sec.panels.append({"kind": "bars", "title": f"sequential read of {R.human(P.seqcold_size)}, "
                       "cold and warm", "unit": "MB/s", "categories": ["cold", "warm"],
                       "series": [{"name": k, "values": [v(k, "cold"), v(k, "warm")]}
                                  for k in SEQCOLD if k in res]})


# ---------------------------------------------------------------------------------------------
# 4. write job (seed 001) + untar

def wl_write(s, sec):
    P = params(s)
    try:
        tar = T.untar_tarball(False, max_files=P.untar_files)
    except R.BenchError as e:
        tar = None
        sec.errors["untar source"] = str(e)
    res: dict = {}
    for key in WRITERS:
        shutil.rmtree(s.b.backing / f"suite-write-{key}", ignore_errors=True)

    def body(c, root):
        r = res.setdefault(c.key, {})
        d = root / f"suite-write-{c.key}"
        os.makedirs(d, exist_ok=True)
        cmd = [R.SYS_PYTHON, T.CHUNK, d / "chunk.bin", str(P.write_size), "--bs",
               str(T.WRITE_BS), "--hash"]
        s.prepare(c, prime=T.WRITE_PRIME_FACTOR * P.write_size)
        dt, p, sl = s.timed(sec, cmd, max(900, P.write_size / 1e6), cgroup=False)
        ch = json.loads(p.stdout.strip().splitlines()[-1])
        s.served(sec, c.key, write=P.write_size)
        q = c.quiesce()
        ch.update({"quiesce": q, "slow_w": sl.get("bytes_written")})
        r["chunk"] = ch
        R.log(f"write {c.key}: write {ch['write_mbps']:,.0f} MB/s, job {ch['total_mbps']:,.0f}"
              f" MB/s" + (f", on the store after +{q:.1f} s" if q is not None else ""))
        if tar:
            u = d / "untar"
            os.makedirs(u, exist_ok=True)
            s.prepare(c, warm_files=[], prime=0)
            s.b.warm_backing([Path(tar["tarball"])])
            t1, _, sl1 = s.timed(sec, ["tar", "-xf", tar["tarball"], "-C", u],
                                 600 + tar["files"] * 0.3, cgroup=False)
            t2, _, _ = s.timed(sec, ["sync", "-f", u], 900, cgroup=False)
            s.served(sec, c.key, write=tar["bytes"])
            q = c.quiesce()
            r["untar"] = {"untar_s": t1, "sync_s": t2, "quiesce": q,
                          "meta": sl1.get("meta_ops")}
            R.log(f"write {c.key}: untar {t1:.1f} s + sync {t2:.1f} s"
                  + (f", on the store after +{q:.1f} s" if q is not None else ""))
            # The tree as it reached the store, checked now: the rm -rf below removes it.
            on_store = s.b.backing / f"suite-write-{c.key}" / "untar"
            p = R.run(["tar", "--diff", "-f", tar["tarball"], "-C", on_store], 900, check=False)
            n = len((p.stdout + p.stderr).strip().splitlines())
            r["untar"]["tree"] = "tree ok" if p.returncode == 0 else f"tree: {n} differences"
            # rm -rf of that tree (`make clean`, a CI workspace wiped), caches dropped first;
            # the store's own directory blocks read back in for the emulated contenders.
            s.prepare(c, warm_files=[], prime=0)
            if c.emulated:
                R.run(["du", "-s", on_store], 900)
            t3, _, _ = s.timed(sec, ["rm", "-rf", u], 600 + tar["files"] * 0.1, cgroup=False)
            t4, _, _ = s.timed(sec, ["sync", "-f", d], 900, cgroup=False)
            q = c.quiesce()
            r["rm"] = {"rm_s": t3, "sync_s": t4, "quiesce": q}
            R.log(f"write {c.key}: rm -rf {t3:.1f} s + sync {t4:.1f} s"
                  + (f", on the store after +{q:.1f} s" if q is not None else ""))

    s.each(sec, WRITERS, body)
    # What reached the local disk behind each contender, after its unmount.
    for key, r in res.items():
        local = s.b.backing / f"suite-write-{key}"
        v = []
        ch = r.get("chunk")
        if ch and ch.get("sha256"):
            f = local / "chunk.bin"
            got = R.run(["sha256sum", f], 900, check=False).stdout.split()[:1] \
                if f.exists() else ["missing"]
            v.append("chunk " + ("ok" if got == [ch["sha256"]] else f"MISMATCH ({got[0][:12]})"))
        if r.get("untar") and tar:
            v.append(r["untar"].get("tree", "tree not checked"))
        if r.get("rm"):
            left = sum(len(fs) + len(ds) for _, ds, fs in os.walk(local / "untar"))
            v.append("removed" if not (local / "untar").exists()
                     else f"rm: {left} entries left")
        r["verify"] = ", ".join(v) or "-"
        shutil.rmtree(local, ignore_errors=True)

    sec.add(f"**Write job** (seed 001, `bench/lib/chunk.py`): `open(O_CREAT|O_TRUNC)`, "
            f"{R.human(P.write_size)} in 512 KiB `write(2)`s of incompressible data, `fsync`, "
            "`close`, each timed on its own; caches dropped and memory primed first "
            f"({T.WRITE_PRIME_FACTOR}x the bytes written, every contender alike: a cache "
            "touches written data more than once, see `WRITE_PRIME_FACTOR` in bench/lib/testdata.py). "
            + (f"**Untar**: `tar -xf` of {tar['files']:,} files / {tar['dirs']:,} directories "
               f"({R.human(tar['bytes'])}; crates.io sources of the first {tar['crates']} "
               f"crates of `Cargo.lock`, normalized tarball `{Path(tar['tarball']).name}`) "
               "into an empty directory, then `sync -f`. " if tar else "")
            + ("**rm -rf** of that tree (after its check: `tar --diff` on the store), caches "
               "dropped first, then `sync -f` of its parent. " if tar else "")
            + "*On the store after*: the time, after the job / the sync, until tierfs "
            "write-back had nothing dirty or rclone had no upload pending (rclone's `fsync` "
            "and `sync -f` do not upload; write-through tierfs and the store are synchronous). "
            "What reached the local disk behind each contender is checked after its unmount "
            "(sha256 of the file, `tar --diff` of the tree). " + emu_line(s, sec), "")
    sec.add("| contender | open s | write s | fsync s | close s | write MB/s | job MB/s | "
            "on the store after +s | untar s | sync s | on the store after +s | untar+sync "
            "files/s | rm -rf + sync s | on the store after +s | check |",
            "|---|" + "---:|" * 13 + "---|")
    for key in WRITERS:
        r = res.get(key)
        if not r:
            continue
        ch, u = r.get("chunk"), r.get("untar")
        a = (f"{ch['open_s']:.3f} | {ch['write_s']:.2f} | {ch['fsync_s']:.2f} | "
             f"{ch['close_s']:.3f} | {ch['write_mbps']:,.0f} | {ch['total_mbps']:,.0f} | "
             f"{md(ch['quiesce'], '.1f')}") if ch else "- | - | - | - | - | - | -"
        b_ = (f"{u['untar_s']:.1f} | {u['sync_s']:.2f} | {md(u['quiesce'], '.1f')} | "
              f"{tar['files'] / (u['untar_s'] + u['sync_s']):,.0f}") if u and tar else \
            "- | - | - | -"
        rm = r.get("rm")
        c_ = (f"{rm['rm_s'] + rm['sync_s']:.2f} | {md(rm['quiesce'], '.1f')}") if rm else "- | -"
        sec.add(f"| {s.c[key].short} | {a} | {b_} | {c_} | {r.get('verify', '-')} |")
    sec.add("")

    def job(k):
        ch = (res.get(k) or {}).get("chunk")
        return ch["total_mbps"] if ch else None

    def durable(k):
        ch = (res.get(k) or {}).get("chunk")
        return P.write_size / (ch["total_s"] + (ch["quiesce"] or 0)) / 1e6 if ch else None

    def untar(k, with_q=False):
        u = (res.get(k) or {}).get("untar")
        if not u or not tar:
            return None
        return tar["files"] / (u["untar_s"] + u["sync_s"] + ((u["quiesce"] or 0) if with_q
                                                               else 0))

    def rm(k, with_q=False):
        r_ = (res.get(k) or {}).get("rm")
        if not r_ or not tar:
            return None
        return tar["files"] / (r_["rm_s"] + r_["sync_s"] + ((r_["quiesce"] or 0) if with_q
                                                            else 0))

    for t in [x for x in ("tierfs", "tierfs-wb") if x in s.keys(WRITERS)]:
        keys = [k for k in s.keys(WRITERS) if k == t or "tierfs" not in k
                or (t == "tierfs" and k == "tierfs-default")]
        sec.metric(f"write job {R.human(P.write_size)} incl. fsync MB/s ({t})", "MB/s",
                   {k: job(k) for k in keys}, tierfs=t)
        sec.metric(f"untar + sync -f files/s ({t})", "files/s", {k: untar(k) for k in keys},
                   tierfs=t)
        sec.metric(f"rm -rf + sync -f files/s ({t})", "files/s", {k: rm(k) for k in keys},
                   tierfs=t)
    if "tierfs-wb" in s.keys(WRITERS):
        sec.metric("untar until on the store files/s (tierfs-wb)", "files/s",
                   {k: untar(k, True) for k in WRITERS if "tierfs" not in k or k == "tierfs-wb"},
                   tierfs="tierfs-wb")
        sec.metric("rm -rf until on the store files/s (tierfs-wb)", "files/s",
                   {k: rm(k, True) for k in WRITERS if "tierfs" not in k or k == "tierfs-wb"},
                   tierfs="tierfs-wb")
    sec.panels += [
        {"kind": "bars", "title": f"write job {R.human(P.write_size)}", "unit": "MB/s (log)",
         "log": True, "categories": ["write phase", "job incl. fsync", "until on the store"],
         "series": [{"name": k, "values": [(r.get("chunk") or {}).get("write_mbps"), job(k),
                                           durable(k)]} for k, r in res.items()]},
        {"kind": "bars", "title": f"untar {tar['files'] if tar else '?'} files",
         "unit": "files/s (log)", "log": True,
         "categories": ["untar + sync -f", "until on the store"],
         "series": [{"name": k, "values": [untar(k), untar(k, True)]} for k in res]},
        {"kind": "bars", "title": f"rm -rf of the {tar['files'] if tar else '?'} files",
         "unit": "files/s (log)", "log": True,
         "categories": ["rm -rf + sync -f", "until on the store"],
         "series": [{"name": k, "values": [rm(k), rm(k, True)]} for k in res]},
    ]


# ---------------------------------------------------------------------------------------------
# 5. mixed concurrent read/write (blogbench style, seed 003)

def wl_mixed(s, sec):
    P = params(s)
    tree, man = T.make_grep_tree(s.b.backing, P.grep_files, P.grep_seed)
    rdir = tree / "d00"
    nfiles = sum(len(fs) for _, _, fs in os.walk(rdir))
    nbytes = sum(os.path.getsize(os.path.join(r_, f)) for r_, _, fs in os.walk(rdir)
                 for f in fs)
    res: dict = {}
    for key in WRITERS:
        shutil.rmtree(s.b.backing / f"suite-mixed-{key}", ignore_errors=True)

    def body(c, root):
        r = res.setdefault(c.key, {})
        src = root / tree.name / "d00"
        if c.caches:
            s.prepare(c, warm_dirs=[rdir])
            dt, _, sl = s.timed(sec, ["sh", "-c", 'find "$0" -type f -print0 | xargs -0 cat '
                                      '> /dev/null', src], 3600)
            s.served(sec, c.key, read=nbytes)
            r["warm"] = {"s": dt, "slow": sl.get("bytes_read")}
        s.prepare(c, warm_dirs=[rdir])
        cmd = [R.SYS_PYTHON, MIXED, src, root / f"suite-mixed-{c.key}", "--readers", "2",
               "--writers", "2", "--seconds", str(P.mixed_s), "--read-only-seconds",
               str(P.mixed_ro_s)]
        _, p, sl = s.timed(sec, cmd, P.mixed_s + P.mixed_ro_s + 600)
        x = json.loads(p.stdout.strip().splitlines()[-1])
        s.served(sec, c.key, read=x["read_only"]["read_bytes"] + x["mixed"]["read_bytes"],
                 write=x["mixed"].get("write_bytes", 0))
        r.update(x)
        r["slow"] = sl
        r["quiesce"] = c.quiesce()
        R.log(f"mixed {c.key}: reads/s alone {x['read_only']['reads_per_s']:,.0f}, with "
              f"writers {x['mixed']['reads_per_s']:,.0f}; writes/s "
              f"{x['mixed'].get('writes_per_s', 0):,.0f}")

    s.each(sec, WRITERS, body)
    for key in WRITERS:
        shutil.rmtree(s.b.backing / f"suite-mixed-{key}", ignore_errors=True)

    sec.add("Debian has no `blogbench` package, so this is `bench/lib/mixed.py`, a small stand-in "
            "for what seed 003 measures (reads/s while writers run): 2 reader processes read "
            f"random whole files of `{tree.name}/d00` ({nfiles:,} files, {R.human(nbytes)}, "
            "listed before the clock starts) with open/read(64 KiB)/close; 2 writer processes "
            "create new 1-64 KiB text files (one `write(2)`, close, no fsync) and every 5th "
            "operation append 1-4 KiB to an earlier one. First the readers alone for "
            f"{P.mixed_ro_s:g} s, then readers and writers together for {P.mixed_s:g} s. "
            "tierfs and rclone read the directory once first (untimed), so the readers measure "
            "cached reads; caches dropped before the run; the readers run in the reader memory "
            f"cgroup ({R.human(s.cg.limit)}). " + emu_line(s, sec), "")
    sec.add("| contender | reads/s alone | reads/s with writers | with / alone | read p50 / "
            "p99 ms (with writers) | writes/s | write MB/s | write p50 / p99 ms | on the store "
            "after +s | store read during run |", "|---|" + "---:|" * 9)
    for key in WRITERS:
        r = res.get(key)
        if not r or "mixed" not in r:
            continue
        ro, mx = r["read_only"], r["mixed"]
        sec.add(f"| {s.c[key].short} | {ro['reads_per_s']:,.0f} | **{mx['reads_per_s']:,.0f}** "
                f"| {R.rx(mx['reads_per_s'] / ro['reads_per_s']) if ro['reads_per_s'] else '-'} "
                f"| {mx['read_p50_ms']:.2f} / {mx['read_p99_ms']:.2f} | "
                f"{mx.get('writes_per_s', 0):,.0f} | {mx.get('write_mbps', 0):,.1f} | "
                f"{mx.get('write_p50_ms', 0):.2f} / {mx.get('write_p99_ms', 0):.2f} | "
                f"{md(r.get('quiesce'), '.1f')} | {hb(r['slow'].get('bytes_read'))} |")
    sec.add("")

    def g(k, ph, fld):
        return ((res.get(k) or {}).get(ph) or {}).get(fld)

    for t in [x for x in ("tierfs", "tierfs-wb") if x in s.keys(WRITERS)]:
        keys = [k for k in s.keys(WRITERS) if k == t or "tierfs" not in k
                or (t == "tierfs" and k == "tierfs-default")]
        sec.metric(f"mixed: reads/s while writers run ({t})", "reads/s",
                   {k: g(k, "mixed", "reads_per_s") for k in keys}, tierfs=t)
        sec.metric(f"mixed: writes/s next to readers ({t})", "writes/s",
                   {k: g(k, "mixed", "writes_per_s") for k in keys}, tierfs=t)
    sec.panels.append({"kind": "bars", "title": "blogbench-style mixed load", "unit":
                       "operations/s (log)", "log": True,
                       "categories": ["reads/s alone", "reads/s with writers", "writes/s"],
                       "series": [{"name": k, "values": [g(k, "read_only", "reads_per_s"),
                                                         g(k, "mixed", "reads_per_s"),
                                                         g(k, "mixed", "writes_per_s")]}
                                  for k in res]})


# ---------------------------------------------------------------------------------------------
# 6. memory coexistence (seed 004)

class Sampler(threading.Thread):
    """Every 0.5 s: the contender daemon's RSS, tierfs's RAM tier (ram.bytes and, when the
    binary has a memory-pressure monitor, its `pressure.target`), MemAvailable."""

    def __init__(self, c):
        super().__init__(daemon=True)
        self.c = c
        self.stop_ev = threading.Event()
        self.rows: list = []
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop_ev.is_set():
            t = time.monotonic() - self.t0
            pids = self.c.pids()
            rss = sum(C.rss_bytes(p) or 0 for p in pids) if pids else None
            st = self.c.stats() if isinstance(self.c, C.Tierfs) else None
            ram = (st or {}).get("ram") if isinstance(st, dict) else None
            ram = ram if isinstance(ram, dict) else {}
            # The memory-pressure monitor's cap of the RAM tier (`pressure.target`); older
            # binaries have none (or, defensively, a ram.*target* key).
            target = R.jget(st, "pressure.target") or next(
                (v for k, v in sorted(ram.items()) if "target" in k
                 and isinstance(v, (int, float))), None)
            self.rows.append({"t": t, "rss": rss, "ram": ram.get("bytes"), "target": target,
                              "avail": meminfo("MemAvailable")})
            self.stop_ev.wait(0.5)

    def stop(self):
        self.stop_ev.set()
        self.join(timeout=10)


def hog_cmd(P, ops) -> list:
    return ["stress-ng", "--vm", "2", "--vm-bytes", str(P.hog_bytes), "--vm-keep",
            "--vm-ops", str(ops), "--metrics-brief"]


def run_hog_and_reader(s, sec, c, hog, reader, P):
    """Starts the hog and the reader together; returns (hog s, reader s, samples)."""
    sam = Sampler(c) if c else None
    if sam:
        sam.start()
    sec.cmd(hog)
    t0 = time.monotonic()
    hp = subprocess.Popen(hog, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    s.hog_procs.append(hp)
    t_reader = None
    if reader:
        t_reader, _, _ = s.timed(sec, reader, 1800)
    try:
        hp.wait(timeout=1800)
    except subprocess.TimeoutExpired:
        s.kill_bg()
        raise R.BenchError("memory hog did not finish in 1800 s")
    t_hog = time.monotonic() - t0
    if sam:
        sam.stop()
    if hp.returncode != 0:
        raise R.BenchError(f"stress-ng failed (rc={hp.returncode}): "
                           f"{(hp.stderr.read() or '').strip()[-300:]}")
    return t_hog, t_reader, (sam.rows if sam else [])


def wl_memory(s, sec):
    P = params(s)
    f = s.b.test_file(f"mem-{size_tag(P.mem_file)}.bin", P.mem_file)
    sec.skipped["store"] = NOT_A_CACHE
    sec.skipped["tierfs-wb"] = READ_SAME
    # Fixed work for the hog: after one discarded warm-up run (the first touch of freshly
    # freed memory is slow on this VM, FUSE-NOTES lesson 8), calibration runs from 400
    # bogo-ops up (x4, at most 3 more) until one lasts at least a quarter of hog_target_s;
    # --vm-ops is then scaled from it linearly. The number is stated.
    R.drop_caches()
    run_hog_and_reader(s, sec, None, hog_cmd(P, 100), None, P)
    cal = []
    c_ops = 400
    for _ in range(4):
        t_c, _, _ = run_hog_and_reader(s, sec, None, hog_cmd(P, c_ops), None, P)
        cal.append((c_ops, t_c))
        if t_c >= P.hog_target_s / 4:
            break
        c_ops *= 4
    ops = int(min(10_000_000, max(100, c_ops * P.hog_target_s / max(t_c, 0.05))))
    R.log(f"memory: hog calibration {cal}: {ops} ops")
    hog = hog_cmd(P, ops)
    R.drop_caches()
    t_alone, _, _ = run_hog_and_reader(s, sec, None, hog, None, P)
    R.log(f"memory: hog alone {t_alone:.1f} s")
    res: dict = {}

    def reader_cmd(root, passes):
        return ["sh", "-c", f'for i in $(seq {passes}); do dd if="$0" of=/dev/null '
                'bs=1M iflag=direct status=none || exit 1; done', str(root / f.name)]

    def body(c, root):
        r = res.setdefault(c.key, {})
        if c.caches:
            r["fill"] = fill_through(s, sec, c, root / f.name, P.mem_file)
        # Passes: as many as last about as long as the hog alone (from one timed pass), so
        # the two overlap; the contenders' readers are compared by MB/s, not by time.
        s.prepare(c, warm_files=[f])
        one, _, _ = s.timed(sec, reader_cmd(root, 1), 600)
        n = int(min(2000, max(3, round(t_alone / max(one, 1e-3)))))
        r["passes"] = n
        vol = P.mem_file * n
        s.served(sec, c.key, read=P.mem_file * (n * 2 + 1))
        s.prepare(c, warm_files=[f])
        sam = Sampler(c)
        sam.start()
        r["reader_alone"], _, _ = s.timed(sec, reader_cmd(root, n), 1800)
        sam.stop()
        r["rss_alone"] = max((x["rss"] or 0 for x in sam.rows), default=None)
        s.prepare(c, warm_files=[f])
        r["hog"], r["reader"], r["samples"] = run_hog_and_reader(s, sec, c, hog,
                                                                  reader_cmd(root, n), P)
        r["mbps_alone"] = vol / r["reader_alone"] / 1e6
        r["mbps"] = vol / r["reader"] / 1e6
        R.log(f"memory {c.key}: reader ({n} passes) alone {r['mbps_alone']:,.0f} MB/s, next "
              f"to the hog {r['mbps']:,.0f} MB/s; hog {r['hog']:.1f} s (alone {t_alone:.1f} s)")

    s.each(sec, CACHED, body)

    total = meminfo("MemTotal")
    sec.add(f"A memory-hungry job next to a cached read loop (seed 004). **Hog**: "
            f"`{shlex.join(hog)}` (2 workers touching {R.human(P.hog_bytes)} in total, fixed "
            f"work of {ops} bogo-ops, scaled from calibration runs ("
            + ", ".join(f"{o} ops {t:.1f} s" for o, t in cal)
            + ") after one discarded warm-up run; the machine has "
            f"{R.human(total)}; the hog's size is what "
            "was available at the start less 2 x ram.max and 2 GiB"
            + (" (quick: the smaller of 2 GiB and 1/8 of it)" if s.quick else "")
            + "). **Reader**: passes of "
            f"`dd bs=1M iflag=direct` over `{f.name}` ({R.human(P.mem_file)}, which fits "
            f"tierfs's RAM tier of {R.human(s.M)}) in the reader cgroup, as many passes as take "
            "about as long as the hog alone (from one timed pass; stated per contender), so "
            "the readers are compared by MB/s. O_DIRECT keeps the reader's page cache out of "
            "it: each contender serves from its own cache (tierfs: its RAM tier; rclone: its "
            "cache file through the page cache; bindfs: the local file through the page cache; "
            "local disk: the device). tierfs and rclone read the file once first. Each "
            "contender: reader alone, then hog and reader started together; the hog alone once "
            f"before: **{t_alone:.1f} s**. Daemon RSS (`/proc/PID/status` VmRSS) and tierfs's "
            "`ram.bytes` and RAM target (`pressure.target`, when the binary reports one) sampled every "
            "0.5 s. " + emu_line(s, sec), "")
    sec.add("| contender | passes | reader alone MB/s | reader next to hog MB/s | with / alone | "
            "hog next to reader s | hog slowdown | daemon RSS max alone / with hog | RAM tier "
            "min / max with hog | MemAvailable min |", "|---|" + "---:|" * 9)
    keys = CACHED
    for key in keys:
        r = res.get(key)
        if not r or "hog" not in r:
            continue
        smp = r["samples"]
        rss = [x["rss"] for x in smp if x["rss"] is not None]
        ram = [x["ram"] for x in smp if x["ram"] is not None]
        sec.add(f"| {s.c[key].short} | {r['passes']} | {r['mbps_alone']:,.0f} | "
                f"**{r['mbps']:,.0f}** | {R.rx(r['mbps'] / r['mbps_alone'])} | {r['hog']:.1f} | "
                f"{R.rx(r['hog'] / t_alone)} | "
                f"{hb(r.get('rss_alone')) if key != 'local' else '-'} / "
                f"{hb(max(rss)) if rss else '-'} | "
                f"{(hb(min(ram)) + ' / ' + hb(max(ram))) if ram else '-'} | "
                f"{hb(min(x['avail'] for x in smp)) if smp else '-'} |")
    sec.add("")
    tg = [x["target"] for x in (res.get("tierfs") or {}).get("samples", []) if x["target"]]
    sec.add("tierfs RAM target: " + (f"reported, min {hb(min(tg))} max {hb(max(tg))}." if tg
                                     else "not reported by this binary (no `pressure.target` "
                                     "in `tierfs stats --json`)."), "")
    sec.metric("memory: cached reader MB/s next to the hog", "MB/s",
               {k: r.get("mbps") for k, r in res.items()})
    sec.metric("memory: hog time next to the reader (ratio as speed)", "1/s",
               {k: 1 / r["hog"] for k, r in res.items() if r.get("hog")},
               note="speed = 1 / seconds")
    sec.panels.append({"kind": "bars", "title": "cached reader, alone and next to the hog",
                       "unit": "MB/s", "categories": ["alone", "next to the hog"],
                       "series": [{"name": k, "values": [r.get("mbps_alone"), r.get("mbps")]}
                                  for k, r in res.items()]})
    sec.panels.append({"kind": "bars", "title": "hog: alone and next to each reader",
                       "unit": "seconds", "categories": ["hog"],
                       "series": [{"name": "hog alone", "values": [t_alone]}]
                       + [{"name": k, "values": [r.get("hog")]} for k, r in res.items()]})
    series = []
    for k, r in res.items():
        smp = r.get("samples") or []
        if k != "local" and any(x["rss"] for x in smp):
            series.append({"name": f"{k} RSS", "x": [x["t"] for x in smp],
                           "y": [(x["rss"] or 0) / 2**20 for x in smp]})
    ts = (res.get("tierfs") or {}).get("samples") or []
    if any(x["ram"] is not None for x in ts):
        series.append({"name": "tierfs ram.bytes", "x": [x["t"] for x in ts],
                       "y": [(x["ram"] or 0) / 2**20 for x in ts]})
    if any(x["target"] for x in ts):
        series.append({"name": "tierfs RAM target", "x": [x["t"] for x in ts],
                       "y": [(x["target"] or 0) / 2**20 for x in ts]})
    sec.panels.append({"kind": "xy", "title": "daemon memory while the hog runs",
                       "unit": "MiB", "xlabel": "seconds", "series": series})


# ---------------------------------------------------------------------------------------------
# Concurrency (issue 5 point 3)

def wl_concurrency(s, sec):
    P = params(s)
    f = s.b.test_file(f"conc-{size_tag(P.conc_file)}.bin", P.conc_file)
    sec.skipped["store"] = NOT_A_CACHE
    sec.skipped["tierfs-wb"] = READ_SAME
    res: dict = {}
    threads = [1, 2, 4]

    def body(c, root):
        r = res.setdefault(c.key, {})
        path = root / f.name
        local = c.key == "local"
        if c.caches:
            fill_through(s, sec, c, path, P.conc_file)
            fill_through(s, sec, c, path, P.conc_file)
        if local:  # the page cache is the local disk's cache: read the file into it
            R.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], 300)
        for bs in ("4k", "1M"):
            for n in threads:
                cmd = ["fio", f"--name=c{bs}{n}", "--filename=" + str(path).replace(":", "\\:"),
                       "--rw=randread", f"--bs={bs}", "--ioengine=psync",
                       f"--direct={0 if local else 1}", f"--numjobs={n}", "--thread",
                       "--group_reporting", "--norandommap", "--randrepeat=0", "--readonly",
                       "--lat_percentiles=1",
                       # fio drops the file's page cache before a job by default; the local
                       # disk's cached case needs it kept.
                       "--invalidate=0",
                       "--ramp_time=1", f"--runtime={P.conc_runtime}", "--time_based",
                       "--output-format=json"]
                _, p, sl = s.timed(sec, cmd, P.conc_runtime + 300, cgroup=False)
                x = fio_parse(p)
                x["slow"] = sl.get("bytes_read")
                if x["ok"]:
                    s.served(sec, c.key, read=x["io_bytes"])
                r[(bs, n)] = x
                R.log(f"concurrency {c.key} {bs} x{n}: " + (f"{x['mbps']:,.0f} MB/s, "
                      f"{x['iops']:,.0f} IOPS" if x["ok"] else x["error"]))

    s.each(sec, CACHED, body)

    sec.add(f"Cached random reads of `{f.name}` ({R.human(P.conc_file)}; fits tierfs's RAM tier "
            f"of {R.human(s.M)}) with 1, 2 and 4 reader threads (fio `--ioengine=psync "
            f"--numjobs=N --thread`, each thread QD1), 4 KiB and 1 MiB, 1 s ramp + "
            f"{P.conc_runtime} s. FUSE contenders: `--direct=1` at the reader, so the page "
            "cache above the mount plays no part and tierfs serves from its RAM tier (rclone "
            "from its cache file, bindfs from the local file, both through the page cache). "
            "The local disk: buffered reads with the file in the page cache (the cached limit). "
            f"This machine has {os.cpu_count()} CPUs: 4 threads cannot scale past 2x. "
            "Scaling = throughput with N threads / with 1. " + emu_line(s, sec), "")
    sec.add("| contender | bs | 1 thread MB/s (IOPS) | 2 threads | 4 threads | scaling 2/1 | "
            "scaling 4/1 | p99 us 1 / 4 threads |", "|---|---|---:|---:|---:|---:|---:|---:|")

    def v(k, bs, n, fld="mbps"):
        x = (res.get(k) or {}).get((bs, n)) or {}
        return x.get(fld) if x.get("ok") else None

    for k in CACHED:
        if k not in res:
            continue
        for bs in ("4k", "1M"):
            cells = [f"{v(k, bs, n):,.0f} ({v(k, bs, n, 'iops'):,.0f})" if v(k, bs, n) else "-"
                     for n in threads]
            sc = [R.rx(v(k, bs, n) / v(k, bs, 1)) if v(k, bs, n) and v(k, bs, 1) else "-"
                  for n in (2, 4)]
            sec.add(f"| {s.c[k].short} | {bs} | " + " | ".join(cells) + f" | {sc[0]} | "
                    f"{sc[1]} | {md(v(k, bs, 1, 'p99_us'))} / {md(v(k, bs, 4, 'p99_us'))} |")
    sec.add("")
    keys = CACHED
    sec.metric("concurrency: 4 KiB random, 4 threads IOPS", "IOPS",
               {k: v(k, "4k", 4, "iops") for k in keys})
    sec.metric("concurrency: 1 MiB random, 4 threads MB/s", "MB/s",
               {k: v(k, "1M", 4) for k in keys})
    sec.metric("concurrency: 4 KiB scaling 4 threads / 1", "x",
               {k: (v(k, "4k", 4) / v(k, "4k", 1)) if v(k, "4k", 4) and v(k, "4k", 1) else None
                for k in keys})
    for bs in ("4k", "1M"):
        sec.panels.append({"kind": "lines", "title": f"cached random reads, bs {bs}",
                           "unit": "MB/s", "xlabel": "reader threads", "x": threads,
                           "series": [{"name": k, "values": [v(k, bs, n) for n in threads]}
                                      for k in keys if k in res]})


# ---------------------------------------------------------------------------------------------
# dirstat: metadata of one directory of small files (the sshfs profile's inode renumbering)

def stat_run(s, sec, c, path: Path, label: str, stat: bool = True, du: bool = True) -> dict:
    """`find DIR -type f -exec stat ... +` (stats/s; the inode number of every file is kept)
    and `du -s DIR` (seconds); tierfs's store requests over both."""
    out: dict = {}
    t0 = c.stats()
    if stat:
        cmd = ["find", str(path), "-type", "f", "-exec", "stat", "-c", "%i %s %Y %n", "{}", "+"]
        dt, p, sl = s.timed(sec, cmd, 900, inner=True)
        rows = [ln.split(" ", 3) for ln in (p.stdout or "").splitlines() if ln.strip()]
        out.update(stat_s=dt, files=len(rows), stats_s=len(rows) / dt if dt else None,
                   inodes={Path(r[3]).name: r[0] for r in rows if len(r) == 4},
                   slow_stat=sl.get("bytes_read"))
    if du:
        dt, p, sl = s.timed(sec, ["du", "-s", str(path)], 900, inner=True)
        out.update(du_s=dt, du_kib=int((p.stdout or "0").split()[0]), slow_du=sl.get("bytes_read"))
    out["backing"] = backing_delta(c, t0, c.stats())
    R.log(f"dirstat {c.key} {label}: "
          + (f"{out['stats_s']:,.0f} stats/s ({out['files']} files) " if stat else "")
          + (f"du -s {out['du_s']:.3f} s" if du else ""))
    return out


def median_run(runs: list) -> dict:
    """The first run's record with every number replaced by the median over the runs (the
    odd count keeps it one measured value); inode maps and backing counters: the first run's."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = sorted(r[k] for r in runs if isinstance(r.get(k), (int, float)))
            out[k] = vals[len(vals) // 2]
    return out


def wl_dirstat(s, sec):
    P = params(s)
    d, man = T.make_stat_dir(s.b.backing, P.dirstat_files, P.dirstat_size)
    sec.skipped["tierfs-wb"] = READ_SAME
    res: dict = {}

    def body(c, root):
        path = root / d.name
        runs: dict = {}
        for rep in range(P.dirstat_reps):
            if rep:
                s.remount(sec, c, fresh=True)
            s.prepare(c, warm_dirs=[d])
            runs.setdefault("cold", []).append(stat_run(s, sec, c, path, "cold", du=False))
            runs.setdefault("warm", []).append(stat_run(s, sec, c, path, "warm"))
            s.prepare(c, warm_dirs=[d])  # drop_caches, no remount
            runs.setdefault("dropped", []).append(
                stat_run(s, sec, c, path, "after drop_caches"))
            s.remount(sec, c, fresh=True)
            s.prepare(c, warm_dirs=[d])
            runs.setdefault("du_cold", []).append(
                stat_run(s, sec, c, path, "du cold", stat=False))
        res[c.key] = {ph: median_run(rs) for ph, rs in runs.items()}

    s.each(sec, READERS, body)
    sec.add(f"One directory, `{d.name}`: **{man['files']:,} files** of {man['size']:,} bytes "
            f"(random). Every number is the median of {P.dirstat_reps} rounds of what follows "
            "(store counters: the first round's); times are taken by the shell around each command "
            "(bash `$EPOCHREALTIME`, as `time CMD` would), so the harness's own process start "
            "is not in them. Per contender, in order: **cold**: fresh mount (empty cache; sshfs "
            "profile: a new sshfs mount under it), caches dropped, `find DIR -type f -exec stat "
            "-c '%i %s %Y %n' {} +` (stats/s = files / seconds); **warm**: the same again at "
            "once, then `du -s DIR`; **after drop_caches**: `sync; echo 3 > "
            "/proc/sys/vm/drop_caches` without a remount (the kernel forgets its inodes: sshfs "
            "then numbers them anew), stat pass and `du -s` again; **du cold**: unmount, mount "
            "fresh with an empty cache, caches dropped, `du -s DIR`. *inode numbers changed*: "
            "files whose `st_ino` differs from the cold pass. " + emu_line(s, sec), "")
    sec.add("| contender | cold stats/s | warm stats/s | after drop_caches stats/s | du -s cold "
            "| du -s warm | du -s after drop_caches | inode numbers changed warm / after "
            "drop_caches | store read cold / warm / dropped / du cold |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def g(key, ph, fld):
        return ((res.get(key) or {}).get(ph) or {}).get(fld)

    def changed(key, ph):
        a, b = g(key, "cold", "inodes"), g(key, ph, "inodes")
        if not a or not b:
            return "-"
        return f"{sum(1 for n, i in b.items() if a.get(n) != i):,}"

    def both(key, ph):
        a, b = g(key, ph, "slow_stat"), g(key, ph, "slow_du")
        return None if a is None and b is None else (a or 0) + (b or 0)

    for key in READERS:
        r = res.get(key)
        if not r or "cold" not in r:
            continue
        slow = [g(key, "cold", "slow_stat"), both(key, "warm"), both(key, "dropped"),
                g(key, "du_cold", "slow_du")]
        bad = [f"{ph}: {g(key, ph, 'files')} files" for ph in ("cold", "warm", "dropped")
               if g(key, ph, "files") not in (None, man["files"])]
        sec.add(f"| {s.c[key].short} | {md(g(key, 'cold', 'stats_s'))} | "
                f"{md(g(key, 'warm', 'stats_s'))} | {md(g(key, 'dropped', 'stats_s'))} | "
                f"{md(g(key, 'du_cold', 'du_s'), '.3f', ' s')} | "
                f"{md(g(key, 'warm', 'du_s'), '.3f', ' s')} | "
                f"{md(g(key, 'dropped', 'du_s'), '.3f', ' s')} | {changed(key, 'warm')} / "
                f"{changed(key, 'dropped')} | " + " / ".join(hb(x) for x in slow) + " |"
                + (f" WRONG COUNT ({'; '.join(bad)})" if bad else ""))
    sec.add("")
    for key in READERS:
        r = res.get(key) or {}
        if isinstance(s.c[key], C.Tierfs) and r.get("cold"):
            sec.add(f"{key} asked the store (`tierfs stats --json` backing counters per "
                    "phase): " + backing_text([(ph, (r.get(k) or {}).get("backing")) for ph, k in
                                               (("cold", "cold"), ("warm", "warm"),
                                                ("after drop_caches", "dropped"),
                                                ("du cold", "du_cold"))]) + ".", "")
    for m_, ph in (("cold", "cold"), ("warm", "warm"), ("after drop_caches", "dropped")):
        sec.metric(f"dirstat {man['files']:,} files: find -exec stat {m_} stats/s", "stats/s",
                   {k: g(k, ph, "stats_s") for k in res})
    for m_, ph in (("cold", "du_cold"), ("after drop_caches", "dropped")):
        sec.metric(f"dirstat: du -s {m_} (ratio as speed)", "1/s",
                   {k: 1 / g(k, ph, "du_s") for k in res if g(k, ph, "du_s")},
                   note="speed = 1 / seconds")
    sec.panels.append({"kind": "bars", "title": f"find -exec stat, {man['files']:,} files",
                       "unit": "stats/s (log)", "log": True,
                       "categories": ["cold", "warm", "after drop_caches"],
                       "series": [{"name": k, "values": [g(k, ph, "stats_s") for ph in
                                                         ("cold", "warm", "dropped")]}
                                  for k in res]})
    sec.panels.append({"kind": "bars", "title": "du -s", "unit": "seconds (log)", "log": True,
                       "categories": ["cold", "warm", "after drop_caches"],
                       "series": [{"name": k, "values": [g(k, ph, "du_s") for ph in
                                                         ("du_cold", "warm", "dropped")]}
                                  for k in res]})


WORKLOADS = {
    "md5": (wl_md5, "1. md5 loop over a file twice the memory budget, 6 passes (seed 002)"),
    "grep": (wl_grep, "2. grep -r over many small files: cold, warm, after remount (seed 000)"),
    "fio": (wl_fio, "3. fio: sequential 1 MiB and 4 KiB random reads warm from the SSD tier, "
                    "1 MiB sequential write"),
    "write": (wl_write, "4. write job (seed 001, open/write/fsync/close) and an untar"),
    "mixed": (wl_mixed, "5. mixed concurrent readers and writers, blogbench style (seed 003)"),
    "memory": (wl_memory, "6. memory coexistence: a memory hog next to a cached read loop "
                          "(seed 004)"),
    "concurrency": (wl_concurrency, "cached 4 KiB / 1 MiB random reads with 1, 2, 4 threads "
                                    "(issue 5 point 3)"),
    "dirstat": (wl_dirstat, "metadata of one directory of 1,000 small files: find -exec stat "
                            "and du -s, cold, warm, after drop_caches"),
}

# The default job list (no WORKLOAD named); dirstat, git and rsync run when named (e.g.
# dirstat@sshfs, git@nfs-lan, rsync@sshfs).
ORDER = ["md5", "grep", "fio", "write", "mixed", "memory", "concurrency"]
