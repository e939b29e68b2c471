"""Runs the chosen scenarios, prints each one's summary, and builds the report."""

from __future__ import annotations

import json
import os
import time

from taskd_netrig import scenarios
from taskd_netrig.rig import Rig


def summary_line(s: dict) -> str:
    b = s.get("bytes_while_switched") or {}
    return "%-12s %s  steps %-5s replay %-5s restarts %s lost %s fault->backup %s ms  while switched: primary %s B, backup %s B%s" % (
        s["name"], "PASS" if s["passed"] else "FAIL", s.get("steps"), s.get("params_match_replay"),
        s.get("restarts"), s.get("steps_lost"), s.get("fault_to_backup_ms", "-"),
        b.get("primary", "-"), b.get("backup", "-"),
        ("  error: %s" % s["error"]) if s.get("error") else "")


def run_all(a, workdir: str) -> dict:
    lib = os.environ.get("TASKD_LIBRARY")
    rig = Rig(a.nodes, a.ranks_per_node, a.taskd, _python(), a.compute_ms, workdir, a.hal, lib)
    names = list(scenarios.SCENARIOS) if a.scenario == "all" else [a.scenario]
    out = {"nodes": a.nodes, "ranks_per_node": a.ranks_per_node, "hal": a.hal,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workdir": workdir,
           "scenarios": []}
    for name in names:
        s = scenarios.SCENARIOS[name](rig)
        print(summary_line(s), flush=True)
        for check, ok in s["checks"].items():
            print("    %s %s" % ("ok  " if ok else "FAIL", check), flush=True)
        out["scenarios"].append(s)
        with open(os.path.join(workdir, name, "report.json"), "w") as f:
            json.dump(s, f, indent=1)
        if a.plots and name in ("maintenance", "degraded"):
            from taskd_netrig.plot import plot

            plot(s, os.path.join(a.plots, "rig-%s.png" % name))
    return out


def _python() -> str:
    import sys

    return sys.executable
