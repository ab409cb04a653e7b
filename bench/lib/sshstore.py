"""The `sshfs` store profile: a real network filesystem instead of the slowfs emulator.

The store is the sshfs client (Debian's sshfs, default options) mounted over a real sshd that
runs in a network namespace the bench creates:

    root namespace                                      namespace tierfs-bench
    sshfs -> ssh -> 127.0.0.1:PORT tierfs-netdelay -> 10.77.0.1 tbench0 == veth == tbench1
                                                          10.77.0.2:22 sshd -> sftp-server

Both veth ends have a `tbf rate 1gbit` qdisc (egress, so each direction is capped at 1 Gbit/s).
The kernel has no `netem`, so the round trip comes from bench/netdelay (`tierfs-netdelay`): a
TCP relay that holds every chunk for a fixed delay in each direction, pipelined (no rate cap),
and a new connection's first bytes for its handshake's round trip too.
sshd serves the same bench/work/backing directory the slowfs profiles use; the harness reads
the backing files into the page cache before measured steps, as for slowfs (the server's RAM),
so the store is bounded by the link, the delay and ssh, not by the local disk.

SshfsStore.setup() builds it all (idempotent; leftovers of an interrupted run are removed
first), teardown() removes it all (sshfs unmounted lazily, sshfs / relay / sshd and whatever
runs in the namespace killed, the namespace deleted); a `Site` gives a store names and
addresses of its own, so a second one can be up next to bench/sshfs-store's (`bench/run
--workload meta` uses one); every external command runs under a timeout. stats() gives the
relay's byte counters in slowfs's key names (bytes_read: server to client, bytes_written:
client to server; ssh stream bytes, protocol overhead included).
"""
import json
import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Optional

import benchcore as R

NETNS = "tierfs-bench"
VETH_HOST, VETH_NS = "tbench0", "tbench1"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"
RATE = "1gbit"
# tbf: bucket of 256 KiB (a few GSO super-packets: tbf segments what exceeds it), 20 ms of
# queue before it drops.
TBF = ["tbf", "rate", RATE, "burst", "256kb", "latency", "20ms"]
DEFAULT_DELAY_US = 2000
NETDELAY_BIN = R.TARGET / "tierfs-netdelay"
DIR = R.WORK / "sshfs"
MNT = R.WORK / "mnt-sshfs"


@dataclass(frozen=True)
class Site:
    """The names and addresses one store uses: its namespace, veth pair, subnet, key
    directory and sshfs mountpoint. Two stores with different sites can be up at once (a
    hand-measurement store of bench/sshfs-store and a bench run), and each one's cleanup
    finds only its own leftovers."""
    netns: str = NETNS
    veth_host: str = VETH_HOST
    veth_ns: str = VETH_NS
    host_ip: str = HOST_IP
    ns_ip: str = NS_IP
    dir: Path = DIR
    mnt: Path = MNT


SITE = Site()
TOOLS = [("sshfs", "sshfs"), ("/usr/sbin/sshd", "openssh-server"), ("ssh", "openssh-client"),
         ("ssh-keygen", "openssh-client"), ("ip", "iproute2"), ("tc", "iproute2")]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def netns_exists(netns: str = NETNS) -> bool:
    p = R.run(["ip", "netns", "list"], 30, check=False)
    return any(line.split()[:1] == [netns] for line in (p.stdout or "").splitlines())


def netns_pids(netns: str = NETNS) -> list:
    if not netns_exists(netns):
        return []
    p = R.run(["ip", "netns", "pids", netns], 30, check=False)
    return [int(x) for x in (p.stdout or "").split() if x.isdigit()]


def leftovers(site: Site = SITE) -> list:
    """What of this profile is still there (for the suite's teardown check): the namespace,
    the host's veth end, processes in the namespace, relays, sshfs / ssh clients of ours."""
    out = []
    if netns_exists(site.netns):
        out.append(f"network namespace {site.netns}")
        out += [f"{pid}: in netns {site.netns}: {cmdline(pid)[:160]}"
                for pid in netns_pids(site.netns)]
    if Path(f"/sys/class/net/{site.veth_host}").exists():
        out.append(f"network interface {site.veth_host}")
    for pid in procs_matching(site):
        out.append(f"{pid}: {cmdline(pid)[:160]}")
    return out


def cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return "?"


def procs_matching(site: Site = SITE) -> list:
    """Relays (tierfs-netdelay to our sshd), sshfs on our mountpoint, ssh with our key (or
    our ssh_config: the sftp store's)."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        c = cmdline(int(d))
        if ("tierfs-netdelay" in c and f"{site.ns_ip}:22" in c) or \
                (c.startswith("sshfs") and str(site.mnt) in c) or \
                (c.startswith("ssh ") and str(site.dir) in c):
            try:
                if ") Z" in open(f"/proc/{d}/stat").read():
                    continue
            except OSError:
                continue
            out.append(int(d))
    return out


def kill_pids(pids, what: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in pids if os.path.exists(f"/proc/{p}")]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not R.wait_pids_gone(left, 5):
            return
    R.log(f"sshfs store: {what} still running after SIGKILL: {pids}")


def stop_proc(p: Optional[subprocess.Popen], timeout: float = 10) -> None:
    if p is None or p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class SshfsStore:
    def __init__(self, b, delay_us: int = DEFAULT_DELAY_US, site: Site = SITE):
        self.b = b
        self.site = site
        self.delay_us = delay_us
        self.port = 0
        self.stats_port = 0
        self.sshd: Optional[subprocess.Popen] = None
        self.relay: Optional[subprocess.Popen] = None
        self.sshfs: Optional[subprocess.Popen] = None
        self.cmds: list = []          # what was run, in order (for the report)
        self.measured: dict = {}      # rtt / bulk measurements of the first setup
        self.versions: dict = {}
        self.mounts = 0
        self.key = site.dir / "client_key"
        self.host_key = site.dir / "host_key"
        self.conf = site.dir / "sshd_config"
        self.up = False

    # -- pieces ------------------------------------------------------------------------------

    def sh(self, cmd, timeout: float = 30, check: bool = True):
        self.cmds.append(shlex.join(str(c) for c in cmd))
        return R.run(cmd, timeout, check=check)

    def clean_stale(self) -> None:
        """Leftovers of an interrupted earlier run: the mount, our processes, the namespace."""
        if R.is_mounted(self.site.mnt):
            R.log(f"stale sshfs mount {self.site.mnt}: unmounting")
            R.run(["fusermount3", "-uz", self.site.mnt], 30, check=False)
        stale = procs_matching(self.site) + netns_pids(self.site.netns)
        if stale:
            R.log(f"sshfs store: killing leftovers of an earlier run: {stale}")
            kill_pids(stale, "leftover")
        if netns_exists(self.site.netns):
            R.run(["ip", "netns", "del", self.site.netns], 30, check=False)
        if Path(f"/sys/class/net/{self.site.veth_host}").exists():
            R.run(["ip", "link", "del", self.site.veth_host], 30, check=False)

    def keys(self) -> None:
        self.site.dir.mkdir(parents=True, exist_ok=True)
        for k in (self.host_key, self.key):
            if not k.exists() or not k.with_name(k.name + ".pub").exists():
                for f in (k, k.with_name(k.name + ".pub")):
                    f.unlink(missing_ok=True)
                self.sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                         f"tierfs-bench {k.name}", "-f", k])
        (self.site.dir / "authorized_keys").write_text(
            self.key.with_name(self.key.name + ".pub").read_text())
        os.chmod(self.site.dir / "authorized_keys", 0o600)
        self.conf.write_text("\n".join([
            "# generated by bench/lib/sshstore.py: the sshfs profile's server",
            f"ListenAddress {self.site.ns_ip}",
            "Port 22",
            f"HostKey {self.host_key}",
            f"PidFile {self.site.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.site.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # bench/work may be group-writable on a developer's machine
            "StrictModes no",
            "UseDNS no",
            "X11Forwarding no",
            "PrintMotd no",
            "LogLevel INFO",
            # Debian's default sftp server, as a stock sshd would run it
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.sh(["/usr/sbin/sshd", "-t", "-f", self.conf])

    def network(self) -> None:
        s = self.site
        self.sh(["ip", "netns", "add", s.netns])
        self.sh(["ip", "link", "add", s.veth_host, "type", "veth", "peer", "name", s.veth_ns,
                 "netns", s.netns])
        self.sh(["ip", "addr", "add", f"{s.host_ip}/24", "dev", s.veth_host])
        self.sh(["ip", "link", "set", s.veth_host, "up"])
        self.sh(["ip", "-n", s.netns, "addr", "add", f"{s.ns_ip}/24", "dev", s.veth_ns])
        self.sh(["ip", "-n", s.netns, "link", "set", s.veth_ns, "up"])
        self.sh(["ip", "-n", s.netns, "link", "set", "lo", "up"])
        self.sh(["tc", "qdisc", "replace", "dev", s.veth_host, "root", *TBF])
        self.sh(["tc", "-n", s.netns, "qdisc", "replace", "dev", s.veth_ns, "root", *TBF])

    def daemon(self, cmd, log_name: str) -> subprocess.Popen:
        self.cmds.append(shlex.join(str(c) for c in cmd))
        R.log("starting: " + shlex.join(str(c) for c in cmd))
        lf = open(self.b.logs / log_name, "a")
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=lf,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        lf.close()
        return p

    def wait_port(self, host: str, port: int, proc: subprocess.Popen, what: str,
                  timeout: float = 20) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if proc.poll() is not None:
                raise R.BenchError(f"{what} exited (rc={proc.returncode}); see "
                                   f"{self.b.logs}")
            try:
                socket.create_connection((host, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise R.BenchError(f"{what} not listening on {host}:{port} after {timeout:.0f} s")

    def ssh_base(self, port: Optional[int] = None, host: str = "127.0.0.1") -> list:
        return ["ssh", "-p", str(port or self.port), "-i", str(self.key),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-T", f"root@{host}"]

    def sshfs_cmd(self) -> list:
        # Default sshfs options, as a user mounts it; -f keeps it in the foreground (a child
        # of ours, to be stopped by pid); the -o options only make the login non-interactive.
        return ["sshfs", "-f", "-p", str(self.port), f"root@127.0.0.1:{self.b.backing}",
                str(self.site.mnt), "-o", f"IdentityFile={self.key},StrictHostKeyChecking=no,"
                "UserKnownHostsFile=/dev/null,BatchMode=yes"]

    # -- sshfs mount -------------------------------------------------------------------------

    def mount(self) -> float:
        self.site.mnt.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.sshfs = self.daemon(self.sshfs_cmd(), "sshfs.log")
        R.wait_mounted(self.site.mnt, 30, lambda: self.sshfs.poll() is None)
        # The mount appears before sshfs's first reply: wait until the root answers.
        R.run(["stat", "-f", self.site.mnt], 30)
        self.mounts += 1
        return time.monotonic() - t0

    def unmount(self) -> None:
        if R.is_mounted(self.site.mnt):
            p = R.run(["fusermount3", "-u", self.site.mnt], 30, check=False)
            if p.returncode != 0 or R.is_mounted(self.site.mnt):
                R.run(["fusermount3", "-uz", self.site.mnt], 30, check=False)
        stop_proc(self.sshfs)
        self.sshfs = None

    def remount(self) -> float:
        """A fresh sshfs mount (empty sshfs caches, a new st_dev); the server stays."""
        self.unmount()
        return self.mount()

    # -- lifecycle ---------------------------------------------------------------------------

    def setup(self) -> None:
        if self.up:
            if self.sshfs is None or self.sshfs.poll() is not None or \
                    not R.is_mounted(self.site.mnt):
                raise R.BenchError("the sshfs store went away (sshfs exited); see "
                                   f"{self.b.logs / 'sshfs.log'}")
            return
        if not NETDELAY_BIN.exists():
            raise R.BenchError(f"{NETDELAY_BIN} missing (build failed?)")
        self.clean_stale()
        self.up = True  # from here on teardown() has something to do
        self.keys()
        self.network()
        self.sshd = self.daemon(["ip", "netns", "exec", self.site.netns, "/usr/sbin/sshd",
                                 "-D", "-e", "-f", self.conf], "sshd.log")
        self.wait_port(self.site.ns_ip, 22, self.sshd, "sshd")
        self.port, self.stats_port = free_port(), free_port()
        self.relay = self.daemon([NETDELAY_BIN, "--listen", f"127.0.0.1:{self.port}",
                                  "--connect", f"{self.site.ns_ip}:22",
                                  "--delay-us", str(self.delay_us),
                                  "--stats", f"127.0.0.1:{self.stats_port}"], "netdelay.log")
        self.wait_port("127.0.0.1", self.port, self.relay, "tierfs-netdelay")
        self.wait_port("127.0.0.1", self.stats_port, self.relay, "tierfs-netdelay stats")
        self.collect_versions()
        if not self.measured:
            self.measure()
        self.mount()

    def teardown(self) -> None:
        """Everything down; idempotent, safe on a half-built setup."""
        if R.is_mounted(self.site.mnt) or self.sshfs is not None:
            try:
                R.run(["fusermount3", "-uz", self.site.mnt], 30, check=False)
            finally:
                stop_proc(self.sshfs)
                self.sshfs = None
        stop_proc(self.relay)
        self.relay = None
        stop_proc(self.sshd)
        self.sshd = None
        left = procs_matching(self.site) + netns_pids(self.site.netns)
        if left:
            kill_pids(left, "sshfs/ssh/relay/netns process")
        if netns_exists(self.site.netns):
            R.run(["ip", "netns", "del", self.site.netns], 30, check=False)
        if Path(f"/sys/class/net/{self.site.veth_host}").exists():
            R.run(["ip", "link", "del", self.site.veth_host], 30, check=False)
        self.up = False

    # -- counters, description ---------------------------------------------------------------

    def stats(self) -> Optional[dict]:
        if not self.relay or self.relay.poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", self.stats_port), timeout=5) as s:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            j = json.loads(data)
        except (OSError, ValueError):
            return None
        return {"bytes_read": j["bytes_down"], "bytes_written": j["bytes_up"],
                "connections": j["connections"], "late_chunks": j["late_chunks"]}

    def collect_versions(self) -> None:
        if self.versions:
            return
        p = R.run(["sshfs", "--version"], 30, check=False)
        out = (p.stdout or "") + (p.stderr or "")
        sshfs = next((ln.split()[-1] for ln in out.splitlines() if ln.startswith("SSHFS")), "?")
        fuse = next((ln.split()[-1] for ln in out.splitlines()
                     if ln.startswith("FUSE library")), "?")
        p = R.run(["ssh", "-V"], 30, check=False)
        ssh = ((p.stderr or "") + (p.stdout or "")).strip()
        ssh_short = ssh.split(",")[0].replace("OpenSSH_", "")
        self.versions = {"sshfs": sshfs, "sshfs_fuse": fuse, "openssh": ssh,
                         "openssh_short": ssh_short.split("p")[0] if ssh_short else "?"}

    def describe(self) -> str:
        v = self.versions or {}
        rtt = self.measured.get("rtt_relay_ms")
        return (f"sshfs {v.get('sshfs', '?')} over OpenSSH {v.get('openssh_short', '?')} to an "
                f"sshd in a network namespace, veth + tbf {RATE.replace('gbit', ' gbit')}, "
                f"userspace relay adding {self.delay_us / 1000:g} ms each way (measured RTT "
                + (f"{rtt:.2f} ms" if rtt else "n/a") + ")")

    def details(self) -> str:
        """The measurements of the link, for the report."""
        m = self.measured
        if not m:
            return "(not measured)"

        def f(k, spec=".2f"):
            v = m.get(k)
            return format(v, spec) if isinstance(v, (int, float)) else "n/a"

        return (f"ssh round trip (a byte echoed by `cat` on the server, median of "
                f"{m.get('rtt_n', '?')}): through the relay **{f('rtt_relay_ms')} ms** (min "
                f"{f('rtt_relay_min_ms')}), straight to {self.site.ns_ip}:22 without the relay "
                f"{f('rtt_direct_ms')} ms; bulk over ssh (`ssh ... cat FILE > /dev/null`, "
                f"{R.human(m.get('bulk_bytes', 0))}, file in the server's page cache): through "
                f"the relay **{f('ssh_relay_mbps', '.0f')} MB/s**, without it "
                f"{f('ssh_direct_mbps', '.0f')} MB/s; `dd bs=1M` of the file through a fresh "
                f"sshfs mount: **{f('sshfs_mbps', '.0f')} MB/s** (tbf caps each direction at "
                "125 MB/s)")

    # -- measuring the link --------------------------------------------------------------------

    def echo_rtt(self, port: int, host: str, n: int = 40) -> list:
        """Round trips of one byte through `ssh ... cat` (ssh session already open)."""
        cmd = ["timeout", "120"] + self.ssh_base(port, host) + ["cat"]
        self.cmds.append(shlex.join(cmd))
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        out = []
        try:
            for i in range(n + 5):
                t0 = time.perf_counter()
                p.stdin.write(b"x")
                p.stdin.flush()
                if not sel.select(timeout=30):
                    raise R.BenchError("ssh echo: no reply in 30 s")
                if p.stdout.read1(1) != b"x":
                    raise R.BenchError("ssh echo: connection closed: "
                                       + (p.stderr.read() or b"").decode()[-300:])
                if i >= 5:  # the first round trips pay for the session start
                    out.append((time.perf_counter() - t0) * 1000)
        finally:
            sel.close()
            stop_proc(p, 5)
        return out

    def measure(self) -> None:
        m = self.measured
        rel = self.echo_rtt(self.port, "127.0.0.1")
        direct = self.echo_rtt(22, self.site.ns_ip)
        m.update(rtt_n=len(rel), rtt_relay_ms=median(rel), rtt_relay_min_ms=min(rel),
                 rtt_direct_ms=median(direct))
        f = self.b.test_file("sshfs-link-256M.bin", 256 << 20)
        m["bulk_bytes"] = f.stat().st_size
        for key, port, host in (("ssh_relay_mbps", self.port, "127.0.0.1"),
                                ("ssh_direct_mbps", 22, self.site.ns_ip)):
            R.drop_caches()
            self.b.warm_backing([f])
            cmd = self.ssh_base(port, host) + [f"cat {shlex.quote(str(f))}"]
            self.cmds.append(shlex.join(cmd) + " > /dev/null")
            t0 = time.monotonic()
            R.run(["sh", "-c", 'exec "$@" > /dev/null', "sh", *cmd], 300)
            m[key] = m["bulk_bytes"] / (time.monotonic() - t0) / 1e6
        self.mount()
        try:
            R.drop_caches()
            self.b.warm_backing([f])
            cmd = ["dd", f"if={self.site.mnt / f.name}", "of=/dev/null", "bs=1M"]
            self.cmds.append(shlex.join(cmd))
            t0 = time.monotonic()
            R.run(cmd, 300)
            m["sshfs_mbps"] = m["bulk_bytes"] / (time.monotonic() - t0) / 1e6
        finally:
            self.unmount()
        R.log(f"sshfs store: RTT through the relay {m['rtt_relay_ms']:.2f} ms (direct "
              f"{m['rtt_direct_ms']:.2f} ms); ssh bulk {m['ssh_relay_mbps']:.0f} MB/s through "
              f"the relay ({m['ssh_direct_mbps']:.0f} direct); sshfs dd {m['sshfs_mbps']:.0f} "
              "MB/s")


def ensure_tools() -> None:
    missing = []
    for binary, pkg in TOOLS:
        if not shutil.which(binary) and pkg not in missing:
            missing.append(pkg)
    if missing and not R.apt_install(missing):
        raise R.BenchError(f"missing tools for the sshfs profile: {missing}")
