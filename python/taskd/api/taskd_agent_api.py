"""The reference's agent API: taskd's node agent runs the launcher's workers.

The launcher calls ``init_taskd_agent({"Framework": NAME}, cls)``, registers its callbacks with
``register_func`` and hands its workers to ``start_taskd_agent()``, which starts them, watches
them and ends when training ended on this node (``taskd/python/framework/agent/``):

- msrun (``"MindSpore"``; ``MS_ENABLE_TFT`` with ``TTP:1``, ``TSP:1``, ...) registers
  ``KILL_WORKER``, ``START_ALL_WORKER``, ``START_WORKER_LIST`` and ``MONITOR``;
- torchrun (``"PyTorch"``, ``cls`` = torch's elastic agent), through
  ``import taskd.python.adaptor.patch`` in ``torch/distributed/run.py`` as the reference's
  documentation says, registers the agent's ``_stop_workers``, ``_initialize_workers``,
  ``_monitor_workers`` and ``_restart_workers``.

The node's proxy runs in the agent's process, as the reference's does: ``init_taskd_proxy`` on a
daemon thread with ``UpstreamAddr`` = the manager's host (msrun: ``$MS_SCHED_HOST``; torchrun:
``$MASTER_ADDR``), ``UpstreamPort = $TASKD_MANAGER_PORT`` (default ``9601``), listening where
``$TASKD_PROXY`` says (default ``127.0.0.1:9602``; port ``0`` picks a free one) and
``ServerRank`` = the node rank the launcher gives. The workers get ``TASKD_PROXY`` and
``TASKD_RESTART_COUNT`` (0, then 1 after the first restart, ...) in their environment, and
under msrun ``MS_NODE_RANK``.

A worker that fails ends the job on this node: the others are killed and the launcher ends
with status 1 (msrun: ``start_taskd_agent`` exits the process; torchrun: it returns a failed
``RunResult``). Restarts: with ``PROCESS_RECOVER=on`` the job's manager coordinates them
(``taskd/python/framework/agent/coordinated.py``): one fault, one restart of every node
together, within the manager's budget; the agent reports its workers' ends to the manager
and follows its orders, and restarts on its own (at most ``$TASKD_AGENT_MAX_RESTARTS`` times,
default 3) only when no order comes within ``$TASKD_AGENT_ORDER_WAIT_MS`` (default 600000).
``TASKD_AGENT_COORDINATED=off`` makes each node restart on its own, as before. Without
``PROCESS_RECOVER=on``, the launcher's own budget (msrun: none; torchrun: ``--max-restarts``).
SIGINT or SIGTERM kills the workers and exits with 128 + the signal.
"""

import importlib
import logging
import os
import threading
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from taskd.api import taskd_proxy_api
from taskd.python.framework import frameworks
from taskd.python.framework.agent import AgentError, NodeAgent, child_pids, end_children
from taskd.python.framework.agent.coordinated import ORDER_WAIT_S, Coordinator
from taskd.python.framework.spec import Framework
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

FRAMEWORKS = frameworks.names()
OPERATORS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR", "RESTART")
DEFAULT_MAX_RESTARTS = 3
DEFAULT_PROXY = "127.0.0.1:9602"
_functions: Dict[str, Callable[..., Any]] = {}
_framework: Optional[Framework] = None
_cls: Any = None  # what init_taskd_agent was given (torchrun: torch's elastic agent)


def _env(name: str, default: Optional[str] = None) -> Optional[str]:
    value = os.environ.get(name, "").strip()
    return value or default


def _env_count(name: str, default: int) -> int:
    value = _env(name)
    if value is None:
        return default
    if not value.isdigit():
        raise ValueError("$%s=%r is not a count (an int >= 0)" % (name, value))
    return int(value)


def _adapter(framework: Framework) -> ModuleType:
    """The framework's launcher module (``taskd/python/framework/agent/``)."""
    return importlib.import_module(framework.launcher)


def _proxy_config(manager_host: str, node_rank: int) -> Dict[str, str]:
    listen = _env("TASKD_PROXY", DEFAULT_PROXY)
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("$TASKD_PROXY=%r is not HOST:PORT" % listen)
    return {
        "UpstreamAddr": manager_host,
        "UpstreamPort": _env("TASKD_MANAGER_PORT", "9601"),
        "ListenAddr": host.strip("[]"),
        "ListenPort": port,
        "ServerRank": str(node_rank),
    }


def _start_proxy(manager_host: str, node_rank: int) -> None:
    threading.Thread(
        target=taskd_proxy_api.init_taskd_proxy, args=(_proxy_config(manager_host, node_rank),),
        name="taskd-proxy", daemon=True,
    ).start()


