"""`bench/run --workload fleet`: the shared tier across a fleet of three hosts (issue 44 points
1 and 5), in one run.

The origin: versitygw (scripts/s3-server) behind bench/netdelay (`tierfs-netdelay`) adding
--s3-delay-us (10 ms) each way, as `--workload s3` runs it (bench/lib/s3bench.py's S3Env): the
dataset's objects are written straight into the server's directory with the `user.etag` xattr.
The shared tier: a SeaweedFS cluster on loopback (scripts/seaweedfs: 1 master, 3 volume servers
keeping 2 copies, a filer and its S3 gateway), no added delay.

The dataset (seeded, the same bytes every run): 14 files of --size/16 (128 MiB at the default
2G) plus 2,000 x (--size / 2 GiB) files of 4-256 KiB; its exact total is in the report.

Three "hosts": three tierfs mounts of the origin, each with its own fresh cache dir, all with
`-o shared=s3://tierfs-shared/fleet,shared.endpoint=...`. Host 1 reads the dataset cold; once
its uploads are done (`shared.queued_bytes` 0), host 2 reads it cold, then host 3. Before them,
a reference: one fresh mount with no shared tier reads the same (host 1's speed without the
uploads). Every read: `sync; echo 3 > drop_caches`, the origin's and the tier's files read back
on their servers (their RAM, so the link and the servers bound them, not this machine's disk),
memory priming, then the reader (READER) timed. Every file's md5 is checked on every host.
Criteria (issue 44 point 1): hosts 2 and 3 each >= 3x host 1's speed; the three hosts together
read <= 1.1x the dataset from the origin. Then host 4, a fourth fresh mount with the read-mostly
tuning (TUNED: no close-to-open request per open), to show what close-to-open costs a host
reading from the tier: each of hosts 2 and 3 asks the origin, 20 ms away, once per file opened.
Report and plot: bench/lib/fleetreport.py.
"""
import hashlib
import os
import random
import shutil
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import benchcore as R
import fleetreport
from benchcore import BenchError, Result, log, run
from s3bench import ACCESS, BUCKET, PREFIX, RCLONE, RCLONE_ENV, SECRET, S3Env, md5_file, put_file
from testbed import Bench

SEAWEEDFS = R.ROOT / "scripts" / "seaweedfs"
# docs/tunables.md's setting for a read-mostly tree (a dataset nobody rewrites while it is read).
TUNED = ["meta.cto=off", "meta.ttl=5m"]
SERVER_SCRIPT = R.ROOT / "scripts" / "s3-server"
SHARED_BUCKET, SHARED_PREFIX = "tierfs-shared", "fleet"
SEED = 44
BIG_FILES = 14               # of --size / 16 each: 7/8 of --size
SMALL_FILES_2G = 2000        # at --size 2G; scaled with --size
SMALL_MIN, SMALL_MAX = 4 << 10, 256 << 10
SMALL_DIRS = 20
MTIME = 1767225600           # 2026-01-01 00:00 UTC: every object's mtime (none is "racy")
VOLUME_MB = 256              # SeaweedFS volume size
BIG_READERS, SMALL_READERS, SMALL_BATCH = 4, 8, 25
# Run in the mount's root; LISTS: the folder of big.list and small.list (paths relative to
# the root, sorted), beside the mount (in it they would be objects).
READER = (f"xargs -a LISTS/big.list -d '\\n' -P {BIG_READERS} -n 1 cat > /dev/null & a=$!; "
          f"xargs -a LISTS/small.list -d '\\n' -P {SMALL_READERS} -n {SMALL_BATCH} cat "
          "> /dev/null & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))")
LISTS = R.WORK / "fleet-lists"
SHARED_KEYS = ("gets", "hits", "hit_bytes", "misses", "puts", "put_bytes", "put_dropped",
               "put_errors", "corrupt", "errors", "skipped", "down", "episodes", "late_puts", "later")


@dataclass
class DataFile:
    rel: str
    size: int
    md5: str


