"""The job's roles as the seed places them, each a process inside a node's namespace:

    python3 -m taskd_netrig.roles manager CONFIG_JSON     # init_taskd_manager + start_taskd_manager
    python3 -m taskd_netrig.roles launcher CONFIG_JSON    # the node's launcher: its proxy
                                                       # (init_taskd_proxy on a daemon thread) and
                                                       # its training processes

The launcher exits with the first non-zero status of its training processes (0 when all
ended cleanly); SIGTERM is passed on to them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading


def manager(cfg: dict) -> int:
    from taskd.api import init_taskd_manager, start_taskd_manager

    if not init_taskd_manager(cfg):
        return 1
    return 0 if start_taskd_manager() else 1


def launcher(cfg: dict) -> int:
    from taskd.api import init_taskd_proxy

    threading.Thread(target=init_taskd_proxy, args=(cfg["proxy"],), daemon=True).start()
    procs = []
    for env in cfg["ranks"]:
        procs.append(subprocess.Popen(cfg["argv"], env=dict(os.environ, **env)))

    def forward(sig, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    codes = [p.wait() for p in procs]
    bad = [c for c in codes if c != 0]
    return bad[0] if bad else 0


def main() -> int:
    role, raw = sys.argv[1], sys.argv[2]
    cfg = json.loads(raw)
    return {"manager": manager, "launcher": launcher}[role](cfg)


if __name__ == "__main__":
    sys.exit(main())
