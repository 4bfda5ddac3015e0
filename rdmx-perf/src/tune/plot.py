"""rdmx-perf tune --plot DIR: one PNG per sweep from tune's JSON.

Run by rdmx-perf (the script is compiled into the binary and fed to `python3 -`):
    python3 - TUNE_JSON OUT_DIR
Each PNG has one panel per figure the sweep names in "plot" (throughput first, then the
p99 it cares about): the measured medians against the knob, and the article's claim as a
dashed reference with its factors marked (the reported factors applied to the measured value
at the claim's baseline row), so the claimed direction and size sit beside what was
measured here.
matplotlib (Debian's python3-matplotlib), Agg backend: no display needed.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "ops_per_sec": "ops/s (median)",
    "lat_p99_us": "p99 latency, us",
    "stream_p99_us": "latency stream p99, us",
    "stream_p999_us": "latency stream p99.9, us",
    "cpu_us_per_op": "CPU us per op (client + server)",
    "ns_per_op": "ns per registration (get + put)",
}


def numeric_axis(rows):
    """True when the rows' x values are the knob itself (not categories)."""
    xs = [r["x"] for r in rows]
    labels = [r["label"] for r in rows]
    return all(str(int(x)) == l for x, l in zip(xs, labels)) if xs else False


def plot_sweep(sweep, out_dir, subtitle):
    rows = sweep["rows"]
    panels = sweep["plot"]
    claim = sweep["claim"]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.2 * len(panels), 9), 4.2), squeeze=False)
    numeric = numeric_axis(rows)
    pos = {r["label"]: (r["x"] if numeric else i) for i, r in enumerate(rows)}
    for ax, metric in zip(axes[0], panels):
        pts = [(pos[r["label"]], r.get(metric)) for r in rows if r.get(metric) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:blue",
                    label="measured here (median)")
        missing = [r for r in rows if r.get(metric) is None]
        for r in missing:
            ax.annotate("not measured", (pos[r["label"]], 0), xycoords=("data", "axes fraction"),
                        xytext=(0, 8), textcoords="offset points", rotation=90,
                        fontsize=7, ha="center", color="gray")
        if claim["metric"] == metric:
            base = next((r.get(metric) for r in rows if r["label"] == claim["baseline"]), None)
            ref = [(pos[p["label"]], base * p["factor"]) for p in claim["points"]
                   if base is not None and p["label"] in pos]
            if ref:
                ax.plot([p[0] for p in ref], [p[1] for p in ref], "s--", color="tab:orange",
                        label="article's claim, from this baseline")
                prev = 1.0
                for (x, y), p in zip(ref, [p for p in claim["points"] if p["label"] in pos]):
                    # Mark where the claimed factor changes (x1.23 once, not on the flat part).
                    if p["factor"] != prev:
                        prev = p["factor"]
                        ax.annotate(f"x{p['factor']:.2f}", (x, y), xytext=(4, 4),
                                    textcoords="offset points", fontsize=7, color="tab:orange")
        if metric == panels[0]:
            for m in claim.get("marks", []):
                if m["label"] in pos:
                    ax.axvline(pos[m["label"]], color="tab:orange", ls=":", lw=1.5)
                    ax.annotate(m["text"], (pos[m["label"]], 0.3), xycoords=("data", "axes fraction"),
                                xytext=(4, 0), textcoords="offset points", rotation=90,
                                fontsize=7, color="tab:orange", va="center")
        ax.set_title(LABELS.get(metric, metric), fontsize=10)
        ax.set_xlabel(sweep["knob"], fontsize=9)
        if numeric:
            xs = [r["x"] for r in rows]
            if max(xs) / max(min(xs), 1e-9) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks([r["x"] for r in rows])
            ax.set_xticklabels([r["label"] for r in rows])
        else:
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels([r["label"] for r in rows])
        ys = [p[1] for p in pts if p[1] > 0]
        if ys and max(ys) / min(ys) > 100:
            ax.set_yscale("log")  # registration: per-IO vs pooled spans orders of magnitude
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{sweep['name']}: {claim['text']}\n{sweep['runs']}; {subtitle}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, f"tune-{sweep['name']}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    src, out_dir = sys.argv[1], sys.argv[2]
    with open(src) as f:
        data = json.load(f)
    subtitle = (f"{data['provider']}, {data['rounds']} rounds x {data['run_seconds']} s"
                + (" (quick)" if data.get("quick") else ""))
    for sweep in data["sweeps"]:
        print(plot_sweep(sweep, out_dir, subtitle))


if __name__ == "__main__":
    main()
