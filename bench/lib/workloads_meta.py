"""The suite's metadata workload, `dirstat`: `find -exec stat` and `du -s` over one directory
of small files, cold, warm and after drop_caches (the sshfs profile renumbers inodes).
Registered by name in workloads.py.
"""

from pathlib import Path

import benchcore as R
import contenders as C
import testdata as T
from workloads_common import (READ_SAME, READERS, backing_delta, backing_text, emu_line, hb, md,
                              params)


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
