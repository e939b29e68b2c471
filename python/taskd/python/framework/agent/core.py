"""The node agent, launcher-neutral: starts, watches and restarts one node's training
processes through a :class:`Launcher` (msrun's callbacks, torchrun's elastic agent, ...).

A launcher does four things for it: start every worker of the node, stop them all, say how
each one is (:class:`WorkerStatus`, a typed :class:`WorkerState`), and give the node's rank.
The agent decides the rest, the same way under every launcher:

- every worker ended with status 0: the job is over on this node (:class:`Outcome` 0);
- a worker failed, vanished, or could not be started: the :data:`FailurePolicy` says whether
  to start every worker again (a new incarnation, ``TASKD_RESTART_COUNT`` one more; the others
  are stopped first), to give up (``Outcome`` 1, the others stopped), or to wait for a restart
  decided elsewhere (the others go on running until it comes: the job's manager may first take
  a last-words checkpoint from them);
- SIGINT or SIGTERM (main thread only): every worker is stopped, ``Outcome`` 128 + the signal;
- :meth:`NodeAgent.restart` (any thread, or the loop itself): every worker is stopped and
  started again at the loop's next turn, whatever the budget (whoever asked owns that policy),
  as the incarnation it names (the job's restart number, when the manager decided); when
  the manager decided, it stopped the job's training first, so the workers get
  :data:`STOPPED_GRACE_S` to end on their own (their ``TrainingStopped`` handlers and last log
  lines run) before they are stopped;
  :meth:`NodeAgent.end`: every worker is stopped and the job ends here (``Outcome`` 1);
- after every stop, the agent waits until the stopped workers' processes have ended (pidfds,
  at most :data:`KILL_WAIT_S`): the launchers only send the signal, and a new worker must
  find its predecessor's ports free.
"""

import dataclasses
import enum
import logging
import os
import select
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

try:  # Python 3.8 has both; the fallback only keeps an older typing importable
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore

#: how many times the workers have been restarted, in the environment of the workers started
RESTART_COUNT = "TASKD_RESTART_COUNT"
#: how long the launcher's other children (msrun's scheduler) may take to end on their own
#: after a clean end (none after a failure or a signal: they are terminated at once)
CHILD_GRACE_S = 30.0
#: how long a terminated child has before it is killed
TERM_GRACE_S = 5.0
#: how long workers stopped for a restart have to end before the new ones start anyway
KILL_WAIT_S = 30.0
#: how long the workers have to end on their own when the job's manager orders a restart: it
#: stopped their training first, and a worker told so raises ``TrainingStopped`` and ends in
#: milliseconds; one stuck in a collective with a dead peer is stopped after this
STOPPED_GRACE_S = 1.0


class AgentError(Exception):
    """The launcher did not do what the agent relies on."""


class WorkerState(enum.Enum):
    """How one worker is, whatever the launcher."""

    NOT_STARTED = "not started"  # the launcher has not started it (or could not)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # ended with status 0
    FAILED = "failed"  # ended with a non-zero status (``exit_code``; negative: a signal)
    VANISHED = "vanished"  # its process is gone and the launcher knows no status
    UNKNOWN = "unknown"  # the launcher cannot tell


#: states that end the current incarnation as a failure
LOST = frozenset((WorkerState.FAILED, WorkerState.VANISHED, WorkerState.NOT_STARTED, WorkerState.UNKNOWN))


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """One worker as the launcher last saw it."""

    local_rank: int
    global_rank: int
    state: WorkerState
    pid: Optional[int] = None
    exit_code: Optional[int] = None  # with FAILED

    def describe(self) -> str:
        if self.state is WorkerState.FAILED and self.exit_code is not None:
            if self.exit_code < 0:
                try:
                    how = "killed by %s" % signal.Signals(-self.exit_code).name
                except ValueError:
                    how = "killed by signal %d" % -self.exit_code
                return "rank %d (%s)" % (self.global_rank, how)
            return "rank %d (status %d)" % (self.global_rank, self.exit_code)
        return "rank %d (%s)" % (self.global_rank, self.state.value)


