"""The suite's report: bench/results/<date>-<commit>[-quick].md and one PNG per section.

Layout: header (date, commit, machine, load, command, versions, emulation, contenders), the
one-screen summary of ratios (tierfs / peer, tierfs / limit, tierfs / store), one section per
workload and profile, endurance, where the time goes (perf, with --profile-tierfs), teardown
check, and every command in order.
"""

import datetime
import json
import shlex
import sys
from pathlib import Path

import benchcore as R

COLS = ["rclone", "bindfs", "local", "store"]


def fnum(v, unit="") -> str:
    if v is None:
        return "-"
    if unit == "x":
        return f"{v:.2f}"
    if unit == "1/s":
        return (f"{1 / v:.1f} s" if 1 / v >= 1 else f"{1 / v:.3f} s") if v else "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:,.1f}"
    return f"{v:.2f}"


def ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "-"
    return R.rx(a / b)


def plot(suite, sec, name: str) -> None:
    if not sec.panels:
        return
    png = R.RESULTS / f"{name}-{sec.workload}-{sec.profile}.png"
    store = "sshfs (a real sshfs mount)" if sec.profile == "sshfs" else f"slowfs {sec.profile}"
    spec = {"title": f"{sec.title} - {store}" + (" (QUICK)" if suite.quick
                                                               else ""),
            "subtitle": sec.emulation, "panels": sec.panels}
    src = suite.b.logs / f"{png.stem}.json"
    src.write_text(json.dumps(spec))
    p = R.run([R.SYS_PYTHON, R.BENCH / "lib" / "suiteplot.py", src, png], 180, check=False)
    if p.returncode == 0 and png.exists():
        sec.png = png.name
    else:
        R.log(f"plot {png.name} failed: {(p.stderr or '').strip()[-400:]}")


def endurance_rows(suite) -> list:
    rows = []
    for sec in suite.sections:
        for key in ("tierfs-default", "tierfs", "tierfs-wb", "rclone"):
            a = sec.acc.get(key)
            if not a or key in sec.skipped or not (a.get("served_read") or a.get("served_write")):
                continue
            served = (a.get("served_read") or 0) + (a.get("served_write") or 0)
            ssd = (a.get("ssd_written") or 0) + (a.get("journal_written") or 0) \
                if key != "rclone" else a.get("disk_write")
            hit = 1 - (a.get("store_read") or 0) / a["served_read"] \
                if a.get("served_read") else None
            own = (a.get("ram_hit", 0) + a.get("ssd_hit", 0)) / a["t_read"] \
                if a.get("t_read") else None
            rows.append({"sec": sec, "key": key, "served_read": a.get("served_read") or 0,
                         "served_write": a.get("served_write") or 0, "ssd": ssd,
                         "disk_write": a.get("disk_write"), "journal": a.get("journal_written"),
                         "per_gb": ssd / (served / 1e9) if ssd is not None and served else None,
                         "store_read": a.get("store_read"), "hit": max(0.0, min(1.0, hit))
                         if hit is not None else None, "own_hit": own})
    return rows


def flat_stats(st: dict, prefix: str = "") -> list:
    """`tierfs stats --json` as one line per object: `ssd: hits=.. misses=..`."""
    top = [f"{k}={v}" for k, v in sorted(st.items()) if not isinstance(v, dict)]
    out = [f"{prefix or '(top)'}: " + " ".join(top)] if top else []
    for k, v in sorted(st.items()):
        if isinstance(v, dict):
            out += flat_stats(v, f"{prefix}.{k}" if prefix else k)
    return out


