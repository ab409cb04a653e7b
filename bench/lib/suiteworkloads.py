"""The suite's workloads by name (`bench/run WORKLOAD[@PROFILE]`): those of workloads.py, and
those with a module of their own (git, rsync: gitbench.py, rsyncbench.py), which use
workloads_common.py's helpers. Above all of them, so that none imports another back."""

import gitbench
import rsyncbench
import workloads

WORKLOADS = dict(workloads.WORKLOADS)
WORKLOADS["git"] = (gitbench.wl_git, "git add and git commit of many small new files "
                                     "(issue 15): loose objects linked into place")
WORKLOADS["rsync"] = (rsyncbench.wl_rsync, "rsync -a of a changed tree over an older copy "
                                           "(issue 15): files renamed over the store's")
