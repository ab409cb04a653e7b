"""`bench/run --workload fleet`'s report (bench/lib/fleetbench.py runs it): the emulation, the
issue-44 criteria with PASS/FAIL, one row per host, what uploading costs host 1, the commands,
and the plot spec (seconds per host, origin GiB per host). Imports only benchcore."""
from pathlib import Path

import benchcore as R
from benchcore import Result

SPEEDUP_TARGET = 3.0      # hosts 2 and 3: host 1's seconds / theirs
ORIGIN_TARGET = 1.1       # hosts 1-3 together: origin bytes / dataset bytes
PLOT_LABELS = {"reference": "reference (no tier)", "host1": "host 1", "host2": "host 2",
               "host3": "host 3", "host4": "host 4 (read-mostly)"}
COLORS = {"reference": "#888888", "host1": "#d9822b", "host2": "#2b7bd9", "host3": "#5aa05a",
          "host4": "#9b59b6"}


def version_of(binary: str) -> str:
    """versitygw-v1.7.0 -> v1.7.0 (the scripts name their binaries by version)."""
    name = Path(binary).name
    return name.split("-", 1)[1] if "-" in name else name


def emulation(delay_us: int, versitygw: str, weed: str) -> str:
    ms = delay_us / 1000
    return (f"origin: versitygw {version_of(versitygw)} (POSIX backend, keep-alive) behind a "
            f"relay (tierfs-netdelay) adding {ms:g} ms each way ({2 * ms:g} ms round trip, one "
            f"more for a new connection's handshake, no bandwidth cap); shared tier: SeaweedFS on loopback (weed {version_of(weed)}: "
            f"1 master, 3 volume servers, 2 copies, filer + S3 gateway), no added delay; both "
            f"servers' files in their page cache before each read")


def rel(p) -> str:
    return str(p).replace(str(R.ROOT) + "/", "")


def criteria(runs: list, total: int) -> list:
    """(criterion, target, measured, passed)."""
    h = {r.name: r for r in runs}
    out = []
    for n in ("host2", "host3"):
        v = h["host1"].seconds / h[n].seconds
        out.append((f"host {n[-1]} reads at >= {SPEEDUP_TARGET:g}x host 1's speed "
                    f"(seconds of host 1 / host {n[-1]})", f">= {SPEEDUP_TARGET:.2f}x", v,
                    v >= SPEEDUP_TARGET))
    v = sum(h[n].origin_bytes for n in ("host1", "host2", "host3")) / total
    out.append((f"the fleet reads <= {ORIGIN_TARGET:g}x the dataset from the origin (sum of "
                "`backing.read_bytes` of hosts 1-3 / dataset bytes)",
                f"<= {ORIGIN_TARGET:.2f}x", v, v <= ORIGIN_TARGET))
    if "host4" in h:
        v = h["host1"].seconds / h["host4"].seconds
        out.append((f"not a criterion: {h['host4'].label} against host 1 (default options), "
                    "what close-to-open costs", f">= {SPEEDUP_TARGET:.2f}x", v,
                    v >= SPEEDUP_TARGET))
    return out


def cell(v, spec=",") -> str:
    return "n/a" if v is None else format(v, spec)


def host_rows(runs: list, total: int) -> list:
    rows = []
    for r in runs:
        c = r.counters if r.shared else {}
        rows.append([r.label, f"{r.seconds:.2f}", f"{total / r.seconds / 1e6:,.1f}",
                     f"{r.origin_bytes:,}", f"{r.origin_gets:,}",
                     *[cell(c.get(k)) for k in ("hits", "hit_bytes", "puts", "put_bytes",
                                                "late_puts", "put_dropped", "corrupt",
                                                "errors")],
                     r.verified])
    return rows


HEAD = ["host", "seconds", "MB/s", "origin bytes", "origin GETs", "shared hits",
        "shared hit bytes", "puts", "put bytes", "late puts", "puts dropped", "corrupt", "errors",
        "md5 of every file"]


