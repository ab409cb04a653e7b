"""The benchmark suite's entry point: `bench/run [--quick] [WORKLOAD[@PROFILE] ...]` calls
main(args).

Builds the job list, runs each workload (bench/lib/workloads.py) on each contender
(bench/lib/contenders.py) with the Suite (bench/lib/suite.py) over the emulated slow store,
then writes one report (bench/lib/report.py), bench/results/<date>-<commit>[-quick].md,
with a one-screen summary of ratios at the top, a section per workload and profile (tables,
exact commands, a PNG), the endurance table, perf summaries (--profile-tierfs) and a
teardown check. Everything mounted or started is stopped on exit, error, Ctrl-C or SIGTERM
(Bench.cleanup plus the Suite's hooks); the teardown check then looks for anything of ours
left in /proc/mounts or the process table and the report says what it found.
"""

import datetime
import os
import re
import time
from typing import Optional

import benchcore as R
import sshstore
from suite import Suite, describe_error
from testbed import Bench

PROFILES = ["hdd", "nfs-lan", "sshfs"]
# The default job list (no WORKLOAD given): every workload on hdd; on nfs-lan the two whose
# cost is dominated by per-request latency rather than by seeks (the small-file grep and the
# write job + untar). --quick: hdd only. See bench/README.md for the time budget.
NFS_WORKLOADS = ["grep", "write"]


def parse_jobs(names: list, profiles: Optional[str], quick: bool) -> list:
    import single  # the single-workload reports' names, for the error message
    import suiteworkloads
    import workloads as W
    profs = [p.strip() for p in profiles.split(",")] if profiles else None
    for p in profs or []:
        if p not in PROFILES + ["none"]:
            raise R.BenchError(f"unknown profile {p!r} (known: {', '.join(PROFILES)}, none)")
    jobs = []
    if not names:
        if profs:
            jobs = [(w, p) for p in profs for w in W.ORDER]
        else:
            jobs = [(w, "hdd") for w in W.ORDER]
            if not quick:
                jobs += [(w, "nfs-lan") for w in NFS_WORKLOADS]
        return jobs
    for n in names:
        w, _, p = n.partition("@")
        if w not in suiteworkloads.WORKLOADS:
            raise R.BenchError(f"unknown workload {w!r} (suite workloads: "
                               f"{', '.join(suiteworkloads.WORKLOADS)}; legacy: --workload "
                               f"{'|'.join(sorted(single.WORKLOADS))})")
        for prof in ([p] if p else (profs or ["hdd"])):
            if prof not in PROFILES + ["none"]:
                raise R.BenchError(f"unknown profile {prof!r} in {n!r}")
            jobs.append((w, prof))
    return jobs


def report_name(started: datetime.datetime, commit: str, quick: bool) -> str:
    base = f"{started:%Y-%m-%d}-{commit[:10]}" + ("-quick" if quick else "")
    name, n = base, 2
    while (R.RESULTS / f"{name}.md").exists():
        name, n = f"{base}-{n}", n + 1
    return name


def teardown_check() -> dict:
    """What of ours is left: mounts under bench/work, processes whose command line names
    bench/work (tierfs, slowfs, rclone, bindfs, fio, stress-ng, perf...). Other FUSE mounts
    on the machine (other users' tests) are listed separately."""
    work = str(R.WORK)
    ours, foreign = [], []
    for line in open("/proc/mounts"):
        if re.search(r"fuse|rclone", line):
            (ours if work in line.split()[1] or work in line.split()[0] else foreign).append(
                line.strip())
    procs = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        if ") Z" in stat:
            continue
        cmd = b" ".join(argv).decode(errors="replace")
        if work in cmd or "tierfs-bench" in cmd:
            procs.append(f"{d}: {cmd[:200]}")
    # the sshfs profile: its namespace, veth, sshd (and its session children) in the
    # namespace, relays to it, sshfs and ssh clients of ours
    for item in sshstore.leftovers():
        if item not in procs and not any(item.split(":")[0] == p.split(":")[0] for p in procs):
            procs.append(item)
    return {"mounts": ours, "foreign_mounts": foreign, "procs": procs}


def main(args) -> int:
    from report import write_suite_report
    started = datetime.datetime.now().astimezone()
    b = None
    suite = None
    code = 0
    try:
        R.ensure_root()
        jobs = parse_jobs(args.workloads, args.profile, args.quick)
        R.ensure_tools()
        if not args.no_build:
            R.build(False)
        for binary in [R.SLOWFS_BIN, R.TIERFS_BIN]:
            if not binary.exists():
                raise R.BenchError(f"{binary} missing (build failed?)")
        machine = R.machine_info()
        args.profile = jobs[0][1]
        b = Bench(args)
        suite = Suite(b, args, jobs)
        suite.run()
    except KeyboardInterrupt:
        R.log("interrupted (Ctrl-C); cleaning up")
        code = 130
    except R.Interrupted as e:
        R.log(f"interrupted ({e}); cleaning up")
        code = 143
    except R.BenchError as e:
        R.log(f"error: {e}")
        code = 1
    except Exception as e:  # noqa: BLE001 - a harness bug: still tear down and report
        import traceback
        traceback.print_exc()
        R.log(f"error: {describe_error(e)}")
        code = 1
    finally:
        if b is not None:
            b.cleanup()
    if suite is None:
        return code or 1
    left = teardown_check()
    if left["mounts"] or left["procs"]:
        R.log(f"TEARDOWN CHECK FAILED: {left}")
        code = code or 1
    else:
        R.log("teardown check: no mount and no process of ours left")
    if args.no_report or not suite.sections:
        return code
    if not hasattr(suite, "t_total"):
        suite.t_total = time.monotonic() - suite.t_start
    commit = machine["commit"].split()[0]
    name = report_name(started, commit, args.quick)
    md = write_suite_report(suite, machine, started, name, left, interrupted=code in (130, 143))
    print(f"\nreport: {md.relative_to(R.ROOT)}")
    return code
