"""What every bench/run workload shares: paths, running commands under `timeout`, tools,
the build, mounts and processes, drop_caches and memory priming, a report's `Result`, and
number formats. `Bench`, which mounts the emulated slow store (tierfs-slowfs) and tierfs over
it and tears both down, is in bench/lib/testbed.py.

Imported by testbed.py, the suite (bench/lib/suite.py, contenders.py, the workloads, report.py)
and the single-workload reports (bench/lib/single.py, ssd.py, writerun.py); it imports none of
them.
"""
import argparse
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
