"""Test data shared by the suite and the single-workload reports: the grep tree of small
text files, the untar tarball (crates.io sources of Cargo.lock), and the write job's
parameters (bench/lib/chunk.py, its write size per call, how much memory is primed)."""
import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Optional

from benchcore import BENCH, ROOT, WORK, BenchError, human, log, run


GREP_MARKER = b"TIERFS_GREP_MARKER"
GREP_FILES_PER_DIR = 25
GREP_DEPTH = 4


def make_grep_tree(backing: Path, n: int, seed: int) -> tuple:
    """N files of 1-64 KiB (uniform) of lowercase text, 25 per directory, 4 directory
    levels, from random.Random(seed): the same tree for the same N and seed. Every
    1000th file holds GREP_MARKER once. Reused when its manifest matches."""
    import random
    name = f"grep-tree-{n}-s{seed}"
    d = backing / name
    manifest = backing / f"{name}.manifest.json"
    want = {"files": n, "seed": seed, "format": 1}
    if d.is_dir() and manifest.exists():
        try:
            man = json.loads(manifest.read_text())
            if all(man.get(k) == v for k, v in want.items()):
                log(f"reusing {d} ({n} files, {human(man['bytes'])})")
                return d, man
        except ValueError:
            pass
    tmp = backing / f"{name}.tmp"
    for p in (tmp, d):
        if p.exists():
            shutil.rmtree(p)
    manifest.unlink(missing_ok=True)
    log(f"creating {d}: {n} files (seed {seed})")
    rng = random.Random(seed)
    alphabet = b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 18 + b"\n" * 4
    pool = rng.randbytes(64 << 20).translate(bytes.maketrans(bytes(range(256)), alphabet))
    leaves = max(1, -(-n // GREP_FILES_PER_DIR))
    fan = 1
    while fan ** GREP_DEPTH < leaves:
        fan += 1
    total, markers, t0 = 0, 0, time.monotonic()
    made = set()
    for i in range(n):
        leaf = i // GREP_FILES_PER_DIR
        parts = [f"d{(leaf // fan ** k) % fan:02d}" for k in range(GREP_DEPTH - 1, -1, -1)]
        sub = tmp.joinpath(*parts)
        if sub not in made:
            sub.mkdir(parents=True, exist_ok=True)
            made.add(sub)
        size = rng.randint(1024, 65536)
        off = rng.randrange(len(pool) - size)
        data = pool[off:off + size]
        if i % 1000 == 0:
            pos = rng.randrange(size - len(GREP_MARKER))
            data = data[:pos] + GREP_MARKER + data[pos + len(GREP_MARKER):]
            markers += 1
        with open(sub / f"f{i:07d}.txt", "wb") as fh:
            fh.write(data)
        total += size
        if i and i % 20000 == 0:
            log(f"  {i} files ({time.monotonic() - t0:.0f} s)")
    run(["sync"], 600)
    tmp.rename(d)
    man = dict(want, bytes=total, markers=markers, dirs=len(made), fan_out=fan,
               depth=GREP_DEPTH)
    manifest.write_text(json.dumps(man))
    log(f"created {d} in {time.monotonic() - t0:.0f} s ({human(total)})")
    return d, man


# The write job (seed 001): bench/lib/chunk.py, 512 KiB per write(2).
CHUNK = BENCH / "lib" / "chunk.py"
WRITE_BS = 512 << 10            # the seed's dd bs=524288
# Memory primed before a measured write: this many times the bytes written. A write through
# a cache touches fresh memory more than once (tierfs write-back holds the data in its RAM
# until it is flushed, by design; the store under slowfs, and rclone's cache file, hold it in
# the page cache), while the local disk touches it once. On real hardware fresh memory costs
# only zeroing; on this VM its first touch after the host took it back is ~4x slower
# (FUSE-NOTES lesson 8), which would charge that artifact to the caches alone. Every
# contender is primed alike.
WRITE_PRIME_FACTOR = 3
UNTAR_QUICK_FILES = 1500        # --quick: the first crates (by name) up to >= this many files


def cargo_registry_srcs() -> list:
    home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    return sorted(p for p in (home / "registry" / "src").glob("*") if p.is_dir())


def untar_tarball(quick: bool, max_files: Optional[int] = None) -> dict:
    """The untar source: the crates.io sources of the registry packages in this commit's
    Cargo.lock (what `cargo vendor` would copy; they are in ~/.cargo/registry/src after the
    build, so no network is needed), all of them, or with --quick the first crates by name up
    to >= UNTAR_QUICK_FILES files (or, with max_files, up to >= max_files). Packed once
    into work/untar/ with a normalized tar (sorted
    names, owner 0:0, mtime 2020-01-01) and reused while its manifest matches. Returns the
    tarball's path and what it holds."""
    lock = (ROOT / "Cargo.lock").read_text()
    pkgs = re.findall(r'\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"\n'
                      r'source = "registry\+', lock)
    srcs = cargo_registry_srcs()
    crates, missing = [], []
    for name, ver in sorted(set(pkgs)):
        d = next((s / f"{name}-{ver}" for s in srcs if (s / f"{name}-{ver}").is_dir()), None)
        (crates if d else missing).append(d or f"{name}-{ver}")
    if missing and max_files:
        # A tree of the first N files needs no particular crate: use the ones cargo has
        # unpacked (crates for other platforms, e.g. winapi-util, are fetched but never
        # unpacked); the tarball's name and manifest say which were taken.
        missing = []
    if missing:
        raise BenchError(f"{len(missing)} crates of Cargo.lock not in the cargo registry sources "
                         f"({', '.join(missing[:5])}...): run `cargo fetch` once")
    if not crates:
        raise BenchError("no registry packages in Cargo.lock")
    if len({c.parent for c in crates}) != 1:
        raise BenchError(f"crates spread over several registry dirs: {srcs}")
    picked, files, dirs, links, nbytes = [], 0, 0, 0, 0
    for c in crates:
        for r, ds, fs in os.walk(c):
            dirs += 1
            for f in fs:
                p = os.path.join(r, f)
                st = os.lstat(p)
                if os.path.islink(p):
                    links += 1
                else:
                    files += 1
                    nbytes += st.st_size
        picked.append(c.name)
        if (quick and files >= UNTAR_QUICK_FILES) or (max_files and files >= max_files):
            break
    import hashlib
    tag = hashlib.sha256("\n".join(picked).encode()).hexdigest()[:12]
    d = WORK / "untar"
    d.mkdir(parents=True, exist_ok=True)
    tar = d / f"cargo-src-{len(picked)}crates-{tag}.tar"
    meta = tar.with_suffix(".json")
    info = {"tarball": str(tar), "registry": str(crates[0].parent), "crates": len(picked),
            "crates_in_lock": len(crates), "files": files, "dirs": dirs, "symlinks": links,
            "bytes": nbytes, "first": picked[0], "last": picked[-1]}
    if tar.exists() and meta.exists():
        try:
            old = json.loads(meta.read_text())
            if all(old.get(k) == v for k, v in info.items()):
                log(f"reusing {tar} ({files} files, {human(nbytes)})")
                return old
        except ValueError:
            pass
    tmp = tar.with_name(tar.name + ".tmp")
    cmd = ["tar", "-cf", tmp, "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
           "--mtime=@1577836800", "--format=gnu", "-C", crates[0].parent, *picked]
    log(f"creating {tar}: {len(picked)} crates, {files} files, {dirs} dirs, {human(nbytes)}")
    run(cmd, 1800)
    tmp.rename(tar)
    info["create_cmd"] = shlex.join(str(c) for c in cmd).replace(str(tmp), str(tar))
    info["tar_bytes"] = tar.stat().st_size
    info["sha256"] = run(["sha256sum", tar], 600).stdout.split()[0]
    meta.write_text(json.dumps(info, indent=1))
    return info


def make_stat_dir(backing: Path, n: int, size: int) -> tuple:
    """One directory of `n` files of `size` random bytes each (`f00000.bin`...), for the
    dirstat workload; reused when it holds exactly those files."""
    d = backing / f"dirstat-{n}x{size}"
    names = [f"f{i:05d}.bin" for i in range(n)]
    if d.is_dir():
        have = sorted(os.listdir(d))
        if have == names and all((d / x).stat().st_size == size for x in names):
            log(f"reusing {d} ({n} files of {size} bytes)")
            return d, {"files": n, "size": size}
        shutil.rmtree(d)
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for x in names:
        with open(tmp / x, "wb") as fh:
            fh.write(os.urandom(size))
    run(["sync"], 600)
    tmp.rename(d)
    log(f"created {d}: {n} files of {size} bytes")
    return d, {"files": n, "size": size}
