"""The report of `bench/run --workload write` (bench/lib/writerun.py): the write targets of
issue 4 point 5 with what the run measured and a verdict each (write-back; write-through for
reference), the write job and untar tables, notes, the exact commands, the console summary,
and the plot: stacked phases per contender (matplotlib), plain bars (lib/plot.py) as the
fallback."""
import json
import shlex
import sys
from pathlib import Path

from benchcore import ROOT, SYS_PYTHON, Result, human, log, parse_size, run, rx
from testbed import Bench
from testdata import WRITE_BS, WRITE_PRIME_FACTOR

WRITE_T_WRITE_VS_STORE = 5.0    # tierfs write phase >= 5x the store's write bandwidth
WRITE_T_WRITE_VS_LOCAL = 0.50   # ... >= 50% of the local disk's sequential write
WRITE_T_JOB_VS_STORE = 0.90     # whole job incl. fsync >= 90% of the store's bandwidth


def result(run) -> Result:
    """The report of a finished run: the summary with a verdict per target, the write
    job and untar tables, notes, commands, the console summary and the plot."""
    b, m, size = run.b, run.m, run.size
    em = b.emulation or f"profile={b.args.profile}"
    prof = b.args.profile
    store = run.store.get("mbps")
    local_c = m["local"].get("chunk")
    local_job = local_c["total_mbps"] if local_c else None
    lines: list = []
    A = lines.append
    con: list = []

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "FAIL")

    def checks(key) -> list:
        """(check, target, measured text, ratio, verdict) for one tierfs contender."""
        c, u = m[key].get("chunk"), m[key].get("untar")
        out = []
        r = c["write_mbps"] / store if c and store else None
        out.append(("write phase / store write bandwidth", f">= {WRITE_T_WRITE_VS_STORE:g}x",
                    f"{c['write_mbps']:,.0f} / {store:,.0f} MB/s" if r else "n/a", r,
                    verdict(None if r is None else r >= WRITE_T_WRITE_VS_STORE)))
        r = c["write_mbps"] / local_job if c and local_job else None
        out.append(("write phase / local disk sequential write (job incl. fsync)",
                    f">= {WRITE_T_WRITE_VS_LOCAL:.0%}",
                    f"{c['write_mbps']:,.0f} / {local_job:,.0f} MB/s" if r else "n/a", r,
                    verdict(None if r is None else r >= WRITE_T_WRITE_VS_LOCAL)))
        r = c["total_mbps"] / store if c and store else None
        out.append(("whole job incl. fsync / store write bandwidth",
                    f">= {WRITE_T_JOB_VS_STORE:.0%}",
                    f"{c['total_mbps']:,.0f} / {store:,.0f} MB/s" if r else "n/a", r,
                    verdict(None if r is None else r >= WRITE_T_JOB_VS_STORE)))
        sd = m["slowfs"].get("untar")
        for what, fld in (("untar", "untar_s"), ("untar + sync -f", "total_s")):
            r = sd[fld] / u[fld] if u and sd else None
            out.append((f"{what}: speed-up vs store direct (time direct / time tierfs)",
                        "-", f"{sd[fld]:.1f} s / {u[fld]:.1f} s" if r else "n/a", r, "-"))
        if key == "wb":
            wt = m["wt"].get("untar")
            for what, fld in (("untar", "untar_s"), ("untar + sync -f", "total_s")):
                r = wt[fld] / u[fld] if u and wt else None
                out.append((f"{what}: speed-up vs write-through", "-",
                            f"{wt[fld]:.1f} s / {u[fld]:.1f} s" if r else "n/a", r, "-"))
        return out

    wb_avail = "unavailable" not in m["wb"] and "wb" not in run.errors and \
        m["wb"].get("chunk") is not None
    invalid = []
    if run.quick:
        invalid.append(f"QUICK VALIDATION RUN (--quick): {human(size)} write job and a "
                       f"{run.tar['files'] if run.tar else '?'}-file untar instead of "
                       f"{run.default_size}iB and the whole tree")
    if m["wb"].get("unavailable"):
        invalid.append("write-back (`-o writeback.mode=back`) not available at this commit")
    if run.errors:
        invalid.append("steps failed: " + ", ".join(run.errors))
    if b.refused:
        invalid.append(f"options refused by this tierfs and dropped: {', '.join(b.refused)}")
    if size != parse_size(run.default_size) and not run.quick:
        invalid.append(f"write job of {human(size)}, not {run.default_size}iB")
    bad_verify = [f"{k}: {w}: {v}" for k in m for w, v in m[k].get("verify", {}).items()
                  if "identical" not in v]
    if bad_verify:
        invalid.append("content check failed (" + "; ".join(bad_verify) + ")")

    A(f"## Summary: write path on slowfs `{prof}`")
    A("")
    A(f"Emulation for every number below: slowfs **{em}** (the `local disk` contender is "
      "`bench/work` on the local disk, not emulated). tierfs: `-o "
      f"{','.join(run.opts)}`; write-back adds `{run.wb_opt}`.")
    A("")
    A(f"Store write bandwidth (slowfs `{prof}`, `dd bs=1M conv=fsync`, {human(size)}): "
      + (f"**{store:,.1f} MB/s**" if store else "not measured") + ". Local disk sequential "
      f"write (chunk.py job incl. fsync, {human(size)}): "
      + (f"**{local_job:,.0f} MB/s**" if local_job else "not measured") + ".")
    A("")
    A(f"| check (slowfs `{prof}`) | target | tierfs write-back | verdict | "
      "tierfs write-through (reference) | verdict |")
    A("|---|---|---|---|---|---|")
    cw = checks("wt") if m["wt"].get("chunk") else None
    cb = checks("wb") if wb_avail else None
    rows = cb or [(x[0], x[1], None, None, None) for x in (cw or [])]
    for i, row in enumerate(rows):
        name, target = row[0], row[1]
        wbc = (f"{cb[i][2]} = **{rx(cb[i][3])}**" if cb[i][3] else cb[i][2]) if cb else \
            ("not available at this commit" if m["wb"].get("unavailable") else "not measured")
        wbv = cb[i][4] if cb else "n/a"
        wtc = (f"{cw[i][2]} = {rx(cw[i][3])}" if cw[i][3] else cw[i][2]) \
            if cw and i < len(cw) else "-"
        wtv = cw[i][4] if cw and i < len(cw) else "-"
        A(f"| {name} | {target} | {wbc} | **{wbv}** | {wtc} | {wtv} |")
    A("")
    targeted = [x for x in (cb or []) if x[4] in ("PASS", "FAIL", "n/a")]
    if m["wb"].get("unavailable"):
        A("**tierfs write-back: not available at this commit** "
          f"(`{run.wb_opt}` refused: `{m['wb']['unavailable']}`). The write-through column "
          "is today's behaviour, for reference.")
    elif not wb_avail:
        A("**tierfs write-back: not measured** (see Errors). The write-through column is "
          "today's behaviour, for reference.")
    elif all(x[4] == "PASS" for x in targeted):
        A("**Write targets (write-back): PASS** (all three, one run).")
    else:
        A("**Write targets (write-back): FAIL** (" + ", ".join(
            x[0] for x in targeted if x[4] != "PASS") + ").")
    if invalid:
        A("")
        A("**Not valid as acceptance evidence:** " + "; ".join(invalid) + ".")
    A("")
    A("![plots](PLOT_PNG_PLACEHOLDER)")
    A("")

    # -- write job table
    A(f"## {human(size)} write job (seed 001, `bench/lib/chunk.py`), slowfs `{prof}`")
    A("")
    A(f"Emulation: slowfs **{em}** (local disk: not emulated). One `open(O_CREAT|O_TRUNC|"
      f"O_WRONLY)`, {size // WRITE_BS} `write(2)` of 512 KiB from a 64 MiB buffer of "
      "pseudo-random bytes (incompressible), `fsync`, `close`; each phase timed on its "
      "own. Before each job: `sync; echo 3 > /proc/sys/vm/drop_caches` and memory priming "
      f"of {WRITE_PRIME_FACTOR}x the bytes written, every contender alike (FUSE-NOTES "
      "lesson 8; a cache touches written data more than once: see WRITE_PRIME_FACTOR "
      "in bench/lib/testdata.py).")
    A("")
    A("| contender | open s | write s | fsync s | close s | job s | write MB/s | job MB/s | "
      "write / store | job / store | slowfs writes / MB written / seeks / meta requests | "
      "slowfs late ms | "
      "content |")
    A("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for key, label, kind in run.contenders:
        c = m[key].get("chunk")
        if not c:
            why = m[key].get("unavailable")
            A(f"| {label} | " + ("not available at this commit" if why else
                                 run.errors.get(f"{key} write job", run.errors.get(
                                     key, "not run")).splitlines()[0][:120])
              + " |" + " |" * 12)
            continue
        s = c.get("slow") or {}
        sl = f"{s.get('writes', 0):,} / {s.get('bytes_written', 0) / 1e6:,.0f} / " \
            f"{s.get('seeks', 0):,} / {s.get('meta_ops', 0):,}" if s else "-"
        late = f"{s.get('late_us', 0) / 1000:,.0f}" if s else "-"
        A(f"| {label} | {c['open_s']:.3f} | {c['write_s']:.2f} | {c['fsync_s']:.2f} | "
          f"{c['close_s']:.3f} | {c['total_s']:.2f} | {c['write_mbps']:,.0f} | "
          f"{c['total_mbps']:,.0f} | "
          + (f"{rx(c['write_mbps'] / store)} | {rx(c['total_mbps'] / store)}" if store
             else "n/a | n/a")
          + f" | {sl} | {late} | {m[key].get('verify', {}).get('chunk', '-')} |")
    A("")
    if run.store:
        s = run.store.get("slow", {})
        A(f"Store write bandwidth: `dd bs=1M conv=fsync` of {human(run.store['bytes'])} "
          f"from a random local file (in the page cache) to the slowfs mount: "
          f"{run.store['seconds']:.2f} s (dd's time, fsync included; wall "
          f"{run.store['wall']:.2f} s) = **{store:,.1f} MB/s**; slowfs counted "
          f"{s.get('writes', 0):,} writes, {s.get('seeks', 0)} seeks, late replies "
          f"{s.get('late_replies', 0)} ({s.get('late_us', 0) / 1000:,.0f} ms).")
        A("")
    for key in ("wt", "wb"):
        if m[key].get("exit_s") is not None or m[key].get("exit_slow"):
            es = m[key].get("exit_slow") or {}
            A(f"- tierfs {key}: daemon exited "
              + (f"{m[key]['exit_s']:.1f} s" if m[key].get("exit_s") is not None
                 else "(killed after 900 s)")
              + f" after `fusermount3 -u`; slowfs received {es.get('bytes_written', 0):,} "
              "bytes of writes in that time.")
    A("")

    # -- untar table
    t = run.tar
    A(f"## Untar of a source tree, slowfs `{prof}`")
    A("")
    if t:
        A(f"Emulation: slowfs **{em}** (local disk: not emulated). Tarball "
          f"`{Path(t['tarball']).relative_to(ROOT) if Path(t['tarball']).is_relative_to(ROOT) else t['tarball']}` "
          f"({human(t.get('tar_bytes', 0))}, sha256 `{t.get('sha256', '?')[:16]}...`): "
          f"the crates.io sources of {t['crates']} of the {t['crates_in_lock']} registry "
          f"packages in this commit's `Cargo.lock` ({t['first']} ... {t['last']}, by name), "
          f"taken from `{t['registry']}`: **{t['files']:,} files, {t['dirs']:,} directories, "
          f"{t['symlinks']} symlinks, {human(t['bytes'])}** of file data. Built once with "
          f"`{t.get('create_cmd', 'tar -cf ... --sort=name ...')}`. Timed: `tar -xf` into "
          "an empty directory on the contender (tarball in the page cache), then "
          "`sync -f` on it (for the local disk that syncs the whole root filesystem).")
    else:
        A(f"No untar source: {run.errors.get('untar source', '?')}")
    A("")
    A("| contender | untar s | sync -f s | untar + sync s | files/s (untar + sync) | "
      "speed-up vs store direct (time direct / time) | slowfs requests (meta / writes / seeks) | "
      "content |")
    A("|---|---:|---:|---:|---:|---:|---|---|")
    sd = m["slowfs"].get("untar")
    for key, label, kind in run.contenders:
        u = m[key].get("untar")
        if not u:
            why = m[key].get("unavailable")
            A(f"| {label} | " + ("not available at this commit" if why else
                                 run.errors.get(f"{key} untar", run.errors.get(
                                     key, "not run")).splitlines()[0][:120]) + " |" * 7)
            continue
        s = u.get("slow") or {}
        sl = f"{s.get('meta_ops', 0):,} / {s.get('writes', 0):,} / {s.get('seeks', 0):,}" \
            if s else "-"
        vs = rx(sd['total_s'] / u['total_s']) if sd else "n/a"
        sync_note = "" if u["sync_rc"] == 0 else f" (rc {u['sync_rc']}: {u['sync_err']})"
        A(f"| {label} | {u['untar_s']:.2f} | {u['sync_s']:.2f}{sync_note} | "
          f"{u['total_s']:.2f} | {t['files'] / u['total_s']:,.0f} | {vs} | {sl} | "
          f"{m[key].get('verify', {}).get('untar', '-')} |")
    A("")
    A("## Notes")
    A("")
    A("- Contenders, in this order, one after the other in the same run: (a) **local disk**: "
      "`bench/work/write-local` on the local filesystem (the physical limit); (b) **store "
      "direct**: the slowfs mount; (c) **tierfs write-through**: a fresh tierfs (empty "
      "cache dir) over the slowfs mount with its default write mode (write-through at "
      "this commit); (d) **tierfs write-back**: the same plus "
      f"`-o {run.wb_opt}` - skipped with *not available at this commit* when the binary "
      "refuses the option (the mount error names the key).")
    A("- What reached the store is checked after the tierfs daemon exited (unmount waits "
      "up to 900 s for a write-back flush): `sha256sum` of the backing file against the "
      "digest chunk.py computed of what it wrote, `tar --diff` of the backing tree.")
    A("- slowfs's fsync (store direct, and what tierfs forwards) fsyncs the backing file "
      "on the local disk: that real time is on top of the emulated cost and shows as "
      "*late* replies. MB = 10^6 bytes.")
    A(f"- Targets (issue 4 point 5): write phase >= {WRITE_T_WRITE_VS_STORE:g}x the store's "
      f"write bandwidth; write phase >= {WRITE_T_WRITE_VS_LOCAL:.0%} of the local disk's "
      "sequential write (taken as the local chunk.py job incl. fsync: what the disk "
      f"sustains); whole job incl. fsync >= {WRITE_T_JOB_VS_STORE:.0%} of the store's "
      "bandwidth. They apply to write-back; write-through is shown for reference.")
    if local_c:
        A(f"- Local disk write phase alone (page cache, before fsync): "
          f"{local_c['write_mbps']:,.0f} MB/s; fsync {local_c['fsync_s']:.2f} s.")
    A(f"- Total time of the measured part: {run.t_total:.0f} s.")
    A("")
    A("## Commands")
    A("")
    A("```")
    A(f"bench/run {shlex.join(sys.argv[1:])}")
    A("# each step: sync; echo 3 > /proc/sys/vm/drop_caches; (write job) memory priming")
    for c in run.cmds:
        A(c)
    A("```")
    A("")
    if run.errors:
        A("## Errors")
        A("")
        for k, v in run.errors.items():
            A(f"- {k}: `{v.splitlines()[0][:300]}`")
        A("")

    # -- console
    con.append(f"write workload, slowfs {em}")
    con.append(f"store write bandwidth (dd bs=1M conv=fsync): "
               + (f"{store:.1f} MB/s" if store else "n/a"))
    con.append(f"{'contender':24} {'open':>7} {'write':>7} {'fsync':>7} {'close':>7} "
               f"{'wr MB/s':>8} {'job MB/s':>8} {'untar s':>8} {'+sync s':>8}")
    for key, label, _ in run.contenders:
        c, u = m[key].get("chunk"), m[key].get("untar")
        if m[key].get("unavailable"):
            con.append(f"{label:24} not available at this commit")
            continue
        con.append(f"{label:24} " + (f"{c['open_s']:7.3f} {c['write_s']:7.2f} "
                                     f"{c['fsync_s']:7.2f} {c['close_s']:7.3f} "
                                     f"{c['write_mbps']:8.0f} {c['total_mbps']:8.0f} "
                                     if c else f"{'-':>7} " * 4 + f"{'-':>8} " * 2)
                   + (f"{u['untar_s']:8.2f} {u['total_s']:8.2f}" if u else ""))
    for key, label, cs in (("wb", "write-back", cb), ("wt", "write-through (reference)", cw)):
        if not cs:
            con.append(f"{label}: " + ("not available at this commit"
                                       if m[key].get("unavailable") else "not measured"))
            continue
        for name, target, meas, r, v in cs:
            con.append(f"  {label}: {name} {target}: {meas}"
                       + (f" = {rx(r)}" if r else "") + (f"  {v}" if v != "-" else ""))
    if invalid:
        con.append("NOT acceptance evidence: " + "; ".join(invalid))

    # -- plot: stacked phases per contender (own matplotlib script), plot.py bars fallback
    # Contenders with numbers, plus write-back as an empty "n/a" slot when unavailable.
    shown = [(k, lab + ("\n(not available)" if m[k].get("unavailable") else ""))
             for k, lab, _ in run.contenders
             if m[k].get("chunk") or m[k].get("untar") or m[k].get("unavailable")]
    keys, labels = [k for k, _ in shown], [lab for _, lab in shown]
    spec = {
        "title": f"write workload, slowfs {prof}" + (" (QUICK validation run)"
                                                     if run.quick else ""),
        "subtitle": em + ("; write-back: not available at this commit"
                          if m["wb"].get("unavailable") else ""),
        "labels": labels,
        "chunk": {"title": f"{human(size)} write job (chunk.py, bs 512 KiB): seconds",
                  "phases": ["open", "write", "fsync", "close"],
                  "values": [[(m[k].get("chunk") or {}).get(f"{p}_s") for p in
                              ["open", "write", "fsync", "close"]] for k in keys],
                  "hline": size / (store * 1e6) if store else None,
                  "hline_label": f"store bandwidth ({store:.0f} MB/s)" if store else ""},
        "untar": {"title": f"untar {run.tar['files']:,} files + sync -f: seconds"
                  if run.tar else "untar",
                  "phases": ["untar", "sync"],
                  "values": [[(m[k].get("untar") or {}).get(f) for f in
                              ["untar_s", "sync_s"]] for k in keys]},
    }
    fallback = {"title": spec["title"], "subtitle": spec["subtitle"], "panels": [
        {"title": spec["chunk"]["title"] + " (total)", "unit": "s",
         "bars": [{"label": lab, "value": (m[k].get("chunk") or {}).get("total_s")}
                  for k, lab in zip(keys, labels)]},
        {"title": spec["untar"]["title"] + " (total)", "unit": "s",
         "bars": [{"label": lab, "value": (m[k].get("untar") or {}).get("total_s")}
                  for k, lab in zip(keys, labels)]}]}
    res = Result(markdown="\n".join(lines), plot=fallback, console="\n".join(con))
    res.plot_fn = lambda png, _s=spec: stacked_plot(b, _s, png)
    res.details = run.details
    return res


STACKED_PLOT = r'''
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
colors = {"open": "#888888", "write": "#2b7bd9", "fsync": "#d9822b", "close": "#c04040",
          "untar": "#5aa05a", "sync": "#d9822b"}
fig, axes = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
for ax, key in zip(axes, ["chunk", "untar"]):
    p = d[key]
    labels = d["labels"]
    bottom = [0.0] * len(labels)
    for i, ph in enumerate(p["phases"]):
        vals = [(row[i] or 0.0) for row in p["values"]]
        ax.bar(labels, vals, bottom=bottom, color=colors.get(ph), label=ph)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for x, tot, row in zip(range(len(labels)), bottom, p["values"]):
        if any(v is not None for v in row):
            ax.annotate(f"{tot:.1f} s", (x, tot), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
        else:
            ax.annotate("n/a", (x, 0), ha="center", va="bottom", fontsize=8)
    if p.get("hline"):
        ax.axhline(p["hline"], color="#c04040", linestyle="--", linewidth=1)
        ax.annotate(p.get("hline_label", ""), (0, p["hline"]), xycoords=("axes fraction", "data"),
                    fontsize=7, color="#c04040", xytext=(2, 2), textcoords="offset points")
    ax.set_title(p["title"], fontsize=10)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    plt.setp(ax.get_xticklabels(), fontsize=8, rotation=12)
fig.suptitle(d["title"], fontsize=11)
fig.text(0.5, 0.005, d["subtitle"], ha="center", va="bottom", fontsize=7, wrap=True)
fig.tight_layout(rect=(0, 0.04, 1, 0.96))
fig.savefig(sys.argv[2])
'''


def stacked_plot(b: Bench, spec: dict, png: Path) -> bool:
    """Stacked bars (phases per contender) with matplotlib; False if that is not available
    (the caller then falls back to lib/plot.py's plain bars)."""
    src = b.logs / f"{png.stem}.stacked.json"
    src.write_text(json.dumps(spec))
    p = run([SYS_PYTHON, "-c", STACKED_PLOT, src, png], 120, check=False)
    if p.returncode != 0:
        log(f"stacked plot failed: {(p.stderr or '').strip()[-300:]}")
    return p.returncode == 0 and png.exists()
