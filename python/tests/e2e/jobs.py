"""What the real-framework jobs (``msrun_job.py``, ``torchrun_job.py``) share: processes whose
output is read as it comes, the ``taskd`` CLI, switches that wait for a job being verified, and
the processes a job left behind (found by the mark every process of the job carries in its
environment, ``TASKD_TEST_JOB``)."""

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT = 180  # seconds: a bound on what takes seconds (MindSpore's start is the slowest)


class Proc:
    """A child process whose output lines are read as they come: stdout and stderr together,
    or with ``merged=False`` stderr alone, stdout kept whole for ``finish()`` (a process that
    prints its result there)."""

    def __init__(self, name, args, env, stdin=False, merged=True):
        self.name = name
        self.p = subprocess.Popen(args, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                                  start_new_session=True)
        self.lines = queue.Queue()
        self.seen = []
        stream = self.p.stdout if merged else self.p.stderr
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in iter(stream.readline, b""):
            self.lines.put(line.decode(errors="replace"))
        self.lines.put(None)

    def wait_line(self, text):
        """The next output line containing ``text``."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError("%s: %r never came; output:\n%s" % (self.name, text, self.output()))
            self.seen.append(line)
            if text in line:
                return line

    def wait_seen(self, text):
        """The first line containing ``text``, read already or still to come (the lines of
        several processes come in no fixed order)."""
        for line in self.seen:
            if text in line:
                return line
        return self.wait_line(text)

    def wait_count(self, text, n):
        """Until ``text`` came ``n`` times (two processes' lines may come joined in one); the
        lines it came in."""
        found, count = [], 0
        while count < n:
            line = self.wait_line(text)
            found.append(line)
            count += line.count(text)
        return found

    def output(self):
        """Every line read so far and waiting, without the frameworks' [WARNING]/[INFO] noise."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append(line)
        return "".join(l for l in self.seen if not l.startswith(("[WARNING]", "[INFO]")))

    def finish(self):
        """Closes stdin; the exit status and stdout (of a process started with ``stdin=True,
        merged=False``)."""
        self.p.stdin.close()
        out = self.p.stdout.read().decode()
        return self.p.wait(WAIT), out


def start_manager(args, env, procs, script="manager_1x2.py", world=2):
    """The job's manager (``script``: ``manager_1x2.py``, one node of two ranks; ``world``
    ranks in all) on free ports, listed in ``procs``; the manager, the port its proxies connect
    to and its control API address. Where ``mindio_ttp`` is installed the manager hosts MindIO's
    controller, from the pod's variables (``POD_IP``, ``TTP_PORT``, ``MS_WORKER_NUM``), on a free
    port; MindSpore's CPU build makes no rank a processor of it."""
    manager = Proc("manager", [args.python, os.path.join(HERE, script)],
                   dict(env, TASKD_MANAGER_LISTEN="127.0.0.1:0", TASKD_CONTROL_ADDR="127.0.0.1:0",
                        RUST_LOG="info", POD_IP="127.0.0.1", TTP_PORT=str(free_port()),
                        MS_WORKER_NUM=str(world)))
    procs.append(manager)
    port = manager.wait_line("taskd manager listening on ").strip().rsplit(":", 1)[1]
    control = manager.wait_line("taskd manager control API on ").strip().rsplit(" ", 1)[1]
    return manager, port, control


def free_port():
    """A port for a launcher that takes a number, not 0 (msrun's scheduler)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def taskd(args, argv):
    """``args.taskd ARGV``: its exit status and output."""
    out = subprocess.run([args.taskd] + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=WAIT)
    return out.returncode, out.stdout.decode()


def job_processes(mark):
    """Every live process carrying this job's mark in its environment."""
    found = []
    needle = ("TASKD_TEST_JOB=%s" % mark).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open("/proc/%s/cmdline" % pid, "rb") as c:
                        found.append((int(pid), c.read().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def reaping(procs, mark):
    """Runs a job's checks: on a failure prints every process's output, and whatever way the
    body ends, kills what is left of the processes started (``procs``) and of the job
    (``mark``)."""
    try:
        yield
    except BaseException:
        for p in procs:
            print("---- %s\n%s" % (p.name, p.output()), file=sys.stderr)
        raise
    finally:
        for p in procs:
            if p.p.poll() is None:
                os.killpg(p.p.pid, signal.SIGKILL)
                p.p.wait()
        for pid, _ in job_processes(mark):
            os.kill(pid, signal.SIGKILL)


def switch(args, control, to, manager, job, node="node-0", devs="0,1"):
    """``taskd switch --wait``. Refused because the manager is still verifying the job's
    (re)started workers: again once it says the job runs."""
    for _ in range(3):
        code, out = taskd(args, ["switch", "--addr", control, "--job", job, "--node", node,
                                 "--dev", devs, "--to", to, "--wait"])
        if "OPERATION_RUNNING" not in out and "JOB_NOT_REGISTERED" not in out:
            return code, out
        manager.wait_line("verified: the job runs")
    return code, out


def switch_there_and_back(args, control, manager, job):
    stalls = []
    for to in ("backup", "primary") * args.pairs:
        code, out = switch(args, control, to, manager, job)
        assert code == 0 and "SUCCEEDED" in out, out
        stalls += [float(l.split()[-2]) for l in out.splitlines() if l.strip().startswith("stall ")]
    return stalls


# What each rank's framework is told by one switch there and back: both devices of node-0 to
# their backup NIC, then back.
THERE_AND_BACK = [([0, 1], [True, True]), ([0, 1], [False, False])]


def check_ranks(out_dir, pairs, ranks=(0, 1)):
    """The ranks' reports (``rank-N.json`` in ``out_dir``), checked against ``pairs``
    switches there and back: every call with the whole target list, training after the last
    one, all held after the same steps (every group agrees on its NIC configuration), the
    same parameters. Returns the reports, the steps they were held after, and the slowest
    rank's mean step in milliseconds."""
    reports = []
    for r in ranks:
        with open(os.path.join(out_dir, "rank-%d.json" % r)) as f:
            reports.append(json.load(f))
    for r, rep in enumerate(reports):
        got = [(c["ranks"], c["use_backup"]) for c in rep["calls"]]
        assert got == THERE_AND_BACK * pairs, "rank %d: %s" % (r, got)
        assert rep["steps"] > rep["calls"][-1]["step"], "rank %d did not train after the last switch" % r
    held = [[c["step"] for c in rep["calls"]] for rep in reports]
    assert all(h == held[0] for h in held), "the ranks were held after different steps: %s" % held
    assert all(rep["params"] == reports[0]["params"] for rep in reports), \
        "the ranks' parameters differ"
    step_ms = max(1000 * rep["seconds"] / max(1, rep["steps"] - 1) for rep in reports)
    return reports, held[0], step_ms


def describe(stalls):
    s = sorted(stalls)
    return "stall %.1f ms median, %.1f-%.1f ms over %d switches" % (
        s[len(s) // 2], s[0], s[-1], len(s))
