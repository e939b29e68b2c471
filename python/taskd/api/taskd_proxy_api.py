"""A node's proxy: ``init_taskd_proxy`` and ``destroy_taskd_proxy``.

Keys (string values, as the reference's): ``UpstreamAddr`` (default ``127.0.0.1``),
``UpstreamPort`` (``"9601"``), ``ListenAddr`` (``127.0.0.1``), ``ListenPort`` (``"9602"``),
``ServerRank`` (``$RANK``, else ``$MS_NODE_RANK``, else ``"0"``); also every flag of
``taskd proxy`` with underscores. The job is ``$MINDX_TASK_ID`` (or ``job_id``).
"""

import os
import threading

from taskd.python.cython_api import cython_api
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

_lock = threading.Lock()
_proxy = None
_retired = []  # stopped proxies: an init call may still be waiting on one

DEFAULTS = {
    "UpstreamAddr": "127.0.0.1",
    "UpstreamPort": "9601",
    "ListenAddr": "127.0.0.1",
    "ListenPort": "9602",
}


def _server_rank():
    for var in ("RANK", "MS_NODE_RANK"):
        value = os.environ.get(var, "").strip()
        if value:
            return value
    return "0"


def _with_defaults(config):
    cfg = dict(config)
    flags_given = {"manager": ("UpstreamAddr", "UpstreamPort"), "listen": ("ListenAddr", "ListenPort")}
    for flag, keys in flags_given.items():
        if flag not in cfg:
            for key in keys:
                cfg.setdefault(key, DEFAULTS[key])
    if "node_rank" not in cfg:
        cfg.setdefault("ServerRank", _server_rank())
    return cfg


@returns_bool
def init_taskd_proxy(config):
    """Starts this node's proxy and blocks until the manager admitted it (run it on a daemon
    thread). A second call in the same process does nothing and returns ``True``."""
    global _proxy
    log = get_logger()
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    with _lock:
        if _proxy is not None:
            log.info("init_taskd_proxy: the proxy already runs")
            return True
        cfg = _with_defaults(config)
        proxy = cython_api.Proxy(cfg)
        _proxy = proxy
    log.info("taskd proxy listening on %s (manager %s:%s)", proxy.addr(),
             cfg.get("UpstreamAddr", cfg.get("manager")), cfg.get("UpstreamPort", ""))
    try:
        node = proxy.wait_registered()
    except cython_api.TaskdError as e:
        if e.code == cython_api.TASKD_ERR_REFUSED:
            destroy_taskd_proxy()
        raise
    log.info("taskd proxy registered as %s", node)
    return True


@returns_bool
def destroy_taskd_proxy():
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
