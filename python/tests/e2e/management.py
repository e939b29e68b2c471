"""A node's management process (what msrun or torchrun's agent is in a job): it starts the
node's proxy through taskd's Python API on a daemon thread, as the reference's callers do, and
lives until its standard input closes; then it destroys the proxy.

    python management.py MANAGER_PORT NODE_RANK
"""

import sys
import threading

from taskd.api import destroy_taskd_proxy, init_taskd_proxy

config = {
    "UpstreamAddr": "127.0.0.1",
    "UpstreamPort": sys.argv[1],
    "ListenAddr": "127.0.0.1",
    "ListenPort": "0",
    "ServerRank": sys.argv[2],
}
threading.Thread(target=init_taskd_proxy, args=(config,), daemon=True).start()
sys.stdin.read()
print("destroy_taskd_proxy", destroy_taskd_proxy(), flush=True)
