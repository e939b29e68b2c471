"""msrun's process manager: the loop behind ``start_taskd_agent()``.

With ``MS_ENABLE_TFT`` asking for taskd (``TTP:1``, ``TSP:1``, ...), msrun does not start its
training processes itself: it registers four callbacks and calls ``start_taskd_agent()``,
which owns the workers from then on. The callbacks are msrun's (``mindspore/utils/utils.py``
registers the methods of its process manager):

- ``START_ALL_WORKER()``: kills the workers it knows, starts every local worker; ``0`` when all
  of them run, ``1`` otherwise.
- ``START_WORKER_LIST(local_ranks)``: starts those local workers; ``0`` / ``1`` the same way.
- ``KILL_WORKER(pids)``: SIGKILLs those workers' process groups (``[-1]``: every worker).
- ``MONITOR(local_ranks)``: ``{local_rank: {"pid", "status", "global_rank", ...}}``
  (``[-1]``: every worker); ``status`` is ``None`` while a worker runs, its exit code once it
  ended, ``200`` before it was started, ``300`` when its process vanished.

The children of the launcher that are not workers (msrun's scheduler) are waited for at the
end and terminated if they outlive it, so that no process of the job is left behind.
"""

import os
import select
import signal
import threading
import time

KILL_ALL = -1
MONITOR_ALL = -1
NOT_STARTED = 200
CALLBACKS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR")
#: how many times the workers have been restarted, in the environment of the workers started
RESTART_COUNT = "TASKD_RESTART_COUNT"
#: how long the launcher's other children (msrun's scheduler) may take to end on their own
CHILD_GRACE_S = 30.0
#: how long a terminated child has before it is killed
TERM_GRACE_S = 5.0
#: how long workers killed for a restart have to end before the new ones start anyway
KILL_WAIT_S = 30.0


class AgentError(Exception):
    """The launcher's callbacks did not do what the agent relies on."""


class Outcome:
    """How the job ended on this node: ``code`` is the launcher's exit status."""

    def __init__(self, code, why):
        self.code = code
        self.why = why

    def __repr__(self):
        return "Outcome(%d, %r)" % (self.code, self.why)


def child_pids(pid=None):
    """The live child processes of ``pid`` (this process by default), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    found = set()
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


def ended(pid, timeout_s):
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


def wait_exit(pid, timeout_s):
    """Waits up to ``timeout_s`` for the child ``pid`` to end and reaps it; whether it ended."""
    if not ended(pid, timeout_s):
        return False
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # reaped by its owner
    return True


def end_children(pids, grace_s, log):
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


def _statuses(answer):
    """MONITOR's answer checked: ``{local_rank: (pid, status, global_rank)}``."""
    if not isinstance(answer, dict):
        raise AgentError("MONITOR answered %r, not a dict" % (answer,))
    out = {}
    for local, info in answer.items():
        if not isinstance(info, dict) or "status" not in info or "global_rank" not in info:
            raise AgentError("MONITOR's entry for local rank %r is %r" % (local, info))
        out[int(local)] = (info.get("pid"), info["status"], int(info["global_rank"]))
    return out


