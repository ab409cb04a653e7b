"""The report of `bench/run --workload meta` (bench/lib/metabench.py): the issue-42 criteria
(points 1 and 2) with the measured ratio and whether each holds, the results of every
contender, the ratios against rclone and against sshfs alone, tierfs's store requests per
step, a plot (bench/lib/suiteplot.py), the exact commands and versions."""
import json
from typing import Optional

import benchcore as R

# Issue 42's "today" (75095fd, same store): warm small files with default options over sshfs.
TODAY_WARM_SMALL = (354, 372)
COLORS = {"sshfs": "#888888", "sshfs-tierfs": "#2b7bd9", "sshfs-tuned": "#1b4f8f",
          "sftp-tierfs": "#5aa05a", "sftp-tuned": "#2f6f2f", "rclone": "#d9822b",
          "rclone-nohash": "#f0b060"}
RCLONES = ["rclone", "rclone-nohash"]
TIERFS = ["sshfs-tierfs", "sshfs-tuned", "sftp-tierfs", "sftp-tuned"]
WL_NAMES = {"seq": "sequential read of 1 file", "small": "small files, 8 readers",
            "stat": "find -exec stat", "grep": "grep -r", "du": "du -s", "git": "git status"}


def emulation(run) -> str:
    rtt = run.store.measured.get("rtt_relay_ms")
    v = run.store.versions.get("openssh_short", "?")
    return (f"sshd (OpenSSH {v}) in a netns, tbf 1 gbit, {run.store.delay_us / 1000:g} ms "
            "added each way by tierfs-netdelay, measured RTT "
            + (f"{rtt:.2f} ms" if rtt else "n/a"))


def find(run, c: str, wl: str, phase: str) -> Optional[dict]:
    return next((r for r in run.rows if r["c"] == c and r["wl"] == wl and r["phase"] == phase),
                None)


def is_rate(wl: str) -> bool:
    """Workloads reported as a rate (higher is better); the rest in seconds."""
    return wl in ("seq", "small", "stat")


def value(run, c: str, wl: str, phase: str) -> Optional[float]:
    """MB/s (seq), files/s (small), stats/s (stat), else seconds; None if not measured.
    A timeout counts as the timeout's seconds (a lower bound of the time)."""
    r = find(run, c, wl, phase)
    if r is None:
        return None
    if r["status"] == "timeout" and not is_rate(wl):
        return float(r["limit"])
    if r["status"] != "ok" or not r["secs"]:
        return None
    if wl == "seq":
        return run.sc.big / r["secs"] / 1e6
    if is_rate(wl):
        return r["n"] / r["secs"]
    return r["secs"]


def speedup(run, c: str, base: str, wl: str, phase: str, base_phase: str = "") -> Optional[float]:
    """How many times faster `c` is than `base` (> 1: c ahead), for rates and times alike."""
    a, b = value(run, c, wl, phase), value(run, base, wl, base_phase or phase)
    if a is None or b is None or a == 0 or b == 0:
        return None
    return a / b if is_rate(wl) else b / a


def cell(run, c: str, wl: str, phase: str) -> str:
    r = find(run, c, wl, phase)
    if r is None:
        return "-"
    if r["status"] == "timeout":
        return f"**timeout** (> {r['limit']:.0f} s)"
    v = value(run, c, wl, phase)
    if v is None:
        return f"failed ({r['note'][:60]})"
    if is_rate(wl):
        return f"{v:,.0f}"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}"


def per(run, c: str, wl: str, phase: str, key: str, n: Optional[int] = None) -> Optional[float]:
    """A tierfs stats delta of a step (`key`, or `req`: lookups + getattrs + opens), divided
    by `n` (default: the step's file count) when n != 1."""
    r = find(run, c, wl, phase)
    if not r or "d" not in r:
        return None
    v = run.requests(r) if key == "req" else r["d"].get(key)
    if v is None:
        return None
    div = r["n"] if n is None else n
    return v / div if div else None


