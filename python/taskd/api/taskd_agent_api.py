"""The reference's agent API: taskd's agent is msrun's process manager.

msrun (``MS_ENABLE_TFT`` with ``TTP:1``, ``TSP:1``, ...) calls ``init_taskd_agent({"Framework":
"MindSpore"})``, registers ``KILL_WORKER``, ``START_ALL_WORKER``, ``START_WORKER_LIST`` and
``MONITOR`` with ``register_func``, and hands its workers to ``start_taskd_agent()``, which
starts them, watches them and returns when training ended on this node
(``taskd.python.framework.agent``).

The node's proxy runs in the agent's process, as the reference's does: ``init_taskd_proxy`` on a
daemon thread with ``UpstreamAddr = $MS_SCHED_HOST``, ``UpstreamPort = $TASKD_MANAGER_PORT``
(default ``9601``), listening where ``$TASKD_PROXY`` says (default ``127.0.0.1:9602``; port
``0`` picks a free one) and ``ServerRank = $MS_NODE_RANK``, or, when the platform does not set
it (plain msrun), the node rank msrun's ``MONITOR`` gives (``--node_rank``). The workers the
agent starts get ``MS_NODE_RANK``, ``TASKD_PROXY`` and ``TASKD_RESTART_COUNT`` (0, then 1 after
the first restart, ...) in their environment.

A worker that fails ends the job on this node: the others are killed, and ``start_taskd_agent``
exits the process with status 1. With ``PROCESS_RECOVER=on`` the agent instead kills the others
and starts every worker again through ``START_ALL_WORKER``, at most ``$TASKD_AGENT_MAX_RESTARTS``
times (default 3). SIGINT or SIGTERM kills the workers and exits with 128 + the signal.
"""

import os
import signal
import threading

from taskd.api import taskd_proxy_api
from taskd.python.framework import frameworks
from taskd.python.framework.agent import AgentError, ProcessAgent, child_pids, end_children
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

FRAMEWORKS = frameworks.names()
OPERATORS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR", "RESTART")
DEFAULT_MAX_RESTARTS = 3
DEFAULT_PROXY = "127.0.0.1:9602"
_functions = {}
_framework = None


def _env(name, default=None):
    value = os.environ.get(name, "").strip()
    return value or default


def _env_count(name, default):
    value = _env(name)
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError("$%s=%r is not a count (an int >= 0)" % (name, value))
    return int(value)


def _proxy_config(node_rank):
    listen = _env("TASKD_PROXY", DEFAULT_PROXY)
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("$TASKD_PROXY=%r is not HOST:PORT" % listen)
    return {
        "UpstreamAddr": _env("MS_SCHED_HOST"),
        "UpstreamPort": _env("TASKD_MANAGER_PORT", "9601"),
        "ListenAddr": host.strip("[]"),
        "ListenPort": port,
        "ServerRank": str(node_rank),
    }


def _start_proxy(node_rank):
    threading.Thread(
        target=taskd_proxy_api.init_taskd_proxy, args=(_proxy_config(node_rank),),
        name="taskd-proxy", daemon=True,
    ).start()


@returns_bool
def init_taskd_agent(config, cls=None):
    """Checks the agent's configuration; for MindSpore, starts this node's proxy when the node
    rank is known (``$MS_NODE_RANK``), else ``start_taskd_agent`` does once msrun's
    ``MONITOR`` gave it."""
    global _framework
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    framework = frameworks.by_name(config.get("Framework")).name
    if framework == "MindSpore":
        if _env("MS_SCHED_HOST") is None:
            raise ValueError("$MS_SCHED_HOST is not set: the proxy needs the manager's host there")
        _env_count("TASKD_AGENT_MAX_RESTARTS", DEFAULT_MAX_RESTARTS)
        node_rank = _env("MS_NODE_RANK")
        if node_rank is not None:
            _start_proxy(node_rank)
    _framework = framework
    get_logger().info("taskd agent initialised for %s", framework)
    return True


@returns_bool
def register_func(operator, func):
    """Keeps a process-management callback (``KILL_WORKER``, ``START_ALL_WORKER``,
    ``START_WORKER_LIST``, ``MONITOR``, ``RESTART``)."""
    if operator not in OPERATORS or not callable(func):
        raise ValueError("unknown operator %r, or not a function" % (operator,))
    _functions[operator] = func
    return True


def _node_rank(agent):
    explicit = _env("MS_NODE_RANK")
    if explicit is not None:
        return int(explicit)
    ranks = agent.node_ranks()
    if not ranks:
        raise AgentError("MONITOR names no local worker")
    return min(ranks.values()) // len(ranks)


class _Signals:
    """SIGINT and SIGTERM end the job through the agent while it runs (main thread only)."""

    def __init__(self, agent):
        self.agent = agent
        self.saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, lambda n, _f: self.agent.request_stop(n))
        return self

    def __exit__(self, *_):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _prepare(log):
    if _framework != "MindSpore":
        raise RuntimeError(
            "start_taskd_agent manages msrun's workers (init_taskd_agent with Framework "
            "MindSpore has not succeeded); torchrun's elastic agent manages its own")
    recover = _env("PROCESS_RECOVER", "").lower() == "on"
    restarts = _env_count("TASKD_AGENT_MAX_RESTARTS", DEFAULT_MAX_RESTARTS) if recover else 0
    interval = _env_count("TASKD_AGENT_MONITOR_MS", 1000) / 1000.0
    agent = ProcessAgent(dict(_functions), log, restarts, interval)
    node_rank = _node_rank(agent)
    if _env("MS_NODE_RANK") is None:
        os.environ["MS_NODE_RANK"] = str(node_rank)
        _start_proxy(node_rank)
    os.environ["TASKD_PROXY"] = taskd_proxy_api.listening_addr()
    log.info("taskd agent: node rank %d, proxy %s, %s", node_rank, os.environ["TASKD_PROXY"],
             "up to %d restarts" % restarts if recover else "no restart (PROCESS_RECOVER is not on)")
    return agent


def start_taskd_agent():
    """Runs msrun's workers until training ended on this node. Returns ``True`` after a clean
    end; after a failure, or SIGINT/SIGTERM, the workers are killed and the process exits with
    a non-zero status (``SystemExit``), which becomes msrun's. ``False`` when no launcher
    registered its callbacks; when they are there and the agent cannot start, the launcher's
    children are ended and the process exits with status 1."""
    log = get_logger()
    try:
        agent = _prepare(log)
    except Exception as e:
        log.error("start_taskd_agent failed: %s", e)
        if not _functions:
            return False
        # A launcher handed its workers over and none will run: end what it started.
        end_children(child_pids(), 0.0, log)
        raise SystemExit(1)
    outcome = None
    try:
        with _Signals(agent):
            outcome = agent.run()
    except Exception as e:
        log.error("taskd agent: %s: killing every worker", e)
        agent.cb["KILL_WORKER"]([-1])
    finally:
        agent.reap_others(outcome is not None and outcome.code == 0)
        if taskd_proxy_api.running():
            taskd_proxy_api.destroy_taskd_proxy()
    if outcome is None:
        raise SystemExit(1)
    log.info("taskd agent: %s", outcome.why)
    if outcome.code != 0:
        raise SystemExit(outcome.code)
    return True