class Launcher(Protocol):
    """What the agent needs of a launcher (``taskd/python/framework/agent/msrun.py``,
    ``torchrun.py``). Called from the agent's thread only."""

    #: how logs name it
    name: str

    def node_rank(self) -> int:
        """This node's rank, before any worker starts (it may block: torchrun's dynamic
        rendezvous). ``AgentError`` naming what to set when it cannot tell."""

    def start_all(self, incarnation: int) -> None:
        """Starts every worker of the node (``incarnation``: 0, then one more per restart)."""

    def stop_all(self) -> None:
        """Stops every worker (it may return before their processes have ended)."""

    def monitor(self) -> List[WorkerStatus]:
        """Every worker of the node, now."""

    def rejoin(self) -> Optional[str]:
        """Why the workers must start again although none failed (torchrun: a node waits to
        join the rendezvous), or ``None``."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the job ended on this node: ``code`` is the launcher's exit status (0, 1, or 128 +
    a signal); ``workers`` as last seen."""

    code: int
    why: str
    workers: Sequence[WorkerStatus] = ()


class Decision(enum.Enum):
    """What to do after a failure."""

    RESTART = "restart every worker of the node"
    GIVE_UP = "end the job on this node"
    WAIT = "wait for a restart decided elsewhere"


#: ``policy(lost, restarts_done) -> Decision``: asked once per failure (``WAIT``: the node's
#: other workers go on until :meth:`NodeAgent.restart` or :meth:`NodeAgent.end`).
FailurePolicy = Callable[[List[WorkerStatus], int], Decision]

#: ``observer(statuses, incarnation)``: every worker as the launcher just saw it, after every
#: look (a coordinator reports the workers that ended to the job's manager).
Observer = Callable[[List[WorkerStatus], int], None]


def local_budget(max_restarts: int) -> FailurePolicy:
    """Restart the node's workers on its own, at most ``max_restarts`` times."""

    def policy(_lost: List[WorkerStatus], restarts_done: int) -> Decision:
        return Decision.RESTART if restarts_done < max_restarts else Decision.GIVE_UP

    return policy


# ---- processes ---------------------------------------------------------------------------