def fx(v: Optional[float], spec: str = ".2f", suffix: str = "x") -> str:
    return "n/a" if v is None else format(v, spec) + suffix


# ---------------------------------------------------------------------------------------------
# Issue 42, points 1 and 2


def holds_text(holds: Optional[bool]) -> str:
    return "n/a" if holds is None else "**yes**" if holds else "**NO**"


def criteria(run) -> list:
    """(point, criterion, measured, holds, against rclone --sftp-disable-hashcheck: measured
    and holds, or "") for every line of points 1 and 2."""
    big = run.sc.ls[-1]
    lsk = f"ls{big}"
    out = []

    def add(point, text, v, target, fmt=fx, le=False, alt=None):
        def ok(x):
            return None if x is None else (x <= target if le else x >= target)
        out.append((point, text, fmt(v), ok(v),
                    "" if alt is None else f"{fmt(alt(v))} ({holds_text(ok(alt(v)))})"))

    sp = speedup

    def vs_rclone(point, text, c, wl, ph, target):
        add(point, text, sp(run, c, "rclone", wl, ph), target,
            alt=lambda _: sp(run, c, "rclone-nohash", wl, ph))

    vs_rclone(1, "sftp store, default: cold sequential 1 GiB >= 1.0x rclone", "sftp-tierfs",
              "seq", "cold", 1.0)
    vs_rclone(1, "sftp store, default: cold small files (8 readers) >= 1.2x rclone",
              "sftp-tierfs", "small", "cold", 1.2)
    vs_rclone(1, "sftp store, default: cold find + stat of 1,000 entries >= 1.0x rclone",
              "sftp-tierfs", "stat", "cold", 1.0)
    vs_rclone(1, "sftp store, default: warm small files (page cache dropped) >= 0.7x rclone",
              "sftp-tierfs", "small", "warm", 0.7)
    vs_rclone(1, "sftp store, default: small files after a remount >= 0.7x rclone",
              "sftp-tierfs", "small", "remount", 0.7)
    vs_rclone(1, f"sftp store, `{TUNED_TXT}`: warm small files >= 5x rclone", "sftp-tuned",
              "small", "warm", 5.0)
    vs_rclone(1, f"sftp store, `{TUNED_TXT}`: small files after a remount >= 5x rclone",
              "sftp-tuned", "small", "remount", 5.0)
    add(2, "over sshfs, default: at most 1.1 store requests (lookups + getattrs + opens) per "
        "warm open", per(run, "sshfs-tierfs", "small", "warm", "req"), 1.1,
        fmt=lambda v: fx(v, ".2f", " per open"), le=True)
    add(2, f"over sshfs, default: warm small files >= 2.5x today's ({TODAY_WARM_SMALL[0]}-"
        f"{TODAY_WARM_SMALL[1]} files/s; measured / {TODAY_WARM_SMALL[1]})",
        (value(run, "sshfs-tierfs", "small", "warm") or 0) / TODAY_WARM_SMALL[1]
        if value(run, "sshfs-tierfs", "small", "warm") else None, 2.5)
    add(2, "over sshfs, default: grep -r of a 1,000-file directory, cold >= 1.5x sshfs alone",
        sp(run, "sshfs-tierfs", "sshfs", "grep", "cold"), 1.5)
    add(2, "over sshfs, default: grep -r, warm >= 3x sshfs alone (warm)",
        sp(run, "sshfs-tierfs", "sshfs", "grep", "warm"), 3.0)
    add(2, f"over sshfs, default: ls -l of {big:,} entries cold: at most the store's time "
        "(>= 1.0x)", sp(run, "sshfs-tierfs", "sshfs", lsk, "cold"), 1.0)
    add(2, f"over sshfs, default: ls -l of {big:,} entries warm >= 5x faster than the store "
        "(warm)", sp(run, "sshfs-tierfs", "sshfs", lsk, "warm"), 5.0)
    lst = [per(run, "sshfs-tierfs", lsk, ph, "meta_listings", 1) for ph in ("cold", "warm")]
    add(2, f"over sshfs, default: at most 2 listings of the directory per ls -l ({big:,}; "
        "the larger of cold and warm)", None if None in lst else max(lst), 2,
        fmt=lambda v: fx(v, ".0f", " listings"), le=True)
    add(2, "over sshfs, default: git status cold >= 1.0x the store",
        sp(run, "sshfs-tierfs", "sshfs", "git", "cold"), 1.0)
    add(2, f"over sshfs, default: du -s of {run.sc.du_dirs} x {run.sc.du_files:,} entries warm "
        ">= 5x the store (warm)", sp(run, "sshfs-tierfs", "sshfs", "du", "warm"), 5.0)
    walks = [(n, ph, sp(run, "sshfs-tierfs", "sshfs", f"ls{n}", ph))
             for n in run.sc.ls for ph in ("cold", "warm")]
    worst = min((w for w in walks if w[2] is not None), key=lambda w: w[2], default=None)
    add(2, "over sshfs, default: no directory size at which a walk (ls -l of "
        + " / ".join(f"{n:,}" for n in run.sc.ls) + ", cold and warm) is slower than the "
        "store alone (the worst of the six, >= 1.0x)" + (f": {worst[0]:,} {worst[1]}"
                                                          if worst else ""),
        worst[2] if worst and all(w[2] is not None for w in walks) else None, 1.0)
    return out


