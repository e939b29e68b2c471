"""``python3 -m taskd_netrig``: see the package's doc and docs/rig.md."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile

from taskd_netrig import net


def parse(argv):
    ap = argparse.ArgumentParser(prog="python3 -m taskd_netrig", description=(
        "A real PyTorch DDP job under taskd on a two-plane network of namespaces: planned "
        "maintenance, a degraded link, a dying link, a subset switch. Needs root and torch."))
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--scenario", default="all",
                    choices=["maintenance", "degraded", "link-dies", "subset", "all"])
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("--plots", help="write the PNG plots into this directory")
    ap.add_argument("--taskd", default=shutil.which("taskd"), help="the taskd command (default: on PATH)")
    ap.add_argument("--hal", choices=["linux", "sim"], default="linux",
                    help="the proxies' link health: the kernel's (default) or every link up")
    ap.add_argument("--compute-ms", type=float, default=20.0, help="each step's simulated compute")
    ap.add_argument("--workdir", help="keep the run's logs here (default: a temporary directory)")
    ap.add_argument("--teardown", action="store_true", help="only remove a rig left behind")
    return ap.parse_args(argv)


def preflight(a) -> str:
    if os.geteuid() != 0:
        return "the rig needs root (network namespaces, veth pairs, bridges, tc)"
    if not a.taskd:
        return "no taskd command: build it (cargo build --bin taskd) and give --taskd PATH"
    try:
        import torch.distributed as d

        if not d.is_gloo_available():
            return "this torch has no Gloo"
    except ImportError as e:
        return "the rig needs torch (%s); see docs/rig.md for the install" % e
    if a.nodes < 2 or a.ranks_per_node < 1:
        return "--nodes must be at least 2 and --ranks-per-node at least 1"
    return ""


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.teardown:
        print("removed: %s" % (", ".join(net.teardown()) or "nothing"))
        return 0
    why = preflight(a)
    if why:
        print("taskd_netrig: %s" % why, file=sys.stderr)
        return 2
    from taskd_netrig.report import run_all

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    workdir = a.workdir or tempfile.mkdtemp(prefix="tdrig-")
    try:
        net.build(a.nodes)
        report = run_all(a, workdir)
    except KeyboardInterrupt:
        print("taskd_netrig: interrupted; the network is torn down", file=sys.stderr)
        return 130
    finally:
        net.teardown()
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(s["passed"] for s in report["scenarios"]) else 1


if __name__ == "__main__":
    sys.exit(main())