def child_pids(pid: Optional[int] = None) -> Set[int]:
    """The live child processes of ``pid`` (this process by default), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    found: Set[int] = set()
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return found


def ended(pid: int, timeout_s: float) -> bool:
    """Waits up to ``timeout_s`` for process ``pid`` to end (a zombie has ended: its files,
    sockets and ports are released); whether it did. Does not reap it."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return True  # gone already
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))
    finally:
        os.close(fd)


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Waits up to ``timeout_s`` for the child ``pid`` to end and reaps it; whether it ended."""
    if not ended(pid, timeout_s):
        return False
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # reaped by its owner
    return True


def end_children(pids: Iterable[int], grace_s: float, log: logging.Logger) -> None:
    """Gives each child ``grace_s`` to end, then SIGTERM, then SIGKILL; reaps them."""
    deadline = time.monotonic() + grace_s
    for pid in sorted(pids):
        if wait_exit(pid, max(0.0, deadline - time.monotonic())):
            continue
        log.warning("taskd agent: process %d outlived the job: terminating it", pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            if wait_exit(pid, TERM_GRACE_S):
                break


# ---- the agent ---------------------------------------------------------------------------


class NodeAgent:
    """Runs one node's workers through ``launcher`` until the job ended on this node.

    ``policy`` decides after a failure (default: :func:`local_budget` of ``max_restarts``);
    ``describe_budget`` says in the log why no restart is left when ``max_restarts`` is 0."""

    def __init__(self, launcher: Launcher, log: logging.Logger, max_restarts: int = 0,
                 monitor_interval_s: float = 1.0, policy: Optional[FailurePolicy] = None,
                 no_restart: str = "no restart is allowed", observer: Optional[Observer] = None,
                 stopped_grace_s: float = STOPPED_GRACE_S):
        self.launcher = launcher
        self.stopped_grace_s = stopped_grace_s
        self.log = log
        self.max_restarts = max_restarts
        self.interval = monitor_interval_s
        self.policy = policy or local_budget(max_restarts)
        self.no_restart = no_restart
        self.observer = observer
        self.restarts = 0  # restarts the failure policy decided
        self.incarnation = 0  # every start after the first, whoever decided it
        self.worker_pids: Set[int] = set()  # every worker's process so far
        self.current: List[WorkerStatus] = []
        self._running = False  # started and not stopped since
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_signal: Optional[int] = None
        self._restart_reason: Optional[Tuple[str, bool]] = None  # why, and whether logged
        self._restart_as: Optional[int] = None  # the incarnation a restart asked for names
        self._end_reason: Optional[str] = None
        self._saved_handlers: Dict[int, Any] = {}

    # -- from other threads (and signal handlers) --

    def restart(self, reason: str, incarnation: Optional[int] = None) -> None:
        """Asks for every worker of the node to be stopped and started again, as one new
        incarnation (``incarnation``, when whoever decided numbers them: the job's restart
        count; else one more), at the loop's next turn (callable from any thread, or from the
        loop's policy). It does not count against ``max_restarts``."""
        self._ask_restart(reason, logged=False, incarnation=incarnation)

    def end(self, reason: str) -> None:
        """Ends the job on this node (callable from any thread): every worker is stopped,
        ``Outcome`` 1 with ``reason``."""
        self._end_reason = reason
        self._wake.set()

    def _ask_restart(self, reason: str, logged: bool, incarnation: Optional[int] = None) -> None:
        with self._lock:
            if self._restart_reason is None:
                self._restart_reason = (reason, logged)
                self._restart_as = incarnation
        self._wake.set()

    def request_stop(self, signum: int) -> None:
        """Ends the job on this node: every worker is stopped, ``Outcome`` 128 + ``signum``."""
        self._stop_signal = signum
        self._wake.set()

    # -- the loop --

    def run(self, handle_signals: bool = True) -> Outcome:
        """Until the job ended on this node: its outcome. With ``handle_signals`` (and on the
        main thread), SIGINT and SIGTERM end it through :meth:`request_stop`."""
        self._signals = handle_signals and threading.current_thread() is threading.main_thread()
        try:
            self._install_handlers()
            return self._loop()
        finally:
            for sig, handler in self._saved_handlers.items():
                signal.signal(sig, handler)
            self._saved_handlers.clear()

    def _install_handlers(self) -> None:
        """(Again) after every start: a launcher may install its own (torch's ``PContext``
        does, for SIGTERM and SIGINT, whenever it starts workers)."""
        if not self._signals:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(sig, lambda n, _f: self.request_stop(n))
            self._saved_handlers.setdefault(sig, previous)

    def _start_all(self) -> None:
        os.environ[RESTART_COUNT] = str(self.incarnation)  # the workers' environment is ours
        self._running = True
        try:
            try:
                self.launcher.start_all(self.incarnation)
            finally:
                self._install_handlers()
        except Exception as e:  # a launcher's own handler ran (torch's raises SignalException)
            sig = getattr(e, "sigval", None)
            if sig is None:
                raise
            self.request_stop(int(sig))

    def _monitor(self) -> List[WorkerStatus]:
        self.current = list(self.launcher.monitor())
        self.worker_pids.update(s.pid for s in self.current if isinstance(s.pid, int))
        if self.observer is not None:
            self.observer(self.current, self.incarnation)
        return self.current

    def _loop(self) -> Outcome:
        self._start_all()
        statuses = self._monitor()
        self.log.info("taskd agent: started %d workers (global ranks %s; %s)", len(statuses),
                      sorted(s.global_rank for s in statuses), self.launcher.name)
        waiting = False  # a failure the policy answered with WAIT
        while True:
            if self._stop_signal is not None:
                return self._stopped()
            if self._end_reason is not None:
                self._stop_all()
                self.log.error("taskd agent: %s: every worker was killed", self._end_reason)
                return Outcome(1, self._end_reason, self.current)
            asked = self._take_restart()
            if asked is not None:
                reason, logged, number = asked
                if not logged:
                    self.log.warning("taskd agent: %s: restarting every worker of this node", reason)
                self._stop_all(self.stopped_grace_s if number is not None else 0.0)
                self.incarnation = self.incarnation + 1 if number is None else number
                waiting = False
                self._start_all()
                statuses = self._monitor()
                continue
            if not waiting:
                lost = [s for s in statuses if s.state in LOST]
                if not lost and statuses and all(s.state is WorkerState.SUCCEEDED for s in statuses):
                    self._stop_all()  # what the launcher keeps for its workers (msrun: log tails)
                    return Outcome(0, "every worker of this node ended with status 0", statuses)
                if lost:
                    outcome = self._after_failure(lost)
                    if outcome is not None:
                        return outcome
                    waiting = self._restart_reason is None
                    continue
                rejoin = self.launcher.rejoin()
                if rejoin is not None:
                    self.restart(rejoin)
                    continue
            self._wake.wait(self.interval)
            self._wake.clear()
            if not waiting and self._stop_signal is None and self._restart_reason is None:
                statuses = self._monitor()

    def _take_restart(self) -> Optional[Tuple[str, bool, Optional[int]]]:
        with self._lock:
            asked, self._restart_reason = self._restart_reason, None
            number, self._restart_as = self._restart_as, None
        return None if asked is None else (asked[0], asked[1], number)

    def _stopped(self) -> Outcome:
        self._stop_all()
        name = signal.Signals(self._stop_signal).name
        return Outcome(128 + self._stop_signal, "%s: every worker was killed" % name, self.current)

    def _after_failure(self, lost: List[WorkerStatus]) -> Optional[Outcome]:
        """Lost ranks: ``None`` when the loop goes on (a restart asked for, or a wait), else
        the job's outcome."""
        names = ", ".join(s.describe() for s in sorted(lost, key=lambda s: s.global_rank))
        decision = self.policy(lost, self.restarts)
        if decision is Decision.WAIT:
            self.log.error("taskd agent: lost %s: the other workers go on until the job's restart "
                           "is ordered", names)
            return None
        self._stop_all()
        if decision is Decision.GIVE_UP:
            left = ("no restart left (%d done)" % self.restarts if self.max_restarts
                    else self.no_restart)
            why = "lost %s; %s" % (names, left)
            self.log.error("taskd agent: %s: every other worker was killed", why)
            return Outcome(1, why, lost)
        self.restarts += 1
        self.log.error("taskd agent: lost %s: restarting every worker of this node (restart %d of %d)",
                       names, self.restarts, self.max_restarts)
        self._ask_restart("lost %s" % names, logged=True)
        return None

    def _stop_all(self, grace_s: float = 0.0) -> None:
        """After up to ``grace_s`` for the workers to end on their own, ``stop_all``, then
        waits until the workers' processes have ended, at most ``KILL_WAIT_S`` in all. Once
        per start."""
        if not self._running:
            return
        self._running = False
        pids = [s.pid for s in self.current if isinstance(s.pid, int)]
        if grace_s > 0:
            until = time.monotonic() + grace_s
            on_their_own = all(ended(p, max(0.0, until - time.monotonic())) for p in pids)
            self.log.info("taskd agent: the workers %s", "ended on their own" if on_their_own
                          else "did not end within %.1f s of the restart order: stopping them"
                          % grace_s)
        self.launcher.stop_all()
        deadline = time.monotonic() + KILL_WAIT_S
        left = [p for p in pids if not ended(p, max(0.0, deadline - time.monotonic()))]
        if left:
            self.log.warning("taskd agent: workers %s still run %.0f s after they were stopped",
                             left, KILL_WAIT_S)

    def reap_others(self, clean: bool) -> None:
        """Ends the launcher's children that are not workers (msrun's scheduler): after a
        clean end each has ``CHILD_GRACE_S`` to end on its own; after a failure or a signal
        none (the job is over, and they would wait for workers that never come back)."""
        others = child_pids() - self.worker_pids
        if others:
            self.log.info("taskd agent: ending the launcher's other processes %s", sorted(others))
            end_children(others, CHILD_GRACE_S if clean else 0.0, self.log)
