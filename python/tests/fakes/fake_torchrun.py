"""A FAKE torchrun elastic agent for the agent's tests (not torch): the parts of torch's
``SimpleElasticAgent`` / ``LocalElasticAgent`` (``torch/distributed/elastic/agent/server/``)
that taskd's torchrun launcher and ``taskd.python.adaptor.patch`` use, with torch's names,
arguments and behaviour: a worker group of ``Worker``s (``local_rank``, ``global_rank``, ``id``
= the pid), ``_rendezvous`` (static: ``--node-rank``; dynamic: the rank the round assigns),
``_start_workers`` (processes in sessions of their own, with torch's worker environment over
this process's, and torch's SIGTERM/SIGINT handlers installed on every start, as ``PContext``
does), ``_stop_workers`` (SIGTERM, then SIGKILL), ``_monitor_workers`` (``RunResult``; a failure
closes the others, as ``SubprocessContext._poll`` does), ``_exit_barrier``, and torch's own
``_invoke_run`` loop (``--max-restarts``), which the patch replaces.
"""

import dataclasses
import enum
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

DEFAULT_ROLE = "default"
#: a worker that runs until it is stopped: it waits on its standard input, never closed
RUN = "import sys; sys.stdin.read()"
#: a worker that is SIGKILLed (by itself) once it has recorded its environment
KILLED = ("import json, os, signal; print(json.dumps({k: os.environ.get(k) for k in ('TASKD_PROXY', "
          "'TASKD_RESTART_COUNT', 'TORCHELASTIC_RESTART_COUNT', 'GROUP_RANK')}), flush=True); "
          "os.kill(os.getpid(), signal.SIGKILL)")


def exits(code: int) -> str:
    """A worker that records its environment's taskd and torch variables and exits."""
    return ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in ('TASKD_PROXY', "
            "'TASKD_RESTART_COUNT', 'TORCHELASTIC_RESTART_COUNT', 'GROUP_RANK')}), flush=True); "
            "sys.exit(%d)" % code)


class WorkerState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclasses.dataclass
class ProcessFailure:
    local_rank: int
    pid: int
    exitcode: int


@dataclasses.dataclass
class RunResult:
    state: WorkerState
    return_values: Dict[int, object] = dataclasses.field(default_factory=dict)
    failures: Dict[int, ProcessFailure] = dataclasses.field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED


class SignalException(Exception):
    def __init__(self, msg: str, sigval: int):
        super().__init__(msg)
        self.sigval = sigval


def _terminate_process_handler(signum, _frame):
    raise SignalException("Process %d got signal: %d" % (os.getpid(), signum), sigval=signum)


class StaticRendezvous:
    """``--rdzv-backend static``: the rank is ``--node-rank``."""

    def __init__(self, rank: int):
        self.rank = rank
        self.waiting = 0

    def num_nodes_waiting(self) -> int:
        waiting, self.waiting = self.waiting, 0
        return waiting


class DynamicRendezvous:
    """``c10d`` (``--standalone``): no rank before a round; each round assigns it."""

    def __init__(self, assigned: int):
        self.assigned = assigned
        self.rounds = 0
        self.waiting = 0

    def num_nodes_waiting(self) -> int:
        waiting, self.waiting = self.waiting, 0
        return waiting


@dataclasses.dataclass
class Worker:
    local_rank: int
    global_rank: int = -1
    id: Optional[int] = None


@dataclasses.dataclass
class WorkerSpec:
    local_world_size: int
    max_restarts: int
    rdzv_handler: object
    monitor_interval: float = 0.01
    role: str = DEFAULT_ROLE


class WorkerGroup:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.workers = [Worker(local_rank=i) for i in range(spec.local_world_size)]
        self.store = None
        self.group_rank = None
        self.group_world_size = None
        self.master_addr = None
        self.master_port = None
        self.state = WorkerState.INIT


