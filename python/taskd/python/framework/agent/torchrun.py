"""torchrun's elastic agent (``torch.distributed.elastic``'s ``SimpleElasticAgent``, torchrun's
``LocalElasticAgent``) as a :class:`~taskd.python.framework.agent.core.Launcher`.

The reference's convention, which this follows: torchrun's ``SimpleElasticAgent._invoke_run``
is replaced (``import taskd.python.adaptor.patch`` in ``torch/distributed/run.py``,
``taskd/python/adaptor/torchrun.py``) by ``init_taskd_agent({"Framework": "PyTorch"},
self)``, four ``register_func`` calls with the agent's own methods (``KILL_WORKER``:
``_stop_workers``, ``START_ALL_WORKER``: ``_initialize_workers``, ``MONITOR``:
``_monitor_workers``, ``RESTART``: ``_restart_workers``; each takes the worker group) and
``return start_taskd_agent()``, whose value is ``_invoke_run``'s: torch's ``RunResult``.

- **Node rank:** the static rendezvous's rank (torchrun's ``--node-rank``); with a dynamic
  rendezvous (``c10d``, ``--standalone``) the rank it assigns: the agent then rendezvouses
  before it starts the proxy, and the first start only starts the workers.
- **Restarts:** torchrun's ``--max-restarts`` unless ``PROCESS_RECOVER=on`` (then
  ``$TASKD_AGENT_MAX_RESTARTS``, as under msrun). The workers see the incarnation in
  ``TORCHELASTIC_RESTART_COUNT`` as in ``TASKD_RESTART_COUNT``. A node waiting to join the
  rendezvous restarts the workers without counting, as torch's own loop does.
- **Manager:** ``$MASTER_ADDR`` (the reference's), else the rendezvous's master address.
- **End:** every worker succeeded: torch's exit barrier, then the last ``RunResult``; no
  restart left: a ``FAILED`` ``RunResult`` (torchrun prints its failure summary and exits 1);
  SIGINT/SIGTERM: ``SystemExit(128 + signal)``.
"""

import logging
import os
import signal
from typing import Any, Callable, Dict, List, Mapping, Optional

from taskd.python.framework.agent.core import AgentError, Outcome, WorkerState, WorkerStatus

NAME = "torchrun"
MANAGER_HOST = "MASTER_ADDR"
NO_RESTART = "torchrun's --max-restarts is 0 (PROCESS_RECOVER=on restarts the workers up to " \
             "$TASKD_AGENT_MAX_RESTARTS times)"


def _callback(callbacks: Mapping[str, Callable[..., Any]], name: str, default: Callable[..., Any]):
    fn = callbacks.get(name)
    return fn if fn is not None else default


