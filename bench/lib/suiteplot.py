#!/usr/bin/python3
"""Plots of one suite section: suiteplot.py IN.json OUT.png  (matplotlib, Agg)

IN.json: {"title": str, "subtitle": str, "panels": [PANEL, ...]}, 2 panels per row.
PANEL kinds:
  {"kind": "bars", "title", "unit", "categories": [str], "series": [{"name", "values"}],
   "log": bool}                        grouped bars, one group per category, one bar per series
  {"kind": "lines", "title", "unit", "x": [num|str], "xlabel", "series": [{"name", "values"}]}
  {"kind": "xy", "title", "unit", "xlabel", "series": [{"name", "x": [num], "y": [num]}]}
None values are left out. Series named after a contender get that contender's colour (a bars
series may give its own: "color").
Exit status 0 when the PNG was written.
"""

import json
import math
import sys

COLORS = {"tierfs": "#2b7bd9", "tierfs-wb": "#1b4f8f", "rclone": "#d9822b",
          "bindfs": "#a05aa0", "local": "#5aa05a", "store": "#888888"}
OTHER = ["#c04040", "#40a0a0", "#808020", "#604020"]


def color(name, i):
    for k in sorted(COLORS, key=len, reverse=True):
        if name == k or name.startswith(k + " "):
            return COLORS[k]
    return OTHER[i % len(OTHER)]


def bars(ax, p):
    cats, series = p["categories"], p["series"]
    n = max(1, len(series))
    w = 0.8 / n
    for i, s in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * w for j in range(len(cats))]
        vals = s["values"]
        pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
        if not pts:
            continue
        rects = ax.bar([x for x, _ in pts], [v for _, v in pts], width=w, label=s["name"],
                       color=s.get("color") or color(s["name"], i))
        for r, (_, v) in zip(rects, pts):
            txt = f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"
            ax.annotate(txt, (r.get_x() + r.get_width() / 2, r.get_height()), ha="center",
                        va="bottom", fontsize=6, rotation=90 if n > 3 else 0,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, fontsize=7)
    if p.get("log"):
        ax.set_yscale("log")
    ax.margins(y=0.18)


def lines(ax, p):
    x = p["x"]
    numeric = all(isinstance(v, (int, float)) for v in x)
    xs = x if numeric else list(range(len(x)))
    for i, s in enumerate(p["series"]):
        pts = [(a, v) for a, v in zip(xs, s["values"]) if v is not None]
        if pts:
            ax.plot([a for a, _ in pts], [v for _, v in pts], marker="o", markersize=3,
                    label=s["name"], color=color(s["name"], i))
    if not numeric:
        ax.set_xticks(xs)
        ax.set_xticklabels(x, fontsize=7)
    if p.get("log"):
        ax.set_yscale("log")


def xy(ax, p):
    used: dict = {}  # colour -> series drawn in it: the next one gets another line style
    for i, s in enumerate(p["series"]):
        pts = [(a, v) for a, v in zip(s["x"], s["y"]) if a is not None and v is not None]
        if pts:
            c = color(s["name"], i)
            style = ["-", "--", ":", "-."][used.get(c, 0) % 4]
            used[c] = used.get(c, 0) + 1
            ax.plot([a for a, _ in pts], [v for _, v in pts], label=s["name"], color=c,
                    linestyle=style, linewidth=1.2)


def main():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.load(open(sys.argv[1]))
    panels = d["panels"]
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), dpi=100,
                             squeeze=False)
    for ax, p in zip([a for row in axes for a in row], panels):
        {"bars": bars, "lines": lines, "xy": xy}[p.get("kind", "bars")](ax, p)
        ax.set_title(p.get("title", ""), fontsize=9)
        ax.set_ylabel(p.get("unit", ""), fontsize=8)
        if p.get("xlabel"):
            ax.set_xlabel(p["xlabel"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    for ax in [a for row in axes for a in row][len(panels):]:
        ax.axis("off")
    fig.suptitle(d.get("title", ""), fontsize=11)
    if d.get("subtitle"):
        fig.text(0.5, 0.005, d["subtitle"], ha="center", va="bottom", fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
