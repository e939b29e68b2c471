"""A node's proxy: ``init_taskd_proxy`` and ``destroy_taskd_proxy``.

Keys (string values, as the reference's): ``UpstreamAddr`` (default ``127.0.0.1``),
``UpstreamPort`` (``"9601"``), ``ListenAddr`` (``127.0.0.1``), ``ListenPort`` (``"9602"``),
``ServerRank`` (``$RANK``, else ``$MS_NODE_RANK``, ``$GROUP_RANK``, ``$PET_NODE_RANK``, the
launcher's ``--node_rank`` option, else ``"0"``); also every flag of
``taskd proxy`` with underscores. The job is ``$MINDX_TASK_ID`` (or ``job_id``).
"""

import os
import sys
import threading
from typing import Any, Dict, Optional

from taskd.python.cython_api import cython_api
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

_lock = threading.Lock()
_started = threading.Condition(_lock)  # notified when a proxy starts
_proxy = None
_start_error = None  # why the last init_taskd_proxy could not start one
_retired = []  # stopped proxies: an init call may still be waiting on one

DEFAULTS = {
    "UpstreamAddr": "127.0.0.1",
    "UpstreamPort": "9601",
    "ListenAddr": "127.0.0.1",
    "ListenPort": "9602",
}


#: where a node's management process finds its node rank, in this order: the variables, then
#: the launcher's own option (torchrun's agent and msrun have ``--node_rank`` / ``--node-rank``)
RANK_VARS = ("RANK", "MS_NODE_RANK", "GROUP_RANK", "PET_NODE_RANK")
RANK_OPTIONS = ("--node_rank", "--node-rank")


def _option(argv, names):
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def _server_rank(argv=None):
    """This node's rank: ``$RANK``, ``$MS_NODE_RANK``, ``$GROUP_RANK``, ``$PET_NODE_RANK``, then
    the launcher's ``--node_rank`` (``-1``, msrun's "not given", is not a rank), else ``"0"``
    with a warning."""
    for var in RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    given = _option(sys.argv if argv is None else argv, RANK_OPTIONS)
    if given is not None and given.strip().isdigit():
        return given.strip()
    get_logger().warning(
        "init_taskd_proxy: no node rank in $%s or the launcher's --node_rank: this node is "
        "node 0 (set ServerRank or $MS_NODE_RANK on every other node)", ", $".join(RANK_VARS))
    return "0"


def _with_defaults(config):
    cfg = dict(config)
    flags_given = {"manager": ("UpstreamAddr", "UpstreamPort"), "listen": ("ListenAddr", "ListenPort")}
    for flag, keys in flags_given.items():
        if flag not in cfg:
            for key in keys:
                cfg.setdefault(key, DEFAULTS[key])
    if "node_rank" not in cfg and "ServerRank" not in cfg:
        cfg["ServerRank"] = _server_rank()
    return cfg


@returns_bool
def init_taskd_proxy(config: Dict[str, Any]) -> bool:
    """Starts this node's proxy and blocks until the manager admitted it (run it on a daemon
    thread). A second call in the same process does nothing and returns ``True``."""
    global _proxy, _start_error
    log = get_logger()
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    with _lock:
        if _proxy is not None:
            log.info("init_taskd_proxy: the proxy already runs")
            return True
        cfg = _with_defaults(config)
        try:
            proxy = cython_api.Proxy(cfg)
        except Exception as e:
            _start_error = str(e)
            _started.notify_all()
            raise
        _proxy, _start_error = proxy, None
        _started.notify_all()
    log.info("taskd proxy listening on %s (manager %s:%s)", proxy.addr(),
             cfg.get("UpstreamAddr", cfg.get("manager")), cfg.get("UpstreamPort", ""))
    try:
        node = proxy.wait_registered()
    except cython_api.TaskdError as e:
        if e.code == cython_api.TASKD_ERR_STOPPED:
            log.info("taskd proxy destroyed before the manager admitted it")
            return False
        if e.code == cython_api.TASKD_ERR_REFUSED:
            destroy_taskd_proxy()
        raise
    log.info("taskd proxy registered as %s", node)
    return True


def running() -> bool:
    """Whether a proxy runs in this process."""
    with _lock:
        return _proxy is not None


def _running_proxy() -> Any:
    with _lock:
        if _proxy is None:
            raise RuntimeError("no proxy runs")
        return _proxy


def next_order(timeout_s: float) -> Optional[Dict[str, Any]]:
    """The manager's next order for this node's launcher (``{"order": "restart", "number": N,
    "reason": ...}`` or ``{"order": "end", "reason": ...}``), or ``None`` when none came within
    ``timeout_s``. ``RuntimeError`` when no proxy runs; ``TaskdError`` once it stopped."""
    return _running_proxy().next_order(int(timeout_s * 1000))


def worker_exited(rank: int, status: str, clean: bool, generation: int) -> None:
    """Tells the manager, through this node's proxy, that the process of ``rank`` ended
    (``clean``: with status 0), started for restart ``generation`` of the job."""
    _running_proxy().worker_exited(rank, status, clean, generation)


def listening_addr(timeout_s: float = 60.0) -> str:
    """Where this process's proxy listens, once ``init_taskd_proxy`` (on another thread)
    started it; ``RuntimeError`` if none started within ``timeout_s``."""
    with _started:
        _started.wait_for(lambda: _proxy is not None or _start_error is not None, timeout_s)
        if _proxy is None:
            raise RuntimeError("the proxy did not start: %s" % (_start_error or "not in %gs" % timeout_s))
        return _proxy.addr()


@returns_bool
def destroy_taskd_proxy() -> bool:
    """Stops this process's proxy (its workers and the manager are told)."""
    global _proxy
    with _lock:
        proxy, _proxy = _proxy, None
        if proxy is None:
            raise RuntimeError("no proxy runs")
        _retired.append(proxy)
    proxy.stop()
    get_logger().info("taskd proxy destroyed")
    return True
