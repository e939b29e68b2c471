"""msrun (MindSpore) as a :class:`~taskd.python.framework.agent.core.Launcher`.

With ``MS_ENABLE_TFT`` asking for taskd (``TTP:1``, ``TSP:1``, ...), msrun does not start its
training processes itself: it calls ``init_taskd_agent({"Framework": "MindSpore"})``, registers
four callbacks and calls ``start_taskd_agent()``, which owns the workers from then on. The
callbacks are msrun's (``mindspore/utils/utils.py`` registers the methods of its process
manager):

- ``START_ALL_WORKER()``: kills the workers it knows, starts every local worker; ``0`` when all
  of them run, ``1`` otherwise.
- ``START_WORKER_LIST(local_ranks)``: starts those local workers; ``0`` / ``1`` the same way.
- ``KILL_WORKER(pids)``: SIGKILLs those workers' process groups (``[-1]``: every worker).
- ``MONITOR(local_ranks)``: ``{local_rank: {"pid", "status", "global_rank", ...}}``
  (``[-1]``: every worker); ``status`` is ``None`` while a worker runs, its exit code once it
  ended, ``200`` before it was started, ``300`` when its process vanished. A started worker's
  entry also has ``node_id``, msrun's ``--node_rank``.

The node rank is ``$MS_NODE_RANK`` (MindCluster's platform sets it), else msrun's own: a
``node_id`` of ``MONITOR``, the ``--node_rank`` of msrun's command line (the agent runs in
msrun's process), or ``0`` for a job of one node (``--worker_num`` equal to
``--local_worker_num``, both 8 by default). msrun's default ``-1`` on a job of several nodes
(the scheduler assigns ranks as nodes come) is not one: set ``$MS_NODE_RANK`` or give
``--node_rank``. The node's proxy reaches the manager at
``$MS_SCHED_HOST``; the workers get ``MS_NODE_RANK``.
"""

import logging
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from taskd.python.framework.agent.core import AgentError, Outcome, WorkerState, WorkerStatus

NAME = "msrun"
KILL_ALL = -1
MONITOR_ALL = -1
#: ``MONITOR``'s statuses that are not exit codes
NOT_STARTED = 200
VANISHED = 300
CALLBACKS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR")
#: where the manager is (the host where ``MS_SCHED_HOST == POD_IP`` runs ``manager.py``)
MANAGER_HOST = "MS_SCHED_HOST"
NODE_RANK = "MS_NODE_RANK"
#: without ``PROCESS_RECOVER=on``, msrun's workers are not restarted
NO_RESTART = "process recovery is off (PROCESS_RECOVER=on restarts the workers)"


def _state(status: Any) -> WorkerState:
    if status is None:
        return WorkerState.RUNNING
    if status == 0:
        return WorkerState.SUCCEEDED
    if status == NOT_STARTED:
        return WorkerState.NOT_STARTED
    if status == VANISHED:
        return WorkerState.VANISHED
    return WorkerState.FAILED


def statuses(answer: Any) -> List[WorkerStatus]:
    """``MONITOR``'s answer, checked and typed."""
    if not isinstance(answer, dict):
        raise AgentError("MONITOR answered %r, not a dict" % (answer,))
    out = []
    for local, info in sorted(answer.items()):
        if not isinstance(info, dict) or "status" not in info or "global_rank" not in info:
            raise AgentError("MONITOR's entry for local rank %r is %r" % (local, info))
        status, pid = info["status"], info.get("pid")
        state = _state(status)
        out.append(WorkerStatus(int(local), int(info["global_rank"]), state,
                                pid if isinstance(pid, int) else None,
                                status if state is WorkerState.FAILED else None))
    return out


#: msrun's defaults (``mindspore/parallel/cluster/run.py``)
DEFAULTS = {"--worker_num": "8", "--local_worker_num": "8", "--node_rank": "-1"}