class ProcessAgent:
    """Starts, watches and restarts one node's training processes through the launcher's
    callbacks. ``max_restarts``: how many times a failed job is started again (0: never)."""

    def __init__(self, callbacks, log, max_restarts=0, monitor_interval_s=1.0):
        missing = [name for name in CALLBACKS if name not in callbacks]
        if missing:
            raise AgentError("the launcher registered no %s callback" % ", ".join(missing))
        self.cb = callbacks
        self.log = log
        self.max_restarts = max_restarts
        self.interval = monitor_interval_s
        self.restarts = 0
        self.stop = threading.Event()  # set by a signal: end the job
        self.stop_signal = None
        self.worker_pids = set()  # every worker's process so far
        self.current_pids = []  # the workers' processes as MONITOR last answered

    def node_ranks(self):
        """``MONITOR([-1])`` before anything runs: ``{local_rank: global_rank}``."""
        return {local: g for local, (_, _, g) in _statuses(self.cb["MONITOR"]([MONITOR_ALL])).items()}

    def request_stop(self, signum):
        self.stop_signal = signum
        self.stop.set()

    def _start_all(self):
        os.environ[RESTART_COUNT] = str(self.restarts)  # the workers' environment is ours
        # Its answer (1: a worker is not running) is not needed: MONITOR says which, and why.
        self.cb["START_ALL_WORKER"]()
        return self._monitor()

    def _monitor(self):
        statuses = _statuses(self.cb["MONITOR"]([MONITOR_ALL]))
        self.current_pids = [pid for pid, _, _ in statuses.values() if isinstance(pid, int)]
        self.worker_pids.update(self.current_pids)
        return statuses

    def _kill_all(self):
        """``KILL_WORKER([-1])``, then waits until the workers' processes have ended: the
        launcher's kill only sends the signal, and neither a new worker nor the launcher's
        exit may come while an old one still runs."""
        code = self.cb["KILL_WORKER"]([KILL_ALL])
        if code not in (0, None):
            self.log.error("taskd agent: KILL_WORKER([-1]) answered %r", code)
        self._wait_ended(self.current_pids)

    def run(self):
        """Until the job ended on this node: its outcome."""
        statuses = self._start_all()
        self.log.info("taskd agent: started %d workers (global ranks %s)", len(statuses),
                      sorted(g for _, _, g in statuses.values()))
        while True:
            failed = {g: s for _, s, g in statuses.values() if s is not None and s != 0}
            if not failed and all(s == 0 for _, s, _ in statuses.values()):
                self._kill_all()  # what the launcher keeps for its workers (msrun: log tails)
                return Outcome(0, "every worker of this node ended with status 0")
            if failed:
                outcome = self._after_failure(failed)
                if outcome is not None:
                    return outcome
                statuses = self._start_all()
                continue
            if self.stop.wait(self.interval):
                self._kill_all()
                name = signal.Signals(self.stop_signal).name
                return Outcome(128 + self.stop_signal, "%s: every worker was killed" % name)
            statuses = self._monitor()

    def _after_failure(self, failed):
        """Lost ranks: ``None`` to start every worker again, else the job's outcome."""
        lost = ", ".join("rank %d (status %s)" % (g, s) for g, s in sorted(failed.items()))
        self._kill_all()
        if self.restarts >= self.max_restarts:
            why = "lost %s; %s" % (
                lost, "no restart left (%d done)" % self.restarts if self.max_restarts
                else "process recovery is off (PROCESS_RECOVER=on restarts the workers)")
            self.log.error("taskd agent: %s: every other worker was killed", why)
            return Outcome(1, why)
        self.restarts += 1
        self.log.error("taskd agent: lost %s: restarting every worker of this node (restart %d of %d)",
                       lost, self.restarts, self.max_restarts)
        return None

    def _wait_ended(self, pids):
        """Waits until the killed workers' processes have ended, at most ``KILL_WAIT_S`` in all:
        a new worker must find its ports free (MindSpore's peers keep the old addresses)."""
        deadline = time.monotonic() + KILL_WAIT_S
        left = [p for p in pids if not ended(p, max(0.0, deadline - time.monotonic()))]
        if left:
            self.log.warning("taskd agent: workers %s still run %.0f s after KILL_WORKER", left, KILL_WAIT_S)

    def reap_others(self, clean):
        """Ends the launcher's children that are not workers (msrun's scheduler): after a
        clean end each has ``CHILD_GRACE_S`` to end on its own, otherwise none."""
        others = child_pids() - self.worker_pids
        if others:
            self.log.info("taskd agent: ending the launcher's other processes %s", sorted(others))
            end_children(others, CHILD_GRACE_S if clean else 0.0, self.log)
