"""``python3 -m taskd_netrig.route --src ADDR backup|primary``: the rig's route command for taskd's
Gloo switch (``TASKD_GLOO_ROUTE_CMD``). ``backup``: this node reaches the primary plane over its
backup interface (two /25 routes, more specific than the primary's own /24, source = the
backup address; the peers answer on their backup interface, which holds a route back);
``primary``: those routes go."""

import argparse
import subprocess
import sys

HALVES = ("10.251.1.0/25", "10.251.1.128/25")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m taskd_netrig.route")
    ap.add_argument("--src", required=True, help="this node's backup address")
    ap.add_argument("--dev", default="bak")
    ap.add_argument("side", choices=["backup", "primary"])
    a = ap.parse_args(argv)
    for half in HALVES:
        if a.side == "backup":
            cmd = ["ip", "route", "replace", half, "dev", a.dev, "src", a.src]
        else:
            cmd = ["ip", "route", "del", half]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0 and a.side == "backup":
            sys.stderr.write(p.stdout.decode())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
