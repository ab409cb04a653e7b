"""The suite's memory workload (6., seed 004): a memory hog (stress-ng) next to a cached
read loop, each alone and both together, with the contender daemon's memory sampled.
Registered by name in workloads.py.
"""

import shlex
import subprocess
import threading
import time

import benchcore as R
import contenders as C
from workloads_common import (CACHED, NOT_A_CACHE, READ_SAME, emu_line, fill_through, hb,
                              meminfo, params, size_tag)


# ---------------------------------------------------------------------------------------------
# 6. memory coexistence (seed 004)

class Sampler(threading.Thread):
    """Every 0.5 s: the contender daemon's RSS, tierfs's RAM tier (ram.bytes and, when the
    binary has a memory-pressure monitor, its `pressure.target`), MemAvailable."""

    def __init__(self, c):
        super().__init__(daemon=True)
        self.c = c
        self.stop_ev = threading.Event()
        self.rows: list = []
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop_ev.is_set():
            t = time.monotonic() - self.t0
            pids = self.c.pids()
            rss = sum(C.rss_bytes(p) or 0 for p in pids) if pids else None
            st = self.c.stats() if isinstance(self.c, C.Tierfs) else None
            ram = (st or {}).get("ram") if isinstance(st, dict) else None
            ram = ram if isinstance(ram, dict) else {}
            # The memory-pressure monitor's cap of the RAM tier (`pressure.target`); older
            # binaries have none (or, defensively, a ram.*target* key).
            target = R.jget(st, "pressure.target") or next(
                (v for k, v in sorted(ram.items()) if "target" in k
                 and isinstance(v, (int, float))), None)
            self.rows.append({"t": t, "rss": rss, "ram": ram.get("bytes"), "target": target,
                              "avail": meminfo("MemAvailable")})
            self.stop_ev.wait(0.5)

    def stop(self):
        self.stop_ev.set()
        self.join(timeout=10)


def hog_cmd(P, ops) -> list:
    return ["stress-ng", "--vm", "2", "--vm-bytes", str(P.hog_bytes), "--vm-keep",
            "--vm-ops", str(ops), "--metrics-brief"]