class FakeElasticAgent:
    """``codes``: local rank -> the worker code of each start (the last one repeats)."""

    def __init__(self, codes: Dict[int, List[str]], max_restarts: int = 0, rdzv=None, nodes: int = 1):
        rdzv = rdzv if rdzv is not None else StaticRendezvous(0)
        self.codes = codes
        self._worker_group = WorkerGroup(WorkerSpec(len(codes), max_restarts, rdzv))
        self._remaining_restarts = max_restarts
        self.nodes = nodes
        self.calls: List[str] = []
        self.procs: Dict[int, subprocess.Popen] = {}
        self.every: List[subprocess.Popen] = []
        self.outputs: List[Dict[int, str]] = []  # per start: what each worker printed
        self.overlaps: List[int] = []
        self.started = 0
        self.on_start = None  # called on a thread after every start

    # -- torch's SimpleElasticAgent --

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        try:
            return self._invoke_run(role)
        except SignalException as e:
            self._shutdown(e.sigval)
            raise
        finally:
            self._shutdown()

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """torch's own loop (the patch replaces it)."""
        self.calls.append("torch's own loop")
        self._initialize_workers(self._worker_group)
        while True:
            time.sleep(self._worker_group.spec.monitor_interval)
            result = self._monitor_workers(self._worker_group)
            self._worker_group.state = result.state
            if result.state == WorkerState.SUCCEEDED:
                self._exit_barrier()
                return result
            if result.state in (WorkerState.UNHEALTHY, WorkerState.FAILED):
                if self._remaining_restarts > 0:
                    self._remaining_restarts -= 1
                    self._restart_workers(self._worker_group)
                else:
                    self._stop_workers(self._worker_group)
                    self._worker_group.state = WorkerState.FAILED
                    return result

    def _rendezvous(self, wg: WorkerGroup) -> None:
        self.calls.append("rendezvous")
        handler = wg.spec.rdzv_handler
        if isinstance(handler, DynamicRendezvous):
            handler.rounds += 1
            wg.group_rank = handler.assigned
        else:
            wg.group_rank = handler.rank
        wg.group_world_size = self.nodes
        wg.master_addr, wg.master_port = "127.0.0.1", 29500
        n = wg.spec.local_world_size
        for w in wg.workers:
            w.global_rank = wg.group_rank * n + w.local_rank

    def _initialize_workers(self, wg: WorkerGroup) -> None:
        self.calls.append("_initialize_workers")
        self._rendezvous(wg)
        ids = self._start_workers(wg)
        for local_rank, pid in ids.items():
            wg.workers[local_rank].id = pid
        wg.state = WorkerState.HEALTHY

    def _restart_workers(self, wg: WorkerGroup) -> None:
        self.calls.append("_restart_workers")
        self._stop_workers(wg)
        wg.state = WorkerState.STOPPED
        self._initialize_workers(wg)

    def _start_workers(self, wg: WorkerGroup) -> Dict[int, int]:
        self.calls.append("_start_workers")
        spec = wg.spec
        restart_count = spec.max_restarts - self._remaining_restarts
        ids = {}
        for w in wg.workers:
            old = self.procs.get(w.local_rank)
            if old is not None and old.poll() is None:
                self.overlaps.append(old.pid)
            runs = self.codes[w.local_rank]
            code = runs[min(self.started, len(runs) - 1)]
            env = dict(os.environ, RANK=str(w.global_rank), LOCAL_RANK=str(w.local_rank),
                       GROUP_RANK=str(wg.group_rank), LOCAL_WORLD_SIZE=str(spec.local_world_size),
                       TORCHELASTIC_RESTART_COUNT=str(restart_count))
            p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, start_new_session=True)
            self.procs[w.local_rank] = p
            self.every.append(p)
            ids[w.local_rank] = p.pid
        self.started += 1
        if threading.current_thread() is threading.main_thread():  # as torch's PContext.start
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, _terminate_process_handler)
        if self.on_start is not None:
            threading.Thread(target=self.on_start, args=(self,), daemon=True).start()
        return ids

    def _stop_workers(self, wg: WorkerGroup) -> None:
        self.calls.append("_stop_workers")
        self._shutdown()

    def _shutdown(self, death_sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
        """torch's ``PContext.close``: the signal to every running worker, then SIGKILL."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            p.send_signal(death_sig)
        deadline = time.monotonic() + timeout
        for p in running:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _monitor_workers(self, wg: WorkerGroup) -> RunResult:
        codes = {local: p.poll() for local, p in self.procs.items()}
        failed = {local: c for local, c in codes.items() if c not in (None, 0)}
        if failed:
            self._shutdown()  # torch's SubprocessContext closes the others on a failure
            failures = {}
            for local, p in self.procs.items():
                if p.returncode not in (None, 0):
                    failures[wg.workers[local].global_rank] = ProcessFailure(local, p.pid, p.returncode)
            return RunResult(WorkerState.FAILED, failures=failures)
        if all(c == 0 for c in codes.values()):
            return RunResult(WorkerState.SUCCEEDED, return_values={w.global_rank: None for w in wg.workers})
        return RunResult(WorkerState.HEALTHY)

    def _exit_barrier(self) -> None:
        self.calls.append("_exit_barrier")

    # -- for the tests --

    def worker_outputs(self) -> Dict[int, str]:
        """What each worker of every start printed, by start (the processes have ended)."""
        out: Dict[int, str] = {}
        for i, p in enumerate(self.every):
            out[i] = p.stdout.read().decode() if p.poll() is not None else ""
        return out

    def alive(self) -> List[int]:
        return [p.pid for p in self.every if p.poll() is None]
