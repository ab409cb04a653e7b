"""The single-workload reports, `bench/run --workload NAME`: the registry (seqread and
blocksize here, ssd in ssd.py, write in writerun.py, fleet in fleetbench.py), their shared report
(bench/results/<date>-<workload>-<profile>[-<size>].md + .png) and the driver, main(args)."""
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import fleetbench
import metabench
import s3bench
import ssd
import writerun
from benchcore import (DEFAULT_SIZE, PLOT, RESULTS, ROOT, SLOWFS_BIN, SYS_PYTHON, TIERFS_BIN,
                       BenchError, Interrupted, Result, build, drop_caches, ensure_root,
                       ensure_tools, human, loadavg, log, machine_info, run)
from testbed import Bench, Measurement
from writerun import WRITE_DEFAULT_SIZE, WRITE_QUICK_SIZE


WORKLOADS: dict = {}


def workload(name: str, description: str):
    def reg(fn):
        WORKLOADS[name] = (fn, description)
        return fn
    return reg


@workload("s3", "tierfs over a real S3 server (versitygw) with added latency: cold and warm "
                "sequential reads, grep -r after a remount, a write + fsync and 1,000 small "
                "objects by 8 readers (with HEAD against LIST latency), against a plain "
                "parallel ranged-GET client and rclone mount (S3 backend); "
                "bench/lib/s3bench.py, s3small.py")
def wl_s3(b: Bench) -> Result:
    return s3bench.wl_s3(b)


@workload("fleet", "the shared tier across three hosts (issue 44): host 1 reads a dataset of "
                   "large and small files cold from an S3 origin 20 ms away (versitygw behind "
                   "the delay relay) and uploads it to a SeaweedFS cluster; hosts 2 and 3 then "
                   "read it cold from the tier; seconds and origin bytes per host, against one "
                   "mount with no tier; bench/lib/fleetbench.py, fleetreport.py")
def wl_fleet(b: Bench) -> Result:
    return fleetbench.wl_fleet(b)


@workload("meta", "metadata and small files over a latency-bound store (issue 42): sshfs "
                  "alone, tierfs over sshfs and over sftp:// (default options and "
                  "meta.ttl=5m,meta.cto=off), rclone mount :sftp:, one sshd behind a 4 ms "
                  "round trip; bench/lib/metabench.py")
def wl_meta(b: Bench) -> Result:
    return metabench.wl_meta(b)


@workload("seqread", "sequential read of one large file: slow store direct, tierfs cold, "
                     "tierfs warm")
def wl_seqread(b: Bench) -> Result:
    r = Result()
    f = b.test_file(f"seqread-{b.args.size}.bin", b.size)
    b.mount_slowfs()
    warm = [f]  # keep the backing file in the page cache: slowfs's emulation is then exact
    direct = b.measure_read(b.slow_mnt / f.name, "slow store direct (slowfs)", "direct",
                            backing_files=warm)
    r.rows.append(direct)
    if b.args.skip_tierfs:
        r.notes.append("tierfs runs skipped (--skip-tierfs).")
        return r

    b.mount_tierfs(fresh_cache=True)
    cold = b.measure_read(b.tier_mnt / f.name, "tierfs cold (fresh mount, empty cache)", "cold",
                          backing_files=warm)
    r.details.append(("tierfs stats after cold read", b.tierfs_stats()))
    hot = b.measure_read(b.tier_mnt / f.name, "tierfs warm (2nd read, page cache dropped)",
                         "warm", backing_files=warm)
    hot_d = b.measure_read(b.tier_mnt / f.name, "tierfs warm, O_DIRECT reader", "warm_odirect",
                           direct=True, prime=False, backing_files=warm)
    r.rows += [cold, hot, hot_d]
    r.details.append(("tierfs stats after warm reads", b.tierfs_stats()))
    if not b.args.no_verify:
        log("verifying tierfs content against the backing file (cmp, untimed)")
        p = run(["cmp", f, b.tier_mnt / f.name], b.dd_timeout(), check=False)
        ok = p.returncode == 0
        r.notes.append("content check `cmp backing tierfs`: " +
                       ("identical" if ok else f"MISMATCH: {(p.stdout + p.stderr).strip()}"))
        if not ok:
            log("CONTENT MISMATCH through tierfs")
    b.unmount_tierfs()

    def ratio(a: Measurement, label: str):
        if a.mbps and direct.mbps:
            r.ratios.append((label, a.mbps / direct.mbps))

    ratio(cold, "tierfs cold / direct")
    ratio(hot, "tierfs warm / direct")
    ratio(hot_d, "tierfs warm O_DIRECT / direct")
    r.notes.append(
        "Each read: `sync; echo 3 > /proc/sys/vm/drop_caches`, then the backing file is read "
        "locally into the page cache (so slowfs's own backing reads are never slower than the "
        "emulated device; slowfs counts deadlines it missed and the table notes them), then "
        "(except the O_DIRECT run) a memory priming pass (FUSE-NOTES lesson 8: write and delete a /dev/shm file of the test "
        "size so page-cache allocations hit host-backed pages), then `dd bs=1M of=/dev/null`. "
        "All rows come from the same run. 'slow store served' and 'slow reads / seeks' are "
        "slowfs's own counters during that read (bytes returned, read requests, requests that "
        "paid the seek penalty).")
    return r


