"""The suite's writing workloads: 4. the write job (seed 001) with an untar and an rm -rf of
the tree, and 5. mixed concurrent readers and writers, blogbench style (seed 003,
bench/lib/mixed.py). Registered by name in workloads.py.
"""

import json
import os
import shutil
from pathlib import Path

import benchcore as R
import testdata as T
from workloads_common import WRITERS, emu_line, hb, md, params

LIB = Path(__file__).resolve().parent
MIXED = LIB / "mixed.py"


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
