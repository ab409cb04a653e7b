"""`bench/run --workload ssd`: the SSD-tier acceptance run (issue 3 point 6; bench/README.md,
"ssd"): raw cache device, bindfs and tierfs with fio, the md5 loop in a memory cgroup, grep -r
over small files after a remount; one report with PASS/FAIL per target (ssdreport.py)."""
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import ssdreport
from benchcore import (SLOWFS_BIN, WORK, BenchError, Result, drop_caches, ensure_tools,
                       force_unmount, hbytes, human, is_mounted, jdiff, jget, log, na,
                       parse_size, prime_memory, run, slow_diff, wait_mounted)
from cgroup import ReaderCgroup
from testbed import Bench
from testdata import GREP_FILES_PER_DIR, GREP_MARKER, make_grep_tree

SSD_DEFAULT_OPTS = ["ssd.max_size=8G", "ssd.write_rate=1G", "ssd.write_burst=64G",
                    "meta.ttl=1h", "meta.cto=off"]
SSD_STATS_KEYS = ["hits", "misses", "hit_bytes", "written_bytes", "admitted", "dropped_budget",
                  "dropped_queue", "write_rate", "write_burst", "cur_burst", "fill_bytes",
                  "cap_bytes", "segments", "entries", "checksum_errors", "reinsertions",
                  "reclaimed_segments", "rebuild_ms", "rebuilt_entries"]
SSD_PHASES = ["raw", "bindfs", "tierfs", "md5", "grep"]


