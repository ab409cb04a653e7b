"""The suite's reading workloads: 1. the md5 loop (seed 002), 2. grep -r over many small
files (seed 000), 3. fio (random and sequential reads warm from the SSD tier, a sequential
write; on the sshfs profile also a cold and a warm sequential read of a whole file), and the
cached random reads with 1, 2 and 4 threads (`concurrency`, issue 5 point 3). Registered by
name in workloads.py.
"""

import json
import os
import shutil
from pathlib import Path

import benchcore as R
import contenders as C
import testdata as T
from workloads_common import (CACHED, NOT_A_CACHE, READ_SAME, READERS, WRITERS, backing_delta,
                              backing_text, emu_line, fill_through, hb, md, params, size_tag)


def median(vals):
    v = sorted(x for x in vals if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def cached_md5(f: Path) -> str:
    side = f.with_name(f.name + ".md5")
    if side.exists() and side.stat().st_mtime >= f.stat().st_mtime:
        return side.read_text().split()[0]
    v = R.run(["md5sum", f], max(300, f.stat().st_size / 50e6)).stdout.split()[0]
    side.write_text(v + "\n")
    return v


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
