"""`bench/run --workload meta`: metadata and small files over a latency-bound store (issue 42).

One sshd, in a network namespace of its own behind `tierfs-netdelay` (bench/lib/sshstore.py's
SshfsStore with a `Site` of its own names, so bench/sshfs-store's store may stay up next to it),
serves one directory, work/meta-store/. Every contender reads that directory, in the same run,
mounted fresh (empty caches) in turn:

    sshfs            sshfs alone, default options (the store)
    sshfs-tierfs     tierfs over that sshfs mount, no -o at all
    sshfs-tuned      the same with -o meta.ttl=5m,meta.cto=off
    sftp-tierfs      tierfs over sftp://root@127.0.0.1:PORT/.../meta-store (the native store),
                     -o sftp.ssh_config=FILE only
    sftp-tuned       the same with meta.ttl=5m,meta.cto=off
    rclone           rclone mount :sftp:... --vfs-cache-mode full, rclone's defaults otherwise
    rclone-nohash    the same with --sftp-disable-hashcheck: a reference. By default rclone
                     runs `md5sum FILE` on the server (an ssh exec session) for every file its
                     VFS cache fetches, ~0.2 s each here; that, not the protocol, sets its cold
                     small-file rate, so the report gives every ratio against both

Workloads (each step after `sync; echo 3 > drop_caches` and the server's files read back into
the page cache, the server's RAM): a 1 GiB sequential read, 1,000 small files read by
`ls | xargs -P8 -n16 cat` (cold, warm, after a remount), `find -exec stat` of 1,000 entries,
`grep -r` of 1,000 files (cold, warm), `ls -l` of 100 / 1,000 / 10,000 entries (cold, warm,
10-minute timeout), `du -s` of 20 x 1,000 entries (cold, warm) and `git status` of a crate's
sources committed into a fresh repository (cold, warm). For tierfs, the deltas of
`tierfs stats --json` around every step (store requests per open, listings per `ls -l`, the
sftp store's requests). The report and the issue-42 criteria: bench/lib/metareport.py.
"""
import json
import os
import random
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import benchcore as R
import s3bench
import sshstore
import testdata
from benchcore import BenchError, log
from testbed import Bench

SITE = sshstore.Site(netns="tierfs-meta", veth_host="tmeta0", veth_ns="tmeta1",
                     host_ip="10.79.0.1", ns_ip="10.79.0.2", dir=R.WORK / "meta-ssh",
                     mnt=R.WORK / "mnt-meta-sshfs")
SERVED = R.WORK / "meta-store"
TUNED = "meta.ttl=5m,meta.cto=off"
# Every file and directory of the data is dated here: a tree nobody has changed for a while,
# as source trees and data sets are (tierfs trusts attributes by their age, docs/tunables.md).
OLD_MTIME = 1767225600  # 2026-01-01 00:00 UTC
NEEDLE = "zqxjv-not-present"
LS_TIMEOUT = 600
FORMAT = 1


@dataclass(frozen=True)
class Scale:
    small: int = 1000          # files of the cat, find and grep directories (each)
    ls: tuple = (100, 1000, 10000)
    du_dirs: int = 20
    du_files: int = 1000
    big: int = 1 << 30
    repo_files: int = 546      # the crate whose file count is nearest is taken whole


FULL = Scale()
QUICK = Scale(small=200, ls=(100, 500, 2000), du_dirs=4, du_files=250, big=128 << 20,
              repo_files=150)


# ---------------------------------------------------------------------------------------------
# The store's data (written straight into the served directory before anything is mounted)


def age(root: Path) -> None:
    """Date every file and directory under `root` OLD_MTIME (directories last, bottom up)."""
    for d, ds, fs in os.walk(root, topdown=False):
        for f in fs:
            os.utime(os.path.join(d, f), (OLD_MTIME, OLD_MTIME), follow_symlinks=False)
        os.utime(d, (OLD_MTIME, OLD_MTIME))


