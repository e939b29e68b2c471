"""A scenario's step time and per-plane bytes over time as a PNG (matplotlib)."""

from __future__ import annotations

import os


def plot(scenario: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = scenario["series"]
    steps = series["steps"]
    t0 = next((m["t"] for m in scenario.get("marks", []) if m["name"] == "start"), steps[0][0] if steps else 0.0)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    top.plot([t - t0 for t, _ in steps], [ms for _, ms in steps], ".-", ms=2, lw=0.6, color="black")
    top.set_ylabel("step time (ms)")
    top.set_yscale("log")
    for plane, colour, label in (("pri", "tab:blue", "primary plane"), ("bak", "tab:orange", "backup plane")):
        pts = [p for p in series["bytes"][plane] if p[0] >= t0]
        bottom.plot([t - t0 for t, _ in pts], [b / 1e6 for _, b in pts], color=colour, label=label)
    bottom.set_ylabel("MB/s (all nodes)")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right")
    for name, t in _named_marks(scenario):
        for ax in (top, bottom):
            ax.axvline(t - t0, color="grey", lw=0.6, ls="--")
        top.annotate(name, (t - t0, 1), xycoords=("data", "axes fraction"), rotation=90,
                     fontsize=7, va="top", ha="right")
    top.set_title("taskd rig: %s (%s)" % (scenario["name"], "passed" if scenario["passed"] else "FAILED"))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _named_marks(scenario: dict):
    return [(m["name"], m["t"]) for m in scenario.get("marks", []) if m["name"] not in ("start", "end")]

