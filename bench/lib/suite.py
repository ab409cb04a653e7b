"""The benchmark suite's runner (bench/run's suite entry point is bench/lib/suitemain.py).

`Suite` runs each workload (bench/lib/workloads.py) on each contender (bench/lib/contenders.py)
over the store of each profile (the emulated slow store, or the sshfs profile's real one):
the measuring helpers the workloads call (prepare, timed, served, remount), the contender
lifecycle (mount, measure, tear down), endurance counters and perf capture
(--profile-tierfs). A `Section` holds what one workload on one profile produced, for the
report. Everything mounted or started is stopped on exit, error, Ctrl-C or SIGTERM
(Bench.cleanup plus the hooks registered here).
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import benchcore as R
import contenders as C
import sshstore
from cgroup import ReaderCgroup

# The sshfs profile (a real sshfs mount, bench/lib/sshstore.py) compares these contenders only:
# the store, tierfs with its default options and with the suite's read-mostly tuning (and
# write-back, in the workloads that write), rclone.
SSHFS_CONTENDERS = ["store", "tierfs-default", "tierfs", "tierfs-wb", "rclone"]
SSHFS_ONLY = "the sshfs profile compares the store, tierfs (default options, tuned, and " \
             "write-back where it writes) and rclone only"
SUITE_SSD_OPTS = ["ssd.max_size=8G", "ssd.write_rate=1G", "ssd.write_burst=64G",
                  "meta.ttl=1h", "meta.cto=off"]


class Section:
    """What one workload on one profile produced."""

    def __init__(self, workload: str, profile: str, title: str):
        self.workload, self.profile, self.title = workload, profile, title
        self.md: list = []           # markdown body
        self.summary: list = []      # {"metric", "unit", "values": {key: v}, "tierfs": key}
        self.panels: list = []       # suiteplot panels
        self.cmds: list = []         # commands in order
        self.errors: dict = {}       # where -> message
        self.skipped: dict = {}      # contender key -> why it does not apply
        self.acc: dict = {}          # contender key -> endurance counters
        self.perf: list = []         # (label, summary text)
        self.daemon: dict = {}       # contender key -> teardown facts
        self.last_stats: dict = {}   # contender key -> its last `tierfs stats --json`
        self.seconds = 0.0
        self.emulation = ""
        self.store_details = ""      # sshfs profile: the link's measurements
        self.png: Optional[str] = None

    def cmd(self, c) -> None:
        s = c if isinstance(c, str) else shlex.join(str(x) for x in c)
        if s not in self.cmds[-3:]:
            self.cmds.append(s)

    def metric(self, metric: str, unit: str, values: dict, tierfs: str = "tierfs",
               note: str = "") -> None:
        self.summary.append({"metric": metric, "unit": unit, "values": values,
                             "tierfs": tierfs, "note": note})
        if tierfs == "tierfs" and self.profile == "sshfs":
            # the sshfs profile: the same row for tierfs with its default options
            self.summary.append({"metric": metric + " (tierfs-default)", "unit": unit,
                                 "values": values, "tierfs": "tierfs-default", "note": note})

    def add(self, *lines) -> None:
        self.md.extend(lines)


class Suite:
    def __init__(self, b, args, jobs: list):
        self.b, self.args, self.jobs = b, args, jobs
        self.quick = args.quick
        self.M = R.parse_size(args.ram_max)
        self.tierfs_opts = self._opts()
        self.cg = ReaderCgroup(max(64 << 20, self.M // 2))
        b.cleanup_hooks.append(("remove reader cgroup", self.cg.remove))
        self.sections: list = []
        self.profile: Optional[str] = None
        self.c = {cls.key: cls(self) for cls in C.ALL}
        self.perf_ok: Optional[str] = None  # None = not checked; "" = works; else why not
        self.perf_procs: dict = {}
        self.open_acc: dict = {}
        self.t_start = time.monotonic()
        shutil.rmtree(R.WORK / "perf", ignore_errors=True)  # perf data of this run only
        self.versions: dict = {}
        self.nofile = None
        self.hog_procs: list = []
        b.cleanup_hooks.append(("stop background jobs", self.kill_bg))
        self.store: Optional[sshstore.SshfsStore] = None  # the sshfs profile's store

    def _opts(self) -> list:
        # tierfs pauses SSD admission when the cache device would drop below
        # ssd.min_free_pct (default 10%) free: on a nearly full shared disk that would turn
        # every SSD-tier number into a RAM-tier-only number. Lowered (and said so) then.
        st = os.statvfs(R.WORK)
        self.disk_free_pct = 100.0 * st.f_bavail / st.f_blocks
        extra = []
        if self.disk_free_pct < 15 and not any(o.startswith("ssd.min_free_pct=")
                                               for o in self.args.tierfs_opt):
            extra = ["ssd.min_free_pct=1"]
            R.log(f"the cache disk is only {self.disk_free_pct:.0f}% free: adding "
                  "ssd.min_free_pct=1 (tierfs would pause its SSD tier below 10%)")
        self.min_free_note = (f"the cache disk was {self.disk_free_pct:.0f}% free at the start, "
                              "below tierfs's default guard (`ssd.min_free_pct=10`), so the "
                              "suite mounted tierfs with `ssd.min_free_pct=1`") if extra else ""
        opts: dict = {}
        for o in [f"ram.max={self.args.ram_max}", *SUITE_SSD_OPTS, *extra,
                  *self.args.tierfs_opt]:
            opts.pop(o.split("=", 1)[0], None)
            opts[o.split("=", 1)[0]] = o
        return list(opts.values())

    # -- slow store --------------------------------------------------------------------------

    def ensure_store(self, fresh: bool = False) -> None:
        """The store is up: slowfs mounted, or (sshfs profile) the sshd, relay and sshfs
        mount; with `fresh` the sshfs mount is a new one (empty sshfs caches, a new st_dev),
        as every contender's fresh start gets (slowfs caches nothing)."""
        if self.profile == "sshfs":
            if self.store is None:
                self.store = sshstore.SshfsStore(self.b, self.args.sshfs_delay_us)
                self.b.store_hooks.append(("tear down the sshfs store", self.store.teardown))
            if not self.store.up:
                self.store.setup()
            elif fresh:
                self.store.remount()
            else:
                self.store.setup()  # checks that it is still there
            self.b.store_mnt = sshstore.MNT
            self.b.emulation = self.store.describe()
            return
        if self.b.slowfs_proc is None or self.b.slowfs_proc.poll() is not None:
            self.b.args.profile = self.profile
            self.b.mount_slowfs()
        self.b.store_mnt = self.b.slow_mnt

    def slowfs_cmd(self) -> str:
        return " ".join([str(R.SLOWFS_BIN), "--profile", self.profile or "?",
                         *self.args.slowfs_arg, str(self.b.backing), str(self.b.slow_mnt)])

    def store_mnt_text(self) -> str:
        """The store's mountpoint for the report: one path, or both when the run used slowfs
        and sshfs profiles."""
        profs = {p for _, p in self.jobs}
        paths = ([str(self.b.slow_mnt)] if profs - {"sshfs"} else []) + \
            ([str(sshstore.MNT)] if "sshfs" in profs else [])
        return paths[0] if len(paths) == 1 else "{" + " | ".join(paths) + "}"

    def store_stats(self) -> Optional[dict]:
        """Counters of the store (slowfs's; sshfs: the relay's bytes each way)."""
        if self.profile == "sshfs":
            return self.store.stats() if self.store else None
        return self.b.slowfs_stats()

    def store_cmd(self) -> str:
        if self.profile == "sshfs":
            return shlex.join(self.store.sshfs_cmd()) if self.store else "sshfs (not mounted)"
        return self.slowfs_cmd()

    def switch_profile(self, profile: str) -> None:
        if profile == self.profile:
            return
        if self.b.slowfs_proc is not None:
            self.b.stop_slowfs()
        if self.store is not None and profile != "sshfs":
            self.store.teardown()
        self.profile = profile
        self.b.args.profile = profile
        self.b.emulation = ""
        self.ensure_store()

    def keys(self, keys: list) -> list:
        """The contenders of `keys` that run on the current profile (sshfs: SSHFS_CONTENDERS,
        with tierfs-default next to tierfs; elsewhere no tierfs-default)."""
        if self.profile != "sshfs":
            return [k for k in keys if k != "tierfs-default"]
        out = []
        for k in keys:
            if k == "tierfs" and "tierfs-default" not in keys:
                out.append("tierfs-default")
            if k in SSHFS_CONTENDERS:
                out.append(k)
        return out

    # -- background jobs (memory hog) ----------------------------------------------------------

    def kill_bg(self) -> None:
        for p in self.hog_procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.hog_procs = []

    # -- measuring helpers -------------------------------------------------------------------

    def prepare(self, c, warm_files=(), warm_dirs=(), prime: int = 0) -> None:
        """Before a measured step: sync + drop_caches; for contenders over the emulated store
        the backing files are read back into the page cache (slowfs's own backing reads must
        not be slower than the emulated device; local disk and bindfs are left cold); memory
        priming (FUSE-NOTES lesson 8)."""
        R.drop_caches()
        if c.emulated:
            self.b.warm_backing(warm_files)
            for d in warm_dirs:
                R.run(["sh", "-c", 'find "$0" -type f -print0 | xargs -0 -r cat > /dev/null', d],
                      3600)
        if prime and not self.args.no_prime:
            R.prime_memory(prime)

    def timed(self, sec: Section, cmd, timeout: float, cgroup: bool = True, ok_rc=(0,),
              inner: bool = False):
        """Runs cmd (in the reader cgroup unless cgroup=False); returns (seconds, process,
        slowfs counter deltas). inner: the seconds are taken by the shell that runs cmd, just
        around it (as `time CMD` would), without the harness's own process start and cgroup
        join (several ms: a third of a 1,000-file stat pass from the page cache)."""
        sec.cmd(cmd)
        if inner:
            cmd = ["bash", "-c", 's=$EPOCHREALTIME; "$@"; rc=$?; e=$EPOCHREALTIME; '
                   'echo "@@timed $s $e" >&2; exit $rc', "timed", *[str(c) for c in cmd]]
        s0 = self.store_stats()
        t0 = time.monotonic()
        p = R.run(self.cg.wrap(cmd) if cgroup else cmd, timeout, check=False)
        dt = time.monotonic() - t0
        s1 = self.store_stats()
        if inner:
            marks = [ln.split() for ln in (p.stderr or "").splitlines()
                     if ln.startswith("@@timed ")]
            if not marks or len(marks[-1]) != 3:
                raise R.BenchError(f"no inner timing from: {shlex.join(str(c) for c in cmd)}")
            # (EPOCHREALTIME uses the locale's decimal point.)
            dt = float(marks[-1][2].replace(",", ".")) - float(marks[-1][1].replace(",", "."))
            p.stderr = "\n".join(ln for ln in (p.stderr or "").splitlines()
                                 if not ln.startswith("@@timed "))
        if p.returncode not in ok_rc:
            raise R.BenchError(f"failed (rc={p.returncode}): "
                               f"{shlex.join(str(c) for c in cmd)}\n"
                               f"{(p.stderr or '').strip()[-800:]}")
        return dt, p, slow_delta(s0, s1)

    def served(self, sec: Section, key: str, read: int = 0, write: int = 0) -> None:
        a = sec.acc.setdefault(key, {})
        a["served_read"] = a.get("served_read", 0) + read
        a["served_write"] = a.get("served_write", 0) + write

    # -- contender lifecycle -----------------------------------------------------------------

    def each(self, sec: Section, keys: list, body: Callable, fresh: bool = True) -> None:
        """For each contender key: mount (fresh cache), run body(contender, root), tear down.
        A failure is recorded in sec.errors and the next contender runs. Endurance counters
        and (--profile-tierfs) perf run from mount to unmount."""
        run_keys = self.keys(keys)
        if self.profile == "sshfs":
            for key in keys:
                if key not in run_keys:
                    sec.skipped.setdefault(key, SSHFS_ONLY)
        for key in run_keys:
            if key in sec.skipped:
                continue
            c = self.c[key]
            R.log(f"--- {sec.workload}@{sec.profile}: {key} ---")
            a = sec.acc.setdefault(key, {})
            s0 = self.store_stats()
            try:
                c.setup(fresh)
                sec.cmd(f"# {key}: " + (c.mount_cmds[-1] if c.mount_cmds else c.describe()))
                self._open(sec, c)
                try:
                    body(c, c.root)
                finally:
                    self._close(sec, c)
            except (R.BenchError, OSError, ValueError, KeyError, TypeError, IndexError,
                    ZeroDivisionError, AttributeError) as e:
                # A bug or a surprise in one contender's run must not cost the others.
                sec.errors[key] = describe_error(e)
                R.log(f"{sec.workload}: {key} failed: {sec.errors[key]}")
                if isinstance(c, C.TierfsWB) and c.unavailable:
                    sec.skipped[key] = c.unavailable
            finally:
                self.cg.kill()
                try:
                    info = c.teardown()
                    if info:
                        sec.daemon.setdefault(key, []).append(info)
                except R.BenchError as e:
                    sec.errors[f"{key} teardown"] = str(e)
                self._perf_report(sec, c)
                s1 = self.store_stats()
                d = slow_delta(s0, s1)
                a["store_read"] = a.get("store_read", 0) + (d.get("bytes_read") or 0)
                a["store_written"] = a.get("store_written", 0) + (d.get("bytes_written") or 0)

    def remount(self, sec: Section, c, fresh: bool = False) -> float:
        """Unmount and mount again keeping the cache (`fresh`: with an empty cache, as at the
        start); counters and perf follow."""
        self._close(sec, c)
        self._perf_report(sec, c)
        dt = c.remount(fresh)
        sec.cmd(f"# {c.key}: remount ({'empty cache' if fresh else 'cache kept'}): " +
                (c.mount_cmds[-1] if c.mount_cmds else "-"))
        self._open(sec, c)
        return dt

    def _open(self, sec, c) -> None:
        self.open_acc[c.key] = (C.daemon_io(c.pids()), c.stats())
        if self.args.profile_tierfs and isinstance(c, C.Tierfs):
            self._perf_start(sec, c)

    def _close(self, sec, c) -> None:
        if c.key not in self.open_acc:
            return
        io0, st0 = self.open_acc.pop(c.key)
        io1, st1 = C.daemon_io(c.pids()), c.stats()
        a = sec.acc.setdefault(c.key, {})

        def add(name, v):
            if v is not None:
                a[name] = a.get(name, 0) + v

        add("disk_write", (io1.get("write_bytes") or 0) - (io0.get("write_bytes") or 0)
            if io1 and io0 else None)
        if st1 is not None:
            sec.last_stats[c.key] = st1
            for name, path in (("ssd_written", "ssd.written_bytes"),
                               ("journal_written", "writeback.journal.bytes_appended"),
                               ("t_read", "read_bytes"), ("t_write", "write_bytes"),
                               ("backing_read", "backing.read_bytes"),
                               ("ram_hit", "ram.hit_bytes"), ("ssd_hit", "ssd.hit_bytes")):
                add(name, R.jdiff(st0, st1, path) if st0 is not None else R.jget(st1, path))
        self._perf_stop(c)

    # -- perf (--profile-tierfs) ---------------------------------------------------------------

    def _perf_check(self) -> str:
        if self.perf_ok is not None:
            return self.perf_ok
        if not shutil.which("perf"):
            R.apt_install(["linux-perf"])
        if not shutil.which("perf"):
            self.perf_ok = "perf not installed (apt-get install linux-perf failed)"
            return self.perf_ok
        p = R.run(["perf", "record", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"], 60,
                  check=False)
        self.perf_ok = "" if p.returncode == 0 else \
            f"`perf record` does not work here: {(p.stderr or '').strip()[-200:]}"
        return self.perf_ok

    def _perf_start(self, sec, c) -> None:
        if self._perf_check():
            return
        pids = c.pids()
        if not pids:
            return
        d = R.WORK / "perf"
        d.mkdir(parents=True, exist_ok=True)
        n = len(list(d.glob(f"{sec.workload}-{sec.profile}-{c.key}-*.data")))
        out = d / f"{sec.workload}-{sec.profile}-{c.key}-{n + 1}.data"
        cmd = ["perf", "record", "-e", "cpu-clock", "-g", "-p", ",".join(map(str, pids)),
               "-o", str(out)]
        sec.cmd(cmd)
        lf = open(self.b.logs / "perf.log", "a")
        p = subprocess.Popen(cmd, stdout=lf, stderr=lf, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        lf.close()
        self.perf_procs[c.key] = (p, out)
        self.b.cleanup_hooks.append(("stop perf", lambda k=c.key: self._perf_stop_key(k)))

    def _perf_stop(self, c) -> None:
        self._perf_stop_key(c.key)

    def _perf_stop_key(self, key) -> None:
        p, out = self.perf_procs.get(key, (None, None))
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def _perf_report(self, sec, c) -> None:
        p, out = self.perf_procs.pop(c.key, (None, None))
        if out is None:
            return
        if not out.exists():
            sec.perf.append((f"{c.key}", "(perf wrote no data)"))
            return
        parts = []
        for sort, limit in (("dso", 2), ("sym", 1.5)):
            q = R.run(["perf", "report", "-i", out, "--stdio", "--no-children", "-g", "none",
                       "--sort", sort, "--percent-limit", str(limit)], 300, check=False)
            rows = [ln.rstrip() for ln in (q.stdout or "").splitlines()
                    if re.match(r"\s+\d+\.\d+%", ln)]
            samples = re.search(r"# Samples: (\S+)", q.stdout or "")
            parts.append(f"by {sort} (>= {limit}% of samples"
                         + (f", {samples.group(1)} samples" if samples else "") + "):")
            parts += rows[:14] or [f"  (none; {(q.stderr or '').strip()[-200:]})"]
        sec.perf.append((f"{c.key}, {out.name}", "\n".join(parts)))

    # -- driver --------------------------------------------------------------------------------

    def raise_nofile(self) -> None:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 20
        try:
            want = min(int(Path("/proc/sys/fs/nr_open").read_text()), want)
        except (OSError, ValueError):
            pass
        for lim in ((want, max(want, hard)), (hard, hard)):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, lim)
                break
            except (ValueError, OSError):
                continue
        self.nofile = ((soft, hard), resource.getrlimit(resource.RLIMIT_NOFILE))

    def collect_versions(self) -> None:
        def first(cmd):
            p = R.run(cmd, 30, check=False)
            return ((p.stdout or "") + (p.stderr or "")).strip().splitlines()[0:1] or ["?"]

        self.versions = {
            "tierfs": R.machine_info()["commit"] + f" (`{R.TIERFS_BIN}`)",
            "tierfs-slowfs": str(R.SLOWFS_BIN),
            "rclone": first(["rclone", "version"])[0] + " (Debian package "
            + first(["dpkg-query", "-W", "-f=${Version}", "rclone"])[0] + ")",
            "bindfs": first(["bindfs", "--version"])[0],
            "fio": first(["fio", "--version"])[0],
            "stress-ng": first(["stress-ng", "--version"])[0],
            "fuse3": first(["dpkg-query", "-W", "-f=${Version}", "fuse3"])[0],
            "python": sys.version.split()[0],
        }
        if any(p == "sshfs" for _, p in self.jobs):
            st = sshstore.SshfsStore(self.b)
            st.collect_versions()
            self.versions["sshfs"] = f"{st.versions['sshfs']} (FUSE library " \
                                     f"{st.versions['sshfs_fuse']})"
            self.versions["openssh"] = st.versions["openssh"]
            self.versions["tierfs-netdelay"] = str(sshstore.NETDELAY_BIN)
        if self.args.profile_tierfs:
            self.versions["perf"] = first(["perf", "--version"])[0] \
                if shutil.which("perf") else "not installed"

    def run(self) -> None:
        import suiteworkloads
        import workloads as W
        self.raise_nofile()
        R.ensure_tools(need_fio=True, extra=[("bindfs", "bindfs"), ("rclone", "rclone"),
                                             ("stress-ng", "stress-ng"), ("tar", "tar"),
                                             ("md5sum", "coreutils"), ("fincore", "util-linux")])
        if any(p == "sshfs" for _, p in self.jobs):
            sshstore.ensure_tools()
        self.collect_versions()
        for wl, prof in self.jobs:
            self.switch_profile(prof)
            fn, title = suiteworkloads.WORKLOADS[wl]
            sec = Section(wl, prof, title)
            sec.emulation = self.b.emulation
            if prof == "sshfs" and self.store is not None:
                sec.store_details = self.store.details()
            self.sections.append(sec)
            R.log(f"=== workload {wl} on {prof} ===")
            t0 = time.monotonic()
            try:
                fn(self, sec)
            except (R.BenchError, OSError, ValueError, KeyError, TypeError, IndexError,
                    ZeroDivisionError, AttributeError) as e:
                sec.errors["workload"] = describe_error(e)
                R.log(f"workload {wl} failed: {sec.errors['workload']}")
            sec.seconds = time.monotonic() - t0
            R.log(f"=== workload {wl} on {prof}: {sec.seconds:.0f} s ===")
        self.t_total = time.monotonic() - self.t_start


def describe_error(e: Exception) -> str:
    """A BenchError's message; for anything else (a harness bug) its type, message and the
    innermost frame, so the report shows where it happened."""
    if isinstance(e, R.BenchError):
        return str(e)
    import traceback
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def slow_delta(s0, s1) -> dict:
    if not s0 or not s1:
        return {}
    return {k: s1[k] - s0.get(k, 0) for k in s1 if isinstance(s1.get(k), int)}