@dataclass
class HostRun:
    name: str
    label: str
    shared: bool
    cmd: str = ""
    seconds: float = 0.0
    drain_seconds: float = 0.0
    origin_bytes: int = 0
    origin_gets: int = 0
    counters: dict = field(default_factory=dict)
    stats_json: str = ""
    verified: str = "not checked"
    bad: list = field(default_factory=list)


def make_dataset(root: Path, total: int) -> list:
    """The dataset under `root` (the origin's bucket/prefix), as the server keeps objects."""
    big = total // 16
    n_small = max(20, round(SMALL_FILES_2G * total / (2 << 30)))
    log(f"dataset: {BIG_FILES} files of {R.human(big)} + {n_small} files of "
        f"{R.human(SMALL_MIN)}-{R.human(SMALL_MAX)} (seed {SEED})")
    files = []

    def put(rel: str, data: bytes) -> None:
        path = root / rel
        put_file(path, data)
        os.utime(path, (MTIME, MTIME))
        files.append(DataFile(rel, len(data), hashlib.md5(data).hexdigest()))

    for i in range(BIG_FILES):
        put(f"big/b{i:02}.bin", random.Random(SEED * 1000 + i).randbytes(big))
    rnd = random.Random(SEED)
    for i in range(n_small):
        put(f"small/d{i % SMALL_DIRS:02}/f{i:05}.bin",
            rnd.randbytes(rnd.randint(SMALL_MIN, SMALL_MAX)))
    return files


def port_block(n: int = 20) -> int:
    """A base port with the n ports from it free on 127.0.0.1 (scripts/seaweedfs uses 20)."""
    rnd = random.Random()
    for _ in range(200):
        base = rnd.randrange(20000, 32000 - n)  # below the ephemeral ports
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise BenchError(f"no {n} free consecutive ports on 127.0.0.1")


def installed(script: Path, what: str) -> str:
    """`script --install`: builds the server if needed; returns the binary's path."""
    log(f"{script.relative_to(R.ROOT)} --install ({what})")
    p = run([script, "--install"], 3600, check=False)
    if p.returncode != 0:
        raise BenchError(f"{script.name} --install failed: {(p.stderr or '')[-500:]}")
    return (p.stdout or "").strip().splitlines()[-1]