@workload("blocksize", "ram.block_size sweep: cold 4 KiB random reads (fio, O_DIRECT, 8 jobs) "
                       "and warm sequential reads, per block size")
def wl_blocksize(b: Bench) -> Result:
    r = Result()
    ensure_tools(need_fio=True)
    f = b.test_file(f"seqread-{b.args.size}.bin", b.size)
    b.mount_slowfs()
    warm = [f]
    for bs in ["64K", "128K", "256K", "1M"]:
        b.args.tierfs_opt = [o for o in b.args.tierfs_opt if not o.startswith("ram.block_size=")]
        b.args.tierfs_opt.append(f"ram.block_size={bs}")
        b.mount_tierfs(fresh_cache=True)
        drop_caches()
        b.warm_backing(warm)
        cmd = ["fio", "--name=rand", f"--filename={b.tier_mnt / f.name}", "--rw=randread",
               "--bs=4k", "--ioengine=psync", "--direct=1", "--numjobs=8",
               "--number_ios=100", "--randrepeat=0", "--group_reporting",
               "--output-format=json"]
        log(f"bs={bs}: {' '.join(cmd)}")
        p = run(cmd, 120, check=False)
        m = Measurement(label=f"bs={bs}: cold 4K random, 8x100 reads (as MB/s)", key=f"rand_{bs}")
        try:
            job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]["read"]
            m.mbps = job["bw_bytes"] / 1e6
            m.bytes = job["io_bytes"]
            m.seconds = job["runtime"] / 1000
            m.note = f"{job['iops']:.0f} IOPS, mean latency {job['clat_ns']['mean'] / 1e6:.1f} ms"
        except (ValueError, KeyError, IndexError):
            m.note = f"fio failed: {(p.stderr or '').strip()[-200:]}"
        r.rows.append(m)
        # Fill the cache with one sequential pass, then time a warm read from the RAM tier.
        run(["dd", f"if={b.tier_mnt / f.name}", "of=/dev/null", "bs=1M"], b.dd_timeout())
        w = b.measure_read(b.tier_mnt / f.name, f"bs={bs}: warm sequential (RAM tier)",
                           f"warm_{bs}", backing_files=warm)
        r.rows.append(w)
        r.details.append((f"tierfs stats, bs={bs}", b.tierfs_stats()))
        b.unmount_tierfs()
    r.notes.append(
        "Each block size gets a fresh tierfs mount (empty cache). Cold random: fio 4 KiB "
        "O_DIRECT random reads, 8 jobs x 100 reads over the whole file; nearly every read "
        "misses (800 reads vs >= 1024 blocks), so this is the cost of one miss (one block "
        "fetched from the slow store) at 8 in flight; shown as MB/s of 4 KiB reads, IOPS in the note. Warm: the file is read once "
        "to fill the RAM tier, then timed with dd bs=1M after drop_caches (page cache empty, "
        "data from tierfs's RAM tier). 'vs direct' is not meaningful here (no direct row).")
    return r


WORKLOADS["ssd"] = (
    ssd.wl_ssd, "SSD-tier acceptance (issue point 6): raw cache device, bindfs and tierfs "
                "with fio; md5 loop in a memory cgroup; grep -r over small files after remount")
WORKLOADS["write"] = (
    writerun.wl_write, "write path (issue 4 point 5, issue 6 workload 4): a 2 GiB write job "
                       "timed open/write/fsync/close (seed 001) and an untar of a source tree, "
                       "on the local disk, the store direct, tierfs write-through and "
                       "write-back")


# ---------------------------------------------------------------------------------------------
# Report


def fmt(v, spec=".1f", none="n/a"):
    return none if v is None else format(v, spec)