def run_hog_and_reader(s, sec, c, hog, reader, P):
    """Starts the hog and the reader together; returns (hog s, reader s, samples)."""
    sam = Sampler(c) if c else None
    if sam:
        sam.start()
    sec.cmd(hog)
    t0 = time.monotonic()
    hp = subprocess.Popen(hog, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    s.hog_procs.append(hp)
    t_reader = None
    if reader:
        t_reader, _, _ = s.timed(sec, reader, 1800)
    try:
        hp.wait(timeout=1800)
    except subprocess.TimeoutExpired:
        s.kill_bg()
        raise R.BenchError("memory hog did not finish in 1800 s")
    t_hog = time.monotonic() - t0
    if sam:
        sam.stop()
    if hp.returncode != 0:
        raise R.BenchError(f"stress-ng failed (rc={hp.returncode}): "
                           f"{(hp.stderr.read() or '').strip()[-300:]}")
    return t_hog, t_reader, (sam.rows if sam else [])


def wl_memory(s, sec):
    P = params(s)
    f = s.b.test_file(f"mem-{size_tag(P.mem_file)}.bin", P.mem_file)
    sec.skipped["store"] = NOT_A_CACHE
    sec.skipped["tierfs-wb"] = READ_SAME
    # Fixed work for the hog: after one discarded warm-up run (the first touch of freshly
    # freed memory is slow on this VM, FUSE-NOTES lesson 8), calibration runs from 400
    # bogo-ops up (x4, at most 3 more) until one lasts at least a quarter of hog_target_s;
    # --vm-ops is then scaled from it linearly. The number is stated.
    R.drop_caches()
    run_hog_and_reader(s, sec, None, hog_cmd(P, 100), None, P)
    cal = []
    c_ops = 400
    for _ in range(4):
        t_c, _, _ = run_hog_and_reader(s, sec, None, hog_cmd(P, c_ops), None, P)
        cal.append((c_ops, t_c))
        if t_c >= P.hog_target_s / 4:
            break
        c_ops *= 4
    ops = int(min(10_000_000, max(100, c_ops * P.hog_target_s / max(t_c, 0.05))))
    R.log(f"memory: hog calibration {cal}: {ops} ops")
    hog = hog_cmd(P, ops)
    R.drop_caches()
    t_alone, _, _ = run_hog_and_reader(s, sec, None, hog, None, P)
    R.log(f"memory: hog alone {t_alone:.1f} s")
    res: dict = {}

    def reader_cmd(root, passes):
        return ["sh", "-c", f'for i in $(seq {passes}); do dd if="$0" of=/dev/null '
                'bs=1M iflag=direct status=none || exit 1; done', str(root / f.name)]

    def body(c, root):
        r = res.setdefault(c.key, {})
        if c.caches:
            r["fill"] = fill_through(s, sec, c, root / f.name, P.mem_file)
        # Passes: as many as last about as long as the hog alone (from one timed pass), so
        # the two overlap; the contenders' readers are compared by MB/s, not by time.
        s.prepare(c, warm_files=[f])
        one, _, _ = s.timed(sec, reader_cmd(root, 1), 600)
        n = int(min(2000, max(3, round(t_alone / max(one, 1e-3)))))
        r["passes"] = n
        vol = P.mem_file * n
        s.served(sec, c.key, read=P.mem_file * (n * 2 + 1))
        s.prepare(c, warm_files=[f])
        sam = Sampler(c)
        sam.start()
        r["reader_alone"], _, _ = s.timed(sec, reader_cmd(root, n), 1800)
        sam.stop()
        r["rss_alone"] = max((x["rss"] or 0 for x in sam.rows), default=None)
        s.prepare(c, warm_files=[f])
        r["hog"], r["reader"], r["samples"] = run_hog_and_reader(s, sec, c, hog,
                                                                  reader_cmd(root, n), P)
        r["mbps_alone"] = vol / r["reader_alone"] / 1e6
        r["mbps"] = vol / r["reader"] / 1e6
        R.log(f"memory {c.key}: reader ({n} passes) alone {r['mbps_alone']:,.0f} MB/s, next "
              f"to the hog {r['mbps']:,.0f} MB/s; hog {r['hog']:.1f} s (alone {t_alone:.1f} s)")

    s.each(sec, CACHED, body)

    total = meminfo("MemTotal")
    sec.add(f"A memory-hungry job next to a cached read loop (seed 004). **Hog**: "
            f"`{shlex.join(hog)}` (2 workers touching {R.human(P.hog_bytes)} in total, fixed "
            f"work of {ops} bogo-ops, scaled from calibration runs ("
            + ", ".join(f"{o} ops {t:.1f} s" for o, t in cal)
            + ") after one discarded warm-up run; the machine has "
            f"{R.human(total)}; the hog's size is what "
            "was available at the start less 2 x ram.max and 2 GiB"
            + (" (quick: the smaller of 2 GiB and 1/8 of it)" if s.quick else "")
            + "). **Reader**: passes of "
            f"`dd bs=1M iflag=direct` over `{f.name}` ({R.human(P.mem_file)}, which fits "
            f"tierfs's RAM tier of {R.human(s.M)}) in the reader cgroup, as many passes as take "
            "about as long as the hog alone (from one timed pass; stated per contender), so "
            "the readers are compared by MB/s. O_DIRECT keeps the reader's page cache out of "
            "it: each contender serves from its own cache (tierfs: its RAM tier; rclone: its "
            "cache file through the page cache; bindfs: the local file through the page cache; "
            "local disk: the device). tierfs and rclone read the file once first. Each "
            "contender: reader alone, then hog and reader started together; the hog alone once "
            f"before: **{t_alone:.1f} s**. Daemon RSS (`/proc/PID/status` VmRSS) and tierfs's "
            "`ram.bytes` and RAM target (`pressure.target`, when the binary reports one) sampled every "
            "0.5 s. " + emu_line(s, sec), "")
    sec.add("| contender | passes | reader alone MB/s | reader next to hog MB/s | with / alone | "
            "hog next to reader s | hog slowdown | daemon RSS max alone / with hog | RAM tier "
            "min / max with hog | MemAvailable min |", "|---|" + "---:|" * 9)
    keys = CACHED
    for key in keys:
        r = res.get(key)
        if not r or "hog" not in r:
            continue
        smp = r["samples"]
        rss = [x["rss"] for x in smp if x["rss"] is not None]
        ram = [x["ram"] for x in smp if x["ram"] is not None]
        sec.add(f"| {s.c[key].short} | {r['passes']} | {r['mbps_alone']:,.0f} | "
                f"**{r['mbps']:,.0f}** | {R.rx(r['mbps'] / r['mbps_alone'])} | {r['hog']:.1f} | "
                f"{R.rx(r['hog'] / t_alone)} | "
                f"{hb(r.get('rss_alone')) if key != 'local' else '-'} / "
                f"{hb(max(rss)) if rss else '-'} | "
                f"{(hb(min(ram)) + ' / ' + hb(max(ram))) if ram else '-'} | "
                f"{hb(min(x['avail'] for x in smp)) if smp else '-'} |")
    sec.add("")
    tg = [x["target"] for x in (res.get("tierfs") or {}).get("samples", []) if x["target"]]
    sec.add("tierfs RAM target: " + (f"reported, min {hb(min(tg))} max {hb(max(tg))}." if tg
                                     else "not reported by this binary (no `pressure.target` "
                                     "in `tierfs stats --json`)."), "")
    sec.metric("memory: cached reader MB/s next to the hog", "MB/s",
               {k: r.get("mbps") for k, r in res.items()})
    sec.metric("memory: hog time next to the reader (ratio as speed)", "1/s",
               {k: 1 / r["hog"] for k, r in res.items() if r.get("hog")},
               note="speed = 1 / seconds")
    sec.panels.append({"kind": "bars", "title": "cached reader, alone and next to the hog",
                       "unit": "MB/s", "categories": ["alone", "next to the hog"],
                       "series": [{"name": k, "values": [r.get("mbps_alone"), r.get("mbps")]}
                                  for k, r in res.items()]})
    sec.panels.append({"kind": "bars", "title": "hog: alone and next to each reader",
                       "unit": "seconds", "categories": ["hog"],
                       "series": [{"name": "hog alone", "values": [t_alone]}]
                       + [{"name": k, "values": [r.get("hog")]} for k, r in res.items()]})
    series = []
    for k, r in res.items():
        smp = r.get("samples") or []
        if k != "local" and any(x["rss"] for x in smp):
            series.append({"name": f"{k} RSS", "x": [x["t"] for x in smp],
                           "y": [(x["rss"] or 0) / 2**20 for x in smp]})
    ts = (res.get("tierfs") or {}).get("samples") or []
    if any(x["ram"] is not None for x in ts):
        series.append({"name": "tierfs ram.bytes", "x": [x["t"] for x in ts],
                       "y": [(x["ram"] or 0) / 2**20 for x in ts]})
    if any(x["target"] for x in ts):
        series.append({"name": "tierfs RAM target", "x": [x["t"] for x in ts],
                       "y": [(x["target"] or 0) / 2**20 for x in ts]})
    sec.panels.append({"kind": "xy", "title": "daemon memory while the hog runs",
                       "unit": "MiB", "xlabel": "seconds", "series": series})
