#!/usr/bin/python3
"""Bar plot of one bench result: plot.py IN.json OUT.png

IN.json: {"title": str, "subtitle": str, "unit": "MB/s",
          "bars": [{"label": str, "value": float|null}, ...]}
or, several panels in one figure (2 per row):
         {"title": str, "subtitle": str,
          "panels": [{"title": str, "unit": str,
                      "bars": [...] (as above, each may have a "color"),
                      "fmt": the bars' number format (default ",.0f"),
                      "hlines": [{"y": float, "label": str}]
                      | "kind": "lines", "categories": [str], "series": [{"name": str,
                        "values": [float]}]}]}
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


def panels_matplotlib(d, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = d["panels"]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), dpi=110,
                             squeeze=False)
    colors = ["#888888", "#aaaaaa", "#d9822b", "#a05aa0", "#2b7bd9", "#5aa05a", "#c04040"]
    for ax, p in zip([a for r in axes for a in r], panels):
        if p.get("kind") == "lines":
            cats = p.get("categories", [])
            for i, s in enumerate(p.get("series", [])):
                vals = [v for v in s.get("values", []) if v is not None]
                if not vals:
                    continue
                ax.plot(cats[: len(vals)], vals, marker="o",
                        color=["#2b7bd9", "#888888", "#d9822b"][i % 3], label=s["name"])
                for x, v in zip(cats, vals):
                    ax.annotate(f"{v:,.0f}", (x, v), ha="center", va="bottom", fontsize=7,
                                xytext=(0, 3), textcoords="offset points")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
        else:
            bars = [b for b in p.get("bars", []) if b.get("value") is not None]
            rects = ax.bar([b["label"] for b in bars], [b["value"] for b in bars],
                           color=[b.get("color") or colors[i % len(colors)]
                                  for i, b in enumerate(bars)])
            for r, b in zip(rects, bars):
                ax.annotate(format(b["value"], p.get("fmt", ",.0f")),
                            (r.get_x() + r.get_width() / 2, r.get_height()),
                            ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                            textcoords="offset points")
            for h in p.get("hlines", []):
                if h.get("y") is not None:
                    ax.axhline(h["y"], color="#c04040", linestyle="--", linewidth=1)
                    ax.annotate(h.get("label", ""), (0, h["y"]), xycoords=("axes fraction", "data"),
                                fontsize=7, color="#c04040", xytext=(2, 2),
                                textcoords="offset points")
            plt.setp(ax.get_xticklabels(), fontsize=7, rotation=15)
            ax.margins(y=0.15)
        ax.set_title(p.get("title", ""), fontsize=10)
        ax.set_ylabel(p.get("unit", ""))
    for ax in [a for r in axes for a in r][len(panels):]:
        ax.set_visible(False)
    fig.suptitle(d.get("title", ""), fontsize=11)
    if d.get("subtitle"):
        fig.text(0.5, 0.005, d["subtitle"], ha="center", va="bottom", fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(out)


def panels_gnuplot(d, out):
    panels = d["panels"]
    rows = (len(panels) + 1) // 2
    script = [f'set terminal pngcairo size 1200,{420 * rows}', f'set output "{out}"',
              f"set multiplot layout {rows},2 title \"{d.get('title', '')}\"",
              "set style fill solid 0.8", "set boxwidth 0.6", "set yrange [0:*]", "unset key"]
    files = []
    for p in panels:
        with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as f:
            if p.get("kind") == "lines":
                s = (p.get("series") or [{"values": []}])[0]
                for i, (c, v) in enumerate(zip(p.get("categories", []), s["values"])):
                    if v is not None:
                        f.write(f'{i} "{c}" {v}\n')
            else:
                for i, b in enumerate(x for x in p.get("bars", []) if x.get("value") is not None):
                    f.write(f'{i} "{b["label"]}" {b["value"]}\n')
            files.append(f.name)
        title = p.get("title", "").replace('"', "'")
        script += [f'set title "{title}"', f'set ylabel "{p.get("unit", "")}"',
                   f'plot "{f.name}" using 1:3:xtic(2) with ' +
                   ("linespoints" if p.get("kind") == "lines" else "boxes")]
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True,
                   timeout=60)


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
    multi = "panels" in d
    try:
        (panels_matplotlib if multi else with_matplotlib)(d, out)
        return 0
    except ImportError:
        pass
    if shutil.which("gnuplot"):
        (panels_gnuplot if multi else with_gnuplot)(d, out)
        return 0
    print("plot.py: neither matplotlib nor gnuplot available", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
