"""The small-object part of `bench/run --workload s3` (bench/lib/s3bench.py; issue 42 point 3):
1,000 objects of 4-64 KiB under one prefix, read by `ls | xargs -P8 -n16 cat` through tierfs
(default options) and rclone mount, cold / warm (page cache dropped) / after a remount, with
tierfs's store requests per open; and, to decide whether one LIST could validate many opens
more cheaply than a HEAD per open, the latency of a HEAD of one object and of a LIST of the
1,000-key prefix on the same server, through the same relay (curl's SigV4 signing, one
curl for all samples of a kind)."""
import random
import statistics
import time

import benchcore as R

SMALL_FILES = 1000
READERS = "ls | xargs -P8 -n16 cat > /dev/null"
SAMPLES = 12
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
KEYS = ("backing.lookup", "backing.getattr", "backing.open", "backing.readdir",
        "backing.read", "meta_listings")


def put_small(put_file, objects, n: int = SMALL_FILES) -> int:
    """`n` objects `small/fNNNNN.txt` of 4-64 KiB of lowercase words (as the meta workload's
    small files); returns their bytes."""
    rng = random.Random(42)
    alphabet = b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 18 + b"\n" * 4
    pool = rng.randbytes(8 << 20).translate(bytes.maketrans(bytes(range(256)), alphabet))
    total = 0
    for i in range(n):
        size = rng.randint(4096, 65536)
        off = rng.randrange(len(pool) - size)
        put_file(objects / "small" / f"f{i:05d}.txt", pool[off:off + size])
        total += size
    return total


def read_small(m, env, phase: str) -> dict:
    """One pass of the 8 readers over small/ in mount `m`, caches dropped and the server's
    files read back first; seconds, files/s and (tierfs) the stats deltas."""
    R.drop_caches()
    env.warm_server()
    s0 = m.stats()
    t = time.monotonic()
    R.run(["sh", "-c", READERS], 900, cwd=m.mnt / "small")
    secs = time.monotonic() - t
    s1 = m.stats()
    out = {"kind": m.kind, "phase": phase, "secs": secs, "rate": SMALL_FILES / secs}
    if s0 and s1:
        import json
        a, b = json.loads(s0), json.loads(s1)
        out["d"] = {k: R.jdiff(a, b, k) for k in KEYS}
        req = [out["d"][k] for k in KEYS[:3]]
        out["per_open"] = None if None in req else sum(req) / SMALL_FILES
    R.log(f"small objects {phase}, {m.kind}: {secs:.2f} s, {out['rate']:.0f} files/s"
          + (f", {out['per_open']:.2f} store requests per open" if out.get("per_open")
             is not None else ""))
    return out


def curl_times(auth: list, urls: list, head: bool) -> list:
    """Seconds of each request, one curl for all, on one kept-alive connection (versitygw
    runs with --keep-alive, scripts/s3-server); the first, which pays curl's own start and
    the connection's handshake round trip (the relay adds it), is dropped by the caller."""
    cmd = ["curl", "-s", "-w", "%{http_code} %{time_total}\\n", *auth]
    if head:
        cmd.append("-I")
    for u in urls:
        cmd += ["-o", "/dev/null", u]
    p = R.run(cmd, 120, check=False)
    out = []
    for line in (p.stdout or "").splitlines():
        code, secs = line.split()
        if code != "200":
            raise R.BenchError(f"curl: HTTP {code} for {'HEAD' if head else 'LIST'}")
        out.append(float(secs))
    return out