def text_dir(d: Path, n: int, seed: int) -> int:
    """`n` files of 4-64 KiB of lowercase words in one directory (the issue's small files);
    returns their bytes."""
    rng = random.Random(seed)
    alphabet = b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 18 + b"\n" * 4
    pool = rng.randbytes(8 << 20).translate(bytes.maketrans(bytes(range(256)), alphabet))
    d.mkdir(parents=True)
    total = 0
    for i in range(n):
        size = rng.randint(4096, 65536)
        off = rng.randrange(len(pool) - size)
        (d / f"f{i:05d}.txt").write_bytes(pool[off:off + size])
        total += size
    return total


def tiny_dir(d: Path, n: int) -> None:
    """`n` files of 100 bytes: what `ls -l` and `du` walk (their size does not matter)."""
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"e{i:05d}").write_bytes(b"x" * 100)


def pick_crate(want: int) -> Path:
    """The crate of ~/.cargo/registry/src whose file count is nearest `want`: a real source
    tree for `git status`, no network needed."""
    best = None
    for src in testdata.cargo_registry_srcs():
        for c in sorted(src.iterdir()):
            n = sum(len(fs) for _, _, fs in os.walk(c))
            if best is None or abs(n - want) < abs(best[0] - want):
                best = (n, c)
    if best is None:
        raise BenchError("no crate sources in ~/.cargo/registry/src (run cargo fetch)")
    return best[1]


def make_repo(d: Path, crate: Path) -> dict:
    """A fresh git repository of the crate's files (dated OLD_MTIME before `git add`, so the
    index is not racily clean), committed and packed; its index is kept aside, so every
    contender's cold `git status` starts from the same one."""
    shutil.copytree(crate, d, symlinks=True)
    age(d)
    env = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", f"{crate.name}"], ["git", "gc", "-q"]):
        R.run(cmd, 300, cwd=d, env=env)
    files = int(R.run(["sh", "-c", "git ls-files | wc -l"], 60, cwd=d).stdout.strip())
    shutil.copy2(d / ".git" / "index", SITE.dir / "repo-index")
    return {"crate": crate.name, "files": files}


def make_data(sc: Scale) -> dict:
    """The served directory, reused while its manifest matches the scale."""
    want = {"format": FORMAT, "scale": list(map(str, sc.__dict__.values()))}
    man_path = SERVED / ".manifest.json"
    if man_path.exists() and (SITE.dir / "repo-index").exists():
        try:
            man = json.loads(man_path.read_text())
            if all(man.get(k) == v for k, v in want.items()) and \
                    (SERVED / "big.bin").stat().st_size == sc.big:
                log(f"reusing {SERVED}")
                return man
        except (ValueError, OSError):
            pass
    log(f"creating {SERVED} (the store's data)")
    if SERVED.exists():
        shutil.rmtree(SERVED)
    SERVED.mkdir(parents=True)
    SITE.dir.mkdir(parents=True, exist_ok=True)
    man = dict(want)
    man["small_bytes"] = text_dir(SERVED / "small", sc.small, 1)
    text_dir(SERVED / "stat", sc.small, 2)
    text_dir(SERVED / "grep", sc.small, 3)
    for n in sc.ls:
        tiny_dir(SERVED / f"ls{n}", n)
    for i in range(sc.du_dirs):
        tiny_dir(SERVED / "du" / f"d{i:02d}", sc.du_files)
    R.run(["sh", "-c", f'head -c {sc.big} /dev/urandom > "$0"', SERVED / "big.bin"],
          max(300, sc.big / 20e6))
    age(SERVED)
    man["repo"] = make_repo(SERVED / "repo", pick_crate(sc.repo_files))
    R.run(["sync"], 600)
    man_path.write_text(json.dumps(man))
    return man


def restore_repo_index() -> None:
    """Put the repository's index back as committed (a contender's `git status` rewrites it
    with the stat data it saw), before the next contender mounts."""
    shutil.copy2(SITE.dir / "repo-index", SERVED / "repo" / ".git" / "index")


# ---------------------------------------------------------------------------------------------
# Contenders