TUNED_TXT = "meta.ttl=5m,meta.cto=off"


# ---------------------------------------------------------------------------------------------
# Tables


def results_tables(run) -> list:
    keys = [c.key for c in run.contenders]
    labels = {c.key: c.label for c in run.contenders}
    L = [f"Store for every number: **{emulation(run)}**.", "",
         "| contender | seq 1 file cold MB/s | small cold files/s | small warm files/s | "
         "small after remount files/s | find+stat cold stats/s | grep -r cold s | "
         "grep -r warm s |", "|---|" + "---:|" * 7]
    cols = [("seq", "cold"), ("small", "cold"), ("small", "warm"), ("small", "remount"),
            ("stat", "cold"), ("grep", "cold"), ("grep", "warm")]
    for k in keys:
        L.append(f"| {labels[k]} | " + " | ".join(cell(run, k, w, p) for w, p in cols) + " |")
    L += ["", f"Store for every number: **{emulation(run)}**. Seconds (lower is better):", "",
          "| contender | " + " | ".join(f"ls -l {n:,} cold | ls -l {n:,} warm" for n in run.sc.ls)
          + " | du -s cold | du -s warm | git status cold | git status warm |",
          "|---|" + "---:|" * (2 * len(run.sc.ls) + 4)]
    cols = [(f"ls{n}", p) for n in run.sc.ls for p in ("cold", "warm")] + \
        [("du", "cold"), ("du", "warm"), ("git", "cold"), ("git", "warm")]
    for k in keys:
        L.append(f"| {labels[k]} | " + " | ".join(cell(run, k, w, p) for w, p in cols) + " |")
    return L


def metrics(run) -> list:
    """(label, wl, phase) of every measured metric, in report order."""
    out = [("sequential read, cold", "seq", "cold")]
    out += [(f"small files, {ph}", "small", ph) for ph in ("cold", "warm", "remount")]
    out += [("find + stat, cold", "stat", "cold"), ("grep -r, cold", "grep", "cold"),
            ("grep -r, warm", "grep", "warm")]
    out += [(f"ls -l {n:,}, {ph}", f"ls{n}", ph) for n in run.sc.ls for ph in ("cold", "warm")]
    out += [(f"{WL_NAMES[w]}, {ph}", w, ph) for w in ("du", "git") for ph in ("cold", "warm")]
    return out


