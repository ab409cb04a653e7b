"""The `git` workload: `git add` and `git commit` of many small new files, as a developer or a
CI job does in a fresh checkout (issue 15: namespace write-back).

git stores every loose object by writing `objects/xx/tmp_obj_XXXXXX`, linking it to its hash
and unlinking the temporary name, and renames `index.lock` and the ref locks into place: a
store round trip each, one at a time. Measured per contender: the files are written and (for
write-back) put on the store first, untimed; then `git add .` and `git commit` are timed,
then the time until everything is on the store (`Contender.quiesce`). What reached the store
is checked after the unmount: `git fsck`, the files indexed, no temporary object left.
"""

import os
import shutil
from pathlib import Path

import benchcore as R
import workloads_common as W

KEYS = ["store", "tierfs-default", "tierfs", "tierfs-wb", "rclone"]
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost",
       "-c", "init.defaultBranch=main", "-c", "gc.auto=0"]


def files_for(s) -> int:
    return 100 if s.quick else 300


def wl_git(s, sec):
    n = files_for(s)
    res: dict = {}
    for key in KEYS:
        shutil.rmtree(s.b.backing / f"suite-git-{key}", ignore_errors=True)

    def body(c, root):
        d = root / f"suite-git-{c.key}"
        os.makedirs(d, exist_ok=True)
        R.run(GIT + ["init", "-q", str(d)], 300)
        for i in range(n):
            # Small source files of a few hundred bytes, distinct contents (one object each).
            (d / f"f{i:04d}.txt").write_text(f"file {i}\n" + "x" * (200 + 7 * i % 900) + "\n")
        c.quiesce()
        s.prepare(c, warm_files=[], prime=0)
        t_add, _, _ = s.timed(sec, GIT + ["-C", str(d), "add", "."], 600 + n, cgroup=False)
        t_commit, _, _ = s.timed(sec, GIT + ["-C", str(d), "commit", "-q", "-m", "bench"],
                                 600 + n, cgroup=False)
        q = c.quiesce()
        res[c.key] = {"add_s": t_add, "commit_s": t_commit, "quiesce": q}
        R.log(f"git {c.key}: add {t_add:.2f} s, commit {t_commit:.2f} s"
              + (f", on the store after +{q:.1f} s" if q is not None else ""))

    s.each(sec, KEYS, body)
    for key, r in res.items():
        local = s.b.backing / f"suite-git-{key}"
        fsck = R.run(["git", "-C", str(local), "fsck", "--no-dangling"], 600, check=False)
        bad = [l for l in (fsck.stdout + fsck.stderr).splitlines()
               if l.strip() and not l.startswith("notice:")]
        listed = R.run(["git", "-C", str(local), "ls-files"], 600, check=False)
        indexed = len(listed.stdout.splitlines()) if listed.returncode == 0 else 0
        tmp = sum(1 for _, _, fs in os.walk(local / ".git" / "objects")
                  for f in fs if f.startswith("tmp_obj_"))
        ok = fsck.returncode == 0 and not bad and indexed == n and tmp == 0
        r["verify"] = ("fsck ok" if ok else
                       f"fsck rc {fsck.returncode}, {len(bad)} lines, {indexed} of {n} "
                       f"indexed, {tmp} tmp_obj left")
        shutil.rmtree(local, ignore_errors=True)

    sec.add(f"**git** (`bench/lib/gitbench.py`): `git init`, {n} new files of 200-1,100 bytes "
            "written (untimed; write-back put on the store first), caches dropped, then "
            "`git add .` and `git commit` timed. git writes each loose object to "
            "`tmp_obj_XXXXXX`, links it to its hash and unlinks the temporary name. *On the "
            "store after*: until tierfs write-back had nothing pending or rclone no upload "
            "(rclone's upload starts at close). Checked on the store after the unmount: "
            "`git fsck`, files indexed, no `tmp_obj` left. " + W.emu_line(s, sec), "")
    sec.add("| contender | git add s | git commit s | on the store after +s | files/s | "
            "files/s until on the store | check |", "|---|" + "---:|" * 5 + "---|")

    def rate(k, with_q=False):
        r = res.get(k)
        if not r:
            return None
        return n / (r["add_s"] + r["commit_s"] + ((r["quiesce"] or 0) if with_q else 0))

    for key in s.keys(KEYS):
        r = res.get(key)
        if not r:
            continue
        sec.add(f"| {s.c[key].short} | {r['add_s']:.2f} | {r['commit_s']:.2f} | "
                f"{W.md(r['quiesce'], '.1f')} | {rate(key):,.1f} | {rate(key, True):,.1f} | "
                f"{r['verify']} |")
    sec.add("")
    for t in [x for x in ("tierfs", "tierfs-wb") if x in s.keys(KEYS)]:
        keys = [k for k in s.keys(KEYS) if k == t or "tierfs" not in k
                or (t == "tierfs" and k == "tierfs-default")]
        sec.metric(f"git add + commit files/s ({t})", "files/s", {k: rate(k) for k in keys},
                   tierfs=t)
    if "tierfs-wb" in s.keys(KEYS):
        sec.metric("git add + commit until on the store files/s (tierfs-wb)", "files/s",
                   {k: rate(k, True) for k in s.keys(KEYS)
                    if "tierfs" not in k or k == "tierfs-wb"}, tierfs="tierfs-wb")
    sec.panels += [
        {"kind": "bars", "title": f"git add + commit of {n} files", "unit": "files/s (log)",
         "log": True, "categories": ["add + commit", "until on the store"],
         "series": [{"name": k, "values": [rate(k), rate(k, True)]} for k in res]},
    ]
