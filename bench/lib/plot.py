#!/usr/bin/python3
"""Bar plot of one bench result: plot.py IN.json OUT.png

IN.json: {"title": str, "subtitle": str, "unit": "MB/s",
          "bars": [{"label": str, "value": float|null}, ...]}
Uses matplotlib (Agg); falls back to gnuplot when matplotlib is missing.
Exit status 0 when the PNG was written.
"""

import json
import shutil
import subprocess
import sys
import tempfile


def with_matplotlib(d, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [b for b in d["bars"] if b.get("value") is not None]
    labels = [b["label"] for b in bars]
    values = [b["value"] for b in bars]
    colors = ["#888888", "#d9822b", "#2b7bd9", "#5aa05a", "#a05aa0", "#c04040"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(bars) + 2), 4.5), dpi=110)
    rects = ax.bar(labels, values, color=[colors[i % len(colors)] for i in range(len(bars))])
    for r, v in zip(rects, values):
        ax.annotate(
            f"{v:,.0f}",
            (r.get_x() + r.get_width() / 2, r.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set_ylabel(d.get("unit", "MB/s"))
    ax.set_title(d["title"], fontsize=11)
    if d.get("subtitle"):
        fig.text(0.5, 0.005, d["subtitle"], ha="center", va="bottom", fontsize=7, wrap=True)
    ax.margins(y=0.12)
    plt.setp(ax.get_xticklabels(), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out)


def with_gnuplot(d, out):
    bars = [b for b in d["bars"] if b.get("value") is not None]
    with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as f:
        for i, b in enumerate(bars):
            f.write(f'{i} "{b["label"]}" {b["value"]}\n')
        dat = f.name
    title = d["title"].replace('"', "'")
    script = f"""
set terminal pngcairo size 900,500
set output "{out}"
set title "{title}"
set ylabel "{d.get('unit', 'MB/s')}"
set style fill solid 0.8
set boxwidth 0.6
set yrange [0:*]
unset key
plot "{dat}" using 1:3:xtic(2) with boxes, "" using 1:3:(sprintf("%.0f",$3)) with labels offset 0,1
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=60)


def main():
    d = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    try:
        with_matplotlib(d, out)
        return 0
    except ImportError:
        pass
    if shutil.which("gnuplot"):
        with_gnuplot(d, out)
        return 0
    print("plot.py: neither matplotlib nor gnuplot available", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
