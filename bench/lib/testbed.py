"""The test bed of one bench/run: `Bench` mounts the emulated slow store (tierfs-slowfs)
and tierfs over it, makes the test files, times reads through a mount (`Measurement`), reads
slowfs's and tierfs's counters, and tears everything down on exit (cleanup, its hooks first).
Built on bench/lib/benchcore.py; used by the suite (suitemain.py) and the single-workload
reports.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchcore import (SLOWFS_BIN, TIERFS_BIN, WORK, BenchError, drop_caches, force_unmount,
                       human, is_mounted, log, pids_with_arg, prime_memory, run,
                       wait_mounted, wait_pids_gone)


@dataclass
class Measurement:
    label: str
    key: str
    bytes: int = 0
    seconds: float = 0.0
    mbps: Optional[float] = None
    slow_bytes_read: Optional[int] = None
    slow_reads: Optional[int] = None
    slow_seeks: Optional[int] = None
    note: str = ""


class Bench:
    def __init__(self, args):
        self.args = args
        self.size = args.size_bytes
        self.backing = WORK / "backing"
        self.slow_mnt = WORK / "mnt-slow"
        # What tierfs and rclone mount on top of: the slowfs mount, or the sshfs mount of the
        # suite's `sshfs` profile (bench/lib/sshstore.py).
        self.store_mnt = self.slow_mnt
        self.tier_mnt = WORK / "mnt-tierfs"
        self.cache_dir = WORK / "cache"
        self.logs = WORK / "logs"
        self.mounted: list = []  # mountpoints we mounted, in order
        self.slowfs_proc: Optional[subprocess.Popen] = None
        self.slowfs_log: Optional[Path] = None
        self.emulation = ""
        # Extra teardown of a workload (reader cgroup, bindfs, ...): run first by cleanup(),
        # newest first; each must be idempotent.
        self.cleanup_hooks: list = []
        # Teardown of a store other than slowfs (the sshfs profile): run by cleanup() after
        # tierfs and the other mounts on top of it are gone; idempotent too.
        self.store_hooks: list = []
        # tierfs options/flags this binary refused (mount_tierfs_tolerant drops them).
        self.refused: list = []
        # Leftovers of an interrupted earlier run.
        for m in [self.tier_mnt, self.slow_mnt]:
            if is_mounted(m):
                log(f"stale mount {m} from an earlier run: unmounting")
                run(["fusermount3", "-uz", m], 30, check=False)
        for d in [self.backing, self.slow_mnt, self.tier_mnt, self.logs]:
            d.mkdir(parents=True, exist_ok=True)

    # -- data -------------------------------------------------------------------------------

    def test_file(self, name: str, size: int) -> Path:
        """A file of `size` random (incompressible) bytes in the backing dir, reused if present."""
        path = self.backing / name
        if path.exists() and path.stat().st_size == size:
            log(f"reusing {path} ({human(size)})")
            return path
        tmp = path.with_name(path.name + ".tmp")
        log(f"creating {path} ({human(size)} from /dev/urandom)")
        run(["sh", "-c", f'head -c {size} /dev/urandom > "$0"', tmp], max(300, size / 20e6))
        tmp.rename(path)
        return path

    # -- slowfs ----------------------------------------------------------------------------

    def mount_slowfs(self) -> None:
        args = self.args
        self.slowfs_log = self.logs / f"slowfs-{args.profile}.log"
        cmd = [str(SLOWFS_BIN), "--profile", args.profile, *args.slowfs_arg,
               str(self.backing), str(self.slow_mnt)]
        log("mounting: " + shlex.join(cmd))
        lf = open(self.slowfs_log, "w")
        # Own session: a terminal Ctrl-C reaches only us; we unmount in order in cleanup.
        self.slowfs_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=lf,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        lf.close()
        self.mounted.append(self.slow_mnt)
        wait_mounted(self.slow_mnt, 20, lambda: self.slowfs_proc.poll() is None)
        for line in self.slowfs_log.read_text().splitlines():
            if line.startswith("tierfs-slowfs: emulation "):
                self.emulation = line[len("tierfs-slowfs: emulation "):].split(" threads=")[0]
        log(f"slowfs: {self.emulation}")

    def slowfs_stats(self) -> Optional[dict]:
        """Counters of the running slowfs (SIGUSR1 makes it print them to its log)."""
        if not self.slowfs_proc or self.slowfs_proc.poll() is not None:
            return None

        def lines():
            return [ln for ln in self.slowfs_log.read_text().splitlines()
                    if ln.startswith("tierfs-slowfs: stats ")]

        before = len(lines())
        os.kill(self.slowfs_proc.pid, signal.SIGUSR1)
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end:
            ls = lines()
            if len(ls) > before:
                try:
                    return json.loads(ls[-1][len("tierfs-slowfs: stats "):])
                except ValueError:
                    pass  # the line is still being written
            time.sleep(0.02)
        return None

    def stop_slowfs(self) -> None:
        force_unmount(self.slow_mnt)
        if self.slow_mnt in self.mounted:
            self.mounted.remove(self.slow_mnt)
        p = self.slowfs_proc
        if p is None:
            return
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log("slowfs did not exit after unmount: SIGTERM")
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.slowfs_proc = None

    # -- tierfs ----------------------------------------------------------------------------

    def mount_tierfs(self, fresh_cache: bool = True) -> None:
        if fresh_cache and self.cache_dir.exists():
            shutil.rmtree(self.cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        opts = [f"ram.max={self.args.ram_max}", *self.args.tierfs_opt]
        cmd = [TIERFS_BIN, "mount", self.slow_mnt, self.tier_mnt, "--cache-dir", self.cache_dir,
               "-o", ",".join(opts)]
        log("mounting: " + shlex.join(str(c) for c in cmd))
        self.mounted.append(self.tier_mnt)
        run(cmd, 120)
        wait_mounted(self.tier_mnt, 30)

    def tierfs_stats(self) -> str:
        p = run([TIERFS_BIN, "stats", self.tier_mnt, "--json"], 60, check=False)
        if p.returncode != 0:
            return f"(tierfs stats failed, rc={p.returncode}: {(p.stderr or '').strip()})"
        try:
            return json.dumps(json.loads(p.stdout), indent=2, sort_keys=True)
        except ValueError:
            return p.stdout.strip()

    def unmount_tierfs(self, daemon_wait: float = 20) -> Optional[float]:
        """Unmounts tierfs and waits up to `daemon_wait` s for its daemon to exit (SIGTERM
        after that). Returns the seconds from unmount to daemon exit (None if it was killed).
        `tierfs unmount` first: it writes every dirty byte to the store, then unmounts (a
        daemon leaves what it has not written back 8 s after a plain unmount in its journal,
        for the next mount); an older binary without it is unmounted plainly."""
        pids = pids_with_arg(str(self.tier_mnt), "tierfs")
        t0 = time.monotonic()
        p = run([TIERFS_BIN, "unmount", self.tier_mnt], max(30.0, daemon_wait), check=False)
        if p.returncode != 0 and is_mounted(self.tier_mnt):
            log(f"tierfs unmount: rc={p.returncode} {(p.stderr or '').strip()[-300:]}; "
                "unmounting plainly")
            force_unmount(self.tier_mnt)
        if self.tier_mnt in self.mounted:
            self.mounted.remove(self.tier_mnt)
        left = wait_pids_gone(pids, daemon_wait)
        for pid in left:
            log(f"tierfs daemon {pid} still running {daemon_wait:.0f} s after unmount: SIGTERM")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return None if left else time.monotonic() - t0

    def mount_tierfs_tolerant(self, cache_dir: Path, reset: bool, opts: list,
                              extra_flags=("--reset-cache",), timeout: float = 300) -> list:
        """Mounts tierfs with `opts` (["k=v", ...]) and, when `reset`, `extra_flags`
        (options of newer tierfs versions). An option or flag this binary refuses (an
        "unknown option" / "unexpected argument" error) is dropped, remembered in
        self.refused (later mounts skip it) and the mount retried. Without reset the cache
        dir is kept as it is; with reset it is also emptied here (so a binary without
        --reset-cache starts empty too). Returns the command that mounted."""
        if reset and cache_dir.exists():
            shutil.rmtree(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(40):
            o = [x for x in opts if x.split("=", 1)[0] not in self.refused]
            flags = [f for f in (extra_flags if reset else ()) if f not in self.refused]
            cmd = [str(TIERFS_BIN), "mount", str(self.store_mnt), str(self.tier_mnt),
                   "--cache-dir", str(cache_dir), *flags] + (["-o", ",".join(o)] if o else [])
            log("mounting: " + shlex.join(cmd))
            self.mounted.append(self.tier_mnt)
            p = run(cmd, timeout, check=False)
            if p.returncode == 0:
                wait_mounted(self.tier_mnt, 30)
                return cmd
            self.mounted.remove(self.tier_mnt)
            err = (p.stderr or "").strip()
            m = re.search(r"option ([A-Za-z0-9_.\-]+)(?:=[^:\n]*)?: unknown option", err) or \
                re.search(r'unknown mount option "([^"]+)"', err) or \
                re.search(r"unexpected argument '(--?[A-Za-z0-9_\-]+)'", err)
            if not m or m.group(1) in self.refused:
                raise BenchError(f"tierfs mount failed (rc={p.returncode}): {shlex.join(cmd)}"
                                 f"\n{err[-2000:]}")
            log(f"tierfs refused {m.group(1)!r} ({err.splitlines()[-1] if err else ''}): "
                "dropping it and retrying")
            self.refused.append(m.group(1))
        raise BenchError("tierfs mount: too many refused options")

    def tierfs_stats_json(self) -> Optional[dict]:
        """`tierfs stats --json` of the running mount as a dict (None if that failed)."""
        p = run([TIERFS_BIN, "stats", "--json", self.tier_mnt], 60, check=False)
        if p.returncode != 0:
            return None
        try:
            v = json.loads(p.stdout)
        except ValueError:
            return None
        return v if isinstance(v, dict) else None

    # -- measuring -------------------------------------------------------------------------

    def dd_timeout(self) -> float:
        return max(180.0, self.size / 5e6)  # never slower than 5 MB/s

    def warm_backing(self, files) -> None:
        """Read backing files locally into the page cache, so slowfs's own backing reads are
        fast and only the emulated cost shows (a cold local disk read can exceed it)."""
        for f in files:
            run(["dd", f"if={f}", "of=/dev/null", "bs=4M"], max(120, f.stat().st_size / 50e6))

    def measure_read(self, path: Path, label: str, key: str, direct: bool = False,
                     prime: bool = True, backing_files=()) -> Measurement:
        """Sequential read of `path` with dd bs=1M after drop_caches, re-warming of the
        backing files (`backing_files`) and memory priming."""
        m = Measurement(label=label, key=key)
        drop_caches()
        self.warm_backing(backing_files)
        if prime and not self.args.no_prime:
            prime_memory(self.size)
        s0 = self.slowfs_stats()
        cmd = ["dd", f"if={path}", "of=/dev/null", "bs=1M"] + (["iflag=direct"] if direct else [])
        log(f"{label}: {' '.join(cmd)}")
        t0 = time.monotonic()
        p = run(cmd, self.dd_timeout(), check=False)
        wall = time.monotonic() - t0
        s1 = self.slowfs_stats()
        if p.returncode != 0:
            m.note = f"dd failed: {(p.stderr or '').strip().splitlines()[-1:]}"
            log(f"{label}: {m.note}")
            return m
        mt = re.search(r"^(\d+) bytes .* copied, ([\d.e+-]+) s,", p.stderr, re.M)
        if mt:
            m.bytes, m.seconds = int(mt.group(1)), float(mt.group(2))
        else:
            m.bytes, m.seconds = self.size, wall
        if m.bytes != self.size:
            m.note = f"read {m.bytes} of {self.size} bytes"
        m.mbps = m.bytes / m.seconds / 1e6 if m.seconds > 0 else None
        if s0 and s1:
            m.slow_bytes_read = s1["bytes_read"] - s0["bytes_read"]
            m.slow_reads = s1["reads"] - s0["reads"]
            m.slow_seeks = s1["seeks"] - s0["seeks"]
        if s0 and s1 and s1.get("late_us", 0) - s0.get("late_us", 0) >= 1000:
            late = s1["late_replies"] - s0["late_replies"]
            late_ms = (s1["late_us"] - s0["late_us"]) / 1000
            m.note = (m.note + "; " if m.note else "") + \
                f"slowfs missed {late} deadlines by {late_ms:.0f} ms total"
        log(f"{label}: {m.mbps:.1f} MB/s ({m.bytes} B in {m.seconds:.2f} s)"
            + (f", slow store served {human(m.slow_bytes_read)}"
               if m.slow_bytes_read is not None else "") + (f" [{m.note}]" if m.note else ""))
        return m

    # -- cleanup ---------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Unmount everything we mounted (tierfs first, it sits on slowfs); idempotent."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

        def attempt(what, fn):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - cleanup must go on
                log(f"cleanup: {what}: {e}")

        while self.cleanup_hooks:
            what, fn = self.cleanup_hooks.pop()
            attempt(what, fn)

        if self.tier_mnt in self.mounted or is_mounted(self.tier_mnt):
            attempt("unmount tierfs", self.unmount_tierfs)
            if is_mounted(self.tier_mnt):
                attempt("fusermount3 -uz tierfs",
                        lambda: run(["fusermount3", "-uz", self.tier_mnt], 30, check=False))
        for m in reversed(list(self.mounted)):
            if m != self.slow_mnt:
                attempt(f"fusermount3 -uz {m}",
                        lambda m=m: run(["fusermount3", "-uz", m], 30, check=False))
        while self.store_hooks:
            what, fn = self.store_hooks.pop()
            attempt(what, fn)
        attempt("stop slowfs", self.stop_slowfs)
        if is_mounted(self.slow_mnt):
            attempt("fusermount3 -uz slowfs",
                    lambda: run(["fusermount3", "-uz", self.slow_mnt], 30, check=False))
        if self.slowfs_proc and self.slowfs_proc.poll() is None:
            self.slowfs_proc.kill()
