"""What every bench/run workload shares: paths, running commands under `timeout`, tools,
the build, mounts and processes, drop_caches and memory priming, and `Bench`, which mounts
the emulated slow store (tierfs-slowfs) and tierfs over it and tears both down.

Imported by the suite (bench/lib/suite.py, contenders.py, workloads.py, report.py) and by the
single-workload reports (bench/lib/single.py, ssd.py, writerun.py); it imports none of them.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


# bench/lib/benchcore.py -> the repository
ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / "work"
RESULTS = BENCH / "results"
# cargo puts the binaries under $CARGO_TARGET_DIR when it is set (build() runs cargo with our
# environment and cwd=ROOT, so a relative one is relative to ROOT), else under <repo>/target.
TARGET = (ROOT / (os.environ.get("CARGO_TARGET_DIR") or "target")) / "release"
SLOWFS_BIN = TARGET / "tierfs-slowfs"
TIERFS_BIN = TARGET / "tierfs"
PLOT = BENCH / "lib" / "plot.py"
SYS_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
DEFAULT_SIZE = "4G"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


class Interrupted(Exception):
    pass


def run(cmd, timeout: float, check: bool = True, capture: bool = True, env=None, cwd=None):
    """Run `cmd` under coreutils timeout (plus a Python-side backstop)."""
    cmd = [str(c) for c in cmd]
    full = ["timeout", "--kill-after=10", f"{max(1, int(timeout))}s"] + cmd
    e = dict(os.environ, LC_ALL="C")
    if env:
        e.update(env)
    try:
        p = subprocess.run(
            full,
            capture_output=capture,
            text=True,
            env=e,
            cwd=cwd,
            timeout=timeout + 30,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"timed out after {timeout:.0f}s: {shlex.join(cmd)}")
    if p.returncode == 124:
        raise BenchError(f"timed out after {timeout:.0f}s: {shlex.join(cmd)}")
    if check and p.returncode != 0:
        err = (p.stderr or "").strip()[-2000:] if capture else ""
        raise BenchError(f"failed (rc={p.returncode}): {shlex.join(cmd)}\n{err}")
    return p


def parse_size(s: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", s.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (want e.g. 256M, 4G)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def human(n: float) -> str:
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"]:
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------------------------------
# Environment


def ensure_root() -> None:
    if os.geteuid() != 0:
        raise BenchError("must run as root (drop_caches, FUSE mounts)")


def apt_install(pkgs) -> bool:
    log(f"installing {' '.join(pkgs)} with apt-get")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    for attempt in range(2):
        p = run(["apt-get", "install", "-y", "--no-install-recommends", *pkgs], 900,
                check=False, env=env)
        if p.returncode == 0:
            return True
        if attempt == 0:
            run(["apt-get", "update"], 600, check=False, env=env)
    log(f"apt-get install {' '.join(pkgs)} failed")
    return False


def ensure_tools(need_fio: bool = False, extra=()) -> None:
    """`extra`: (binary, Debian package) pairs needed by a workload."""
    missing = []
    if not shutil.which("fusermount3"):
        missing.append("fuse3")
    if need_fio and not shutil.which("fio"):
        missing.append("fio")
    for binary, pkg in extra:
        if not shutil.which(binary) and pkg not in missing:
            missing.append(pkg)
    if missing and not apt_install(missing):
        raise BenchError(f"missing tools: {missing}")
    if not plotting_available():
        if not apt_install(["python3-matplotlib"]):
            apt_install(["gnuplot-nox"])


def plotting_available() -> bool:
    p = subprocess.run([SYS_PYTHON, "-c", "import matplotlib"], capture_output=True)
    return p.returncode == 0 or shutil.which("gnuplot") is not None


def build(skip_tierfs: bool) -> None:
    pkgs = ["-p", "tierfs-slowfs"] if skip_tierfs else ["-p", "tierfs-cli", "-p", "tierfs-slowfs",
                                                        "-p", "tierfs-netdelay"]
    log(f"cargo build --release {' '.join(pkgs)}")
    p = run(["cargo", "build", "--release", *pkgs], 3600, check=False, capture=False, cwd=ROOT)
    if p.returncode != 0:
        raise BenchError("cargo build failed (use --skip-tierfs to measure the slow store alone)")


def machine_info() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    commit = run(["git", "rev-parse", "HEAD"], 30, check=False, cwd=ROOT).stdout.strip() or "?"
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], 30, check=False,
                cwd=ROOT).stdout.strip()
    return {
        "commit": commit + (" (working tree has uncommitted changes)" if dirty else ""),
        "nproc": os.cpu_count(),
        "ram": f"{mem_kib / (1 << 20):.1f} GiB",
        "kernel": os.uname().release,
        "cpu": cpu,
        "load": loadavg(),
    }


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# Mounts and processes


def is_mounted(mnt: Path) -> bool:
    target = os.path.realpath(mnt)  # no stat of the mountpoint itself: it may be a dead FUSE
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp == target:
                    return True
    except OSError:
        pass
    return False


def wait_mounted(mnt: Path, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if is_mounted(mnt):
            return
        if not alive():
            raise BenchError(f"mount daemon for {mnt} exited before the mount appeared")
        time.sleep(0.05)
    raise BenchError(f"{mnt} not mounted after {timeout:.0f}s")


def force_unmount(mnt: Path) -> None:
    """Unmount cleanly if possible, lazily (-uz) otherwise."""
    if not is_mounted(mnt):
        return
    p = run(["fusermount3", "-u", mnt], 30, check=False)
    if p.returncode != 0 or is_mounted(mnt):
        log(f"fusermount3 -u {mnt} failed ({(p.stderr or '').strip()}); using -uz")
        run(["fusermount3", "-uz", mnt], 30, check=False)


def pids_with_arg(arg: str, exe_suffix: str):
    """Pids whose argv[0] ends with exe_suffix and whose argv contains `arg` exactly."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace").endswith(exe_suffix) and \
                arg.encode() in argv:
            out.append(int(d))
    return out


