"""`bench/run --workload s3`: tierfs over a real S3 server with added latency, against the
server read by a plain parallel ranged-GET client and against `rclone mount` (its S3 backend,
`--vfs-cache-mode full`), all in one run (issue 14).

The store: versitygw (scripts/s3-server) on loopback, behind bench/netdelay (`tierfs-netdelay`,
a TCP relay that holds every chunk for --s3-delay-us each way: the kernel has no netem). Every
client, tierfs included, talks to the relay's port. The objects are written straight into the
server's directory (with the `user.etag` xattr a PUT would leave), so setting up costs no
upload; the server's files stay in the page cache (the server's RAM), so the store is bounded
by the relay, the delay and the server, not by the local disk.

Measured, each after `drop_caches`:
- cold sequential read of one large object: `rclone copyto --multi-thread-streams 8` (parallel
  ranged GETs: what the server delivers to a plain client), `rclone cat` (one stream),
  tierfs on a fresh cache, rclone mount on a fresh cache;
- a plain multipart upload of --s3-write-size (`rclone copyto`, 8 parts of 8 MiB in flight),
  the reference for tierfs's write + fsync (issue 44 point 4);
- warm sequential read: each mount unmounted and mounted again on its cache;
- `grep -r` over a tree of small objects, after a first pass and a remount;
- a write of --s3-write-size + fsync through each mount (`dd conv=fsync`), and whether the
  object is whole on the server the moment dd returns;
- 1,000 small objects read by 8 readers, cold, warm and after a remount, with tierfs's store
  requests per open, and the latency of one HEAD against one LIST of their prefix
  (bench/lib/s3small.py, issue 42 point 3).
"""
import hashlib
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import benchcore as R
import s3small
from benchcore import BenchError, Result, log, run
from testbed import Bench

ACCESS, SECRET = "tierfs", "tierfs-secret"
BUCKET, PREFIX = "data", "pre"
SERVER_SCRIPT = R.ROOT / "scripts" / "s3-server"
NETDELAY_BIN = R.TARGET / "tierfs-netdelay"
GREP_FILES = 2000
# rclone's S3 backend (aws-sdk-go) fails to start ("LoadCustomCABundleError ... unsupported
# transport") when AWS_CA_BUNDLE is set, as it is on some machines: not for a plain-HTTP
# endpoint anyway.
RCLONE_ENV = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
RCLONE = ["env", "-u", "AWS_CA_BUNDLE", "rclone"]



def write_random(path: Path, size: int):
    """`size` random bytes into `path` (a source for the writes)."""
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n

def free_port() -> int:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    import socket
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f} s")