def head_and_list(endpoint: str, access: str, secret: str, bucket: str, prefix: str) -> dict:
    """Latency of a HEAD of one object and of a LIST (ListObjectsV2, max-keys 1000) of the
    small/ prefix: the median and min of SAMPLES (one curl for each kind)."""
    # versitygw wants the payload's hash; curl signs the header with the rest. The query is
    # given encoded, as SigV4's canonical form has it (curl signs it as written).
    auth = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{access}:{secret}", "-H",
            f"x-amz-content-sha256: {EMPTY_SHA256}"]
    heads = [f"{endpoint}/{bucket}/{prefix}/small/f{i:05d}.txt" for i in range(SAMPLES + 1)]
    lst = f"{endpoint}/{bucket}?list-type=2&max-keys=1000&prefix={prefix}%2Fsmall%2F"
    p = R.run(["curl", "-s", *auth, lst], 60, check=False)
    keys = (p.stdout or "").count("<Key>")
    h = curl_times(auth, heads, True)[1:]
    l_ = curl_times(auth, [lst] * (SAMPLES + 1), False)[1:]
    res = {"head_ms": statistics.median(h) * 1e3, "head_min_ms": min(h) * 1e3,
           "list_ms": statistics.median(l_) * 1e3, "list_min_ms": min(l_) * 1e3,
           "list_keys": keys, "samples": len(h)}
    R.log(f"HEAD {res['head_ms']:.2f} ms, LIST of {keys} keys {res['list_ms']:.2f} ms "
          f"(medians of {len(h)})")
    return res


def markdown(small: dict, lat: dict, emulation: str, rclone_cmd: str) -> list:
    """The section of the s3 report: the three passes, ratios, issue 42 point 3, HEAD/LIST."""
    def get(kind, phase):
        return small.get((kind, phase)) or {}

    L = ["", "### Small objects, 8 readers (issue 42 point 3)", "",
         f"Store: **{emulation}**. {SMALL_FILES:,} objects of 4-64 KiB under `small/`, read "
         f"by `{READERS}` in `MNT/small`, after `echo 3 > /proc/sys/vm/drop_caches`: *cold* on "
         "the fresh mount, *warm* right after (everything in tierfs's tiers), *after a "
         "remount* (unmounted, mounted again on the same cache). tierfs with default options; "
         f"rclone as above (`{rclone_cmd}`). *requests per open* = (`backing.lookup` + "
         "`getattr` + `open`) / files, from `tierfs stats --json` deltas.", "",
         "| pass | tierfs files/s | rclone files/s | tierfs / rclone | tierfs requests per open "
         "(lookup / getattr / open / readdir) |", "|---|---:|---:|---:|---|"]
    ratios = {}
    for phase, label in (("cold", "cold"), ("warm", "warm"), ("remount", "after a remount")):
        t, r = get("tierfs", phase), get("rclone", phase)
        ratio = t["rate"] / r["rate"] if t.get("rate") and r.get("rate") else None
        ratios[phase] = ratio
        d = t.get("d") or {}
        L.append(f"| {label} | {t.get('rate', 0):,.0f} | {r.get('rate', 0):,.0f} | "
                 + (f"{ratio:.2f}x" if ratio else "n/a") + " | "
                 + (f"{t['per_open']:.2f} ({d.get('backing.lookup')} / "
                    f"{d.get('backing.getattr')} / {d.get('backing.open')} / "
                    f"{d.get('backing.readdir')})" if t.get("per_open") is not None else "n/a")
                 + " |")
    crit = [("warm small objects >= 0.7x rclone", ratios["warm"], 0.7),
            ("cold at least today's 3.0x rclone", ratios["cold"], 3.0),
            ("after a remount at least today's 5.3x rclone", ratios["remount"], 5.3)]
    L += ["", "| issue 42 point 3 (S3, default options) | measured | holds |", "|---|---:|---|"]
    for text, v, target in crit:
        L.append(f"| {text} | " + (f"{v:.2f}x" if v else "n/a") + " | "
                 + ("n/a" if v is None else "**yes**" if v >= target else "**NO**") + " |")
    if lat:
        L += ["", f"HEAD against LIST on this server, through the same relay (curl "
              f"`--aws-sigv4`, {lat['samples']} samples each, one curl for each kind, "
              "the connecting request dropped): a HEAD of one object **"
              f"{lat['head_ms']:.2f} ms** median (min {lat['head_min_ms']:.2f}); a LIST "
              f"(ListObjectsV2, `max-keys=1000`) of the `small/` prefix, {lat['list_keys']:,} "
              f"keys with ETag, size and time, **{lat['list_ms']:.2f} ms** median (min "
              f"{lat['list_min_ms']:.2f}): one LIST costs "
              f"{lat['list_ms'] / lat['head_ms']:.1f} HEADs and carries the versions of "
              f"{lat['list_keys']:,} objects."]
    return L + [""]