def wait_pids_gone(pids, timeout: float) -> list:
    t_end = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < t_end:
        left = [p for p in left if os.path.exists(f"/proc/{p}")]
        if left:
            time.sleep(0.1)
    return left


def drop_caches() -> None:
    run(["sync"], 300)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def prime_memory(nbytes: int) -> None:
    """FUSE-NOTES lesson 8: this VM returns freed pages to the host after drop_caches, and the
    first touch of such memory is slow (cold buffered reads land near 420-470 MB/s). Touch
    `nbytes` of memory (a /dev/shm file, then delete it) right before a measured read so page
    allocations during the read hit host-backed pages."""
    try:
        st = os.statvfs("/dev/shm")
        shm_free = st.f_bavail * st.f_frsize
    except OSError:
        return
    avail = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    n = min(nbytes, shm_free - (64 << 20), avail // 2)
    if n < (64 << 20):
        return
    path = "/dev/shm/tierfs-bench-prime"
    try:
        run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={n >> 20}"], 600)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


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


@dataclass
class Result:
    rows: list = field(default_factory=list)
    ratios: list = field(default_factory=list)  # (label, value)
    notes: list = field(default_factory=list)
    details: list = field(default_factory=list)  # (title, text) appended verbatim
    # A workload with its own report layout sets these instead of rows/ratios: `markdown` is
    # the report body (after the common header), `plot` a bench/lib/plot.py spec, `console`
    # what is printed at the end.
    markdown: Optional[str] = None
    plot: Optional[dict] = None
    console: Optional[str] = None
    # Optional plotter of its own: plot_fn(png_path) -> True when it wrote the PNG; `plot`
    # (lib/plot.py) is the fallback when it returns False.
    plot_fn: Optional[Callable[[Path], bool]] = None


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


def jget(d, path: str):
    """Number at dotted `path` of a stats dict; None when missing (older/newer tierfs)."""
    cur = d
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    if isinstance(cur, bool) or not isinstance(cur, (int, float)):
        return None
    return cur


def jdiff(a, b, path: str):
    va, vb = jget(a, path), jget(b, path)
    return None if va is None or vb is None else vb - va


def na(v, spec=",.0f", unit=""):
    if v is None:
        return "n/a"
    if spec.endswith("d") and not isinstance(v, int):
        v = int(v)
    return format(v, spec) + unit


def hbytes(v):
    return "n/a" if v is None else human(v)


def rx(v: float) -> str:
    """A ratio: 2 decimals, 3 when small."""
    return f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"


def slow_diff(s0, s1, key="bytes_read"):
    if not s0 or not s1 or key not in s0 or key not in s1:
        return None
    return s1[key] - s0[key]


def fs_info(path: Path) -> str:
    p = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", path], 30, check=False)
    return (p.stdout or "").strip() or "?"


def install_signals() -> None:
    def on_signal(signum, _frame):
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Python leaves SIGINT ignored when it starts ignored (a background job of a shell): then
    # `kill -INT` would not stop us. Ctrl-C/SIGINT always means clean up and stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