def ratio_tables(run) -> list:
    L = [f"Store for every ratio: **{emulation(run)}**. Higher = the contender faster (rates "
         "divided, times inverted). Against sshfs alone:", "",
         "| metric | " + " | ".join(f"{k} / sshfs" for k in TIERFS + RCLONES) + " |",
         "|---|" + "---:|" * (len(TIERFS) + len(RCLONES))]
    for label, wl, ph in metrics(run):
        a = [fx(speedup(run, k, "sshfs", wl, ph)) for k in TIERFS + RCLONES]
        L.append(f"| {label} | " + " | ".join(a) + " |")
    L += ["", "Against rclone (defaults) and rclone `--sftp-disable-hashcheck` (`rclone-nohash`):",
          "", "| metric | " + " | ".join(f"{k} / {r}" for r in RCLONES for k in TIERFS) + " |",
          "|---|" + "---:|" * (len(TIERFS) * len(RCLONES))]
    for label, wl, ph in metrics(run):
        b = [fx(speedup(run, k, r, wl, ph)) for r in RCLONES for k in TIERFS]
        L.append(f"| {label} | " + " | ".join(b) + " |")
    return L


def requests_table(run) -> list:
    L = [f"Store: **{emulation(run)}**. Deltas of `tierfs stats --json` around each step: "
         "*lookup/getattr/open* are `backing.*`, *per file* = (lookup + getattr + open) / files "
         "of the step, *listings* = `meta_listings` (+ `meta_renewals`), *sftp* = "
         "`sftp.requests` (and per file).", "",
         "| contender | step | files | lookup | getattr | open | per file | readdir | listings "
         "(+renewals) | sftp requests (per file) |", "|---|---|" + "---:|" * 8]
    for r in run.rows:
        d = r.get("d")
        if not d:
            continue

        def n(k):
            return "n/a" if d.get(k) is None else f"{d[k]:,}"

        req, sftp = run.requests(r), d.get("sftp.requests")
        L.append(f"| {r['c']} | {r['wl']} {r['phase']} | {r['n']:,} | {n('backing.lookup')} | "
                 f"{n('backing.getattr')} | {n('backing.open')} | "
                 f"{fx(req / r['n'] if req is not None and r['n'] else None, '.2f', '')} | "
                 f"{n('backing.readdir')} | {n('meta_listings')} (+{n('meta_renewals')}) | "
                 + (f"{sftp:,} ({sftp / r['n']:.2f})" if sftp is not None and r["n"] else "")
                 + " |")
    return L