def table_rows(res: Result, direct_mbps: Optional[float]):
    rows = []
    for m in res.rows:
        vs = (m.mbps / direct_mbps) if (m.mbps and direct_mbps) else None
        rows.append([
            m.label, fmt(m.mbps), (fmt(vs, ".2f") + "x") if vs else "n/a",
            fmt(m.seconds if m.bytes else None, ".2f"),
            human(m.slow_bytes_read) if m.slow_bytes_read is not None else "n/a",
            f"{m.slow_reads} / {m.slow_seeks}" if m.slow_reads is not None else "n/a",
            m.note,
        ])
    return rows


HEAD = ["run", "MB/s", "vs direct", "seconds", "slow store served", "slow reads / seeks",
        "note"]


def print_table(res: Result, direct_mbps) -> None:
    rows = [HEAD] + table_rows(res, direct_mbps)
    w = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            print("  ".join("-" * x for x in w))
    for label, v in res.ratios:
        print(f"{label}: {v:.2f}x")


def default_size(args) -> str:
    """--size when not given: 4G; ssd --quick 1G; write 2G, write --quick 256M."""
    if args.workload == "write":
        return WRITE_QUICK_SIZE if args.quick else WRITE_DEFAULT_SIZE
    if args.workload == "ssd" and args.quick:
        return "1G"
    if args.workload == "meta":
        return "128M" if args.quick else "1G"
    if args.workload == "fleet":
        return "2G"
    return DEFAULT_SIZE


def report_paths(args, started: datetime.datetime):
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = f"{started:%Y-%m-%d}-{args.workload}-{args.profile}"
    if args.workload == "meta":
        # <date>-<commit>-meta, as the suite's reports are named by commit
        commit = run(["git", "rev-parse", "HEAD"], 30, check=False, cwd=ROOT).stdout.strip()
        base = f"{started:%Y-%m-%d}-{commit[:10] or 'unknown'}-meta"
    elif args.workload == "fleet":
        base = f"{started:%Y-%m-%d}-fleet-{args.size}"
    elif args.size != default_size(args):
        base += f"-{args.size}"
    if getattr(args, "quick", False):
        base += "-quick"
    name, n = base, 2
    while (RESULTS / f"{name}.md").exists():
        name, n = f"{base}-{n}", n + 1
    return name, RESULTS / f"{name}.md", RESULTS / f"{name}.png"


def report_header(b: Bench, machine: dict, started: datetime.datetime, title: str) -> list:
    args = b.args
    L = [f"# {title}", ""]
    L.append(f"- date: {started:%Y-%m-%d %H:%M:%S %Z}".rstrip())
    L.append(f"- git commit: `{machine['commit']}`")
    L.append(f"- machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram']} RAM, "
             f"kernel {machine['kernel']}")
    L.append(f"- load average (1/5/15 min) at start: {machine.get('load', '?')}, at end: "
             f"{loadavg()} (other processes competing for the CPUs skew FUSE timings)")
    L.append(f"- command: `bench/run {shlex.join(sys.argv[1:])}`")
    L.append(f"- workload: {WORKLOADS[args.workload][1]}")
    if args.workload in ("meta", "fleet"):
        L.append(f"- store: **{b.emulation}**")
    else:
        L.append(f"- slow store emulation (tierfs-slowfs): `{b.emulation or 'not mounted'}`")
    L.append(f"- tierfs binary: `{TIERFS_BIN}`")
    return L


def write_custom_report(b: Bench, res: Result, machine: dict,
                        started: datetime.datetime) -> Path:
    name, md, png = report_paths(b.args, started)
    have_png = bool(res.plot_fn and res.plot_fn(png))
    if res.plot and not have_png:
        plot_in = b.logs / f"{name}.plot.json"
        plot_in.write_text(json.dumps(res.plot))
        p = run([SYS_PYTHON, PLOT, plot_in, png], 120, check=False)
        have_png = p.returncode == 0 and png.exists()
        if not have_png:
            log(f"plot failed: {(p.stderr or '').strip()[-500:]}")
    title = {"s3": "tierfs over an S3 server with added latency",
             "ssh": "Metadata and small files over ssh: sshfs, tierfs (sshfs, sftp://), rclone "
                    "sftp (issue 42)",
             "fleet": "The shared tier across a fleet: three hosts read one dataset from a "
                      "20 ms origin (issue 44)"}.get(b.args.profile,
                                           f"{b.args.workload} on slowfs `{b.args.profile}`")
    L = report_header(b, machine, started, title)
    L.append("")
    body = res.markdown or ""
    body = body.replace("![plots](PLOT_PNG_PLACEHOLDER)",
                        f"![{name}]({png.name})" if have_png else "(plot failed)")
    L.append(body)
    for title, text in res.details:
        L += [f"<details><summary>{title}</summary>", "", "```", text, "```", "</details>", ""]
    md.write_text("\n".join(L))
    return md