class SeaweedFS:
    """The shared tier's object store: scripts/seaweedfs's cluster under bench/work/."""

    def __init__(self, b: Bench, env: dict, dataset_bytes: int):
        self.b = b
        self.dir = R.WORK / "seaweedfs"
        self.port = 0
        self.binary = ""
        # 2 copies of the dataset (and a margin) in VOLUME_MB volumes over 3 servers.
        pairs = -(-3 * dataset_bytes // (2 * VOLUME_MB << 20)) + 8
        self.max_volumes = max(20, -(-2 * pairs // 3) + 4)
        self.env = dict(env, SEAWEEDFS_BUCKETS=SHARED_BUCKET,
                        SEAWEEDFS_VOLUME_SIZE_MB=str(VOLUME_MB),
                        SEAWEEDFS_MAX_VOLUMES=str(self.max_volumes))
        self.running = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_cmd(self) -> str:
        return (f"SEAWEEDFS_BUCKETS={SHARED_BUCKET} SEAWEEDFS_VOLUME_SIZE_MB={VOLUME_MB} "
                f"SEAWEEDFS_MAX_VOLUMES={self.max_volumes} scripts/seaweedfs start "
                f"bench/work/seaweedfs {self.port}")

    def start(self) -> None:
        self.binary = installed(SEAWEEDFS, "SeaweedFS")
        if (self.dir / "pids").exists():
            log("stale SeaweedFS cluster from an earlier run: stopping it")
            run([SEAWEEDFS, "stop", self.dir], 120, check=False)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.port = port_block()
        log(f"starting SeaweedFS: {self.start_cmd()}")
        self.b.store_hooks.append(("stop SeaweedFS", self.stop))
        self.running = True
        p = run([SEAWEEDFS, "start", self.dir, self.port], 600, check=False, env=self.env)
        if p.returncode != 0:
            raise BenchError(f"scripts/seaweedfs start failed: {(p.stderr or '')[-1500:]}")

    def stop(self) -> None:
        if self.running and (self.dir / "pids").exists():
            p = run([SEAWEEDFS, "stop", self.dir], 120, check=False)
            if p.returncode != 0:
                log(f"scripts/seaweedfs stop: rc={p.returncode} {(p.stderr or '')[-300:]}")
        self.running = False

    def warm(self) -> None:
        """Its volume files in the page cache (the servers' RAM), as the origin's are."""
        run(["sh", "-c", f"find '{self.dir}' -type f -exec cat {{}} + >/dev/null"], 600,
            check=False)


class Host:
    """One tierfs mount of the origin with its own cache dir: a host of the fleet."""

    def __init__(self, b: Bench, env: S3Env, name: str, tier: SeaweedFS = None,
                 extra: list = ()):
        self.b, self.env, self.name, self.tier, self.extra = b, env, name, tier, list(extra)
        self.mnt = R.WORK / f"mnt-fleet-{name}"
        self.cache = R.WORK / f"cache-fleet-{name}"

    def opts(self) -> list:
        o = [f"s3.endpoint={self.env.endpoint}"]
        if self.tier:
            o += [f"shared=s3://{SHARED_BUCKET}/{SHARED_PREFIX}",
                  f"shared.endpoint={self.tier.endpoint}"]
        return o + self.extra + list(self.b.args.tierfs_opt)

    def command(self) -> list:
        return [R.TIERFS_BIN, "mount", f"s3://{BUCKET}/{PREFIX}", self.mnt, "--cache-dir",
                self.cache, "-o", ",".join(self.opts())]

    def mount(self) -> None:
        if R.is_mounted(self.mnt):
            run(["fusermount3", "-uz", self.mnt], 30, check=False)
        if self.cache.exists():
            shutil.rmtree(self.cache)
        self.cache.mkdir(parents=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        log("mounting: " + " ".join(str(c) for c in cmd))
        self.b.mounted.append(self.mnt)
        self.b.cleanup_hooks.append((f"unmount {self.name}", self.unmount))
        run(cmd, 120, env=self.env.env)
        R.wait_mounted(self.mnt, 60)

    def stats(self) -> dict:
        import json
        p = run([R.TIERFS_BIN, "stats", "--json", self.mnt], 60, check=False)
        try:
            v = json.loads(p.stdout) if p.returncode == 0 else None
        except ValueError:
            v = None
        if not isinstance(v, dict):
            raise BenchError(f"tierfs stats --json {self.mnt} failed: {(p.stderr or '')[-300:]}")
        return v

    def drain(self, timeout: float = 600) -> float:
        """Waits until this host's uploads are done (shared.queued_bytes 0, and no chunk left
        for a late upload from its SSD tier, shared.later 0); seconds."""
        t0 = time.monotonic()
        while True:
            st = self.stats()
            q, later = R.jget(st, "shared.queued_bytes"), R.jget(st, "shared.later")
            if q is None or later is None:
                raise BenchError(f"{self.name}: no shared.queued_bytes/later in tierfs stats")
            if q == 0 and later == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise BenchError(f"{self.name}: {q} bytes queued and {later} chunks waiting "
                                 f"for upload after {timeout:.0f} s")
            time.sleep(0.2)

    def unmount(self) -> None:
        """`tierfs unmount`, then `fusermount3 -uz` if still mounted; the daemon waited for
        (SIGTERM after 30 s). Idempotent."""
        pids = R.pids_with_arg(str(self.mnt), "tierfs")
        if R.is_mounted(self.mnt):
            run([R.TIERFS_BIN, "unmount", self.mnt], 60, check=False)
        if R.is_mounted(self.mnt):
            run(["fusermount3", "-uz", self.mnt], 30, check=False)
        if self.mnt in self.b.mounted:
            self.b.mounted.remove(self.mnt)
        for pid in R.wait_pids_gone(pids, 30):
            log(f"tierfs daemon {pid} of {self.mnt} still running 30 s after unmount: SIGTERM")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def verify(mnt: Path, files: list) -> list:
    """Every file's md5 read through `mnt`; the paths that differ (or fail)."""
    def bad(f: DataFile):
        try:
            return None if md5_file(mnt / f.rel) == f.md5 else f.rel
        except OSError as e:
            return f"{f.rel} ({e})"

    with ThreadPoolExecutor(4) as ex:
        return [x for x in ex.map(bad, files) if x]


def read_on(b: Bench, host: Host, env: S3Env, tier: SeaweedFS, files: list, total: int,
            hr: HostRun) -> None:
    """Mount `host` (fresh cache), read the dataset cold with READER, timed; its counters."""
    host.mount()
    hr.cmd = " ".join(str(c) for c in host.command()).replace(str(R.ROOT) + "/", "")
    R.drop_caches()
    env.warm_server()
    if tier:
        tier.warm()
    if not b.args.no_prime:
        R.prime_memory(total)
    log(f"{hr.label}: reading the dataset ({READER})")
    t0 = time.monotonic()
    run(["sh", "-c", READER.replace("LISTS", str(LISTS))], max(1800, total / 2e6),
        cwd=host.mnt)
    hr.seconds = time.monotonic() - t0
    log(f"{hr.label}: {hr.seconds:.2f} s, {total / hr.seconds / 1e6:.1f} MB/s")
    if hr.shared:
        hr.drain_seconds = host.drain()
        log(f"{hr.label}: uploads done {hr.drain_seconds:.1f} s after the read")
    s = host.stats()
    import json
    hr.stats_json = json.dumps(s, indent=2, sort_keys=True)
    hr.origin_bytes = R.jget(s, "backing.read_bytes") or 0
    hr.origin_gets = R.jget(s, "backing.read") or 0
    hr.counters = {k: R.jget(s, f"shared.{k}") for k in SHARED_KEYS}
    hr.counters["shared_blocks"] = R.jget(s, "shared_blocks")
    log(f"{hr.label}: origin {hr.origin_bytes:,} bytes; shared " +
        ", ".join(f"{k}={v}" for k, v in hr.counters.items() if v))
    if b.args.no_verify:
        hr.verified = "not checked (--no-verify)"
    else:
        hr.bad = verify(host.mnt, files)
        hr.verified = (f"all {len(files):,} right" if not hr.bad else
                       f"{len(hr.bad)} of {len(files):,} WRONG")
        log(f"{hr.label}: md5 {hr.verified}")
    host.unmount()


def plain_tier_read(tier: SeaweedFS, total: int) -> dict:
    """What the cluster serves on this machine: a plain S3 client (`rclone copy`, 8 transfers)
    reads every object the hosts put in the tier into /dev/shm, after the same cache drop and
    warm-up as a host's read. The ceiling of a host reading the dataset from the tier."""
    dest = Path("/dev/shm/tierfs-fleet-plain")
    shutil.rmtree(dest, ignore_errors=True)
    remote = (f":s3,provider=Other,env_auth=false,access_key_id={ACCESS},"
              f"secret_access_key={SECRET},endpoint='{tier.endpoint}',"
              f"force_path_style=true:{SHARED_BUCKET}/{SHARED_PREFIX}")
    cmd = RCLONE + ["copy", remote, str(dest), "--transfers", "8", "--checkers", "16"]
    R.drop_caches()
    tier.warm()
    log("plain client reading the tier: rclone copy --transfers 8 into /dev/shm")
    t0 = time.monotonic()
    p = run(cmd, max(1800, total / 2e6), check=False, env=RCLONE_ENV)
    secs = time.monotonic() - t0
    got = [f.stat().st_size for f in dest.rglob("*") if f.is_file()]
    shutil.rmtree(dest, ignore_errors=True)
    out = {"seconds": secs, "objects": len(got), "bytes": sum(got), "rc": p.returncode,
           "cmd": " ".join(cmd).replace(SECRET, "...")}
    log(f"plain client: {out['objects']:,} objects, {out['bytes']:,} bytes in {secs:.2f} s "
        f"({out['bytes'] / secs / 1e6:.1f} MB/s), rc {p.returncode}")
    return out


def leftovers(procs: list, tier: SeaweedFS, hosts: list) -> list:
    """What this run left behind: mounts under bench/work in /proc/mounts, processes."""
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            mp = line.split()[1].encode().decode("unicode_escape")
            if mp.startswith(str(R.WORK)):
                out.append(f"mount {mp}")
    for h in hosts:
        out += [f"tierfs daemon {p} ({h.mnt})" for p in R.pids_with_arg(str(h.mnt), "tierfs")]
    for p, what in zip(procs, ("versitygw", "tierfs-netdelay")):
        if p is not None and p.poll() is None:
            out.append(f"{what} pid {p.pid}")
    if (tier.dir / "pids").exists():
        out.append(f"SeaweedFS cluster in {tier.dir} (scripts/seaweedfs stop did not finish)")
    return out


def wl_fleet(b: Bench) -> Result:
    args = b.args
    # scripts/seaweedfs talks to weed with curl; rclone reads the tier as a plain client
    R.ensure_tools(extra=[("curl", "curl"), ("rclone", "rclone")])
    b.logs.mkdir(parents=True, exist_ok=True)
    env = S3Env(b)
    if env.dir.exists():
        shutil.rmtree(env.dir)
    # The SSD tier keeps `ssd.min_free_pct` (10%) of its device free and gives segments back
    # below that: on a nearly full disk host 1's tier dropped chunks its late uploads needed
    # (a run at 7098d01 with 26 GB free: 234 chunks never uploaded, hosts 2 and 3 read them
    # from the origin). The run holds the dataset about 9 times (origin, two copies in the
    # tier, five cache dirs) on top of that floor.
    st = os.statvfs(R.WORK)
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    need = 9 * args.size_bytes + size // 10
    if free < need:
        raise BenchError(f"{R.WORK}: {R.human(free)} free, the fleet run needs {R.human(need)} "
                         f"(9 x the dataset above the SSD tier's 10% floor); remove the cache "
                         f"dirs of earlier runs (bench/work/cache-*)")
    files = make_dataset(env.objects, args.size_bytes)
    total = sum(f.size for f in files)
    log(f"dataset: {len(files):,} files, {total:,} bytes ({R.human(total)})")
    versitygw = installed(SERVER_SCRIPT, "versitygw")
    env.start(args.s3_delay_us)
    tier = SeaweedFS(b, env.env, total)
    tier.start()
    b.emulation = fleetreport.emulation(args.s3_delay_us, versitygw, tier.binary)
    LISTS.mkdir(exist_ok=True)
    (LISTS / "big.list").write_text("".join(f"{f.rel}\n" for f in files if f.rel[:4] == "big/"))
    (LISTS / "small.list").write_text("".join(f"{f.rel}\n" for f in files
                                              if f.rel[:4] != "big/"))
    hosts = [Host(b, env, "reference"), Host(b, env, "host1", tier), Host(b, env, "host2", tier),
             Host(b, env, "host3", tier), Host(b, env, "host4", tier, TUNED)]
    runs = [HostRun("reference", "reference: one mount, no shared tier", False),
            HostRun("host1", "host 1", True), HostRun("host2", "host 2", True),
            HostRun("host3", "host 3", True),
            HostRun("host4", f"host 4 ({','.join(TUNED)})", True)]
    for h, hr in zip(hosts, runs):
        read_on(b, h, env, tier if hr.shared else None, files, total, hr)
    bad = {hr.label: hr.bad for hr in runs if hr.bad}
    plain = plain_tier_read(tier, total)

    # Tear everything down now, so the report can say nothing is left.
    for h in hosts:
        h.unmount()
    procs = [env.server, env.relay]
    tier.stop()
    env.stop()
    left = leftovers(procs, tier, hosts)
    if bad:
        raise BenchError("content mismatch: " + "; ".join(
            f"{k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}" for k, v in bad.items()))
    return fleetreport.result(b, runs, files, total, tier, env, left,
                              {"seed": SEED, "reader": READER.replace("LISTS/", ""),
                               "plain": plain, "tuned": ",".join(TUNED)})