class StoreHost:
    """What SshfsStore needs of a bench run (as bench/sshfs-store's Host): the directory its
    sshd serves, where logs go, and the test-file helpers of its link measurement."""
    test_file = Bench.test_file
    warm_backing = Bench.warm_backing

    def __init__(self, b: Bench):
        self.backing = SERVED
        self.logs = b.logs


class SshfsAlone:
    """The store itself: a fresh sshfs mount (empty sshfs caches) for each start."""
    kind = "sshfs"

    def __init__(self, run: "MetaRun"):
        self.run, self.key, self.label = run, "sshfs", "sshfs alone"
        self.mnt = SITE.mnt
        self.cmd = ""

    def mount(self, fresh: bool) -> None:
        self.run.store.remount()
        self.cmd = shlex.join(self.run.store.sshfs_cmd())

    def remount(self) -> None:
        self.run.store.remount()

    def unmount(self) -> None:
        pass  # the store's sshfs mount stays up; the next contender remounts it

    def stats(self) -> Optional[dict]:
        return None


class Mounted(s3bench.Mount):
    """tierfs (over the sshfs mount or sftp://) or rclone (sftp backend): s3bench.Mount's
    unmount (tierfs unmount and its daemon's exit; rclone's SIGINT) and stats, mounted here."""

    def __init__(self, run: "MetaRun", key: str, label: str, opts: str = ""):
        super().__init__(run.b, None, "rclone" if key.startswith("rclone") else "tierfs")
        self.run, self.key, self.label, self.opts = run, key, label, opts
        self.mnt = R.WORK / f"mnt-meta-{key}"
        self.cache = R.WORK / f"cache-meta-{key}"
        self.cmd = ""

    def command(self) -> list:
        st = self.run.store
        if self.kind == "rclone":
            return ["rclone", "mount", f":sftp:{SERVED}", str(self.mnt), "--sftp-host",
                    "127.0.0.1", "--sftp-port", str(st.port), "--sftp-user", "root",
                    "--sftp-key-file", str(st.key), "--vfs-cache-mode", "full",
                    "--cache-dir", str(self.cache), "--log-level", "NOTICE",
                    "--log-file", str(self.b.logs / f"{self.key}-meta.log")] + \
                (["--sftp-disable-hashcheck"] if self.key == "rclone-nohash" else [])
        if self.key.startswith("sftp"):
            opts = f"sftp.ssh_config={self.run.ssh_config}" + (f",{self.opts}" if self.opts
                                                                 else "")
            return [str(R.TIERFS_BIN), "mount", f"sftp://root@127.0.0.1:{st.port}{SERVED}",
                    str(self.mnt), "--cache-dir", str(self.cache), "-o", opts]
        return [str(R.TIERFS_BIN), "mount", str(SITE.mnt), str(self.mnt), "--cache-dir",
                str(self.cache)] + (["-o", self.opts] if self.opts else [])

    def mount(self, fresh: bool) -> None:
        if fresh and self.cache.exists():
            shutil.rmtree(self.cache)
        if fresh and self.key.startswith("sshfs"):
            self.run.store.remount()  # empty sshfs caches under a fresh tierfs too
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        self.cmd = shlex.join(cmd)
        log("mounting: " + self.cmd)
        if self.kind == "tierfs":
            R.run(cmd, 120)
        else:
            import subprocess
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        self.b.mounted.append(self.mnt)
        R.wait_mounted(self.mnt, 60)
        R.run(["stat", "-f", self.mnt], 60)

    def remount(self) -> None:
        self.unmount()
        self.mount(fresh=False)

    def stats(self) -> Optional[dict]:
        text = super().stats()
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None


# ---------------------------------------------------------------------------------------------
# The run


STAT_KEYS = ["backing.lookup", "backing.getattr", "backing.open", "backing.readdir",
             "backing.read", "backing.read_bytes", "meta_listings", "meta_renewals", "opens",
             "checked_opens", "cto_checks", "cto_shared", "lazy_opens", "sftp.requests"]