class SsdRun:
    """The phases of the `ssd` workload: each records its numbers in self.m and its commands
    in self.cmds; ssdreport.result() turns them into the summary, the phase sections and the
    plot."""

    def __init__(self, b: Bench):
        self.b = b
        a = b.args
        self.quick = a.quick
        self.runtime = a.fio_runtime or (8 if a.quick else 20)
        self.ramp = 2
        self.ram_max = parse_size(a.ram_max)
        self.file = None
        self.file_size = b.size
        self.md5_size = parse_size(a.md5_size) if a.md5_size else 2 * self.ram_max
        self.reader_mem = parse_size(a.reader_mem) if a.reader_mem else \
            max(64 << 20, self.ram_max // 2)
        self.grep_files = a.grep_files or (10_000 if a.quick else 100_000)
        self.grep_seed = a.grep_seed
        self.md5_passes = a.md5_passes
        self.md5_direct_passes = a.md5_direct_passes or (1 if a.quick else 2)
        self.phases = [p.strip() for p in a.phases.split(",") if p.strip()]
        bad = [p for p in self.phases if p not in SSD_PHASES]
        if bad:
            raise BenchError(f"unknown --phases {bad} (known: {','.join(SSD_PHASES)})")
        # Options: ram.max, the SSD/meta defaults, then --tierfs-opt (same key overrides).
        opts: dict = {}
        for o in [f"ram.max={a.ram_max}", *SSD_DEFAULT_OPTS, *a.tierfs_opt]:
            k = o.split("=", 1)[0]
            opts.pop(k, None)
            opts[k] = o
        self.opts = list(opts.values())
        self.cmds: dict = {p: [] for p in SSD_PHASES}
        self.all_phases = SSD_PHASES  # every phase, in order: for ssdreport.py
        self.m: dict = {}
        self.errors: dict = {}
        self.details: list = []
        self.bindfs: Optional[tuple] = None
        self.cg: Optional[ReaderCgroup] = None
        self.last_slow: dict = {}
        if self.file_size <= self.ram_max:
            log(f"warning: file ({human(self.file_size)}) not larger than ram.max")

    # -- helpers ---------------------------------------------------------------------------

    def cmd(self, phase: str, cmd) -> None:
        self.cmds[phase].append(shlex.join(str(c) for c in cmd))

    def prepare(self, warm_files=(), warm_dirs=(), prime: int = 0) -> None:
        """Before every measured step: sync + drop_caches, re-read the slow store's backing
        files into the page cache (slowfs's own backing reads must never be slower than the
        emulated device), prime memory (FUSE-NOTES lesson 8)."""
        drop_caches()
        self.b.warm_backing(warm_files)
        for d in warm_dirs:
            run(["sh", "-c", 'find "$0" -type f -print0 | xargs -0 -r cat > /dev/null', d],
                3600)
        if prime and not self.b.args.no_prime:
            prime_memory(prime)

    def fio(self, phase: str, kind: str, path: Path) -> dict:
        if kind == "seq":
            job = ["--rw=read", "--bs=1M", "--iodepth=16"]
        else:
            job = ["--rw=randread", "--bs=4k", "--iodepth=32", "--norandommap",
                   "--randrepeat=0"]
        cmd = ["fio", f"--name={phase}-{kind}",
               "--filename=" + str(path).replace(":", "\\:"), "--ioengine=libaio",
               "--direct=1", "--readonly", *job, "--numjobs=1", f"--ramp_time={self.ramp}",
               f"--runtime={self.runtime}", "--time_based", "--output-format=json"]
        self.cmd(phase, cmd)
        log(f"{phase}: fio {kind} on {path}")
        p = run(self.cg.wrap(cmd), self.runtime + self.ramp + 300, check=False)
        r: dict = {"ok": False}
        try:
            j = json.loads(p.stdout[p.stdout.index("{"):])
            jb = j["jobs"][0]
            if jb.get("error"):
                raise ValueError(f"fio job error {jb['error']}")
            rd = jb["read"]
            if not rd.get("io_bytes"):
                raise ValueError("fio read nothing")
            pct = rd.get("clat_ns", {}).get("percentile", {})
            r = {"ok": True, "mbps": rd["bw_bytes"] / 1e6, "iops": rd["iops"],
                 "lat_us": rd["lat_ns"]["mean"] / 1000,
                 "p99_us": pct["99.000000"] / 1000 if "99.000000" in pct else None,
                 "io_bytes": rd["io_bytes"], "runtime_s": rd["runtime"] / 1000}
            log(f"{phase} {kind}: {r['mbps']:.1f} MB/s, {r['iops']:.0f} IOPS, "
                f"mean latency {r['lat_us']:.0f} us")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            err = (p.stderr or "").strip()[-400:] or str(e)
            r["error"] = f"fio failed (rc={p.returncode}): {err}"
            log(f"{phase} {kind}: {r['error']}")
        return r

    def resident(self, paths) -> Optional[int]:
        """Bytes of `paths` (files, or directories walked) in the page cache (fincore)."""
        files = []
        for p in paths:
            p = Path(p)
            if p.is_dir():
                files += [Path(r) / f for r, _, fs in os.walk(p) for f in fs]
            elif p.exists():
                files.append(p)
        if not files or not shutil.which("fincore"):
            return None if not shutil.which("fincore") else 0
        total = 0
        for i in range(0, len(files), 500):
            q = run(["fincore", "-b", "-n", "-o", "RES", *files[i:i + 500]], 120, check=False)
            for line in (q.stdout or "").split():
                if line.isdigit():
                    total += int(line)
        return total

    def timed(self, phase: str, cmd, timeout: float, ok_rc=(0,)):
        """Runs a reader in the cgroup; returns (seconds, process, slowfs bytes served).
        self.last_slow: all slowfs counter deltas of that run (reads, seeks, late_us...)."""
        self.cmd(phase, cmd)
        s0 = self.b.slowfs_stats()
        t0 = time.monotonic()
        p = run(self.cg.wrap(cmd), timeout, check=False)
        dt = time.monotonic() - t0
        s1 = self.b.slowfs_stats()
        self.last_slow = {k: slow_diff(s0, s1, k) for k in (s1 or {})
                          if isinstance((s1 or {}).get(k), int)}
        if p.returncode not in ok_rc:
            raise BenchError(f"failed (rc={p.returncode}): {shlex.join(str(c) for c in cmd)}\n"
                             f"{(p.stderr or '').strip()[-1000:]}")
        return dt, p, slow_diff(s0, s1)

    def mount(self, phase: str, cache: Path, reset: bool) -> float:
        t0 = time.monotonic()
        cmd = self.b.mount_tierfs_tolerant(cache, reset, self.opts)
        dt = time.monotonic() - t0
        self.cmd(phase, cmd)
        return dt

    def stats(self) -> Optional[dict]:
        return self.b.tierfs_stats_json()

    def dump(self, title: str, st: Optional[dict]) -> None:
        self.details.append((title, json.dumps(st, indent=2, sort_keys=True) if st is not None
                             else "(tierfs stats --json failed)"))

    def ssd_settle(self, limit: float = 60) -> Optional[dict]:
        """Waits until the SSD tier's written_bytes and fill_bytes stop moving (writes are
        queued behind reads), at most `limit` s. Returns the last stats."""
        st = self.stats()
        if jget(st, "ssd.written_bytes") is None and jget(st, "ssd.fill_bytes") is None:
            return st
        t_end, same, last = time.monotonic() + limit, 0, None
        while time.monotonic() < t_end and same < 4:
            time.sleep(0.5)
            st = self.stats()
            cur = (jget(st, "ssd.written_bytes"), jget(st, "ssd.fill_bytes"))
            same = same + 1 if cur == last else 0
            last = cur
        return st

    def ssd_table(self, st: Optional[dict]) -> list:
        ssd = st.get("ssd") if isinstance(st, dict) else None
        if not isinstance(ssd, dict):
            return ["(no `ssd` object in `tierfs stats --json`: this tierfs has no SSD tier)"]
        cells = [f"{k}={na(jget(st, 'ssd.' + k), 'd')}" for k in SSD_STATS_KEYS]
        return ["`ssd`: " + ", ".join(cells)]

    # -- phase 1: raw cache device ---------------------------------------------------------

    def phase_raw(self, key: str) -> None:
        for kind in ("seq", "rand"):
            self.prepare(prime=self.file_size)
            self.m[f"{key}_{kind}"] = self.fio("raw", kind, self.file)

    # -- phase 2: bindfs -------------------------------------------------------------------

    BINDFS_VARIANTS = [
        ("bindfs", [], "bindfs defaults: single-threaded; O_DIRECT is cleared, so bindfs reads "
                       "the underlying file through its page cache (cold at the start)"),
        ("bindfs-mt-odirect", ["--multithreaded", "--forward-odirect=4096"],
         "`--multithreaded --forward-odirect=4096`: libfuse worker threads, O_DIRECT forwarded "
         "(every read goes to the disk)"),
    ]

    def mount_bindfs(self, flags) -> Path:
        mnt = WORK / "mnt-bindfs"
        mnt.mkdir(parents=True, exist_ok=True)
        if is_mounted(mnt):
            run(["fusermount3", "-uz", mnt], 30, check=False)
        cmd = ["bindfs", "-f", *flags, str(self.b.backing), str(mnt)]
        self.cmd("bindfs", cmd)
        log("mounting: " + shlex.join(cmd))
        lf = open(self.b.logs / "bindfs.log", "a")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=lf,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        lf.close()
        self.bindfs = (proc, mnt)
        self.b.cleanup_hooks.append(("stop bindfs", self.stop_bindfs))
        wait_mounted(mnt, 20, lambda: proc.poll() is None)
        return mnt

    def stop_bindfs(self) -> None:
        if not self.bindfs:
            return
        proc, mnt = self.bindfs
        self.cg.kill()  # an interrupted reader would keep the mount busy
        force_unmount(mnt)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if is_mounted(mnt):
            run(["fusermount3", "-uz", mnt], 30, check=False)
        self.bindfs = None

    def phase_bindfs(self) -> None:
        for name, flags, _ in self.BINDFS_VARIANTS:
            mnt = self.mount_bindfs(flags)
            try:
                for kind in ("seq", "rand"):
                    self.prepare(prime=self.file_size)
                    r = self.fio("bindfs", kind, mnt / self.file.name)
                    r["resident_after"] = self.resident([self.file])
                    self.m[f"{name}_{kind}"] = r
            finally:
                self.stop_bindfs()

    # -- phase 3: tierfs over slowfs, data from the SSD tier -------------------------------

    def phase_tierfs(self) -> None:
        b, f, size = self.b, self.file, self.file_size
        cache = WORK / "cache-ssd"
        self.m["tierfs_mount_s"] = self.mount("tierfs", cache, reset=True)
        try:
            path = b.tier_mnt / f.name
            warm = []
            for i in (1, 2):
                self.prepare(warm_files=[f], prime=size)
                dt, p, slow = self.timed("tierfs", ["dd", f"if={path}", "of=/dev/null",
                                                    "bs=1M"], b.dd_timeout())
                st = self.ssd_settle()
                fill = jget(st, "ssd.fill_bytes")
                warm.append({"pass": i, "mbps": size / dt / 1e6, "seconds": dt,
                             "slow_bytes": slow, "fill": fill,
                             "entries": jget(st, "ssd.entries"),
                             "written": jget(st, "ssd.written_bytes")})
                log(f"tierfs warm-up pass {i}: {size / dt / 1e6:.1f} MB/s, slow store served "
                    f"{hbytes(slow)}, ssd.fill_bytes {na(fill, 'd')}")
                self.dump(f"phase 3: tierfs stats after warm-up pass {i}", st)
                if fill is not None and fill >= 0.95 * size:
                    break
            self.m["warm"] = warm
            last = warm[-1]
            self.m["ssd_holds"] = None if last["fill"] is None else last["fill"] >= 0.95 * size
            self.m["ssd_after_warm"] = self.ssd_table(st)
            for kind in ("seq", "rand"):
                self.prepare(warm_files=[f], prime=size)
                s0, t0 = b.slowfs_stats(), self.stats()
                r = self.fio("tierfs", kind, path)
                s1, t1 = b.slowfs_stats(), self.stats()
                r["slow_bytes"] = slow_diff(s0, s1)
                r["slow_reads"] = slow_diff(s0, s1, "reads")
                r["ssd_hit_bytes"] = jdiff(t0, t1, "ssd.hit_bytes")
                r["ssd_misses"] = jdiff(t0, t1, "ssd.misses")
                r["ram_hit_bytes"] = jdiff(t0, t1, "ram.hit_bytes")
                r["resident_after"] = self.resident([cache])
                self.m[f"tierfs_{kind}"] = r
            self.dump("phase 3: tierfs stats after the fio jobs", self.stats())
            if not b.args.no_verify:
                log("verifying the file through tierfs against the backing file (cmp, untimed)")
                c = ["cmp", str(f), str(path)]
                self.cmd("tierfs", c)
                p = run(self.cg.wrap(c), b.dd_timeout() * 2, check=False)
                self.m["tierfs_cmp"] = "identical" if p.returncode == 0 else \
                    f"MISMATCH: {(p.stdout + p.stderr).strip()[-300:]}"
        finally:
            self.cg.kill()
            b.unmount_tierfs(daemon_wait=120)

    # -- phase 4: md5 loop -----------------------------------------------------------------

    def md5_loop(self, phase: str, path: Path, passes: int, ref: str, tierfs: bool) -> list:
        out = []
        for k in range(1, passes + 1):
            t0 = self.stats() if tierfs else None
            dt, p, slow = self.timed(phase, ["md5sum", path], max(600, self.md5_size / 2e6))
            t1 = self.stats() if tierfs else None
            got = (p.stdout or "").split()[0] if (p.stdout or "").split() else "?"
            r = {"pass": k, "seconds": dt, "mbps": self.md5_size / dt / 1e6, "slow_bytes": slow,
                 "slow_reads": self.last_slow.get("reads"),
                 "slow_seeks": self.last_slow.get("seeks"), "md5_ok": got == ref,
                 "ram_hit_bytes": jdiff(t0, t1, "ram.hit_bytes"),
                 "ssd_hit_bytes": jdiff(t0, t1, "ssd.hit_bytes")}
            log(f"{phase} pass {k}: {r['mbps']:.1f} MB/s ({dt:.2f} s), slow store served "
                f"{hbytes(slow)}" + ("" if r["md5_ok"] else f", MD5 MISMATCH {got}"))
            out.append(r)
        return out

    def phase_md5(self) -> None:
        b = self.b
        f = b.test_file(f"md5-{self.md5_size >> 20}M.bin", self.md5_size)
        c = ["md5sum", str(f)]
        ref = run(c, max(300, self.md5_size / 50e6)).stdout.split()[0]
        self.m["md5_ref"] = ref
        self.m["md5_file"] = f.name
        self.m["md5_mount_s"] = self.mount("md5", WORK / "cache-md5", reset=True)
        try:
            self.prepare(warm_files=[f], prime=self.md5_size)
            self.cg.reset_peak()
            self.m["md5_tierfs"] = self.md5_loop("md5", b.tier_mnt / f.name, self.md5_passes,
                                                 ref, True)
            self.m["md5_cgroup_peak"] = self.cg.peak()
            self.dump("phase 4: tierfs stats after the md5 loop", self.stats())
        finally:
            self.cg.kill()
            b.unmount_tierfs(daemon_wait=120)
        self.prepare(warm_files=[f], prime=self.md5_size)
        self.m["md5_direct"] = self.md5_loop("md5", b.slow_mnt / f.name,
                                             self.md5_direct_passes, ref, False)

    # -- phase 5: grep over many small files -----------------------------------------------

    def grep_tree(self) -> tuple:
        return make_grep_tree(self.b.backing, self.grep_files, self.grep_seed)

    def grep(self, root: Path, man: dict) -> dict:
        cmd = ["grep", "-r", "-l", GREP_MARKER.decode(), str(root)]
        # rc 2: some files could not be read; the run is reported (and fails) with the count.
        dt, p, slow = self.timed("grep", cmd, 300 + man["files"] * 0.05, ok_rc=(0, 1, 2))
        found = len((p.stdout or "").splitlines())
        errs = [ln for ln in (p.stderr or "").splitlines() if ln.startswith("grep:")]
        r = {"seconds": dt, "files_s": man["files"] / dt, "mbps": man["bytes"] / dt / 1e6,
             "slow_bytes": slow, "found": found,
             "ok": found == man["markers"] and not errs, "errors": len(errs),
             "first_error": errs[0] if errs else "", "slow": dict(self.last_slow)}
        if errs:
            log(f"grep -r: {len(errs)} errors, first: {errs[0]}")
        log(f"grep -r: {man['files']} files in {dt:.1f} s = {r['files_s']:,.0f} files/s, "
            f"slow store served {hbytes(slow)}, {found} matches (expected {man['markers']}); "
            f"slowfs counters: {self.last_slow}")
        return r

    def phase_grep(self) -> None:
        b = self.b
        tree, man = self.grep_tree()
        self.m["grep_tree"] = (tree, man)
        cache = WORK / "cache-grep"
        root = b.tier_mnt / tree.name
        self.m["grep_mount1_s"] = self.mount("grep", cache, reset=True)
        try:
            self.prepare(warm_dirs=[tree], prime=man["bytes"])
            self.m["grep_cold"] = self.grep(root, man)
            st = self.stats()
            self.dump("phase 5: tierfs stats after the cold grep", st)
            self.m["grep_ssd_cold"] = self.ssd_table(st)
        finally:
            self.cg.kill()
            self.m["grep_daemon_exit_s"] = b.unmount_tierfs(daemon_wait=300)
        self.cmd("grep", ["fusermount3", "-u", b.tier_mnt])
        self.cmd("grep", ["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        self.prepare(warm_dirs=[tree], prime=man["bytes"])
        self.m["grep_mount2_s"] = self.mount("grep", cache, reset=False)
        try:
            st0 = self.stats()
            self.m["grep_ssd_remount"] = self.ssd_table(st0)
            self.m["grep_remount"] = self.grep(root, man)
            st = self.stats()
            self.m["grep_remount"]["ssd_hit_bytes"] = jdiff(st0, st, "ssd.hit_bytes")
            self.m["grep_remount"]["backing_ops"] = {
                k: jdiff(st0, st, f"backing.{k}") for k in ("lookup", "getattr", "open",
                                                             "read", "readdir")}
            self.dump("phase 5: tierfs stats right after the remount", st0)
            self.dump("phase 5: tierfs stats after the grep after remount", st)
        finally:
            self.cg.kill()
            b.unmount_tierfs(daemon_wait=120)

    # -- driver ----------------------------------------------------------------------------

    def phase(self, name: str, fn, *a) -> None:
        if name not in self.phases:
            return
        log(f"=== phase {name} ===")
        t0 = time.monotonic()
        try:
            fn(*a)
        except BenchError as e:
            log(f"phase {name} failed: {e}")
            self.errors[name] = (self.errors.get(name, "") + "\n" + str(e)).strip()
        self.m[f"t_{name}"] = self.m.get(f"t_{name}", 0) + time.monotonic() - t0

    def nofile_need(self) -> int:
        """tierfs keeps a descriptor per directory the kernel knows and for at most 4096 other
        files (it resolves the rest again by name when needed): the grep tree's directories
        (leaves and the levels above them) plus that bound, plus slack."""
        return 2 * (self.grep_files // GREP_FILES_PER_DIR) + 4096 + 1000

    def raise_nofile(self) -> None:
        """Raises the descriptor limit for the daemons we start (they inherit it; needs
        CAP_SYS_RESOURCE) and says so in the report; the report warns if the limit is below
        what tierfs may hold during the grep phase (`nofile_need`)."""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            want = min(int(Path("/proc/sys/fs/nr_open").read_text()), 1 << 20)
        except (OSError, ValueError):
            want = 1 << 20
        self.m["nofile_before"] = (soft, hard)
        if hard < want or soft < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
            except (ValueError, OSError) as e:
                log(f"cannot raise RLIMIT_NOFILE to {want}: {e}")
        self.m["nofile_after"] = resource.getrlimit(resource.RLIMIT_NOFILE)
        log(f"RLIMIT_NOFILE soft/hard {soft}/{hard} -> "
            f"{self.m['nofile_after'][0]}/{self.m['nofile_after'][1]} (inherited by the daemons)")
        if "grep" in self.phases and self.m["nofile_after"][0] < self.nofile_need():
            log(f"WARNING: RLIMIT_NOFILE {self.m['nofile_after'][0]} < {self.nofile_need()} "
                "descriptors tierfs may hold in the grep phase: expect EMFILE")

    def run(self) -> Result:
        b = self.b
        self.raise_nofile()
        ensure_tools(need_fio=True, extra=[("bindfs", "bindfs"), ("fincore", "util-linux"),
                                           ("md5sum", "coreutils"), ("grep", "grep")])
        self.cg = ReaderCgroup(self.reader_mem)
        b.cleanup_hooks.append(("remove reader cgroup", self.cg.remove))
        self.file = b.test_file(f"seqread-{b.args.size}.bin", self.file_size)
        t_start = time.monotonic()
        self.phase("raw", self.phase_raw, "raw")
        self.phase("bindfs", self.phase_bindfs)
        if {"tierfs", "md5", "grep"} & set(self.phases):
            b.mount_slowfs()
            self.cmds["tierfs"].append(f"(slow store) {SLOWFS_BIN} --profile {b.args.profile} "
                                       f"{shlex.join(b.args.slowfs_arg)} {b.backing} "
                                       f"{b.slow_mnt}".replace("  ", " "))
        self.phase("tierfs", self.phase_tierfs)
        # The raw device again, right after tierfs: the local disk's speed drifts from run to
        # run (FUSE-NOTES: 1.3-2.1 GB/s), the target is against the mean of both.
        self.phase("raw", self.phase_raw, "raw2")
        self.phase("md5", self.phase_md5)
        self.phase("grep", self.phase_grep)
        self.m["t_total"] = time.monotonic() - t_start
        self.m["cgroup_peak_end"] = self.cg.peak()
        self.cg.remove()
        for d in sorted(WORK.glob("cache-*")):
            lf = d / "tierfs.log"
            if lf.exists():
                tail = lf.read_text(errors="replace").splitlines()[-30:]
                self.details.append((f"last lines of {d.name}/tierfs.log", "\n".join(tail)))
        return ssdreport.result(self)


def wl_ssd(b: Bench) -> Result:
    if b.args.skip_tierfs:
        raise BenchError("--skip-tierfs makes no sense for the ssd workload")
    return SsdRun(b).run()