def options(argv: Sequence[str]) -> Dict[str, str]:
    """msrun's own options on its command line (``argv[0]`` is msrun), defaults included:
    every one takes a value (``--opt V`` or ``--opt=V``), and the first other word is the
    training script, whose options are its own."""
    found = dict(DEFAULTS)
    i = 1
    while i < len(argv) and argv[i].startswith("--"):
        name, sep, value = argv[i].partition("=")
        if not sep:
            if i + 1 >= len(argv):
                break
            value = argv[i + 1]
            i += 1
        found[name.replace("-", "_").replace("__", "--", 1)] = value
        i += 1
    return found


def _rank(value: Any) -> Optional[int]:
    """A node rank (an int >= 0, or its text), else ``None`` (msrun's ``-1`` included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


class Msrun:
    """msrun's callbacks as a launcher."""

    name = NAME

    def __init__(self, callbacks: Mapping[str, Callable[..., Any]], log: logging.Logger,
                 environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None):
        missing = [name for name in CALLBACKS if name not in callbacks]
        if missing:
            raise AgentError("the launcher registered no %s callback" % ", ".join(missing))
        self.cb = dict(callbacks)
        self.log = log
        self.environ = os.environ if environ is None else environ
        self.argv = sys.argv if argv is None else argv

    def node_rank(self) -> int:
        explicit = self.environ.get(NODE_RANK, "").strip()
        if explicit:
            if _rank(explicit) is None:
                raise AgentError("$%s=%r is not a node rank (an int >= 0)" % (NODE_RANK, explicit))
            return int(explicit)
        answer = self.cb["MONITOR"]([MONITOR_ALL])
        for info in (answer.values() if isinstance(answer, dict) else ()):
            if isinstance(info, dict) and _rank(info.get("node_id")) is not None:
                return _rank(info["node_id"])
        given = options(self.argv)
        if _rank(given["--node_rank"]) is not None:
            return _rank(given["--node_rank"])
        if given["--worker_num"] == given["--local_worker_num"]:
            return 0  # one node: every worker is local
        raise AgentError(
            "this node's rank is unknown: msrun was given no --node_rank for a job of %s "
            "workers, %s of them here (its -1 lets the scheduler assign ranks, which taskd's "
            "proxy cannot wait for); set $%s to this node's rank, or give msrun --node_rank"
            % (given["--worker_num"], given["--local_worker_num"], NODE_RANK))

    def start_all(self, incarnation: int) -> None:
        # Its answer (1: a worker is not running) is not needed: MONITOR says which, and why.
        self.cb["START_ALL_WORKER"]()

    def stop_all(self) -> None:
        code = self.cb["KILL_WORKER"]([KILL_ALL])
        if code not in (0, None):
            self.log.error("taskd agent: KILL_WORKER([-1]) answered %r", code)

    def monitor(self) -> List[WorkerStatus]:
        return statuses(self.cb["MONITOR"]([MONITOR_ALL]))

    def rejoin(self) -> Optional[str]:
        return None

    # -- what the driver needs besides the protocol --

    def manager_host(self) -> Optional[str]:
        return self.environ.get(MANAGER_HOST, "").strip() or None

    def worker_env(self, node_rank: int) -> Dict[str, str]:
        """What the workers need besides msrun's environment: their node rank."""
        return {NODE_RANK: str(node_rank)}

    def default_restarts(self) -> int:
        return 0

    def finish(self, outcome: Outcome) -> bool:
        """What ``start_taskd_agent()`` gives msrun: ``True`` after a clean end, otherwise
        the process exits with the outcome's status (msrun's)."""
        if outcome.code != 0:
            raise SystemExit(outcome.code)
        return True


def check_init(config: Mapping[str, Any], cls: Any) -> Optional[int]:
    """``init_taskd_agent``'s checks for msrun; the node rank when it is known already (the
    proxy then starts at once, as the reference's does)."""
    if not os.environ.get(MANAGER_HOST, "").strip():
        raise ValueError("$%s is not set: the proxy needs the manager's host there" % MANAGER_HOST)
    explicit = os.environ.get(NODE_RANK, "").strip()
    return _rank(explicit) if explicit else None


def make(callbacks: Mapping[str, Callable[..., Any]], cls: Any, log: logging.Logger) -> Msrun:
    return Msrun(callbacks, log)
