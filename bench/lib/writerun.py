"""`bench/run --workload write`: the write path (issue 4 point 5; bench/README.md, "write"):
seed 001's write job timed open / write / fsync / close and an untar of a source tree, on
the local disk, the store direct, tierfs write-through and write-back, in one run; the
report is writereport.py's."""
import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Optional

import writereport
from benchcore import (SLOWFS_BIN, SYS_PYTHON, TIERFS_BIN, WORK, BenchError, Result,
                       drop_caches, ensure_tools, log, prime_memory, run, slow_diff,
                       wait_mounted)
from testbed import Bench
from testdata import CHUNK, WRITE_BS, WRITE_PRIME_FACTOR, untar_tarball

WRITE_DEFAULT_SIZE = "2G"
WRITE_QUICK_SIZE = "256M"
WB_OPT = "writeback.mode=back"
# (key, label, kind): kind local = bench/work on the local disk, slowfs = the slowfs mount,
# tierfs = tierfs over slowfs.
WRITE_CONTENDERS = [
    ("local", "local disk", "local"),
    ("slowfs", "store direct (slowfs)", "slowfs"),
    ("wt", "tierfs write-through", "tierfs"),
    ("wb", "tierfs write-back", "tierfs"),
]


class WriteRun:
    """The `write` workload: measures the store's write bandwidth (dd conv=fsync on slowfs),
    then per contender the chunk.py job and the untar; writereport.result() builds the
    summary."""

    def __init__(self, b: Bench):
        self.b = b
        a = b.args
        self.quick = a.quick
        self.size = b.size
        opts: dict = {}
        for o in [f"ram.max={a.ram_max}", *a.tierfs_opt]:
            opts.pop(o.split("=", 1)[0], None)
            opts[o.split("=", 1)[0]] = o
        self.opts = list(opts.values())
        self.m: dict = {k: {} for k, _, _ in WRITE_CONTENDERS}
        self.store: dict = {}
        self.cmds: list = []
        self.errors: dict = {}
        self.details: list = []
        self.tar: Optional[dict] = None
        self.wb_unavailable: Optional[str] = None
        self.cache = WORK / "cache-write"
        # for writereport.py, which imports nothing of this module:
        self.contenders = WRITE_CONTENDERS
        self.wb_opt = WB_OPT
        self.default_size = WRITE_DEFAULT_SIZE

    def cmd(self, c) -> None:
        self.cmds.append(shlex.join(str(x) for x in c))

    def dest(self, key: str, kind: str) -> tuple:
        """(path written through the contender, the same place on the local disk)."""
        if kind == "local":
            p = WORK / "write-local"
            return p, p
        name = f"write-{key}"
        return (self.b.slow_mnt if kind == "slowfs" else self.b.tier_mnt) / name, \
            self.b.backing / name

    def prepare(self, prime: bool) -> None:
        drop_caches()
        if self.tar:
            self.b.warm_backing([Path(self.tar["tarball"])])
        if prime and not self.b.args.no_prime:
            prime_memory(WRITE_PRIME_FACTOR * self.size)

    def slow_delta(self, s0, s1) -> dict:
        return {k: slow_diff(s0, s1, k) for k in (s1 or {}) if isinstance((s1 or {}).get(k), int)}

    # -- the store's own write bandwidth ----------------------------------------------------

    def store_bandwidth(self) -> None:
        b = self.b
        src = b.test_file(f"write-src-{b.args.size}.bin", self.size)
        d = b.slow_mnt / "write-dd"
        os.makedirs(d, exist_ok=True)
        drop_caches()
        b.warm_backing([src])
        cmd = ["dd", f"if={src}", f"of={d / 'dd.bin'}", "bs=1M", f"count={self.size >> 20}",
               "conv=fsync"]
        self.cmd(cmd)
        log("store bandwidth: " + shlex.join(str(c) for c in cmd))
        s0 = b.slowfs_stats()
        t0 = time.monotonic()
        p = run(cmd, max(600, self.size / 2e6), check=False)
        wall = time.monotonic() - t0
        s1 = b.slowfs_stats()
        if p.returncode != 0:
            raise BenchError(f"dd to slowfs failed: {(p.stderr or '').strip()[-300:]}")
        mt = re.search(r"^(\d+) bytes .* copied, ([\d.e+-]+) s,", p.stderr, re.M)
        nb, secs = (int(mt.group(1)), float(mt.group(2))) if mt else (self.size, wall)
        self.store = {"bytes": nb, "seconds": secs, "wall": wall, "mbps": nb / secs / 1e6,
                      "slow": self.slow_delta(s0, s1)}
        log(f"store bandwidth: {self.store['mbps']:.1f} MB/s ({nb} B in {secs:.2f} s, "
            "dd bs=1M conv=fsync)")
        shutil.rmtree(b.backing / "write-dd", ignore_errors=True)

    # -- one contender --------------------------------------------------------------------

    def chunk(self, key: str, target: Path) -> None:
        b = self.b
        os.makedirs(target, exist_ok=True)
        cmd = [SYS_PYTHON, CHUNK, target / "chunk.bin", str(self.size), "--bs",
               str(WRITE_BS), "--hash"]
        self.cmd(cmd)
        self.prepare(prime=True)
        log(f"{key}: write job: " + shlex.join(str(c) for c in cmd))
        s0 = b.slowfs_stats()
        p = run(cmd, max(600, self.size / 2e6), check=False)
        s1 = b.slowfs_stats()
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BenchError(f"chunk.py failed (rc={p.returncode}): "
                             f"{(p.stderr or '').strip()[-500:]}")
        r["slow"] = self.slow_delta(s0, s1) if s0 and s1 else {}
        self.m[key]["chunk"] = r
        log(f"{key}: open {r['open_s']:.3f} s, write {r['write_s']:.2f} s "
            f"({r['write_mbps']:.0f} MB/s), fsync {r['fsync_s']:.2f} s, close "
            f"{r['close_s']:.3f} s; job {r['total_mbps']:.0f} MB/s")

    def untar(self, key: str, target: Path) -> None:
        b = self.b
        dest = target / "untar"
        os.makedirs(dest, exist_ok=True)
        tarball = self.tar["tarball"]
        c1 = ["tar", "-xf", tarball, "-C", dest]
        c2 = ["sync", "-f", dest]
        self.cmd(c1)
        self.cmd(c2)
        self.prepare(prime=False)
        log(f"{key}: untar: {shlex.join(str(c) for c in c1)} && {shlex.join(str(c) for c in c2)}")
        tmo = 600 + self.tar["files"] * 0.2
        s0 = b.slowfs_stats()
        t0 = time.monotonic()
        p = run(c1, tmo, check=False)
        t1 = time.monotonic()
        if p.returncode != 0:
            raise BenchError(f"tar -xf failed (rc={p.returncode}): "
                             f"{(p.stderr or '').strip()[-500:]}")
        s_mid = b.slowfs_stats()
        p = run(c2, tmo, check=False)
        t2 = time.monotonic()
        s1 = b.slowfs_stats()
        r = {"untar_s": t1 - t0, "sync_s": t2 - t1, "total_s": t2 - t0,
             "sync_rc": p.returncode, "sync_err": (p.stderr or "").strip()[-200:],
             "slow": self.slow_delta(s0, s1) if s0 and s1 else {},
             "slow_sync": self.slow_delta(s_mid, s1) if s_mid and s1 else {}}
        self.m[key]["untar"] = r
        log(f"{key}: untar {r['untar_s']:.2f} s, sync -f {r['sync_s']:.2f} s")

    def verify(self, key: str, local: Path) -> None:
        """Untimed: what reached the local disk behind the contender (for slowfs and tierfs
        the backing directory, after tierfs is unmounted) is what was written."""
        v = {}
        c = self.m[key].get("chunk")
        f = local / "chunk.bin"
        if c and c.get("sha256"):
            if f.exists():
                got = run(["sha256sum", f], max(300, self.size / 50e6)).stdout.split()[0]
                v["chunk"] = "identical (sha256)" if got == c["sha256"] else \
                    f"MISMATCH: sha256 {got} != written {c['sha256']}"
            else:
                v["chunk"] = "MISSING in the backing directory"
        if self.m[key].get("untar"):
            p = run(["tar", "--diff", "-f", self.tar["tarball"], "-C", local / "untar"], 900,
                    check=False)
            out = (p.stdout + p.stderr).strip().splitlines()
            v["untar"] = "identical (`tar --diff`: content, mode, mtime, owner)" \
                if p.returncode == 0 else f"{len(out)} differences (`tar --diff`), first: " \
                f"{out[0] if out else '?'}"
        self.m[key]["verify"] = v
        if any("identical" not in x for x in v.values()):
            log(f"{key}: VERIFY FAILED: {v}")

    def mount_tierfs(self, key: str) -> bool:
        """Fresh cache dir; write-back adds WB_OPT. False when this binary does not know it."""
        b = self.b
        if key == "wt":
            cmd = b.mount_tierfs_tolerant(self.cache, True, self.opts)
            self.cmd(cmd)
            return True
        if self.cache.exists():
            shutil.rmtree(self.cache)
        self.cache.mkdir(parents=True)
        opts = [o for o in self.opts if o.split("=", 1)[0] not in b.refused] + [WB_OPT]
        flags = [] if "--reset-cache" in b.refused else ["--reset-cache"]
        cmd = [str(TIERFS_BIN), "mount", str(b.slow_mnt), str(b.tier_mnt), "--cache-dir",
               str(self.cache), *flags, "-o", ",".join(opts)]
        log("mounting: " + shlex.join(cmd))
        b.mounted.append(b.tier_mnt)
        p = run(cmd, 300, check=False)
        if p.returncode == 0:
            wait_mounted(b.tier_mnt, 30)
            self.cmd(cmd)
            return True
        b.mounted.remove(b.tier_mnt)
        err = (p.stderr or "").strip()
        if WB_OPT.split("=")[0] in err or "writeback" in err:
            self.wb_unavailable = err.splitlines()[-1] if err else f"rc={p.returncode}"
            self.cmds.append(f"# refused: {shlex.join(cmd)}")
            log(f"tierfs refused {WB_OPT} ({self.wb_unavailable}): write-back contender "
                "not available at this commit")
            return False
        raise BenchError(f"tierfs mount failed (rc={p.returncode}): {shlex.join(cmd)}\n"
                         f"{err[-1000:]}")

    def contender(self, key: str, kind: str) -> None:
        b = self.b
        target, local = self.dest(key, kind)
        shutil.rmtree(local, ignore_errors=True)
        if kind == "tierfs" and not self.mount_tierfs(key):
            self.m[key]["unavailable"] = self.wb_unavailable
            return
        try:
            try:
                self.chunk(key, target)
            except BenchError as e:
                self.errors[f"{key} write job"] = str(e)
                log(f"{key}: write job failed: {e}")
            if self.tar:
                try:
                    self.untar(key, target)
                except BenchError as e:
                    self.errors[f"{key} untar"] = str(e)
                    log(f"{key}: untar failed: {e}")
            if kind == "tierfs":
                st = b.tierfs_stats_json()
                self.details.append((f"tierfs stats --json after the {key} contender",
                                     json.dumps(st, indent=2, sort_keys=True)
                                     if st is not None else "(tierfs stats --json failed)"))
        finally:
            if kind == "tierfs":
                # A write-back daemon may still flush after the unmount: give it time and
                # record how long it took (what is left in the backing dir is checked next).
                s0 = b.slowfs_stats()
                self.m[key]["exit_s"] = b.unmount_tierfs(daemon_wait=900)
                s1 = b.slowfs_stats()
                self.m[key]["exit_slow"] = self.slow_delta(s0, s1) if s0 and s1 else {}
                lf = self.cache / "tierfs.log"
                if lf.exists():
                    tail = lf.read_text(errors="replace").splitlines()[-20:]
                    self.details.append((f"last lines of tierfs.log ({key})", "\n".join(tail)))
        self.verify(key, local)
        shutil.rmtree(local, ignore_errors=True)

    def run(self) -> Result:
        b = self.b
        ensure_tools(extra=[("tar", "tar"), ("sha256sum", "coreutils")])
        for k, _, kind in WRITE_CONTENDERS:
            shutil.rmtree(self.dest(k, kind)[1], ignore_errors=True)
        try:
            self.tar = untar_tarball(self.quick)
        except BenchError as e:
            self.errors["untar source"] = str(e)
            log(f"no untar source: {e}")
        t0 = time.monotonic()
        todo = [c for c in WRITE_CONTENDERS if not (b.args.skip_tierfs and c[2] == "tierfs")]
        for key, _, kind in todo:
            if kind != "local" and b.slowfs_proc is None:
                b.mount_slowfs()
                self.cmds.append(f"{SLOWFS_BIN} --profile {b.args.profile} "
                                 f"{shlex.join(b.args.slowfs_arg)} {b.backing} "
                                 f"{b.slow_mnt}".replace("  ", " "))
                try:
                    self.store_bandwidth()
                except BenchError as e:
                    self.errors["store bandwidth"] = str(e)
            log(f"=== contender {key} ===")
            try:
                self.contender(key, kind)
            except BenchError as e:
                self.errors[key] = str(e)
                log(f"contender {key} failed: {e}")
        self.t_total = time.monotonic() - t0
        return writereport.result(self)


def wl_write(b: Bench) -> Result:
    return WriteRun(b).run()