@returns_bool
def init_taskd_agent(config: Dict[str, Any], cls: Any = None) -> bool:
    """Checks the agent's configuration for the framework's launcher; under msrun, starts this
    node's proxy when the node rank is known (``$MS_NODE_RANK``), else ``start_taskd_agent``
    does once the launcher gave it."""
    global _framework, _cls
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    framework = frameworks.by_name(config.get("Framework"))
    adapter = _adapter(framework)
    node_rank = adapter.check_init(config, cls)
    _env_count("TASKD_AGENT_MAX_RESTARTS", DEFAULT_MAX_RESTARTS)
    if node_rank is not None:
        _start_proxy(os.environ[adapter.MANAGER_HOST].strip(), node_rank)
    _framework, _cls = framework, cls
    get_logger().info("taskd agent initialised for %s", framework.name)
    return True


@returns_bool
def register_func(operator: str, func: Callable[..., Any]) -> bool:
    """Keeps a process-management callback (``KILL_WORKER``, ``START_ALL_WORKER``,
    ``START_WORKER_LIST``, ``MONITOR``, ``RESTART``)."""
    if operator not in OPERATORS or not callable(func):
        raise ValueError("unknown operator %r, or not a function" % (operator,))
    _functions[operator] = func
    return True


def _prepare(log: logging.Logger) -> Tuple[NodeAgent, Any, Optional[Coordinator]]:
    """The launcher and the agent over it, the proxy started: ``(agent, launcher,
    coordinator)`` (``None`` when each node restarts on its own)."""
    if _framework is None:
        raise RuntimeError("init_taskd_agent has not succeeded")
    adapter = _adapter(_framework)
    launcher = adapter.make(dict(_functions), _cls, log)
    recover = _env("PROCESS_RECOVER", "").lower() == "on"
    if recover:
        restarts = _env_count("TASKD_AGENT_MAX_RESTARTS", DEFAULT_MAX_RESTARTS)
        budget, no_restart = "up to %d restarts" % restarts, "$TASKD_AGENT_MAX_RESTARTS is 0"
    else:
        restarts = launcher.default_restarts()
        no_restart = adapter.NO_RESTART
        budget = ("up to %d restarts (%s's)" % (restarts, launcher.name) if restarts
                  else "no restart (PROCESS_RECOVER is not on)")
    if _env("TASKD_AGENT_MONITOR_MS") is not None or not hasattr(launcher, "monitor_interval_s"):
        interval = _env_count("TASKD_AGENT_MONITOR_MS", 1000) / 1000.0
    else:
        interval = launcher.monitor_interval_s()
    node_rank = launcher.node_rank()
    os.environ.update(launcher.worker_env(node_rank))
    if not taskd_proxy_api.running():
        host = launcher.manager_host()
        if host is None:
            raise AgentError("the manager's host is unknown: set $%s" % adapter.MANAGER_HOST)
        _start_proxy(host, node_rank)
    os.environ["TASKD_PROXY"] = taskd_proxy_api.listening_addr()
    coordinator = None
    if recover and _env("TASKD_AGENT_COORDINATED", "on").lower() != "off":
        wait_s = _env_count("TASKD_AGENT_ORDER_WAIT_MS", int(ORDER_WAIT_S * 1000)) / 1000.0
        coordinator = Coordinator(taskd_proxy_api.next_order, taskd_proxy_api.worker_exited,
                                  log, restarts, wait_s)
        budget = ("restarts coordinated by the job's manager (on its own, up to %d when no "
                  "order comes within %.0f s)" % (restarts, wait_s))
    log.info("taskd agent: node rank %d, proxy %s, %s", node_rank, os.environ["TASKD_PROXY"], budget)
    if coordinator is None:
        return NodeAgent(launcher, log, restarts, interval, no_restart=no_restart), launcher, None
    agent = NodeAgent(launcher, log, restarts, interval, policy=coordinator.policy,
                      no_restart=no_restart, observer=coordinator.observe)
    coordinator.attach(agent)
    coordinator.start()
    return agent, launcher, coordinator


def start_taskd_agent() -> Any:
    """Runs the launcher's workers until training ended on this node; what it returns is the
    launcher's (msrun: ``True`` after a clean end, and after a failure, or SIGINT/SIGTERM, the
    workers are killed and the process exits with a non-zero status, ``SystemExit``;
    torchrun: torch's ``RunResult``). ``False`` when no launcher registered its callbacks; when
    they are there and the agent cannot start, the launcher's children are ended and the
    process exits with status 1."""
    log = get_logger()
    try:
        agent, launcher, coordinator = _prepare(log)
    except Exception as e:
        log.error("start_taskd_agent failed: %s", e)
        if not _functions:
            return False
        # A launcher handed its workers over and none will run: end what it started.
        end_children(child_pids(), 0.0, log)
        raise SystemExit(1)
    outcome = None
    try:
        outcome = agent.run()
    except Exception as e:
        log.error("taskd agent: %s: killing every worker", e)
        try:
            launcher.stop_all()
        except Exception as e2:
            log.error("taskd agent: the workers could not be stopped: %s", e2)
    finally:
        if coordinator is not None:
            coordinator.close()
        agent.reap_others(outcome is not None and outcome.code == 0)
        if taskd_proxy_api.running():
            taskd_proxy_api.destroy_taskd_proxy()
    if outcome is None:
        raise SystemExit(1)
    log.info("taskd agent: %s", outcome.why)
    return launcher.finish(outcome)