def notes(runs: list, total: int) -> list:
    h = {r.name: r for r in runs}
    ref, h1 = h["reference"], h["host1"]
    d = h1.seconds / ref.seconds - 1
    L = [f"What uploading costs host 1: its read took {h1.seconds:.2f} s against "
         f"{ref.seconds:.2f} s for the same read by a mount with no shared tier "
         f"({d * 100:+.1f}%); its uploads were all done {h1.drain_seconds:.1f} s after its "
         f"read ended (`shared.queued_bytes` 0 and `shared.later` 0: late uploads from its SSD tier "
         f"included), before host 2 started."]
    dropped = h1.counters.get("put_dropped") or 0
    if dropped:
        L.append(f"Host 1 did not upload {dropped:,} chunks (`shared.put_dropped`): the tier "
                 "was down, or a chunk its upload queue (`shared.queue`) could not take was no "
                 "longer whole in its SSD tier for the late upload; another host reads those "
                 "from the origin.")
    late = h1.counters.get("late_puts") or 0
    if late:
        L.append(f"Host 1 uploaded {late:,} chunks late, read back from its SSD tier "
                 "(`shared.late_puts`): its upload queue was full when it read them.")
    for n in ("host2", "host3", "host4"):
        r = h.get(n)
        if r and r.origin_bytes:
            c = r.counters
            L.append(f"Host {n[-1]} read {r.origin_bytes:,} bytes ({r.origin_bytes / total:.1%} "
                     f"of the dataset) from the origin in {r.origin_gets:,} GETs: "
                     f"{cell(c.get('misses'))} chunks were not in the tier "
                     f"(`shared.misses`), {cell(c.get('skipped'))} not asked "
                     f"(`shared.skipped`, tier down), {cell(c.get('errors'))} errors.")
    return L


