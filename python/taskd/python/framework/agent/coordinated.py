"""Restarts coordinated by the job's manager: one fault, one restart of the whole job.

With process recovery on (``PROCESS_RECOVER=on``), the manager decides every restart, for
every node at once: a worker that dies on one node stops training everywhere, and every
node's agent stops its workers and starts them all again as the same restart of the job
(``TASKD_RESTART_COUNT`` is the job's restart count). A node whose workers fail because a
peer went does not restart on its own. The budget is the job's (the manager's
``--max-restarts``), not each node's.

What the agent does here (:class:`Coordinator`):

- it tells the manager, through the node's proxy, of every worker that ended (cleanly or not):
  the manager learns even of a worker that died before it registered;
- after a failure it waits, the node's other workers still running (the manager may first take
  a last-words checkpoint from them), for the manager's order: ``restart`` (stop every worker,
  start them all as restart N) or ``end`` (stop every worker; the job ends here);
- when no order comes within :data:`ORDER_WAIT_S` (the manager is unreachable), it restarts the
  node's workers on its own, within ``$TASKD_AGENT_MAX_RESTARTS``, and says so.

The orders arrive on a thread of the coordinator's own, from the proxy that runs in the agent's
process (``taskd_proxy_next_order``).
"""

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from taskd.python.framework.agent.core import Decision, NodeAgent, WorkerState, WorkerStatus

#: how long a node whose worker failed waits for the manager's order before it restarts its
#: workers on its own (the manager orders within a second when it is reachable; a last-words
#: checkpoint first may take longer: ``$TASKD_AGENT_ORDER_WAIT_MS``)
ORDER_WAIT_S = 600.0
#: how long one wait for an order lasts before the thread looks whether the agent still runs
POLL_S = 1.0

#: ``orders(timeout_s) -> order or None``: the manager's next order for this node
Orders = Callable[[float], Optional[Dict[str, Any]]]
#: ``report(rank, status, clean, generation)``: a worker's process ended
Report = Callable[[int, str, bool, int], None]

ENDED = (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.VANISHED)


class Coordinator:
    """The agent's side of restarts the manager coordinates: the failure policy
    (:meth:`policy`), the observer of the workers (:meth:`observe`) and the thread that takes
    the manager's orders (:meth:`start`). ``local_restarts``: how many times the node may
    restart on its own when the manager gives no order within ``order_wait_s``."""

    def __init__(self, orders: Orders, report: Report, log: logging.Logger,
                 local_restarts: int, order_wait_s: float = ORDER_WAIT_S):
        self.orders = orders
        self.report = report
        self.log = log
        self.local_restarts = local_restarts
        self.order_wait_s = order_wait_s
        self.agent: Optional[NodeAgent] = None
        self._reported: Set[Tuple[int, int]] = set()  # (incarnation, global rank)
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._waiting: Optional[threading.Timer] = None
        self._lock = threading.Lock()
        self._taken: Set[int] = set()  # restart numbers acted on

    def attach(self, agent: NodeAgent) -> None:
        self.agent = agent

    # -- the agent's hooks (its loop's thread) --

    def observe(self, statuses: List[WorkerStatus], incarnation: int) -> None:
        """Reports every worker that ended since the last look, once."""
        for s in statuses:
            key = (incarnation, s.global_rank)
            if s.state not in ENDED or key in self._reported:
                continue
            self._reported.add(key)
            clean = s.state is WorkerState.SUCCEEDED
            try:
                self.report(s.global_rank, s.describe(), clean, incarnation)
            except Exception as e:  # the manager learns it anyway once its proxy sees it go
                self.log.warning("taskd agent: could not report %s to the manager: %s",
                                 s.describe(), e)

    def policy(self, lost: List[WorkerStatus], restarts_done: int) -> Decision:
        """After a failure: wait for the manager's order, with a bound."""
        self._arm_fallback(restarts_done)
        return Decision.WAIT

    # -- orders --

    def start(self) -> None:
        """Starts taking the manager's orders for this node, until :meth:`close`."""
        self._thread = threading.Thread(target=self._take_orders, name="taskd-orders",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        self._cancel_fallback()
        if self._thread is not None:
            self._thread.join(POLL_S * 5)

    def _take_orders(self) -> None:
        while not self._done.is_set():
            try:
                order = self.orders(POLL_S)
            except Exception as e:  # the proxy stopped: no order will come
                if not self._done.is_set():
                    self.log.warning("taskd agent: no more orders from the manager: %s", e)
                return
            if order is not None:
                self._follow(order)

    def _follow(self, order: Dict[str, Any]) -> None:
        agent = self.agent
        if agent is None:
            return
        reason = str(order.get("reason", ""))
        kind = order.get("order")
        if kind == "restart":
            number = int(order["number"])
            with self._lock:
                if number in self._taken or number <= agent.incarnation:
                    return  # the same restart, asked again (an old process came back)
                self._taken.add(number)
            self._cancel_fallback()
            self.log.warning("taskd agent: the manager restarts the job (restart %d): %s",
                             number, reason)
            agent.restart("the job's restart %d" % number, incarnation=number)
        elif kind == "end":
            self._cancel_fallback()
            agent.end("the manager ended the job: %s" % reason)
        else:
            self.log.error("taskd agent: an order of the manager this agent does not know: %r",
                           order)

    def _arm_fallback(self, restarts_done: int) -> None:
        self._cancel_fallback()
        agent = self.agent
        if agent is None:
            return
        incarnation = agent.incarnation

        def fallback() -> None:
            if agent.incarnation != incarnation or self._done.is_set():
                return  # an order came
            if restarts_done < self.local_restarts:
                agent.restarts += 1
                agent.restart("the manager ordered no restart within %.0f s: restarting this "
                              "node on its own (%d of %d)"
                              % (self.order_wait_s, agent.restarts, self.local_restarts))
            else:
                agent.end("the manager ordered no restart within %.0f s and this node has no "
                          "restart of its own left" % self.order_wait_s)

        timer = threading.Timer(self.order_wait_s, fallback)
        timer.daemon = True
        with self._lock:
            self._waiting = timer
        timer.start()

    def _cancel_fallback(self) -> None:
        with self._lock:
            timer, self._waiting = self._waiting, None
        if timer is not None:
            timer.cancel()
