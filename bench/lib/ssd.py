"""`bench/run --workload ssd`: the SSD-tier acceptance run (issue 3 point 6; bench/README.md,
"ssd"): raw cache device, bindfs and tierfs with fio, the md5 loop in a memory cgroup, grep -r
over small files after a remount; one report with PASS/FAIL per target."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from benchcore import (SLOWFS_BIN, WORK, Bench, BenchError, Result, drop_caches,
                       ensure_tools, force_unmount, fs_info, hbytes, human, is_mounted,
                       jdiff, jget, log, na, parse_size, prime_memory, run, rx, slow_diff,
                       wait_mounted)
from cgroup import ReaderCgroup
from testdata import GREP_FILES_PER_DIR, GREP_MARKER, make_grep_tree

SSD_DEFAULT_OPTS = ["ssd.max_size=8G", "ssd.write_rate=1G", "ssd.write_burst=64G",
                    "meta.ttl=1h", "meta.cto=off"]
SSD_STATS_KEYS = ["hits", "misses", "hit_bytes", "written_bytes", "admitted", "dropped_budget",
                  "dropped_queue", "write_rate", "write_burst", "cur_burst", "fill_bytes",
                  "cap_bytes", "segments", "entries", "checksum_errors", "reinsertions",
                  "reclaimed_segments", "rebuild_ms", "rebuilt_entries"]
SSD_PHASES = ["raw", "bindfs", "tierfs", "md5", "grep"]
SEQ_TARGET = 0.80          # tierfs seq / raw device seq
GREP_TARGET = 10_000       # files/s after remount
STEADY_TOLERANCE = 0.90    # pass 2 >= 90% of the median of the later passes
STEADY_SLOW_FRACTION = 0.05  # ... and at most 5% of the file read from the slow store


class SsdRun:
    """The phases of the `ssd` workload: each records its numbers in self.m and its commands
    in self.cmds; report() turns them into the summary, the phase sections and the plot."""

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

    def steady(self):
        """(verdict, explanation) for 'steady state by pass 2'."""
        ps = self.m.get("md5_tierfs") or []
        if len(ps) < 3:
            return None, "fewer than 3 passes"
        later = sorted(p["mbps"] for p in ps[2:])
        med = later[len(later) // 2] if len(later) % 2 else \
            (later[len(later) // 2 - 1] + later[len(later) // 2]) / 2
        p2 = ps[1]
        c1 = p2["mbps"] >= STEADY_TOLERANCE * med
        slow2 = p2["slow_bytes"]
        c2 = slow2 is not None and slow2 <= STEADY_SLOW_FRACTION * self.md5_size
        c3 = all(p["md5_ok"] for p in ps)
        why = (f"pass 2 {p2['mbps']:,.0f} MB/s = {p2['mbps'] / med:.2f}x the median of passes "
               f"3-{len(ps)} ({med:,.0f} MB/s; need >= {STEADY_TOLERANCE:.2f}x); slow store "
               f"served {hbytes(slow2)} in pass 2 (need <= {STEADY_SLOW_FRACTION:.0%} of the "
               f"file, i.e. pass 2 comes from tierfs's tiers, not from the HDD)")
        if not c3:
            why += "; MD5 MISMATCH in some pass"
        return c1 and c2 and c3, why

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
        return self.report()

    # -- report ----------------------------------------------------------------------------

    def report(self) -> Result:
        m, b = self.m, self.b
        em = b.emulation or f"profile={b.args.profile} (slowfs not mounted in this run)"
        lines: list = []
        A = lines.append
        cmdline = "bench/run " + shlex.join(sys.argv[1:])

        # Validity of this run as evidence for acceptance point 6.
        invalid = []
        ssd_refused = [r for r in b.refused if r.startswith("ssd.")]
        if ssd_refused:
            invalid.append("this tierfs binary refused the SSD-tier options "
                           f"({', '.join(ssd_refused)}): it has no SSD tier, the tierfs numbers "
                           "are its RAM tier + the slow store")
        if "--reset-cache" in b.refused:
            invalid.append("`--reset-cache` refused by this binary (the harness emptied the "
                           "cache dirs itself)")
        other_refused = [r for r in b.refused if not r.startswith("ssd.")
                         and r != "--reset-cache"]
        if other_refused:
            invalid.append(f"options refused and dropped: {', '.join(other_refused)}")
        if self.quick:
            invalid.append("quick validation run (--quick): sizes and durations below the "
                           "acceptance setup")
        if b.args.profile != "hdd":
            invalid.append(f"profile {b.args.profile}, the acceptance point is for hdd")
        if self.file_size <= self.ram_max:
            invalid.append("test file not larger than ram.max")
        if not self.cg.path:
            invalid.append("no memory cgroup: the readers were not memory-limited")
        if set(self.phases) != set(SSD_PHASES):
            invalid.append(f"only phases {','.join(self.phases)} were run")
        if self.errors:
            invalid.append(f"phases failed: {', '.join(self.errors)}")
        if not self.quick and self.grep_files != 100_000 and "grep" in self.phases:
            invalid.append(f"grep tree of {self.grep_files} files, not 100k")

        def mean_raw(kind, field_):
            vals = [m[k][field_] for k in (f"raw_{kind}", f"raw2_{kind}")
                    if m.get(k, {}).get("ok")]
            return sum(vals) / len(vals) if vals else None

        def val(key, field_):
            r = m.get(key)
            return r[field_] if r and r.get("ok") else None

        targets = []  # (target, measured, verdict)
        raw_seq = mean_raw("seq", "mbps")
        t_seq = val("tierfs_seq", "mbps")
        if raw_seq and t_seq is not None:
            ratio = t_seq / raw_seq
            targets.append(("1. sequential 1 MiB reads (fio O_DIRECT, QD16) from the SSD tier "
                            f">= {SEQ_TARGET:.0%} of the raw cache device",
                            f"tierfs {t_seq:,.0f} MB/s vs raw {raw_seq:,.0f} MB/s "
                            f"(mean of the raw runs) = **{rx(ratio)}**",
                            "PASS" if ratio >= SEQ_TARGET else "FAIL"))
        else:
            targets.append(("1. sequential 1 MiB reads from the SSD tier >= 80% of raw",
                            "not measured", "n/a"))
        bind = [(n, val(f"{n}_rand", "iops")) for n, _, _ in self.BINDFS_VARIANTS]
        bind = [(n, v) for n, v in bind if v is not None]
        t_rand = val("tierfs_rand", "iops")
        if bind and t_rand is not None:
            bname, biops = max(bind, key=lambda x: x[1])
            targets.append(("2. 4 KiB random reads (fio O_DIRECT, QD32) from the SSD tier: IOPS "
                            ">= bindfs over the local disk (best bindfs variant)",
                            f"tierfs {t_rand:,.0f} IOPS vs {bname} {biops:,.0f} IOPS = "
                            f"**{rx(t_rand / biops)}**",
                            "PASS" if t_rand >= biops else "FAIL"))
        else:
            targets.append(("2. 4 KiB random reads QD32 >= bindfs IOPS", "not measured", "n/a"))
        ok, why = self.steady() if m.get("md5_tierfs") else (None, "not measured")
        targets.append((f"3. md5 loop over a file 2x the RAM budget ({human(self.md5_size)}, "
                        f"ram.max {human(self.ram_max)}) reaches steady state by pass 2",
                        why, "n/a" if ok is None else ("PASS" if ok else "FAIL")))
        ttl = next((o for o in self.opts if o.startswith("meta.ttl=")), None)
        cto = next((o for o in self.opts if o.startswith("meta.cto=")), None)
        ttl_s = "meta.ttl: " + (f"`{ttl}`" + (" (REFUSED by this binary: its default applied)"
                                              if "meta.ttl" in b.refused else "")
                                if ttl else "not set (tierfs default)")
        if cto:
            ttl_s += f", `{cto}`" + (" (REFUSED by this binary, dropped)"
                                     if "meta.cto" in b.refused else "")
        g = m.get("grep_remount")
        if g:
            targets.append((f"4. `grep -r` over {self.grep_files:,} small files after a remount "
                            f"with kernel caches dropped >= {GREP_TARGET:,} files/s",
                            f"**{g['files_s']:,.0f} files/s** ({g['seconds']:.1f} s; cold "
                            f"{m['grep_cold']['files_s']:,.0f} files/s); {ttl_s}"
                            + (f"; **{g['errors']} grep errors** ({g['first_error'][-120:]})"
                               if g.get("errors") else "")
                            + ("" if g["ok"] or g.get("errors") else
                               f"; WRONG match count {g['found']}"),
                            "PASS" if g["files_s"] >= GREP_TARGET and g["ok"] else "FAIL"))
        else:
            targets.append(("4. grep -r after remount >= 10,000 files/s", "not measured",
                            "n/a"))
        holds = m.get("ssd_holds")
        pre = ("SSD tier holds the test file after the warm-up (`ssd.fill_bytes` >= 95% of the "
               "file)", "; ".join(
                   f"pass {w['pass']}: fill_bytes {na(w['fill'], 'd')}" for w in m.get("warm", []))
               or "not measured",
               "n/a" if holds is None else ("yes" if holds else "NO"))

        A("## Summary (acceptance point 6 of the SSD-tier issue)")
        A("")
        A(f"Emulation: slowfs **{em}**. tierfs: `-o {','.join(self.opts)}`"
          + (f" (refused by this binary and dropped: {', '.join(b.refused)})"
             if b.refused else "") + f". Reader memory cgroup: {self.cg.describe()}.")
        A("")
        A("| target | measured | verdict |")
        A("|---|---|---|")
        for t, meas, v in targets:
            A(f"| {t} | {meas} | **{v}** |")
        A(f"| (precondition) {pre[0]} | {pre[1]} | {pre[2]} |")
        A("")
        verdicts = [v for _, _, v in targets]
        if invalid:
            A("**Not valid as acceptance evidence:** " + "; ".join(invalid) + ".")
        elif all(v == "PASS" for v in verdicts):
            A("**Acceptance point 6: PASS** (all four targets, one run).")
        else:
            A("**Acceptance point 6: FAIL** (" + ", ".join(
                t.split(".")[0] for t, _, v in targets if v != "PASS") + " not met).")
        A("")
        A(f"Run took {m.get('t_total', 0) / 60:.1f} min ("
          + ", ".join(f"{p} {m.get('t_' + p, 0):.0f} s" for p in SSD_PHASES if 't_' + p in m)
          + ").")
        A("")
        png = "PLOT_PNG_PLACEHOLDER"
        A(f"![plots]({png})")
        A("")
        if self.errors:
            A("### Phase errors")
            A("")
            for k, v in self.errors.items():
                A(f"- **{k}**:")
                A("")
                A("```")
                A(v)
                A("```")
            A("")

        A("## Method")
        A("")
        A("- Every measured step: `sync; echo 3 > /proc/sys/vm/drop_caches`, then (phases 3-5) "
          "the slow store's backing files are re-read locally into the page cache (so slowfs's "
          "own backing reads are never slower than the emulated HDD), then a memory priming pass "
          "(FUSE-NOTES lesson 8: write and delete a /dev/shm file as large as the data so page "
          "allocations hit host-backed memory). The tierfs RAM tier is not dropped by this.")
        A(f"- Every measured reader (fio, dd, md5sum, cmp, grep) runs in the reader memory "
          f"cgroup: {self.cg.describe()}. The tierfs, bindfs and slowfs daemons do not.")
        nb, na_ = m.get("nofile_before"), m.get("nofile_after")
        if nb and na_:
            A(f"- RLIMIT_NOFILE (soft/hard) of the harness and the daemons it starts: "
              f"{nb[0]}/{nb[1]}" + (f" raised to {na_[0]}/{na_[1]}" if na_ != nb else
                                    " (could not be raised: no CAP_SYS_RESOURCE)")
              + ": tierfs holds a descriptor per directory the kernel knows and for at most "
              "4096 other files.")
            need = self.nofile_need()
            if "grep" in self.phases and na_[0] < need:
                A(f"- **WARNING: tierfs may hold up to {need:,} descriptors in the grep phase "
                  f"but may open only {na_[0]:,}: expect EMFILE ('Too many open files').**")
        A(f"- fio: libaio, `--direct=1`, 1 job, {self.ramp} s ramp + {self.runtime} s "
          "time-based; sequential = `--rw=read --bs=1M --iodepth=16`, random = `--rw=randread "
          "--bs=4k --iodepth=32 --norandommap --randrepeat=0`, over the whole "
          f"{human(self.file_size)} file.")
        same = os.stat(b.backing).st_dev == os.stat(WORK).st_dev
        A(f"- Test file `{self.file.name}` ({self.file_size} bytes, random content) in "
          f"`{b.backing}` ({fs_info(b.backing)}); tierfs cache dirs `{WORK}/cache-*` "
          f"({fs_info(WORK)}, " + ("same filesystem" if same else "A DIFFERENT filesystem")
          + "). Phase 1 measures the device under both.")
        A("")

        # Phase 1+2+3 table
        A("## Phases 1-3: raw cache device, bindfs, tierfs SSD tier")
        A("")
        A("| run | seq 1 MiB QD16 MB/s | rand 4 KiB QD32 IOPS | rand mean / p99 latency | "
          "page cache after job | slow store served (seq / rand) |")
        A("|---|---:|---:|---:|---|---:|")

        def row(label, key, resident_label, slow=False):
            s, r = m.get(f"{key}_seq", {}), m.get(f"{key}_rand", {})
            if not s and not r:
                return
            lat = (f"{r['lat_us']:,.0f} / {na(r.get('p99_us'))} us" if r.get("ok")
                   else r.get("error", "n/a")[:120])
            res = resident_label(s, r)
            sl = (f"{hbytes(s.get('slow_bytes'))} / {hbytes(r.get('slow_bytes'))}"
                  if slow else "-")
            A(f"| {label} | {na(s.get('mbps') if s.get('ok') else None, ',.1f')} | "
              f"{na(r.get('iops') if r.get('ok') else None)} | {lat} | {res} | {sl} |")

        def res_file(s, r):
            return (f"underlying file resident: {hbytes(s.get('resident_after'))} after seq, "
                    f"{hbytes(r.get('resident_after'))} after rand (dropped before each job)")

        row("1. raw device (the test file, O_DIRECT)", "raw",
            lambda s, r: "not used (O_DIRECT on the local file)")
        for n, _, desc in self.BINDFS_VARIANTS:
            row(f"2. {n}", n, res_file)
        row("3. tierfs (SSD tier), `--direct=1` on the mount", "tierfs",
            lambda s, r: f"cache dir files resident: {hbytes(s.get('resident_after'))} / "
                         f"{hbytes(r.get('resident_after'))}", slow=True)
        row("1'. raw device again (after tierfs)", "raw2",
            lambda s, r: "not used (O_DIRECT on the local file)")
        A("")
        if raw_seq and t_seq is not None:
            A(f"- tierfs seq / raw seq (mean of both raw runs, {raw_seq:,.0f} MB/s): "
              f"**{rx(t_seq / raw_seq)}** (target >= {rx(SEQ_TARGET)})")
        raw_rand = mean_raw("rand", "iops")
        if raw_rand and t_rand is not None:
            A(f"- tierfs rand / raw rand ({raw_rand:,.0f} IOPS): {rx(t_rand / raw_rand)}")
        for n, v in bind:
            if t_rand is not None:
                A(f"- tierfs rand / {n} rand ({v:,.0f} IOPS): **{rx(t_rand / v)}**")
            bs = val(f"{n}_seq", "mbps")
            if bs and t_seq is not None:
                A(f"- tierfs seq / {n} seq ({bs:,.0f} MB/s): {rx(t_seq / bs)}")
        A("")
        A("Fairness: all rows read the same file (`bench/work/backing`, local ext4) with the same "
          "fio jobs, O_DIRECT at the reader, page cache dropped before each job. bindfs is run "
          "two ways: " + "; ".join(f"`{n}`: {d}" for n, _, d in self.BINDFS_VARIANTS)
          + ". The target uses the better of the two. 'page cache after job' shows how much of "
          "the underlying data the kernel held after the job (fincore): cached data makes a "
          "layer look faster than the device.")
        A("")
        for kind in ("seq", "rand"):
            r = m.get(f"tierfs_{kind}")
            if r and r.get("ok"):
                A(f"- tierfs {kind}: read {hbytes(r['io_bytes'])}; tierfs counters during the "
                  f"job: ssd.hit_bytes +{hbytes(r.get('ssd_hit_bytes'))}, ssd.misses "
                  f"+{na(r.get('ssd_misses'))}, ram.hit_bytes +{hbytes(r.get('ram_hit_bytes'))};"
                  f" slow store: {hbytes(r.get('slow_bytes'))} in {na(r.get('slow_reads'))} "
                  "reads")
        if m.get("warm"):
            A("")
            A("SSD warm-up through the mount (`dd bs=1M`, buffered, reader in the cgroup):")
            A("")
            A("| pass | MB/s | seconds | slow store served | ssd.fill_bytes | ssd.entries | "
              "ssd.written_bytes |")
            A("|---|---:|---:|---:|---:|---:|---:|")
            for w in m["warm"]:
                A(f"| {w['pass']} | {w['mbps']:,.1f} | {w['seconds']:.1f} | "
                  f"{hbytes(w['slow_bytes'])} | {na(w['fill'], 'd')} | {na(w['entries'], 'd')} | "
                  f"{na(w['written'], 'd')} |")
            A("")
            A("After warm-up: " + " ".join(m.get("ssd_after_warm", [])))
            A("")
            A(f"Content check `cmp backing tierfs` (after the fio jobs): "
              f"{m.get('tierfs_cmp', 'skipped (--no-verify)')}.")
            A("")

        # Phase 4
        if m.get("md5_tierfs") is not None:
            A("## Phase 4: md5 loop, file 2x the RAM budget")
            A("")
            A(f"`md5sum` of `{m['md5_file']}` ({self.md5_size} bytes = {human(self.md5_size)}; "
              f"ram.max {human(self.ram_max)}; reader cgroup limit {human(self.reader_mem)}: "
              "neither the RAM tier, nor the reader's page cache, nor both together can hold "
              "it), passes back to back on one fresh tierfs mount (empty cache dir); then the "
              "same on slowfs directly. Caches are dropped once before each loop, not between "
              f"passes. Reader cgroup during the tierfs loop: {m.get('md5_cgroup_peak', 'n/a')}.")
            A("")
            A("| run | pass | MB/s | seconds | slow store served | slow reads / seeks | "
              "ram.hit_bytes | ssd.hit_bytes | md5 |")
            A("|---|---:|---:|---:|---:|---:|---:|---:|---|")
            for label, key in (("tierfs", "md5_tierfs"), ("slowfs direct", "md5_direct")):
                for p in m.get(key) or []:
                    A(f"| {label} | {p['pass']} | {p['mbps']:,.1f} | {p['seconds']:.2f} | "
                      f"{hbytes(p['slow_bytes'])} | {na(p.get('slow_reads'))} / "
                      f"{na(p.get('slow_seeks'))} | {hbytes(p['ram_hit_bytes'])} | "
                      f"{hbytes(p['ssd_hit_bytes'])} | {'ok' if p['md5_ok'] else 'MISMATCH'} |")
            A("")
            A(f"Steady state by pass 2 means here: pass 2 >= {STEADY_TOLERANCE:.0%} of the "
              f"median MB/s of passes 3-{self.md5_passes}, and pass 2 read at most "
              f"{STEADY_SLOW_FRACTION:.0%} of the file from the slow store (an LRU RAM tier that "
              "misses every pass is also 'steady', at HDD speed; that is not the steady state "
              f"meant). Result: {why}.")
            A("")

        # Phase 5
        if m.get("grep_cold"):
            tree, man = m["grep_tree"]
            c, r = m["grep_cold"], m.get("grep_remount")
            A("## Phase 5: grep -r over small files, cold and after a remount")
            A("")
            A(f"Tree `{tree.name}` on the slow store: {man['files']:,} files of 1-64 KiB "
              f"(uniform), {human(man['bytes'])} in total, {man['dirs']:,} leaf directories "
              f"{man['depth']} levels deep (fan-out {man['fan_out']}, {GREP_FILES_PER_DIR} files "
              f"each), lowercase text from `random.Random({self.grep_seed})`; every 1000th file "
              f"holds `{GREP_MARKER.decode()}` ({man['markers']} files). Command: `grep -r -l "
              f"{GREP_MARKER.decode()} <mnt>/{tree.name}` (prints the matching files; reads "
              f"every other file to the end). {ttl_s}.")
            A("")
            A("| run | files/s | MB/s | seconds | slow store served | slow reads / seeks / "
              "metadata ops | matches | tierfs mount took |")
            A("|---|---:|---:|---:|---:|---:|---:|---:|")

            def sl(x):
                d = x.get("slow") or {}
                return f"{na(d.get('reads'))} / {na(d.get('seeks'))} / {na(d.get('meta_ops'))}"

            A(f"| cold (fresh mount, empty cache dir) | {c['files_s']:,.0f} | {c['mbps']:,.1f} | "
              f"{c['seconds']:.1f} | {hbytes(c['slow_bytes'])} | {sl(c)} | {c['found']} "
              f"{'ok' if c['ok'] else 'WRONG'} | {m['grep_mount1_s']:.2f} s |")
            if r:
                A(f"| after unmount, drop_caches, mount (same cache dir) | {r['files_s']:,.0f} | "
                  f"{r['mbps']:,.1f} | {r['seconds']:.1f} | {hbytes(r['slow_bytes'])} | {sl(r)} | "
                  f"{r['found']} {'ok' if r['ok'] else 'WRONG'} | {m['grep_mount2_s']:.2f} s |")
            A("")
            ex = m.get("grep_daemon_exit_s")
            for label, x in (("cold", c), ("after remount", r or {})):
                if x.get("errors"):
                    A(f"- **grep {label}: {x['errors']} files or directories could not be read**"
                      f", first: `{x['first_error']}`")
            A(f"- tierfs daemon exited {na(ex, '.1f', ' s')} after the unmount (waited up to "
              "300 s before SIGTERM).")
            if r:
                bo = r.get("backing_ops") or {}
                A("- backing-store operations by tierfs during the grep after remount: " +
                  ", ".join(f"{k} {na(v)}" for k, v in bo.items()) +
                  f"; ssd.hit_bytes +{hbytes(r.get('ssd_hit_bytes'))}.")
                A("- SSD tier right after the remount: " + " ".join(m.get("grep_ssd_remount", [])))
            A("")

        # Commands
        A("## Commands")
        A("")
        A(f"`{cmdline}` ran, in order (readers were run as `sh -c 'echo $$ > <cgroup>/cgroup.procs"
          "; exec CMD'`, every step under `timeout`):")
        A("")
        for p in SSD_PHASES:
            if self.cmds[p]:
                A(f"- {p}:")
                A("")
                A("  ```")
                for c_ in dict.fromkeys(self.cmds[p]):
                    A("  " + c_)
                A("  ```")
        A("")

        # Console summary
        con = [f"ssd workload, slowfs: {em}", ""]
        for t, meas, v in targets:
            con.append(f"[{v}] {t}\n       {meas.replace('**', '')}")
        con.append(f"[{pre[2]}] {pre[0]}: {pre[1]}")
        if invalid:
            con.append("NOT VALID as acceptance evidence: " + "; ".join(invalid))
        if "grep" in self.phases and m.get("nofile_after") and \
                m["nofile_after"][0] < self.nofile_need():
            con.append(f"WARNING: RLIMIT_NOFILE {m['nofile_after'][0]} < {self.nofile_need()} "
                       "descriptors tierfs may hold in the grep phase (EMFILE expected)")

        # Plot
        panels = []
        colors = {"raw": "#888888", "raw again": "#b0b0b0", "bindfs": "#d9822b",
                  "bindfs-mt-odirect": "#a05aa0", "tierfs": "#2b7bd9"}
        bars = [("raw", val("raw_seq", "mbps")), ("raw again", val("raw2_seq", "mbps"))] + \
            [(n, val(f"{n}_seq", "mbps")) for n, _, _ in self.BINDFS_VARIANTS] + \
            [("tierfs", t_seq)]
        panels.append({"title": "seq 1 MiB O_DIRECT QD16", "unit": "MB/s",
                       "bars": [{"label": k, "value": v, "color": colors.get(k)}
                                for k, v in bars],
                       "hlines": [{"y": SEQ_TARGET * raw_seq, "label": "80% raw"}]
                       if raw_seq else []})
        bars = [("raw", val("raw_rand", "iops")), ("raw again", val("raw2_rand", "iops"))] + \
            [(n, val(f"{n}_rand", "iops")) for n, _, _ in self.BINDFS_VARIANTS] + \
            [("tierfs", t_rand)]
        panels.append({"title": "4 KiB randread O_DIRECT QD32", "unit": "IOPS",
                       "bars": [{"label": k, "value": v, "color": colors.get(k)}
                                for k, v in bars],
                       "hlines": [{"y": max(v for _, v in bind), "label": "best bindfs"}]
                       if bind else []})
        if m.get("md5_tierfs"):
            panels.append({"title": f"md5sum loop, {human(self.md5_size)} file", "unit": "MB/s",
                           "kind": "lines",
                           "categories": [f"pass {i}" for i in range(1, self.md5_passes + 1)],
                           "series": [{"name": "tierfs",
                                       "values": [p["mbps"] for p in m["md5_tierfs"]]},
                                      {"name": "slowfs direct",
                                       "values": [p["mbps"] for p in m.get("md5_direct") or []]}]})
        if m.get("grep_cold"):
            panels.append({"title": f"grep -r, {self.grep_files:,} files", "unit": "files/s",
                           "bars": [{"label": "cold", "value": m["grep_cold"]["files_s"],
                                     "color": "#d9822b"},
                                    {"label": "after remount", "color": "#2b7bd9",
                                     "value": (m.get("grep_remount") or {}).get("files_s")}],
                           "hlines": [{"y": GREP_TARGET, "label": "target"}]})
        plot = {"title": f"ssd workload, slowfs {b.args.profile}" +
                (" (quick)" if self.quick else ""), "subtitle": em, "panels": panels}

        res = Result(markdown="\n".join(lines), plot=plot, console="\n".join(con))
        res.details = self.details
        return res


def wl_ssd(b: Bench) -> Result:
    if b.args.skip_tierfs:
        raise BenchError("--skip-tierfs makes no sense for the ssd workload")
    return SsdRun(b).run()