class MetaRun:
    def __init__(self, b: Bench):
        self.b = b
        self.quick = bool(getattr(b.args, "quick", False))
        self.sc = QUICK if self.quick else FULL
        self.store = sshstore.SshfsStore(StoreHost(b), b.args.sshfs_delay_us, SITE)
        self.ssh_config = SITE.dir / "ssh_config"
        # Where the data is and how it is dated, for the report (metareport).
        self.served = SERVED
        self.old_mtime = OLD_MTIME
        self.rows: list = []       # one dict per measured step
        self.final_stats: dict = {}
        self.cmds: dict = {}       # contender key -> mount command
        self.data: dict = {}
        self.rclone_version = "?"
        self.t0 = time.monotonic()
        self.contenders = [
            SshfsAlone(self),
            Mounted(self, "sshfs-tierfs", "tierfs over sshfs, default options"),
            Mounted(self, "sshfs-tuned", f"tierfs over sshfs, {TUNED}", TUNED),
            Mounted(self, "sftp-tierfs", "tierfs over sftp://, default options"),
            Mounted(self, "sftp-tuned", f"tierfs over sftp://, {TUNED}", TUNED),
            Mounted(self, "rclone", "rclone mount :sftp: --vfs-cache-mode full"),
            Mounted(self, "rclone-nohash", "the same, --sftp-disable-hashcheck (reference)"),
        ]
        # `--meta-only`: a subset of contenders and steps, for a look by hand.
        only = [w for w in (getattr(b.args, "meta_only", None) or "").split(",") if w]
        keys = {c.key for c in self.contenders}
        steps = {"seq", "small", "stat", "grep", "ls", "du", "git"}
        bad = [w for w in only if w not in keys | steps]
        if bad:
            raise BenchError(f"--meta-only: unknown {', '.join(bad)} (contenders: "
                             f"{', '.join(sorted(keys))}; steps: {', '.join(sorted(steps))})")
        self.partial = bool(only)
        if any(w in keys for w in only):
            self.contenders = [c for c in self.contenders if c.key in only]
        self.steps = {w for w in only if w in steps} or steps

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        sshstore.ensure_tools()
        R.ensure_tools(extra=[("rclone", "rclone"), ("git", "git")])
        p = R.run(["rclone", "version"], 30, check=False)
        self.rclone_version = (p.stdout or "?").splitlines()[0] if p.stdout else "?"
        SITE.dir.mkdir(parents=True, exist_ok=True)
        self.data = make_data(self.sc)
        self.b.store_hooks.append(("tear down the meta store", self.store.teardown))
        self.store.setup()
        self.ssh_config.write_text("\n".join([
            "# generated by bench/lib/metabench.py: tierfs's sftp:// store to the bench's sshd",
            "Host *", f"  IdentityFile {self.store.key}", "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR", ""]))
        for c in self.contenders:
            self.b.cleanup_hooks.append((f"unmount {c.key}", c.unmount))

    # -- one measured step -------------------------------------------------------------------

    def warm_server(self, rel: str) -> None:
        """The server's copy of `rel` into the page cache (its RAM) and its dentries."""
        path = SERVED / rel
        if path.is_file():
            R.run(["dd", f"if={path}", "of=/dev/null", "bs=4M"], 600)
        else:
            R.run(["sh", "-c", 'find "$0" -type f -exec cat {} + > /dev/null', path], 600)

    def step(self, c, wl: str, phase: str, shell: str, rel: str, n: int,
             timeout: float = 900, ok=(0,), cwd: str = "", prime: int = 0) -> dict:
        """Runs `shell` in the contender's mount (or its `cwd` under it), after drop_caches
        and the server's data of `rel` read back; records seconds, rc, the tierfs stats and
        relay deltas. A timeout or an error is recorded, not raised."""
        row = {"c": c.key, "wl": wl, "phase": phase, "cmd": shell, "n": n, "secs": None,
               "status": "ok", "note": "", "limit": timeout}
        self.rows.append(row)
        try:
            R.drop_caches()
            self.warm_server(rel)
            if prime:
                R.prime_memory(prime)
            s0, r0 = c.stats(), self.store.stats()
            t = time.monotonic()
            p = R.run(["sh", "-c", shell], timeout, check=False, cwd=c.mnt / cwd)
            secs = time.monotonic() - t
            s1, r1 = c.stats(), self.store.stats()
        except BenchError as e:
            row["status"] = "timeout" if "timed out" in str(e) else "failed"
            row["note"] = str(e).splitlines()[0][:300]
            log(f"{c.key} {wl} {phase}: {row['status']}: {row['note']}")
            return row
        if p.returncode not in ok:
            row["status"] = "failed"
            row["note"] = f"rc={p.returncode} {(p.stderr or '').strip()[-300:]}"
        row["secs"] = secs
        row["out"] = (p.stdout or "")[-2000:]
        if s0 and s1:
            row["d"] = {k: R.jdiff(s0, s1, k) for k in STAT_KEYS}
        if r0 and r1:
            row["relay_down"] = r1["bytes_read"] - r0["bytes_read"]
        log(f"{c.key} {wl} {phase}: {secs:.2f} s ({row['status']})"
            + (f" store requests {self.requests(row)}" if "d" in row else ""))
        return row

    @staticmethod
    def requests(row: dict) -> Optional[int]:
        d = row.get("d") or {}
        v = [d.get(k) for k in ("backing.lookup", "backing.getattr", "backing.open")]
        return None if any(x is None for x in v) else sum(v)

    # -- one contender -------------------------------------------------------------------------

    def contender(self, c) -> None:
        sc = self.sc
        log(f"=== {c.label} ({time.monotonic() - self.t0:.0f} s into the run)")
        restore_repo_index()
        if c.key.startswith("sftp") or c.key.startswith("rclone"):
            self.store.unmount()  # no sshfs under them: nothing else on the link
        c.mount(fresh=True)
        self.cmds[c.key] = c.cmd
        try:
            want = self.steps
            if "seq" in want:
                self.step(c, "seq", "cold", "dd if=big.bin of=/dev/null bs=1M 2>&1", "big.bin",
                          1, timeout=600, prime=sc.big)
            for phase in ("cold", "warm", "remount") if "small" in want else ():
                if phase == "remount":
                    c.remount()
                self.step(c, "small", phase, "ls | xargs -P8 -n16 cat > /dev/null", "small",
                          sc.small, cwd="small")
            if "stat" in want:
                self.step(c, "stat", "cold", "find stat -type f -exec stat -c '%s %Y %n' {} + "
                          "> /dev/null", "stat", sc.small)
            for phase in ("cold", "warm") if "grep" in want else ():
                self.step(c, "grep", phase, f"grep -r {NEEDLE} grep", "grep", sc.small, ok=(1,))
            for n in sc.ls if "ls" in want else ():
                for phase in ("cold", "warm"):
                    self.step(c, f"ls{n}", phase, f"ls -l ls{n} > /dev/null", f"ls{n}", n,
                              timeout=LS_TIMEOUT)
            for phase in ("cold", "warm") if "du" in want else ():
                self.step(c, "du", phase, "du -s du", "du", sc.du_dirs * sc.du_files)
            for phase in ("cold", "warm") if "git" in want else ():
                self.step(c, "git", phase, "git status --porcelain", "repo",
                          self.data["repo"]["files"], timeout=600, cwd="repo")
            st = c.stats()
            if st:
                self.final_stats[c.key] = st
        finally:
            c.unmount()

    def run(self) -> None:
        self.setup()
        for c in self.contenders:
            try:
                self.contender(c)
            except BenchError as e:
                log(f"{c.key}: {e}")
                self.rows.append({"c": c.key, "wl": "mount", "phase": "", "secs": None,
                                  "status": "failed", "note": str(e)[:300], "n": 0,
                                  "cmd": "", "limit": 0})
        self.minutes = (time.monotonic() - self.t0) / 60


def wl_meta(b: Bench) -> R.Result:
    import metareport
    run = MetaRun(b)
    run.run()
    return metareport.result(run)
