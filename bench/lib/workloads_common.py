"""What the suite's workloads share (workloads_read.py, workloads_write.py,
workloads_memory.py, workloads_meta.py, gitbench.py, rsyncbench.py): the contender lists,
the sizes (`Params`, full / --quick), the report's number formats and its line on the store,
tierfs's store-request counters, and reading a file through a contender until its cache
holds it.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import benchcore as R
import contenders as C

READ_SAME = "the read path does not depend on the write mode: tierfs write-back reads " \
            "exactly as write-through, so it is run only in the workloads that write"
# tierfs-default (no -o) runs on the sshfs profile only (Suite.keys drops it elsewhere).
READERS = ["local", "store", "tierfs-default", "tierfs", "rclone", "bindfs"]
WRITERS = ["local", "store", "tierfs-default", "tierfs", "tierfs-wb", "rclone", "bindfs"]
CACHED = ["tierfs-default", "tierfs", "rclone", "bindfs", "local"]
NOT_A_CACHE = "not a cache: every read pays the emulated store, nothing is 'cached' to share " \
              "memory with"


@dataclass
class Params:
    md5_size: int
    md5_passes: int
    grep_files: int
    grep_seed: int
    fio_size: int
    fio_runtime: int
    fio_ramp: int
    fio_write: int
    write_size: int
    untar_files: int
    mixed_s: float
    mixed_ro_s: float
    mem_file: int
    hog_bytes: int
    hog_target_s: float
    conc_file: int
    conc_runtime: int
    seqcold_size: int
    dirstat_files: int
    dirstat_size: int
    dirstat_reps: int


def params(s) -> Params:
    a, q, M = s.args, s.quick, s.M
    # The sshfs profile (a real network store, ~40-70 MB/s and ~10 ms per small file cold)
    # runs smaller: a 1 GiB fio file, which is also the cold/warm sequential file, and a 2,000
    # file grep tree, so md5 + grep + fio + dirstat fit in ~20 min.
    net = s.profile == "sshfs"
    avail = meminfo("MemAvailable")
    if a.hog_bytes:
        hog = R.parse_size(a.hog_bytes)
    elif q:
        hog = min(2 << 30, avail // 8)  # quick: a modest hog (shared development machine)
    else:
        # full: what is available minus room for tierfs's RAM tier, the reader and 2 GiB.
        hog = max(1 << 30, avail - 2 * M - (2 << 30))
    return Params(
        md5_size=R.parse_size(a.md5_size) if a.md5_size else 2 * M,
        md5_passes=a.md5_passes,
        grep_files=a.grep_files or (500 if q else 2_000 if net else 5_000),
        grep_seed=a.grep_seed,
        fio_size=R.parse_size(a.size) if a.size else
        ((256 << 20) if q and net else (512 << 20) if q else (1 << 30) if net else (2 << 30)),
        fio_runtime=a.fio_runtime or (3 if q else 10),
        fio_ramp=1 if q else 2,
        fio_write=(128 << 20) if q else (1 << 30),
        write_size=(256 << 20) if q else (2 << 30),
        untar_files=a.untar_files or (500 if q else 2000),
        mixed_s=6 if q else 20,
        mixed_ro_s=3 if q else 10,
        mem_file=M // 2,
        hog_bytes=hog,
        hog_target_s=6 if q else 20,
        conc_file=max(32 << 20, M // 4),
        conc_runtime=2 if q else 5,
        seqcold_size=(256 << 20) if q else (1 << 30),  # the 1 GiB; == fio_size on sshfs
        dirstat_files=1000,
        dirstat_size=4096,
        dirstat_reps=1 if q else 3,  # a 1,000-file pass is ~0.1-0.3 s: noisy alone
    )


def size_tag(n: int) -> str:
    """4G / 512M: the names bench/run's other workloads give their test files."""
    return f"{n >> 30}G" if n % (1 << 30) == 0 else f"{n >> 20}M"


def meminfo(key: str) -> int:
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def md(v, spec=",.0f", unit="") -> str:
    return R.na(v, spec, unit)


def hb(v) -> str:
    return R.hbytes(v)


def emu_line(s, sec) -> str:
    if sec.profile == "sshfs":
        return (f"Store: **{sec.emulation or s.b.emulation}** (profile `sshfs`: a real sshfs "
                "mount, no emulator, bench/lib/sshstore.py; *store read* = bytes the relay "
                "carried from the server, i.e. the ssh stream with its protocol overhead). "
                f"Link: {sec.store_details}. `tierfs-default` runs with tierfs's own defaults "
                "(no `-o`: its default `ram.max`, SSD-tier and metadata-cache settings), so what "
                "this section says relative to `ram.max` holds for `tierfs` only.")
    return f"Emulation: slowfs **{s.b.emulation or sec.emulation}** (profile `{sec.profile}`)."


BACKING_KEYS = ("read_bytes", "lookup", "getattr", "readdir", "open", "read")


def backing_delta(c, t0, t1) -> Optional[dict]:
    """What a tierfs contender asked of its store between two `tierfs stats --json`
    snapshots (the `backing` counters); None for other contenders."""
    if not isinstance(c, C.Tierfs) or t1 is None:
        return None
    return {k: R.jdiff(t0, t1, f"backing.{k}") if t0 is not None else R.jget(t1, f"backing.{k}")
            for k in BACKING_KEYS}


def backing_text(phases: list) -> str:
    """`[(label, backing_delta)]` as one line: read bytes, then request counts per phase."""
    out = []
    for label, d in phases:
        if not d:
            out.append(f"{label}: n/a")
            continue
        out.append(f"{label}: **{hb(d.get('read_bytes'))}** read, "
                   + ", ".join(f"{k} {md(d.get(k))}" for k in BACKING_KEYS[1:]))
    return "; ".join(out)


def fill_through(s, sec, c, path: Path, size: int, fill0: Optional[int] = None) -> list:
    """Reads `path` through the contender until its cache holds it (tierfs: ssd.fill_bytes
    >= 95% of the file or 2 passes; others: one pass). Untimed for the result, reported."""
    out = []
    # what the SSD tier held before (another file read earlier on the same mount); `fill0`:
    # counted from before an earlier read of this same file
    if fill0 is None:
        fill0 = R.jget(c.stats(), "ssd.fill_bytes") or 0
    for i in (1, 2):
        s.prepare(c, warm_files=[s.b.backing / path.name], prime=0)
        dt, _, sl = s.timed(sec, ["dd", f"if={path}", "of=/dev/null", "bs=1M"],
                            max(600, size / 5e6))
        s.served(sec, c.key, read=size)
        st = c.stats()
        fill = R.jget(st, "ssd.fill_bytes")
        out.append({"pass": i, "mbps": size / dt / 1e6, "slow": sl.get("bytes_read"),
                    "fill": fill})
        if not isinstance(c, C.Tierfs) or fill is None or fill - fill0 >= 0.95 * size:
            break
    return out