def put_file(path: Path, data: bytes) -> None:
    """An object as the server keeps it: the file and its ETag (quoted MD5) in user.etag."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.setxattr(path, "user.etag", f'"{hashlib.md5(data).hexdigest()}"'.encode())


def md5_file(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                return h.hexdigest()
            h.update(b)


class S3Env:
    def __init__(self, b: Bench):
        self.b = b
        self.dir = R.WORK / "s3srv"
        self.objects = self.dir / BUCKET / PREFIX
        self.server = None
        self.relay = None
        self.port = 0
        self.env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rclone_remote(self) -> str:
        # An on-the-fly remote: nothing written to rclone.conf.
        return (f":s3,provider=Other,env_auth=false,access_key_id={ACCESS},"
                f"secret_access_key={SECRET},endpoint='{self.endpoint}',"
                f"force_path_style=true:{BUCKET}/{PREFIX}")

    def start(self, delay_us: int) -> None:
        log("scripts/s3-server --install (versitygw)")
        p = run([SERVER_SCRIPT, "--install"], 1800, check=False)
        if p.returncode != 0:
            raise BenchError(f"scripts/s3-server --install failed: {(p.stderr or '')[-500:]}")
        inner = free_port()
        logs = self.b.logs
        logs.mkdir(parents=True, exist_ok=True)
        self.server = subprocess.Popen(
            [SERVER_SCRIPT, self.dir, str(inner)], env=self.env, stdin=subprocess.DEVNULL,
            stdout=open(logs / "s3-server.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.b.store_hooks.append(("stop the S3 server", self.stop))
        wait_port(inner, self.server, "versitygw")
        self.port = free_port()
        if not NETDELAY_BIN.exists():
            raise BenchError(f"{NETDELAY_BIN} missing (build failed?)")
        self.relay = subprocess.Popen(
            [NETDELAY_BIN, "--listen", f"127.0.0.1:{self.port}", "--connect",
             f"127.0.0.1:{inner}", "--delay-us", str(delay_us)],
            stdin=subprocess.DEVNULL, stdout=open(logs / "s3-netdelay.log", "w"),
            stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, self.relay, "tierfs-netdelay")

    def stop(self) -> None:
        for p in (self.relay, self.server):
            if p and p.poll() is None:
                try:
                    os.killpg(p.pid, 15)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
        self.relay = self.server = None

    def warm_server(self) -> None:
        """The server's files in the page cache (the server's RAM), like the slowfs profiles."""
        run(["sh", "-c", f"find {shlex.quote(str(self.objects))} -type f -exec cat {{}} + "
             ">/dev/null"], 600, check=False)


class Mount:
    """tierfs or rclone mount of the bucket."""

    def __init__(self, b: Bench, env: S3Env, kind: str):
        self.b, self.env, self.kind = b, env, kind
        self.mnt = R.WORK / f"mnt-s3-{kind}"
        self.cache = R.WORK / f"cache-s3-{kind}"
        self.proc = None

    def mount(self, fresh: bool) -> None:
        if fresh and self.cache.exists():
            shutil.rmtree(self.cache)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        if self.kind == "tierfs":
            opts = [f"s3.endpoint={self.env.endpoint}", *self.b.args.tierfs_opt]
            cmd = [R.TIERFS_BIN, "mount", f"s3://{BUCKET}/{PREFIX}", self.mnt, "--cache-dir",
                   self.cache, "-o", ",".join(opts)]
            log("mounting: " + shlex.join(str(c) for c in cmd))
            run(cmd, 120, env=self.env.env)
        else:
            cmd = ["rclone", "mount", self.env.rclone_remote(), str(self.mnt),
                   "--vfs-cache-mode", "full", "--cache-dir", str(self.cache),
                   "--vfs-cache-max-size", "100G", "--dir-cache-time", "1h"]
            log("mounting: " + shlex.join(cmd))
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=RCLONE_ENV,
                                         stdout=open(self.b.logs / "rclone-s3.log", "a"),
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.b.mounted.append(self.mnt)
        R.wait_mounted(self.mnt, 60)

    def unmount(self) -> None:
        if self.kind == "tierfs":
            pids = R.pids_with_arg(str(self.mnt), "tierfs")
            run([R.TIERFS_BIN, "unmount", self.mnt], 600, check=False)
            R.wait_pids_gone(pids, 30)
        else:
            if self.proc and self.proc.poll() is None:
                self.proc.send_signal(2)
                try:
                    self.proc.wait(120)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self.proc = None
        if R.is_mounted(self.mnt):
            run(["fusermount3", "-uz", self.mnt], 30, check=False)
        if self.mnt in self.b.mounted:
            self.b.mounted.remove(self.mnt)

    def stats(self) -> str:
        if self.kind != "tierfs":
            return ""
        p = run([R.TIERFS_BIN, "stats", self.mnt, "--json"], 60, check=False)
        return p.stdout if p.returncode == 0 else ""


def timed(cmd, timeout: float, cwd=None, env=None, ok=(0,)) -> float:
    R.drop_caches()
    t = time.monotonic()
    p = run(cmd, timeout, check=False, cwd=cwd, env=env)
    dt = time.monotonic() - t
    if p.returncode not in ok:
        raise BenchError(f"{shlex.join(str(c) for c in cmd)}: rc={p.returncode} "
                         f"{(p.stderr or '')[-400:]}")
    return dt


def read_seconds(path: Path, size: int) -> float:
    return timed(["dd", f"if={path}", "of=/dev/null", "bs=1M"], max(600, size / 5e6))


def backing_read(stats_json: str) -> str:
    import json
    try:
        s = json.loads(stats_json)
        return f"{s['backing']['read_bytes']:,} bytes in {s['backing']['read']:,} GETs"
    except (ValueError, KeyError, TypeError):
        return "?"


def wl_s3(b: Bench) -> Result:
    args = b.args
    size = args.size_bytes
    wsize = R.parse_size(args.s3_write_size)
    R.ensure_tools(extra=[("rclone", "rclone"), ("unzip", "unzip")])
    b.logs.mkdir(parents=True, exist_ok=True)
    env = S3Env(b)
    if env.dir.exists():
        shutil.rmtree(env.dir)
    log(f"S3 objects: one of {R.human(size)}, a tree of {GREP_FILES} small ones")
    big = os.urandom(size)
    put_file(env.objects / "big.bin", big)
    big_md5 = hashlib.md5(big).hexdigest()
    del big
    import random
    rnd = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "tierfs", "bucket", "object", "needle0"]
    for i in range(GREP_FILES):
        text = " ".join(rnd.choice(words) for _ in range(rnd.randint(200, 3000)))
        put_file(env.objects / f"tree/d{i % 40:02}/f{i:05}.txt", text.encode())
    s3small.put_small(put_file, env.objects)
    env.start(args.s3_delay_us)
    env.warm_server()
    latency = s3small.head_and_list(env.endpoint, ACCESS, SECRET, BUCKET, PREFIX)
    emulation = (f"versitygw v1.7.0 (POSIX backend, keep-alive) on loopback behind tierfs-netdelay "
                 f"adding {args.s3_delay_us / 1000:g} ms each way ({2 * args.s3_delay_us / 1000:g} "
                 f"ms round trip, one more for a new connection's handshake, no bandwidth cap); "
                 f"server files in its page cache")
    rows = []  # (what, contender, seconds, MB/s or None, note)

    def row(what, who, secs, nbytes=None, note=""):
        mbps = nbytes / secs / 1e6 if nbytes else None
        rows.append((what, who, secs, mbps, note))
        log(f"{what}, {who}: {secs:.2f} s" + (f", {mbps:.0f} MB/s" if mbps else "") +
            (f" ({note})" if note else ""))
        return mbps if nbytes else secs

    # The plain clients.
    shm = Path("/dev/shm/tierfs-s3bench")
    shm.mkdir(exist_ok=True)
    b.cleanup_hooks.append(("remove /dev/shm copy", lambda: shutil.rmtree(shm, True)))
    plain = row("cold sequential read", "plain client: 8 parallel ranged GETs",
                timed([*RCLONE, "copyto", f"{env.rclone_remote()}/big.bin", str(shm / "big"),
                       "--multi-thread-streams", "8", "--multi-thread-cutoff", "1M"],
                      max(600, size / 5e6)), size, "rclone copyto --multi-thread-streams 8")
    if md5_file(shm / "big") != big_md5:
        raise BenchError("the plain client read wrong bytes")
    (shm / "big").unlink()
    one = row("cold sequential read", "plain client: one GET",
              timed(["sh", "-c", f"{shlex.join(RCLONE)} cat "
                     f"{shlex.quote(env.rclone_remote() + '/big.bin')} >/dev/null"],
                    max(600, size / 5e6)), size, "rclone cat")

    # A plain multipart upload of the write's size (issue 44 point 4: tierfs's write + fsync
    # against it): rclone copyto, 8 parts of 8 MiB in flight, no checksum of its own.
    src = shm / "w.src"
    write_random(src, wsize)
    R.drop_caches()
    multipart = row(f"write {R.human(wsize)}", "plain client: multipart upload",
                    timed([*RCLONE, "copyto", str(src), f"{env.rclone_remote()}/w-plain.bin",
                           "--s3-upload-concurrency", "8", "--s3-chunk-size", "8M",
                           "--s3-no-check-bucket", "--s3-disable-checksum"],
                          max(1200, wsize / 2e6)), wsize,
                    "rclone copyto --s3-upload-concurrency 8 --s3-chunk-size 8M")
    plain_up = (env.objects / "w-plain.bin")
    if not plain_up.exists() or plain_up.stat().st_size != wsize:
        raise BenchError("the plain multipart upload did not land whole")
    plain_up.unlink()
    src.unlink()

    results = {}
    stats = {}
    small = {}
    for kind in ("tierfs", "rclone"):
        m = Mount(b, env, kind)
        b.cleanup_hooks.append((f"unmount {kind}", m.unmount))
        m.mount(fresh=True)
        results[kind, "cold"] = row("cold sequential read", kind,
                                    read_seconds(m.mnt / "big.bin", size), size,
                                    "fresh mount, empty cache")
        t = timed(["grep", "-rc", "needle0", "tree"], 900, cwd=m.mnt, ok=(0, 1))
        results[kind, "grep_cold"] = row("grep -r, cold", kind, t)
        for phase in ("cold", "warm"):
            small[kind, phase] = s3small.read_small(m, env, phase)
        if kind == "rclone":
            # rclone uploads and caches in the background: let it settle before remounting.
            time.sleep(5)
        m.unmount()
        m.mount(fresh=False)
        results[kind, "warm"] = row("warm sequential read (remount, page cache dropped)", kind,
                                    read_seconds(m.mnt / "big.bin", size), size)
        t = timed(["grep", "-rc", "needle0", "tree"], 900, cwd=m.mnt, ok=(0, 1))
        results[kind, "grep_warm"] = row("grep -r after remount", kind, t)
        small[kind, "remount"] = s3small.read_small(m, env, "remount")
        stats[kind, "read"] = m.stats()
        # The write: dd from /dev/shm with fsync, then at once: is it whole on the server?
        write_random(src, wsize)
        want = md5_file(src)
        name = f"w-{kind}.bin"
        R.drop_caches()
        t0 = time.monotonic()
        p = run(["dd", f"if={src}", f"of={m.mnt / name}", "bs=1M", "conv=fsync"],
                max(1200, wsize / 2e6), check=False)
        secs = time.monotonic() - t0
        on_server = env.objects / name
        whole = on_server.exists() and on_server.stat().st_size == wsize and \
            md5_file(on_server) == want
        note = ("on the server, whole, when dd (fsync) returned" if whole else
                "NOT whole on the server when dd (fsync) returned")
        if p.returncode != 0:
            note = f"dd failed rc={p.returncode}: {(p.stderr or '')[-200:]}"
        results[kind, "write"] = row(f"write {R.human(wsize)} + fsync", kind, secs, wsize, note)
        results[kind, "write_whole"] = whole
        src.unlink()
        stats[kind, "write"] = m.stats()
        m.unmount()

    ratios = [
        ("tierfs cold sequential / plain parallel ranged-GET client",
         results["tierfs", "cold"] / plain),
        ("tierfs cold sequential / one GET stream", results["tierfs", "cold"] / one),
        ("tierfs warm sequential / rclone warm", results["tierfs", "warm"] /
         results["rclone", "warm"]),
        ("tierfs grep -r after remount, speed / rclone's", results["rclone", "grep_warm"] /
         results["tierfs", "grep_warm"]),
        ("tierfs write+fsync / rclone's", results["tierfs", "write"] / results["rclone", "write"]),
        ("tierfs write+fsync / a plain multipart upload of the same bytes (issue 44 wants at "
         "most 1.3x its time: >= 0.77x)", results["tierfs", "write"] / multipart),
    ]
    L = [f"Emulation for every number: **{emulation}**.", "",
         f"Objects: `big.bin` {R.human(size)} (random), a tree of {GREP_FILES} text objects "
         f"(200-3000 words each) for grep; writes of {R.human(wsize)} random bytes from /dev/shm.",
         "", "| what | contender | seconds | MB/s | note |", "|---|---|---:|---:|---|"]
    for what, who, secs, mbps, note in rows:
        L.append(f"| {what} | {who} | {secs:.2f} | {f'{mbps:,.0f}' if mbps else ''} | {note} |")
    L += ["", "Ratios (> 1: tierfs ahead):", ""]
    L += [f"- {k}: **{v:.2f}x**" for k, v in ratios]
    L += ["", "![plots](PLOT_PNG_PLACEHOLDER)", "",
          "Commands: reads `dd if=MNT/big.bin of=/dev/null bs=1M`; grep `grep -rc needle0 tree` "
          "in the mount; writes `dd if=/dev/shm/... of=MNT/w-*.bin bs=1M conv=fsync`; each "
          "after `echo 3 > /proc/sys/vm/drop_caches`. tierfs: `tierfs mount "
          f"s3://{BUCKET}/{PREFIX} MNT -o s3.endpoint=URL` (default options"
          + (f" plus {','.join(args.tierfs_opt)}" if args.tierfs_opt else "") + "). rclone: "
          "`rclone mount :s3,provider=Other,...:data/pre MNT --vfs-cache-mode full "
          "--vfs-cache-max-size 100G --dir-cache-time 1h`. Plain client: `rclone copyto "
          "--multi-thread-streams 8 --multi-thread-cutoff 1M` (parallel ranged GETs) and "
          "`rclone cat` (one GET).", ""]
    L += s3small.markdown(small, latency, emulation,
                          "rclone mount :s3,...:data/pre MNT --vfs-cache-mode full "
                          "--vfs-cache-max-size 100G --dir-cache-time 1h")
    res = Result()
    res.markdown = "\n".join(L)
    res.console = "\n".join(L[:len(rows) + 8] + [f"{k}: {v:.2f}x" for k, v in ratios])
    res.plot = {
        "title": "tierfs over S3 (versitygw + added latency)",
        "subtitle": emulation,
        "panels": [
            {"title": "sequential read", "unit": "MB/s", "bars": [
                {"label": "plain 8x GET", "value": plain},
                {"label": "plain 1 GET", "value": one},
                {"label": "tierfs cold", "value": results["tierfs", "cold"]},
                {"label": "rclone cold", "value": results["rclone", "cold"]},
                {"label": "tierfs warm", "value": results["tierfs", "warm"]},
                {"label": "rclone warm", "value": results["rclone", "warm"]}]},
            {"title": "grep -r (s, lower is better)", "unit": "s", "bars": [
                {"label": "tierfs cold", "value": results["tierfs", "grep_cold"]},
                {"label": "rclone cold", "value": results["rclone", "grep_cold"]},
                {"label": "tierfs remount", "value": results["tierfs", "grep_warm"]},
                {"label": "rclone remount", "value": results["rclone", "grep_warm"]}]},
            {"title": f"{s3small.SMALL_FILES:,} small objects, 8 readers", "unit": "files/s",
             "bars": [{"label": f"{k} {ph}", "value": small[k, ph]["rate"]}
                      for k in ("tierfs", "rclone") for ph in ("cold", "warm", "remount")
                      if (k, ph) in small]},
            {"title": f"write {R.human(wsize)} + fsync", "unit": "MB/s", "bars": [
                {"label": "tierfs", "value": results["tierfs", "write"]},
                {"label": "rclone" + ("" if results["rclone", "write_whole"] else
                                      " (not on the server at fsync)"),
                 "value": results["rclone", "write"]}]},
        ],
    }
    for (kind, phase), text in stats.items():
        if text:
            res.details.append((f"tierfs stats after the {phase} phase", text))
    res.details.append(("tierfs backing reads after the remount's reads",
                        backing_read(stats.get(("tierfs", "read"), ""))))
    return res
