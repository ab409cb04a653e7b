"""The contenders of the benchmark suite (bench/run WORKLOAD...): what a workload runs on.

Each contender makes the data of the store's backing directory (bench/work/backing) visible
under some root directory and can be mounted fresh (empty cache), remounted (cache kept) and
torn down. The suite opens every contender in `Suite.contender()`, which also records what
it cost (endurance: bytes the daemon wrote to the local disk, tierfs's SSD counters, what the
store served) and, with --profile-tierfs, a perf profile of the tierfs daemon.

    local      the local disk itself (bench/work/backing on ext4): the physical limit
    store      the slow store directly (the tierfs-slowfs mount; the sshfs profile: the
               sshfs mount of bench/lib/sshstore.py)
    tierfs     tierfs over the store, write-through (its default), the suite's tuning
    tierfs-default  tierfs over the store with no -o at all (sshfs profile only)
    tierfs-wb  tierfs over the store with -o writeback.mode=back
    rclone     rclone mount of the store (`:local:` remote on the slowfs mount),
               --vfs-cache-mode full, cache dir on the same disk as tierfs's
    bindfs     bindfs over the local disk: the cost of a FUSE layer alone

Helpers (mounting slowfs and tierfs, run(), ...) come from bench/lib/benchcore.py.
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import benchcore as R
import sshstore

WB_OPT = "writeback.mode=back"


def daemon_io(pids) -> dict:
    """Sum of /proc/PID/io over `pids` (read_bytes/write_bytes: what reached the block layer
    on behalf of the process; rchar/wchar: all read/write syscalls)."""
    out: dict = {}
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/io"):
                k, v = line.split(":")
                out[k.strip()] = out.get(k.strip(), 0) + int(v)
        except (OSError, ValueError):
            pass
    return out


def rss_bytes(pid: int) -> Optional[int]:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Contender:
    key = "?"
    label = "?"
    short = "?"          # column header in tables
    emulated = False     # data behind it sits on the emulated store (backing warmed first)
    caches = False       # keeps data of its own (RAM, SSD, cache dir): warm runs make sense

    def __init__(self, suite):
        self.s = suite
        self.b = suite.b
        self.root: Optional[Path] = None
        self.mount_cmds: list = []

    # -- lifecycle (the suite calls these through Suite.contender) -----------------------

    def setup(self, fresh: bool = True) -> Path:
        raise NotImplementedError

    def teardown(self) -> dict:
        """Unmounts; returns facts worth reporting (daemon exit time...)."""
        return {}

    def remount(self, fresh: bool = False) -> float:
        """Unmount and mount again keeping the cache (`fresh`: emptying it); returns the
        mount time in seconds."""
        self.teardown()
        t0 = time.monotonic()
        self.setup(fresh=fresh)
        return time.monotonic() - t0

    def pids(self) -> list:
        return []

    def stats(self) -> Optional[dict]:
        return None

    def quiesce(self, timeout: float = 900) -> Optional[float]:
        """Waits until everything written through the contender is on the store (rclone:
        uploads done; tierfs write-back: nothing dirty). Returns the seconds waited, None
        when the contender has nothing of the kind (writes are synchronous)."""
        return None

    def describe(self) -> str:
        return "; ".join(self.mount_cmds) if self.mount_cmds else "-"


class Local(Contender):
    key, label, short = "local", "local disk (physical limit)", "local"

    def setup(self, fresh=True):
        self.root = self.b.backing
        return self.root

    def remount(self, fresh=False):
        R.drop_caches()  # the root filesystem cannot be remounted: caches dropped instead
        return 0.0

    def describe(self):
        return f"`{self.b.backing}` on {R.fs_info(self.b.backing)}, no FUSE"


class Store(Contender):
    key, label, short = "store", "store direct (emulated, slowfs)", "store"
    emulated = True

    def setup(self, fresh=True):
        self.s.ensure_store(fresh)
        if self.s.profile == "sshfs":
            self.mount_cmds.append(self.s.store_cmd())
        self.root = self.b.store_mnt
        return self.root

    def remount(self, fresh=False):
        if self.s.profile == "sshfs":
            # sshfs keeps the kernel's page cache and attribute caches of its own: a
            # remount is a new sshfs mount (the server stays)
            t0 = time.monotonic()
            self.s.ensure_store(fresh=True)
            return time.monotonic() - t0
        return 0.0  # slowfs caches nothing (DIRECT_IO, zero TTLs): a remount changes nothing

    def describe(self):
        profs = {p for _, p in self.s.jobs}
        out = []
        if profs - {"sshfs"}:
            out.append(f"the slowfs mount `{self.b.slow_mnt}` itself (`{self.s.slowfs_cmd()}`)")
        if "sshfs" in profs:
            out.append(f"profile `sshfs`: the sshfs mount `{sshstore.MNT}` itself (`"
                       + shlex.join(sshstore.SshfsStore(self.b).sshfs_cmd()).replace(
                           "-p 0 ", "-p PORT ") + "`, PORT: the relay's; bench/lib/sshstore.py)")
        return "; ".join(out)


class Tierfs(Contender):
    key, label, short = "tierfs", "tierfs write-through", "tierfs"
    emulated = True
    caches = True
    extra_opts: list = []

    def __init__(self, suite):
        super().__init__(suite)
        self.cache = R.WORK / f"cache-suite-{self.key}"
        self.unavailable: Optional[str] = None

    def opts(self) -> list:
        return list(self.s.tierfs_opts) + list(self.extra_opts)

    def setup(self, fresh=True):
        self.s.ensure_store(fresh)
        cmd = self.b.mount_tierfs_tolerant(self.cache, fresh, self.opts(), timeout=300)
        self.mount_cmds.append(shlex.join(cmd))
        self.root = self.b.tier_mnt
        return self.root

    def teardown(self):
        if not R.is_mounted(self.b.tier_mnt):
            return {}
        t = self.b.unmount_tierfs(daemon_wait=900)
        return {"daemon_exit_s": t}

    def pids(self):
        return R.pids_with_arg(str(self.b.tier_mnt), "tierfs")

    def stats(self):
        return self.b.tierfs_stats_json()

    def quiesce(self, timeout=900):
        st = self.stats()
        if R.jget(st, "writeback.dirty_bytes") is None:
            return None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = self.stats()
            # Deferred namespace operations (creates, mkdirs: writeback.namespace=back)
            # are on the store too.
            if not R.jget(st, "writeback.dirty_bytes") and \
                    not R.jget(st, "writeback.dirty_files") and \
                    not R.jget(st, "writeback.namespace.pending"):
                return time.monotonic() - t0
            time.sleep(0.2)
        R.log(f"{self.key}: still dirty after {timeout:.0f} s")
        return time.monotonic() - t0

    def describe(self):
        o = f" -o {','.join(self.opts())}" if self.opts() else ""
        return f"`tierfs mount {self.s.store_mnt_text()} {self.b.tier_mnt} --cache-dir " \
               f"{self.cache} --reset-cache{o}` (fresh cache per workload; kept across a remount)"


class TierfsDefault(Tierfs):
    """tierfs as a user would mount it over a network filesystem: no -o at all, only the
    cache dir in bench/work (the sshfs profile)."""
    key, label, short = "tierfs-default", "tierfs, default options", "tierfs-default"

    def opts(self) -> list:
        return []


class TierfsWB(Tierfs):
    key, label, short = "tierfs-wb", "tierfs write-back", "tierfs-wb"
    # The write-back contender keeps OPEN requests (fuse.no_open=off; meta.cto stays off,
    # so they are answered from the metadata cache): with FUSE no-open there is no OPEN to
    # give a file opened for writing only direct I/O (fuse.direct_write_only), and every
    # write would take the page-cache path.
    extra_opts = [WB_OPT, "fuse.no_open=off"]

    def setup(self, fresh=True):
        root = super().setup(fresh)
        st = self.stats()
        mode = (st or {}).get("writeback", {}).get("mode") if isinstance(st, dict) else None
        if "writeback.mode" in self.b.refused or (mode is not None and mode != "back"):
            self.unavailable = f"this tierfs refused `{WB_OPT}` (stats say mode={mode})"
            raise R.BenchError(self.unavailable)
        return root


class Rclone(Contender):
    key, label, short = "rclone", "rclone mount, --vfs-cache-mode full", "rclone"
    emulated = True
    caches = True

    def __init__(self, suite):
        super().__init__(suite)
        self.mnt = R.WORK / "mnt-rclone"
        self.cache = R.WORK / "cache-rclone"
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log = self.b.logs / "rclone.log"

    def cmd(self) -> list:
        return ["rclone", "mount", f":local:{self.b.store_mnt}", str(self.mnt),
                "--vfs-cache-mode", "full", "--cache-dir", str(self.cache),
                # the same metadata trust as tierfs's meta.ttl=1h (see Suite.tierfs_opts)
                "--dir-cache-time", "1h", "--attr-timeout", "1h",
                "--rc", "--rc-addr", f"127.0.0.1:{self.port}", "--rc-no-auth",
                "--log-level", "NOTICE", "--log-file", str(self.log)]

    def setup(self, fresh=True):
        self.s.ensure_store(fresh)
        if fresh and self.cache.exists():
            shutil.rmtree(self.cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        if R.is_mounted(self.mnt):
            R.run(["fusermount3", "-uz", self.mnt], 30, check=False)
        self.port = free_port()
        cmd = self.cmd()
        self.mount_cmds.append(shlex.join(cmd))
        R.log("mounting: " + shlex.join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.b.cleanup_hooks.append(("stop rclone", self.teardown))
        R.wait_mounted(self.mnt, 30, lambda: self.proc.poll() is None)
        self.root = self.mnt
        return self.root

    def rc(self, what: str) -> Optional[dict]:
        p = R.run(["rclone", "rc", "--url", f"http://127.0.0.1:{self.port}/", what], 30,
                  check=False)
        try:
            return json.loads(p.stdout) if p.returncode == 0 else None
        except ValueError:
            return None

    def pending_uploads(self) -> Optional[int]:
        st = self.rc("vfs/stats")
        dc = (st or {}).get("diskCache") or {}
        if "uploadsQueued" not in dc:
            return None
        return int(dc.get("uploadsQueued", 0)) + int(dc.get("uploadsInProgress", 0))

    def quiesce(self, timeout=900):
        if not self.proc or self.proc.poll() is not None:
            return None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            n = self.pending_uploads()
            if n is None:
                return None
            if n == 0:
                return time.monotonic() - t0
            time.sleep(0.2)
        R.log(f"rclone: uploads still pending after {timeout:.0f} s")
        return time.monotonic() - t0

    def teardown(self):
        if self.proc is None:
            return {}
        self.s.cg.kill()  # a leftover reader would keep the mount busy
        t0 = time.monotonic()
        # rclone's own way to stop a mount: SIGINT makes it unmount and exit (after a
        # plain `fusermount3 -u` it sometimes lingers for minutes with --rc on).
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            R.log("rclone did not exit 60 s after SIGINT: unmounting, SIGTERM")
            R.force_unmount(self.mnt)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if R.is_mounted(self.mnt):
            R.run(["fusermount3", "-uz", self.mnt], 30, check=False)
        self.proc = None
        return {"daemon_exit_s": time.monotonic() - t0}

    def pids(self):
        return [self.proc.pid] if self.proc and self.proc.poll() is None else []

    def describe(self):
        return "`" + shlex.join(self.cmd()).replace(f"127.0.0.1:{self.port}", "127.0.0.1:PORT") \
            .replace(f":local:{self.b.store_mnt}", f":local:{self.s.store_mnt_text()}") \
            + "` (fresh cache dir per workload, kept across a remount; `--rc` only to ask " \
            "`vfs/stats` whether uploads are pending)"


class Bindfs(Contender):
    key, label, short = "bindfs", "bindfs over the local disk (FUSE overhead)", "bindfs"

    def __init__(self, suite):
        super().__init__(suite)
        self.mnt = R.WORK / "mnt-bindfs"
        self.proc: Optional[subprocess.Popen] = None

    def cmd(self) -> list:
        return ["bindfs", "-f", str(self.b.backing), str(self.mnt)]

    def setup(self, fresh=True):
        self.mnt.mkdir(parents=True, exist_ok=True)
        if R.is_mounted(self.mnt):
            R.run(["fusermount3", "-uz", self.mnt], 30, check=False)
        cmd = self.cmd()
        self.mount_cmds.append(shlex.join(cmd))
        R.log("mounting: " + shlex.join(cmd))
        lf = open(self.b.logs / "bindfs.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=lf,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        lf.close()
        self.b.cleanup_hooks.append(("stop bindfs", self.teardown))
        R.wait_mounted(self.mnt, 20, lambda: self.proc.poll() is None)
        self.root = self.mnt
        return self.root

    def teardown(self):
        if self.proc is None:
            return {}
        self.s.cg.kill()
        R.force_unmount(self.mnt)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if R.is_mounted(self.mnt):
            R.run(["fusermount3", "-uz", self.mnt], 30, check=False)
        self.proc = None
        return {}

    def pids(self):
        return [self.proc.pid] if self.proc and self.proc.poll() is None else []

    def describe(self):
        return f"`{shlex.join(self.cmd())}` (bindfs defaults: single-threaded, no kernel " \
               "caching flags; O_DIRECT is cleared, so it reads the underlying file through " \
               "the page cache)"


ALL = [Local, Store, TierfsDefault, Tierfs, TierfsWB, Rclone, Bindfs]
KEYS = [c.key for c in ALL]
