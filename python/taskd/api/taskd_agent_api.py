"""The reference's agent API, for the launcher's management process.

``init_taskd_agent({"Framework": "MindSpore"})`` starts this node's proxy the way the reference
does: ``init_taskd_proxy`` on a daemon thread with ``UpstreamAddr = $MS_SCHED_HOST`` and
``ServerRank = $MS_NODE_RANK``. Restarting training processes (``start_taskd_agent``, the
callbacks of ``register_func``) is MindCluster's process management, not part of taskd-rs:
``register_func`` keeps the callbacks and ``start_taskd_agent`` says so and returns ``False``.
"""

import os
import threading

from taskd.api.taskd_proxy_api import init_taskd_proxy
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

FRAMEWORKS = ("PyTorch", "MindSpore")
OPERATORS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR", "RESTART")
_functions = {}


@returns_bool
def init_taskd_agent(config, cls=None):
    """Checks the agent's configuration; for MindSpore, starts this node's proxy."""
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    framework = config.get("Framework")
    if framework not in FRAMEWORKS:
        raise ValueError("Framework must be PyTorch or MindSpore, got %r" % (framework,))
    if framework == "MindSpore":
        proxy_config = {}
        for key, var in (("UpstreamAddr", "MS_SCHED_HOST"), ("ServerRank", "MS_NODE_RANK")):
            value = os.environ.get(var, "").strip()
            if not value:
                raise ValueError("$%s is not set: the proxy needs it" % var)
            proxy_config[key] = value
        threading.Thread(
            target=init_taskd_proxy, args=(proxy_config,), name="taskd-proxy", daemon=True
        ).start()
    get_logger().info("taskd agent initialised for %s", framework)
    return True


@returns_bool
def start_taskd_agent():
    """The reference's process-management loop: not part of taskd-rs (returns ``False``)."""
    raise NotImplementedError(
        "restarting training processes is MindCluster's process management, which taskd-rs "
        "does not provide; the launcher keeps managing them"
    )


@returns_bool
def register_func(operator, func):
    """Keeps a process-management callback (``KILL_WORKER``, ``START_ALL_WORKER``,
    ``START_WORKER_LIST``, ``MONITOR``, ``RESTART``)."""
    if operator not in OPERATORS or not callable(func):
        raise ValueError("unknown operator %r, or not a function" % (operator,))
    _functions[operator] = func
    return True
