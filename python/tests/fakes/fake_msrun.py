"""A FAKE msrun process manager for the agent's tests: the four callbacks msrun registers with
``register_func``, with msrun's arguments, return values and process handling
(``mindspore/parallel/cluster/process_entity/_api.py``): workers in sessions of their own,
SIGKILLed by process group and not waited for, ``MONITOR`` answering ``None`` while a worker runs, its exit code
after, ``200`` before it started. A worker is ``python -c CODE``; ``codes`` says what each
start of each local rank runs, and every worker gets this process's environment, as msrun's do.
"""

import os
import signal
import subprocess
import sys
import threading

#: a worker that runs until it is killed: it waits on its standard input, never closed
RUN = "import sys; sys.stdin.read()"


def exits(code):
    """A worker that records its environment's taskd variables and exits with ``code``."""
    return ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in "
            "('MS_NODE_RANK', 'TASKD_PROXY', 'TASKD_RESTART_COUNT')}), flush=True); "
            "sys.exit(%d)" % code)


def _kill_group(p):
    try:
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended on its own


def _relay(prefix, stream):
    """Passes a worker's output on to this process's stderr, line by line, each line after
    ``prefix``: a test reads what the workers say as they say it."""
    for line in iter(stream.readline, b""):
        sys.stderr.write(prefix + line.decode(errors="replace"))
        sys.stderr.flush()


class FakeMsrun:
    def __init__(self, codes, node_rank=0, on_start=None, kill_delay_s=0.0, relay=False):
        self.codes = codes  # local rank -> list of worker codes, one per start
        self.local_worker_num = len(codes)
        self.node_rank = node_rank
        self.proc_rank_map = {}
        self.calls = []  # (callback, argument)
        self.started = 0
        self.on_start = on_start  # called after every START_ALL_WORKER
        self.outputs = []
        self.others = []  # other children, as msrun's scheduler
        # How long a killed worker takes to end (a process group whose members are slow to
        # die): the SIGKILL is delivered that much later, from a thread.
        self.kill_delay_s = kill_delay_s
        self.workers = []  # every worker ever started
        self.overlaps = []  # workers still running when a new one of their rank started
        # Whether the workers' output goes on to stderr as it comes ("worker L.N " before each
        # line: local rank L, start N) rather than kept for ``worker_output``.
        self.relay = relay

    def callbacks(self):
        return {"KILL_WORKER": self.kill_workers, "START_ALL_WORKER": self.start_all_workers,
                "START_WORKER_LIST": self.start_worker_list, "MONITOR": self.monitor_rank_status}

    def spawn_other(self, code):
        self.others.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE))

    def _start(self, local):
        old = self.proc_rank_map.get(local)
        if old is not None and old.poll() is None:
            self.overlaps.append(old.pid)
        runs = self.codes[local]
        code = runs[min(self.started, len(runs) - 1)]
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, start_new_session=True)
        self.proc_rank_map[local] = p
        self.workers.append(p)
        if self.relay:
            threading.Thread(target=_relay, args=("worker %d.%d " % (local, self.started), p.stdout),
                             daemon=True).start()

    def start_all_workers(self):
        self.calls.append(("START_ALL_WORKER", None))
        self.kill_workers([-1], record=False)
        for local in range(self.local_worker_num):
            self._start(local)
        self.started += 1
        if self.on_start is not None:
            threading.Thread(target=self.on_start, args=(self,), daemon=True).start()
        status = self.monitor_rank_status([-1], record=False)
        return 1 if any(s["status"] is not None for s in status.values()) else 0

    def start_worker_list(self, rank_ids):
        self.calls.append(("START_WORKER_LIST", rank_ids))
        if not isinstance(rank_ids, list):
            raise TypeError("The type of 'rank_ids' must be a list, but got:%s" % rank_ids)
        for local in rank_ids:
            self._start(local)
        return 0

    def kill_workers(self, pids, record=True):
        if record:
            self.calls.append(("KILL_WORKER", pids))
        for p in self.proc_rank_map.values():
            if (-1 in pids or p.pid in pids) and p.poll() is None:
                if self.kill_delay_s:
                    threading.Timer(self.kill_delay_s, _kill_group, args=(p,)).start()
                else:
                    _kill_group(p)
        return 0

    def monitor_rank_status(self, local_ranks, record=True):
        if record:
            self.calls.append(("MONITOR", local_ranks))
        ranks = range(self.local_worker_num) if -1 in local_ranks else local_ranks
        out = {}
        for local in ranks:
            g = self.node_rank * self.local_worker_num + local
            p = self.proc_rank_map.get(local)
            if p is None:
                out[local] = {"pid": None, "status": 200, "global_rank": g}
            else:
                out[local] = {"pid": p.pid, "status": p.poll(), "global_rank": g,
                              "local_rank": local, "node_id": self.node_rank}
        return out

    def worker_output(self):
        """What each current worker printed (they have ended; relayed: nothing kept)."""
        if self.relay:
            return {}
        return {local: p.stdout.read().decode() for local, p in self.proc_rank_map.items()}

    def alive(self):
        """Processes of this fake still running."""
        procs = self.workers + self.others
        return [p.pid for p in procs if p.poll() is None]