class Torchrun:
    """torch's elastic agent ``agent`` as a launcher; ``callbacks`` are what the patch
    registered (its own methods; anything missing is taken from ``agent``)."""

    name = NAME

    def __init__(self, agent: Any, callbacks: Mapping[str, Callable[..., Any]], log: logging.Logger):
        if agent is None or not hasattr(agent, "_worker_group"):
            raise AgentError(
                "init_taskd_agent({'Framework': 'PyTorch'}, cls) needs torch's elastic agent as "
                "cls (taskd.python.adaptor.patch passes it), got %r" % (agent,))
        self.agent = agent
        self.group = agent._worker_group
        self.spec = self.group.spec
        self.log = log
        self.start = _callback(callbacks, "START_ALL_WORKER", agent._initialize_workers)
        self.stop = _callback(callbacks, "KILL_WORKER", agent._stop_workers)
        self.watch = _callback(callbacks, "MONITOR", agent._monitor_workers)
        self.last: Any = None  # the last RunResult
        self._rendezvoused = False  # a rendezvous done for the node rank, not yet started on
        self._rank: Optional[int] = None

    def _states(self):
        return type(self.group.state)  # torch's WorkerState, without importing torch here

    def node_rank(self) -> int:
        rank = getattr(self.spec.rdzv_handler, "rank", None)  # the static rendezvous's
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
            self._rank = rank
            return rank
        self.log.info("taskd agent: rendezvous for this node's rank")
        self.agent._rendezvous(self.group)
        self._rendezvoused = True
        self._rank = self.group.group_rank
        if not isinstance(self._rank, int):
            raise AgentError("torch's rendezvous gave no group rank (%r)" % (self._rank,))
        return self._rank

    def start_all(self, incarnation: int) -> None:
        # torch's workers see spec.max_restarts - _remaining_restarts as their restart count
        self.agent._remaining_restarts = self.spec.max_restarts - incarnation
        if self._rendezvoused:
            self._rendezvoused = False
            ids = self.agent._start_workers(self.group)
            for local_rank, worker_id in ids.items():
                self.group.workers[local_rank].id = worker_id
            self.group.state = self._states().HEALTHY
        else:
            self.start(self.group)
        if self._rank is not None and self.group.group_rank != self._rank:
            self.log.warning("taskd agent: the rendezvous made this node %s, its proxy is node %d",
                             self.group.group_rank, self._rank)

    def stop_all(self) -> None:
        self.stop(self.group)

    def monitor(self) -> List[WorkerStatus]:
        result = self.watch(self.group)
        self.last = result
        self.group.state = result.state
        state = result.state.name
        failures = dict(getattr(result, "failures", None) or {})
        if any(getattr(f, "exitcode", None) != -signal.SIGTERM for f in failures.values()):
            # torch SIGTERMs the others when one fails, and records them as failed too
            failures = {g: f for g, f in failures.items()
                        if getattr(f, "exitcode", None) != -signal.SIGTERM}
        out = []
        for w in self.group.workers:
            pid = w.id if isinstance(w.id, int) else None
            failure = failures.get(w.global_rank)
            if failure is not None:
                out.append(WorkerStatus(w.local_rank, w.global_rank, WorkerState.FAILED,
                                        getattr(failure, "pid", pid), getattr(failure, "exitcode", None)))
            elif state == "SUCCEEDED":
                out.append(WorkerStatus(w.local_rank, w.global_rank, WorkerState.SUCCEEDED, pid, None))
            elif state == "HEALTHY" or (state in ("FAILED", "UNHEALTHY") and failures):
                out.append(WorkerStatus(w.local_rank, w.global_rank, WorkerState.RUNNING, pid, None))
            elif state in ("INIT", "STOPPED"):
                out.append(WorkerStatus(w.local_rank, w.global_rank, WorkerState.NOT_STARTED, pid, None))
            else:  # UNKNOWN, or UNHEALTHY without a failed worker
                out.append(WorkerStatus(w.local_rank, w.global_rank, WorkerState.UNKNOWN, pid, None))
        return out

    def rejoin(self) -> Optional[str]:
        waiting = self.spec.rdzv_handler.num_nodes_waiting()
        return "%d nodes wait to join the rendezvous" % waiting if waiting > 0 else None

    # -- what the driver needs besides the protocol --

    def manager_host(self) -> Optional[str]:
        return os.environ.get(MANAGER_HOST, "").strip() or self.group.master_addr or None

    def worker_env(self, node_rank: int) -> Dict[str, str]:
        return {}  # torch gives its workers RANK, LOCAL_WORLD_SIZE, GROUP_RANK

    def default_restarts(self) -> int:
        return int(self.spec.max_restarts)

    def monitor_interval_s(self) -> float:
        return float(self.spec.monitor_interval)

    def finish(self, outcome: Outcome) -> Any:
        """What ``start_taskd_agent()`` (so ``_invoke_run``) gives torch."""
        if outcome.code == 0:
            self.agent._exit_barrier()
            return self.last
        if outcome.code == 1:
            failed = self._states().FAILED
            self.group.state = failed
            last = self.last
            if last is None:
                raise SystemExit(1)
            if last.state is failed:
                return last
            return type(last)(state=failed, failures=getattr(last, "failures", None) or {})
        raise SystemExit(outcome.code)


def check_init(config: Mapping[str, Any], cls: Any) -> Optional[int]:
    """``init_taskd_agent``'s checks for torchrun: none before the agent starts (its node rank
    may come from the rendezvous)."""
    return None


def make(callbacks: Mapping[str, Callable[..., Any]], cls: Any, log: logging.Logger) -> Torchrun:
    return Torchrun(cls, callbacks, log)
