"""The reader memory cgroup: measured readers run in it so their page cache is limited."""
import os
import signal
import time
from pathlib import Path
from typing import Optional

from benchcore import human, log


class ReaderCgroup:
    """Memory cgroup for the measured readers (fio, dd, md5sum, grep): their page cache is
    charged to it, so with a limit below the file size the kernel cannot hold the file for
    them. cgroup v2 (`memory.max`) when a v2 hierarchy offers the memory controller; else
    cgroup v1 (`memory.limit_in_bytes`), nested under this process's own memory cgroup (so
    the readers stay accounted where the harness is). Readers join it with
    `sh -c 'echo $$ > cgroup.procs; exec CMD'`. remove() kills what is left in it (by pid)
    and removes it; it is registered as a Bench cleanup hook."""

    def __init__(self, limit: int):
        self.limit = limit
        self.version: Optional[int] = None
        self.path: Optional[Path] = None
        self.error = ""
        name = f"tierfs-bench-reader-{os.getpid()}"
        try:
            if not self._setup_v2(name) and not self._setup_v1(name):
                self.error = "no cgroup v2 hierarchy with the memory controller and no v1 " \
                             "memory hierarchy found"
        except OSError as e:
            self.error = f"{e}"
            self.remove()
        if self.path:
            log(f"reader cgroup: v{self.version} {self.path}, limit {human(limit)}")
        else:
            log(f"reader cgroup unavailable ({self.error}): readers run unlimited")

    def _setup_v2(self, name: str) -> bool:
        seen = set()
        for root in [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")]:
            ctl = root / "cgroup.controllers"
            if not ctl.exists() or os.path.realpath(root) in seen:
                continue
            seen.add(os.path.realpath(root))
            if "memory" not in ctl.read_text().split():
                continue
            sub = root / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
            path = root / name
            path.mkdir()
            self.path, self.version = path, 2
            (path / "memory.max").write_text(str(self.limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            return True
        return False

    def _setup_v1(self, name: str) -> bool:
        root = Path("/sys/fs/cgroup/memory")
        if not (root / "memory.limit_in_bytes").exists():
            return False
        own = "/"
        for line in open("/proc/self/cgroup"):
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3 and "memory" in parts[1].split(","):
                own = parts[2]
        last: Optional[OSError] = None
        for parent in dict.fromkeys([root / own.lstrip("/"), root]):
            try:
                (parent / name).mkdir()
            except OSError as e:
                last = e
                continue
            self.path, self.version = parent / name, 1
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            return True
        raise last or OSError("cannot create a v1 memory cgroup")

    def describe(self) -> str:
        if not self.path:
            return f"none ({self.error}); readers NOT memory-limited"
        knob = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return f"cgroup v{self.version} `{self.path}`, {knob} = {self.limit} ({human(self.limit)})"

    def wrap(self, cmd) -> list:
        cmd = [str(c) for c in cmd]
        if not self.path:
            return cmd
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"),
                *cmd]

    def reset_peak(self) -> None:
        if self.path and self.version == 1:
            try:
                (self.path / "memory.max_usage_in_bytes").write_text("0")
            except OSError:
                pass

    def peak(self) -> str:
        """Peak usage (since reset_peak, v1) and how often the limit was hit."""
        if not self.path:
            return "n/a"
        try:
            if self.version == 1:
                mx = int((self.path / "memory.max_usage_in_bytes").read_text())
                fc = int((self.path / "memory.failcnt").read_text())
                return f"peak usage {human(mx)} of {human(self.limit)}, limit hit {fc} times " \
                       "(memory.failcnt, cumulative)"
            pk = (self.path / "memory.peak").read_text().strip() \
                if (self.path / "memory.peak").exists() else None
            ev = dict(ln.split() for ln in (self.path / "memory.events").read_text().splitlines())
            return (f"peak usage {human(int(pk))} of {human(self.limit)}, " if pk else "") + \
                f"memory.events max={ev.get('max', '?')} (cumulative)"
        except (OSError, ValueError):
            return "n/a"

    def pids(self) -> list:
        if not self.path:
            return []
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILLs every process left in the cgroup (readers of an interrupted step: run()
        kills only its `timeout` wrapper) and waits until it is empty."""
        if not self.path or not self.path.exists():
            return
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            for pid in left:
                log(f"reader cgroup: killing leftover reader {pid}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def remove(self) -> None:
        if not self.path or not self.path.exists():
            return
        self.kill()
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            log(f"reader cgroup: could not remove {self.path}")
