"""The workloads of the benchmark suite (issue 6; `concurrency` is issue 5 point 3).

Each is `def wl_NAME(s: Suite, sec: Section)`, registered in WORKLOADS, and fills `sec`:
markdown (`sec.add`), summary metrics (`sec.metric`, higher is better), plot panels
(`sec.panels`), commands (`s.timed` logs them). Sizes come from `Params` (full / --quick) and
each section states them. Contenders that do not apply are put in `sec.skipped` with why.

This module names them (WORKLOADS) and sets the default job list (ORDER). The workloads
themselves: workloads_read.py (md5, grep, fio, concurrency), workloads_write.py (write,
mixed), workloads_memory.py (memory), workloads_meta.py (dirstat); what they share:
workloads_common.py. git and rsync have modules of their own (gitbench.py,
rsyncbench.py), named in suiteworkloads.py.
"""

from workloads_memory import wl_memory
from workloads_meta import wl_dirstat
from workloads_read import wl_concurrency, wl_fio, wl_grep, wl_md5
from workloads_write import wl_mixed, wl_write

WORKLOADS = {
    "md5": (wl_md5, "1. md5 loop over a file twice the memory budget, 6 passes (seed 002)"),
    "grep": (wl_grep, "2. grep -r over many small files: cold, warm, after remount (seed 000)"),
    "fio": (wl_fio, "3. fio: sequential 1 MiB and 4 KiB random reads warm from the SSD tier, "
                    "1 MiB sequential write"),
    "write": (wl_write, "4. write job (seed 001, open/write/fsync/close) and an untar"),
    "mixed": (wl_mixed, "5. mixed concurrent readers and writers, blogbench style (seed 003)"),
    "memory": (wl_memory, "6. memory coexistence: a memory hog next to a cached read loop "
                          "(seed 004)"),
    "concurrency": (wl_concurrency, "cached 4 KiB / 1 MiB random reads with 1, 2, 4 threads "
                                    "(issue 5 point 3)"),
    "dirstat": (wl_dirstat, "metadata of one directory of 1,000 small files: find -exec stat "
                            "and du -s, cold, warm, after drop_caches"),
}

# The default job list (no WORKLOAD named); dirstat, git and rsync run when named (e.g.
# dirstat@sshfs, git@nfs-lan, rsync@sshfs).
ORDER = ["md5", "grep", "fio", "write", "mixed", "memory", "concurrency"]