def result(b, runs: list, files: list, total: int, tier, env, left: list, ctx: dict) -> Result:
    em = b.emulation
    big = [f for f in files if f.rel.startswith("big/")]
    small = [f for f in files if not f.rel.startswith("big/")]
    crit = criteria(runs, total)
    L = [f"Emulation for every number: **{em}**.", "",
         f"Dataset: {len(files):,} files, **{total:,} bytes ({total / (1 << 30):.3f} GiB)**: "
         f"{len(big)} files of {R.human(big[0].size)} (`big/`) and {len(small):,} files of "
         f"4-256 KiB (`small/d00`..`d19/`, {sum(f.size for f in small):,} bytes); sizes and "
         f"bytes from Python's `random` seeded with {ctx['seed']} (the same every run), "
         "incompressible; every object's mtime 2026-01-01.", "",
         "## Criteria (issue 44 point 1)", "", f"Emulation: **{em}**.", "",
         "| criterion | target | measured | result |", "|---|---|---:|---|"]
    for what, target, v, ok in crit:
        L.append(f"| {what} | {target} | {v:.2f}x | **{'PASS' if ok else 'FAIL'}** |")
    L += ["", "## Per host", "", f"Emulation: **{em}**.", "",
          "| " + " | ".join(HEAD) + " |", "|---|" + "---:|" * (len(HEAD) - 2) + "---|"]
    L += ["| " + " | ".join(row) + " |" for row in host_rows(runs, total)]
    L += [""] + [f"- {n}" for n in notes(runs, total)]
    pl = ctx.get("plain")
    if pl and pl["seconds"] > 0:
        rate = pl["bytes"] / pl["seconds"] / 1e6
        h2 = {r.name: r for r in runs}
        share = ", ".join(f"{r.label} {total / r.seconds / 1e6 / rate:.0%}"
                          for r in (h2.get("host2"), h2.get("host3")) if r and r.seconds)
        L += [f"- The tier alone, same run: a plain S3 client (`rclone copy`, 8 transfers, into "
              f"/dev/shm) read the {pl['objects']:,} objects the hosts put there "
              f"({pl['bytes']:,} bytes) in {pl['seconds']:.2f} s, **{rate:.1f} MB/s** "
              f"(rc {pl['rc']}): the most a host can read from this cluster on this machine. "
              f"Reading the dataset through tierfs from the tier reached {share} of it."]
    L += ["", "![plots](PLOT_PNG_PLACEHOLDER)", "", "## How it ran", ""]
    h = {r.name: r for r in runs}
    L += [
        f"- Origin: `scripts/s3-server bench/work/s3srv PORT` (versitygw, credentials tierfs / "
        f"tierfs-secret) behind `target/release/tierfs-netdelay --listen 127.0.0.1:{env.port} "
        f"--connect 127.0.0.1:PORT --delay-us {b.args.s3_delay_us}`; the objects written "
        f"straight into `bench/work/s3srv/data/pre/` with the `user.etag` xattr.",
        f"- Shared tier: `{tier.start_cmd()}`, the same credentials (the bucket "
        f"`tierfs-shared` created by the script).",
        f"- Hosts: `{h['host1'].cmd}` (and `host2`, `host3` alike; `host4` with "
        f"`{ctx['tuned']}` added: the read-mostly tuning), each with its own fresh "
        f"cache dir, in the environment `AWS_ACCESS_KEY_ID=tierfs "
        f"AWS_SECRET_ACCESS_KEY=tierfs-secret`. Reference: `{h['reference'].cmd}`.",
        "- Order: reference, host 1, host 1's uploads waited for (`shared.queued_bytes` and `shared.later` 0 in "
        "`tierfs stats --json`), host 2, host 3, host 4. Each mount is unmounted (`tierfs unmount`) "
        "after its read, before the next is mounted.",
        "- Before each read: `sync; echo 3 > /proc/sys/vm/drop_caches`; the origin's files "
        "(`find bench/work/s3srv -type f -exec cat {} + >/dev/null`) and the SeaweedFS "
        "cluster's (`find bench/work/seaweedfs -type f -exec cat {} + >/dev/null`) read back "
        "into the page cache, the servers' RAM" +
        ("" if b.args.no_prime else "; a memory priming pass (a /dev/shm file of the "
         "dataset's size written and deleted, FUSE-NOTES lesson 8)") + ".",
        f"- The reader, the same on every host, timed from its start to its end, in the "
        f"mount's root: `{ctx['reader']}` (`big.list`: the {len(big)} large files, "
        f"`small.list`: the {len(small):,} small ones, sorted).",
        "- Counters: `tierfs stats --json MNT` right after the read (hosts 1-3: once "
        "`shared.queued_bytes` is 0): `backing.read_bytes` / `backing.read` are what that "
        "mount read from the origin, `shared.*` the shared tier's counters.",
        "- md5: every file read again through the mount right after the read (untimed, page "
        "cache not dropped: the bytes the reader got) and compared with the dataset's.",
        "- Teardown: every mount unmounted (`tierfs unmount`, then `fusermount3 -uz`), "
        "`scripts/seaweedfs stop`, versitygw and the relay stopped; then /proc/mounts and the "
        "processes checked: " + ("nothing left." if not left else
                                 "LEFT: " + "; ".join(left) + "."),
        ""]
    if b.args.tierfs_opt:
        L.insert(-1, f"- Extra tierfs options on every mount: `{','.join(b.args.tierfs_opt)}`.")
    res = Result()
    res.markdown = "\n".join(L)
    res.console = "\n".join(
        [em, f"dataset: {len(files):,} files, {total:,} bytes", ""] +
        [f"{r[0]}: {r[1]} s, {r[2]} MB/s, origin {r[3]} bytes, shared hits {r[5]} "
         f"({r[6]} bytes), puts {r[7]} ({r[8]} bytes), dropped {r[9]}, corrupt {r[10]}, "
         f"errors {r[11]}, md5 {r[12]}" for r in host_rows(runs, total)] + [""] +
        [f"{'PASS' if ok else 'FAIL'}: {what}: {v:.2f}x (target {target})"
         for what, target, v, ok in crit] +
        ([f"LEFT BEHIND: {'; '.join(left)}"] if left else []))
    for r in runs:
        res.details.append((f"tierfs stats --json, {r.label}", r.stats_json))
    h1 = h["host1"].seconds
    res.plot = {
        "title": f"Shared tier: each host reads {total / (1 << 30):.2f} GiB cold, one after another",
        "subtitle": em,
        "panels": [
            {"title": "seconds to read the dataset (lower is better)", "unit": "s",
             "fmt": ",.1f",
             "bars": [{"label": PLOT_LABELS[r.name], "value": r.seconds,
                       "color": COLORS[r.name]} for r in runs],
             "hlines": [{"y": h1 / SPEEDUP_TARGET,
                         "label": f"hosts 2, 3 target: host 1 / {SPEEDUP_TARGET:g}"}]},
            {"title": "read from the origin (backing.read_bytes)", "unit": "GiB",
             "fmt": ",.2f",
             "bars": [{"label": PLOT_LABELS[r.name], "value": r.origin_bytes / (1 << 30),
                       "color": COLORS[r.name]} for r in runs],
             "hlines": [{"y": total / (1 << 30), "label": "the dataset"}]},
        ],
    }
    return res