def relay_table(run) -> list:
    """MB the relay carried from the server during each step, every contender."""
    keys = [c.key for c in run.contenders]
    L = [f"Store: **{emulation(run)}**. MB the relay carried from the server to the client "
         "during each step (the ssh stream, protocol included; `tierfs-netdelay --stats`): "
         "what each contender asked of the store.", "",
         "| step | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for label, wl, ph in metrics(run):
        cells = []
        for k in keys:
            r = find(run, k, wl, ph)
            v = (r or {}).get("relay_down")
            cells.append("-" if v is None else f"{v / 1e6:,.2f}")
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    return L


# ---------------------------------------------------------------------------------------------
# Plot


def plot_spec(run) -> dict:
    keys = [c.key for c in run.contenders]
    labels = {c.key: c.label for c in run.contenders}

    def panel(title, unit, cats, log=False):
        series = []
        for k in keys:
            vals = [value(run, k, w, p) for _, w, p in cats]
            series.append({"name": labels[k], "values": vals, "color": COLORS.get(k)})
        return {"kind": "bars", "title": title, "unit": unit, "log": log,
                "categories": [c for c, _, _ in cats], "series": series}

    lsc = [(f"{n:,} {ph}", f"ls{n}", ph) for n in run.sc.ls for ph in ("cold", "warm")]
    return {
        "title": "Metadata and small files over ssh (issue 42)" + (" (QUICK)" if run.quick
                                                                  else ""),
        "subtitle": emulation(run),
        "panels": [
            panel(f"{run.sc.small:,} small files, ls | xargs -P8 -n16 cat (files/s, log)",
                  "files/s", [("cold", "small", "cold"), ("warm", "small", "warm"),
                              ("after remount", "small", "remount")], log=True),
            panel(f"sequential read of {R.human(run.sc.big)}, cold (MB/s)", "MB/s",
                  [("cold", "seq", "cold")]),
            panel(f"find -exec stat of {run.sc.small:,} entries, cold (stats/s, log)",
                  "stats/s", [("cold", "stat", "cold")], log=True),
            panel(f"grep -r of {run.sc.small:,} files (s, log; lower is better)", "s",
                  [("cold", "grep", "cold"), ("warm", "grep", "warm")], log=True),
            panel("ls -l (s, log; a timeout is drawn at its limit)", "s", lsc, log=True),
            panel("du -s and git status (s, log)", "s",
                  [("du cold", "du", "cold"), ("du warm", "du", "warm"),
                   ("git cold", "git", "cold"), ("git warm", "git", "warm")], log=True),
        ]}


def write_plot(run, png) -> bool:
    src = run.b.logs / f"{png.stem}.json"
    src.write_text(json.dumps(plot_spec(run)))
    p = R.run([R.SYS_PYTHON, R.BENCH / "lib" / "suiteplot.py", src, png], 180, check=False)
    if p.returncode != 0:
        R.log(f"plot failed: {(p.stderr or '').strip()[-400:]}")
    return p.returncode == 0 and png.exists()


# ---------------------------------------------------------------------------------------------
# The report body


def commands(run) -> list:
    sc = run.sc
    L = ["Mount commands (PORT: the relay's, 127.0.0.1):", ""]
    for c in run.contenders:
        cmd = run.cmds.get(c.key, "(not mounted)").replace(f":{run.store.port}", ":PORT") \
            .replace(f"--sftp-port {run.store.port}", "--sftp-port PORT") \
            .replace(f"-p {run.store.port}", "-p PORT")
        L.append(f"- {c.label}: `{cmd}`")
    L += ["", f"The sftp store's ssh_config (`{run.ssh_config}`):", "", "```",
          run.ssh_config.read_text().strip() if run.ssh_config.exists() else "?", "```", "",
          "Steps, in this order on each contender (in the mount's root; each after `sync; echo 3 "
          "> /proc/sys/vm/drop_caches` and the server's files of the step read back into the "
          "page cache, the server's RAM; the 1 GiB read also after a memory priming pass, "
          "FUSE-NOTES lesson 8), warm = the same command again right after, caches dropped:", ""]
    seen = set()
    for r in run.rows:
        key = (r["wl"], r["cmd"])
        if r["wl"] != "mount" and key not in seen:
            seen.add(key)
            where = " (in `small/`)" if r["wl"] == "small" else \
                " (in `repo/`)" if r["wl"] == "git" else ""
            L.append(f"- {r['wl']}: `{r['cmd']}`{where}")
    L += ["- small files after a remount: unmount (`tierfs unmount`, rclone SIGINT; sshfs "
          "alone: a new sshfs mount), mount again on the same cache, drop caches, run", "",
          f"Data (`{run.served}`, written on the server's side before anything is mounted, every "
          f"file and directory dated {run.old_mtime} = 2026-01-01: a tree nobody changed lately): "
          f"`big.bin` {R.human(sc.big)} random; `small/`, `stat/`, `grep/`: {sc.small:,} files "
          f"of 4-64 KiB of random lowercase words each (three copies, so each cold step finds "
          f"its directory cold; the find + stat runs over `stat/`); "
          + ", ".join(f"`ls{n}/`" for n in sc.ls) + " files of 100 bytes; "
          f"`du/d00..d{sc.du_dirs - 1:02d}` {sc.du_files:,} files of 100 bytes each; `repo/`: "
          f"the sources of crate {run.data['repo']['crate']} ({run.data['repo']['files']} "
          "tracked files, from ~/.cargo/registry/src), `git init` + `git add -A` + `git commit` "
          "+ `git gc` on the server's side; its index is put back before every contender (a "
          "cold `git status` through a mount sees other inode numbers and rewrites it).", "",
          "Store setup (bench/lib/sshstore.py, a network namespace and names of its own):", "",
          "```"] + [c.replace(str(run.store.port), "PORT") for c in run.store.cmds] + ["```"]
    return L


def result(run) -> R.Result:
    b = run.b
    b.emulation = emulation(run)
    v = run.store.versions
    crit = criteria(run)
    L = [f"- took {run.minutes:.1f} min; scale: " + ("**--quick** " if run.quick else "")
         + ("**partial (--meta-only: criteria missing a contender or a step read n/a)** "
            if run.partial else "")
         + f"{run.sc.small:,} small files, ls -l of {', '.join(f'{n:,}' for n in run.sc.ls)}, "
         f"du of {run.sc.du_dirs} x {run.sc.du_files:,}, {R.human(run.sc.big)} file",
         f"- store: **{emulation(run)}**. {run.store.details()}",
         f"- versions: sshfs {v.get('sshfs', '?')} (FUSE {v.get('sshfs_fuse', '?')}); "
         f"{v.get('openssh', '?')} (client and server); {run.rclone_version}; tierfs "
         f"`{R.TIERFS_BIN}` as built from the commit above",
         f"- contenders, all against the same sshd in this run, each mounted fresh (empty "
         f"caches) in turn: " + "; ".join(f"`{c.key}` = {c.label}" for c in run.contenders),
         "", "## Issue 42: what it must show (points 1 and 2)", "",
         f"Store: **{emulation(run)}**; all contenders in this run.", "",
         "The criteria are against rclone with its defaults, as the issue asks. By default "
         "rclone's sftp backend runs `md5sum FILE` on the server (an ssh exec session) for "
         "every file its VFS cache fetches (its log: `Running remote command: md5sum ...`, "
         "`vfs cache: checking remote fingerprint`), which is most of its cold small-file "
         "time here; the last column gives point 1 against rclone with "
         "`--sftp-disable-hashcheck` too.", "",
         "| point | criterion | measured | holds | against rclone --sftp-disable-hashcheck |",
         "|---|---|---:|---|---:|"]
    for point, text, meas, holds, alt in crit:
        L.append(f"| {point} | {text} | {meas} | {holds_text(holds)} | {alt or '-'} |")
    bad = [r for r in run.rows if r["status"] != "ok"]
    L += ["", "## Results", ""] + results_tables(run) + ["", "![plots](PLOT_PNG_PLACEHOLDER)", ""]
    if bad:
        L += ["Timed out or failed:", ""] + [f"- {r['c']} {r['wl']} {r['phase']}: "
                                             f"{r['status']} ({r['note']})" for r in bad] + [""]
    git_dirty = [r for r in run.rows if r["wl"] == "git" and r.get("out", "").strip()]
    if git_dirty:
        L += ["`git status --porcelain` printed something (the tree looked changed) on: "
              + ", ".join(f"{r['c']} {r['phase']} ({len(r['out'].splitlines())} lines)"
                          for r in git_dirty), ""]
    L += ["## Ratios", ""] + ratio_tables(run)
    L += ["", "## Store requests per step (tierfs)", ""] + requests_table(run)
    L += ["", "## Bytes from the server per step (every contender)", ""] + relay_table(run)
    L += ["", "## Commands", ""] + commands(run) + [""]
    res = R.Result()
    res.markdown = "\n".join(L)
    res.plot_fn = lambda png: write_plot(run, png)
    res.console = "\n".join([f"{p} {'yes' if h else 'NO' if h is not None else 'n/a':>3}  "
                             f"{m:>16}  {t}" + (f"  [nohash: {a}]" if a else "")
                             for p, t, m, h, a in crit])
    for k, st in run.final_stats.items():
        res.details.append((f"{k}: tierfs stats --json before its unmount",
                            json.dumps(st, indent=1, sort_keys=True)))
    res.details.append(("every step (JSON)", json.dumps(
        [{k: v for k, v in r.items() if k != "out"} for r in run.rows], indent=None)))
    return res