def write_report(b: Bench, res: Result, machine: dict, started: datetime.datetime) -> Path:
    if res.markdown is not None:
        return write_custom_report(b, res, machine, started)
    args = b.args
    name, md, png = report_paths(args, started)
    direct = next((m.mbps for m in res.rows if m.key == "direct"), None)

    plot_in = b.logs / f"{name}.plot.json"
    plot_in.write_text(json.dumps({
        "title": f"{args.workload}, {human(b.size)}, slowfs profile {args.profile}",
        "subtitle": b.emulation,
        "unit": "MB/s",
        "bars": [{"label": m.label.split(" (")[0], "value": m.mbps} for m in res.rows],
    }))
    p = run([SYS_PYTHON, PLOT, plot_in, png], 120, check=False)
    have_png = p.returncode == 0 and png.exists()
    if not have_png:
        log(f"plot failed: {(p.stderr or '').strip()[-500:]}")

    cmdline = "bench/run " + shlex.join(sys.argv[1:])
    L = []
    L.append(f"# {args.workload} on slowfs `{args.profile}`, {human(b.size)}")
    L.append("")
    L.append(f"- date: {started:%Y-%m-%d %H:%M:%S %Z}".rstrip())
    L.append(f"- git commit: `{machine['commit']}`")
    L.append(f"- machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram']} RAM, "
             f"kernel {machine['kernel']}")
    L.append(f"- load average (1/5/15 min) at start: {machine.get('load', '?')}, at end: "
             f"{loadavg()} (other processes competing for the CPUs skew FUSE timings)")
    L.append(f"- command: `{cmdline}`")
    L.append(f"- workload: {WORKLOADS[args.workload][1]}; file size {b.size} bytes "
             f"({human(b.size)}), random content")
    L.append(f"- slow store emulation (tierfs-slowfs): `{b.emulation}`")
    if not args.skip_tierfs:
        L.append(f"- tierfs: `tierfs mount <slowfs mnt> <mnt> --cache-dir <dir> -o "
                 f"{','.join([f'ram.max={args.ram_max}', *args.tierfs_opt])}`")
    L.append("")
    L.append(f"Emulation for these numbers: **{b.emulation}**")
    L.append("")
    L.append("| " + " | ".join(HEAD) + " |")
    L.append("|" + "|".join(["---"] + ["---:"] * 5 + ["---"]) + "|")
    for r in table_rows(res, direct):
        L.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    L.append("")
    for label, v in res.ratios:
        L.append(f"- {label}: **{v:.2f}x**")
    if res.ratios:
        L.append("")
    if have_png:
        L.append(f"![{name}]({png.name})")
        L.append("")
    for n_ in res.notes:
        L.append(f"- {n_}")
    L.append("")
    for title, text in res.details:
        L.append(f"<details><summary>{title}</summary>")
        L.append("")
        L.append("```")
        L.append(text)
        L.append("```")
        L.append("</details>")
        L.append("")
    md.write_text("\n".join(L))
    return md


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Driver (bench/run --workload NAME, after its argument checks)


def main(args) -> int:
    started = datetime.datetime.now().astimezone()
    b = None
    try:
        ensure_root()
        ensure_tools()
        if not args.no_build:
            build(args.skip_tierfs)
        for binary in [SLOWFS_BIN] + ([] if args.skip_tierfs else [TIERFS_BIN]):
            if not binary.exists():
                raise BenchError(f"{binary} missing (build failed?)")
        machine = machine_info()
        b = Bench(args)
        fn, _ = WORKLOADS[args.workload]
        res = fn(b)
        b.cleanup()
        direct = next((m.mbps for m in res.rows if m.key == "direct"), None)
        print()
        if res.console is not None:
            print(res.console)
        else:
            print(f"{args.workload}, {human(b.size)}, slowfs: {b.emulation}")
            print_table(res, direct)
        if not args.no_report:
            md = write_report(b, res, machine, started)
            print(f"\nreport: {md.relative_to(ROOT)}")
        return 0
    except KeyboardInterrupt:
        log("interrupted (Ctrl-C); cleaning up")
        return 130
    except Interrupted as e:
        log(f"interrupted ({e}); cleaning up")
        return 143
    except BenchError as e:
        log(f"error: {e}")
        return 1
    finally:
        if b is not None:
            b.cleanup()