def write_suite_report(suite, machine: dict, started: datetime.datetime, name: str,
                       left: dict, interrupted: bool) -> Path:
    b, args = suite.b, suite.args
    for sec in suite.sections:
        plot(suite, sec, name)
    multi = len({s.profile for s in suite.sections}) > 1
    L: list = []
    A = L.append
    A(f"# tierfs benchmark suite: {started:%Y-%m-%d}, commit `{machine['commit'].split()[0][:10]}`"
      + (" (QUICK)" if suite.quick else ""))
    A("")
    warn = []
    if suite.quick:
        warn.append("**QUICK run (`--quick`)**: every workload scaled down to validate the "
                    "harness and the report format; not the recorded measurement")
    if interrupted:
        warn.append("**INTERRUPTED**: the run was stopped before all workloads finished")
    if args.shared_machine:
        warn.append("**the machine was shared** with other jobs (builds, tests) during this "
                    "run: timings are noisy, ratios only roughly indicative")
    try:
        load0 = float(str(machine.get("load", "0")).split()[0])
    except ValueError:
        load0 = 0.0
    if load0 > 1.0 and not args.shared_machine:
        warn.append(f"load average at the start was {load0:.2f} (other processes were "
                    "running): timings may be skewed")
    if warn:
        A("> " + "; ".join(warn) + ".")
        A("")
    A(f"- date: {started:%Y-%m-%d %H:%M:%S %Z}; the run took {suite.t_total / 60:.1f} min ("
      + ", ".join(f"{s.workload}@{s.profile} {s.seconds / 60:.1f}" for s in suite.sections)
      + ")")
    A(f"- git commit: `{machine['commit']}`")
    A(f"- machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram']} RAM, kernel "
      f"{machine['kernel']}; load average at start {machine.get('load', '?')}, at end "
      f"{R.loadavg()}")
    A(f"- command: `bench/run {shlex.join(sys.argv[1:])}`")
    A("- versions: " + "; ".join(f"{k} {v}" for k, v in suite.versions.items()))
    profs = {}
    for s in suite.sections:
        profs.setdefault(s.profile, s.emulation)
    emu = {p: e for p, e in profs.items() if p != "sshfs"}
    if emu:
        A("- emulated store (tierfs-slowfs, see bench/README.md): " + "; ".join(
            f"`{p}`: `{e}`" for p, e in emu.items()))
    if "sshfs" in profs:
        det = next((s.store_details for s in suite.sections if s.profile == "sshfs"), "")
        A(f"- store of the `sshfs` profile (no emulator; bench/lib/sshstore.py): "
          f"**{profs['sshfs']}**. {det}")
    A(f"- memory budget: tierfs `ram.max` = {R.human(suite.M)}; measured readers run in a "
      f"memory cgroup: {suite.cg.describe()}")
    A(f"- tierfs options in every workload: `-o {','.join(suite.tierfs_opts)}` (write-back "
      "adds `writeback.mode=back,fuse.no_open=off`: OPEN requests kept, answered from the "
      "metadata cache, so that files opened for writing only get direct I/O)" + (f"; **{suite.min_free_note}**" if suite.min_free_note
                                        else ""))
    if suite.nofile:
        (s0, h0), (s1, h1) = suite.nofile
        A(f"- RLIMIT_NOFILE of the harness and the daemons: {s0}/{h0}"
          + (f" raised to {s1}/{h1}" if (s1, h1) != (s0, h0) else " (could not be raised)"))
    A("")

    # -- summary
    A("## Summary: ratios")
    A("")
    A("Every metric is *higher is better* (times are given as seconds but compared as speeds, "
      "so a ratio > 1 always means tierfs is faster). **tierfs / rclone** is against the peer "
      "(rclone mount with `--vfs-cache-mode full`), **tierfs / local** against the physical "
      "limit (the local disk the caches live on), **tierfs / store** against the emulated "
      "store alone. `tierfs` is write-through unless the row says `tierfs-wb` (write-back). "
      "bindfs over the local disk is the cost of a FUSE layer alone.")
    A("")
    A("| metric | tierfs | rclone | bindfs | local | store | **tierfs / rclone** | "
      "**tierfs / local** | tierfs / store |")
    A("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sec in suite.sections:
        for m in sec.summary:
            v = m["values"]
            t = v.get(m["tierfs"])
            unit = m["unit"]
            label = (f"[{sec.profile}] " if multi else "") + m["metric"].replace(
                "(tierfs)", "").replace("(tierfs-wb)", "**(tierfs-wb)**").replace(
                "(tierfs-default)", "**(tierfs-default)**").strip()
            cells = [fnum(v.get(k), unit) if k not in sec.skipped else "n/a" for k in COLS]
            A(f"| {label} | {fnum(t, unit)} | " + " | ".join(cells) + " | "
              f"{ratio(t, v.get('rclone'))} | {ratio(t, v.get('local'))} | "
              f"{ratio(t, v.get('store'))} |")
    A("")
    A("Units: MB/s, IOPS, files/s, operations/s as in the metric's name; `x` = a ratio of "
      "the contender's own numbers; `n/a` = the contender does not apply to the workload (the "
      "section says why); `-` = not measured or failed (the section says which).")
    A("")
    errs = [(s, k, v) for s in suite.sections for k, v in s.errors.items()]
    if errs:
        A("**Errors** (details in the sections): " + "; ".join(
            f"{s.workload}@{s.profile} {k}: {v.splitlines()[0][:160]}" for s, k, v in errs))
        A("")

    # -- contenders
    A("## Contenders")
    A("")
    A("| contender | what | how |")
    A("|---|---|---|")
    for key, c in suite.c.items():
        if key == "tierfs-default" and not any(key in s.acc for s in suite.sections):
            continue  # the sshfs profile's contender, not run here
        A(f"| `{key}` | {c.label} | {c.describe()} |")
    A("")
    A("Each workload mounts each contender fresh (tierfs: `--reset-cache`; rclone: empty cache "
      "dir) and unmounts it afterwards. Before every measured step: `sync; echo 3 > "
      "/proc/sys/vm/drop_caches`; for the contenders over the emulated store the store's "
      "backing files are then read back into the page cache (so slowfs's own reads are never "
      "slower than the emulated device; `local` and `bindfs` stay cold), and memory is primed "
      "(FUSE-NOTES lesson 8). The tierfs and rclone caches are on the same disk "
      f"({R.fs_info(R.WORK)}) as the local-disk contender's data.")
    A("")

    # -- sections
    for sec in suite.sections:
        A(f"## {sec.title} - `{sec.profile}`")
        A("")
        A(f"Took {sec.seconds:.0f} s.")
        if sec.skipped:
            A("Not run: " + "; ".join(f"**{k}**: {v}" for k, v in sec.skipped.items()) + ".")
        A("")
        L.extend(sec.md)
        if sec.png:
            A(f"![{sec.workload} {sec.profile}]({sec.png})")
            A("")
        for k, v in sec.errors.items():
            A(f"- **error, {k}**: `{v.strip().splitlines()[0][:300]}`")
        if sec.errors:
            A("")
        d = [(k, x) for k, xs in sec.daemon.items() for x in xs if x.get("daemon_exit_s")]
        if d:
            A("Daemon exit after unmount: " + "; ".join(
                f"{k} {x['daemon_exit_s']:.1f} s" for k, x in d) + ".")
            A("")
        if sec.perf:
            A("<details><summary>Where tierfs's time goes (perf, --profile-tierfs)</summary>")
            A("")
            for label, text in sec.perf:
                A(f"`{label}`:")
                A("")
                A("```")
                A(text)
                A("```")
            A("</details>")
            A("")
        for k, st in sec.last_stats.items():
            A(f"<details><summary>{k}: <code>tierfs stats --json</code> before its last "
              "unmount</summary>")
            A("")
            A("```")
            L.extend(flat_stats(st))
            A("```")
            A("</details>")
            A("")
        A("<details><summary>Commands</summary>")
        A("")
        A("```")
        L.extend(sec.cmds)
        A("```")
        A("</details>")
        A("")

    # -- endurance
    A("## 7. Endurance: SSD bytes written per GB served, hit ratio")
    A("")
    A("Per workload and caching contender, from mount to unmount. *served*: what the workload "
      "read and wrote through the mount (its own count, incl. untimed fill passes); *SSD "
      "written*: tierfs: `ssd.written_bytes` + `writeback.journal.bytes_appended` from `tierfs "
      "stats --json`; rclone: the daemon's `write_bytes` in `/proc/PID/io` (its cache files); "
      "*daemon disk writes*: `/proc/PID/io` write_bytes for tierfs too. *hit ratio*: 1 - bytes "
      "the store served (slowfs counters) / bytes read through the mount; tierfs's own ratio: "
      "(`ram.hit_bytes` + `ssd.hit_bytes`) / `read_bytes`.")
    A("")
    A("| workload | contender | served read | served write | SSD written | SSD written per GB "
      "served | daemon disk writes | store read | hit ratio | tierfs's own hit ratio |")
    A("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in endurance_rows(suite):
        A(f"| {r['sec'].workload}@{r['sec'].profile} | {r['key']} | {R.human(r['served_read'])} | "
          f"{R.human(r['served_write'])} | {R.hbytes(r['ssd'])} | "
          + (f"{R.human(r['per_gb'])}" if r["per_gb"] is not None else "-") + " | "
          f"{R.hbytes(r['disk_write'])} | {R.hbytes(r['store_read'])} | "
          + (f"{r['hit']:.1%}" if r["hit"] is not None else "-") + " | "
          + (f"{r['own_hit']:.1%}" if r["own_hit"] is not None else "-") + " |")
    A("")

    # -- teardown
    A("## Teardown check")
    A("")
    ok = not left["mounts"] and not left["procs"]
    A(("**OK**: after the run no mount under `bench/work` and no process naming it "
       "(tierfs, tierfs-slowfs, rclone, bindfs, fio, stress-ng, perf, readers) was left"
       + ("; no network namespace, veth, sshd, tierfs-netdelay relay, sshfs or ssh of the "
          "sshfs profile either." if "sshfs" in {s.profile for s in suite.sections} else ".")
       if ok else "**FAILED**: left behind: " + "; ".join(left["mounts"] + left["procs"])))
    if left["foreign_mounts"]:
        A(f" Other FUSE mounts on the machine, not ours: {len(left['foreign_mounts'])} "
          "(other users' tests).")
    A("")
    md = R.RESULTS / f"{name}.md"
    md.write_text("\n".join(L) + "\n")
    return md
