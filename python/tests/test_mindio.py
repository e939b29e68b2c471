"""MindIO's controller hosted by taskd (``python/taskd/python/framework/mindio``) against the
REAL ``mindio_ttp`` wheel, with stand-ins for MindSpore 2.10.0's training processes on Ascend
(``mindio/standin_train.py``: MindSpore's calls, MindSpore's checkpoint, deterministic
parameters). Where ``mindio_ttp`` is not importable (it is CPython 3.11 only; CI installs it
into its MindSpore environment) those tests are skipped, saying so; the checks of the
variables run everywhere.

Every wait is on an event of a process (its output, its end) with a bound; ``measured:`` lines
on standard error give the times of the host's calls.
"""

import glob
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

from taskd.python.framework.mindio import host as mindio_host
from taskd.python.framework.mindio import (
    LastWords,
    MindioConfig,
    MindioConfigError,
    MindioHost,
    MindioStartError,
)

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN_DIR = os.path.join(HERE, "mindio")
STANDIN = os.path.join(STANDIN_DIR, "standin_train.py")
sys.path.insert(0, STANDIN_DIR)
import standin_train  # noqa: E402  (its parameters and replay; it imports mindio_ttp only in main)

HAS_MINDIO = mindio_host.mindio_location() is not None
NO_MINDIO = ("mindio_ttp is not importable by %s (a CPython 3.11 wheel: .ci/run installs it "
             "into its MindSpore environment)" % sys.executable)
if not HAS_MINDIO:
    sys.stderr.write("test_mindio: the tests against MindIO are skipped: %s\n" % NO_MINDIO)

STEP_MS = 20
#: a bound on what takes a fraction of it
WAIT_S = 20.0


def measured(what, seconds):
    sys.stderr.write("measured: %s: %.3f s\n" % (what, seconds))


def free_port():
    """A port nothing listens on. MindIO's controller needs a fixed one: it refuses port 0
    (``tft_start_controller`` raises at once), and the training processes must be told the port
    (``MS_TFT_PORT``) before they start."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Job:
    """Stand-in training processes of one job: started, watched through their ``EVT`` lines,
    and killed (SIGKILL) at the end."""

    def __init__(self, tmp, port, world, tft="{TTP:1,TSP:1}"):
        self.tmp, self.port, self.world, self.tft = tmp, port, world, tft
        self.ckpt = os.path.join(tmp, "ckpt")
        self.procs = {}
        self.cond = threading.Condition()
        self.events = []  # (rank, generation, name, fields)
        self.generation = 0

    def start(self, ranks=None, resume=False, steps=0):
        self.generation += 1
        for rank in range(self.world) if ranks is None else ranks:
            logs = os.path.join(self.tmp, "ttp-rank%d-%d" % (rank, self.generation))
            env = dict(os.environ, MS_TFT_IP="127.0.0.1", MS_TFT_PORT=str(self.port),
                       MS_WORKER_NUM=str(self.world), MS_NODE_ID=str(rank),
                       MINDX_TASK_ID="mindio-test", MS_ENABLE_TFT=self.tft,
                       MINDIO_FOR_MINDSPORE="1", TTP_LOG_PATH=logs)
            env.pop("TTP_LOG_STDOUT", None)
            cmd = [sys.executable, STANDIN, "--ckpt-dir", self.ckpt, "--step-ms", str(STEP_MS),
                   "--steps", str(steps)] + (["--resume"] if resume else [])
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            self.procs[rank] = p
            threading.Thread(target=self._pump, args=(rank, self.generation, p),
                             daemon=True).start()

    def _pump(self, rank, generation, p):
        for raw in p.stdout:
            line = raw.decode(errors="replace")
            if line.startswith("EVT "):
                _, name, fields = line.split(" ", 2)
                self._add(rank, generation, name, json.loads(fields))
        p.stdout.close()
        self._add(rank, generation, "exited", {"status": p.wait()})

    def _add(self, rank, generation, name, fields):
        with self.cond:
            self.events.append((rank, generation, name, fields))
            self.cond.notify_all()

    def wait(self, rank, name, pred=lambda f: True, timeout_s=WAIT_S):
        """The first event ``name`` of ``rank`` (a rank, or a list of ranks) in the current
        generation for which ``pred`` holds."""
        ranks = rank if isinstance(rank, list) else [rank]
        gen = self.generation
        end = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for r, g, n, f in self.events:
                    if r in ranks and (g, n) == (gen, name) and pred(f):
                        return f
                left = end - time.monotonic()
                if left <= 0:
                    theirs = [(r, n, f) for r, g, n, f in self.events
                              if r in ranks and g == gen and n != "step"]
                    raise AssertionError("rank %s: no %s within %g s; their events: %s"
                                         % (rank, name, timeout_s, theirs))
                self.cond.wait(left)

    def wait_stepping(self, step):
        for rank in self.procs:
            self.wait(rank, "step", lambda f: f["step"] >= step)

    def kill(self, rank):
        p = self.procs[rank]
        try:
            p.kill()
        except ProcessLookupError:
            pass  # it has just ended
        p.wait()

    def kill_all(self):
        for rank in list(self.procs):
            self.kill(rank)

    def checkpoints(self):
        found = glob.glob(os.path.join(self.ckpt, "ttp_saved_checkpoints-step_*"))
        return sorted(os.path.basename(d) for d in found)


def pod_env(tmp, port, world, **extra):
    """The manager's environment in the job's pod, as the job's YAML and MindCluster give it."""
    env = dict(os.environ, POD_IP="127.0.0.1", TTP_PORT=str(port), MS_WORKER_NUM=str(world),
               TASKD_LOG_PATH=tmp, MS_ENABLE_TFT="{TTP:1,TSP:1}")
    for var in ("WORLD_SIZE", "TTP_LOG_PATH", "TASKD_PROCESS_ENABLE", "PROCESS_RECOVER",
                "HIGH_AVAILABILITY"):
        env.pop(var, None)
    env.update(extra)
    return env


class Variables(unittest.TestCase):
    """What ``from_env`` reads and refuses (no MindIO needed)."""

    def env(self, **kw):
        base = {"POD_IP": "10.0.0.7", "TTP_PORT": "8000", "MS_WORKER_NUM": "16"}
        base.update(kw)
        return {k: v for k, v in base.items() if v is not None}

    def refused(self, variable, text, **kw):
        with self.assertRaises(MindioConfigError) as cm:
            MindioConfig.from_env(self.env(**kw))
        self.assertEqual(cm.exception.variable, variable)
        self.assertIn(variable, str(cm.exception))
        self.assertIn(text, str(cm.exception))

    def test_the_references_variables_are_read(self):
        c = MindioConfig.from_env(self.env(PROCESS_RECOVER="on", TASKD_LOG_PATH="/var/log/job",
                                           HIGH_AVAILABILITY="retry,elastic-training"))
        self.assertEqual((c.ip, c.port, c.world, c.process_recover, c.elastic),
                         ("10.0.0.7", 8000, 16, True, True))
        self.assertEqual(c.log_dir, os.path.join("/var/log/job", "mindio"))
        c = MindioConfig.from_env(self.env(WORLD_SIZE="32", POD_IP="[FD00::1]",
                                           TTP_LOG_PATH="/ttp"))
        self.assertEqual((c.ip, c.world, c.process_recover, c.elastic, c.log_dir),
                         ("fd00::1", 32, False, False, "/ttp"))
        self.assertEqual(MindioHost(c).address, "[fd00::1]:8000")

    def test_a_missing_or_unusable_variable_is_refused_by_name(self):
        self.refused("POD_IP", "is not set", POD_IP=None)
        self.refused("POD_IP", "status.podIP", POD_IP=" ")
        self.refused("POD_IP", "every address", POD_IP="0.0.0.0")
        self.refused("POD_IP", "every address", POD_IP="::")
        self.refused("POD_IP", "is not an IP address", POD_IP="pod-0.job")
        self.refused("TTP_PORT", "is not set", TTP_PORT=None)
        self.refused("TTP_PORT", "not a port", TTP_PORT="ttp")
        self.refused("TTP_PORT", "not a port", TTP_PORT="0")
        self.refused("TTP_PORT", "not a port", TTP_PORT="65536")
        self.refused("WORLD_SIZE", "neither WORLD_SIZE nor MS_WORKER_NUM", MS_WORKER_NUM=None)
        self.refused("MS_WORKER_NUM", "not a positive number", MS_WORKER_NUM="0")
        self.refused("WORLD_SIZE", "not a positive number", WORLD_SIZE="many")

    def test_from_env_refuses_at_once_where_mindio_is_importable(self):
        with mock.patch.object(mindio_host, "mindio_location", return_value="/site-packages"):
            with self.assertRaises(MindioConfigError) as cm:
                MindioHost.from_env(self.env(POD_IP="0.0.0.0"))
            self.assertEqual(cm.exception.variable, "POD_IP")
            self.assertIsInstance(MindioHost.from_env(self.env()), MindioHost)
            off = self.env(TASKD_PROCESS_ENABLE="off", POD_IP=None)
            self.assertIsNone(MindioHost.from_env(off))

    def test_without_mindio_one_warning_names_the_85_s_and_how_to_install(self):
        with mock.patch.object(mindio_host, "mindio_location", return_value=None):
            with self.assertLogs("taskd", "WARNING") as logs:
                env = self.env(MS_ENABLE_TFT="{TTP:1,TSP:1}", POD_IP=None)
                self.assertIsNone(MindioHost.from_env(env))
            self.assertEqual(len(logs.records), 1, logs.output)
            text = logs.output[0]
            for part in ("mindio_ttp is not importable", "85 s", "pip install mindio_ttp",
                         "{TTP:1,TSP:1}"):
                self.assertIn(part, text)
            with self.assertLogs("taskd", "DEBUG") as logs:
                self.assertIsNone(MindioHost.from_env(self.env(MS_ENABLE_TFT="{RSC:1}")))
                self.assertIsNone(MindioHost.from_env(self.env()))
            self.assertEqual([r for r in logs.records if r.levelname != "DEBUG"], [],
                             "no warning without MindIO's features")

    def test_faults_must_be_ranks_of_the_job(self):
        h = MindioHost(MindioConfig("127.0.0.1", 8000, 2))
        for bad in ({2: 1}, {-1: 1}, {"0": 1}, {0: 5}, {True: 1}, [0]):
            with self.assertRaises(ValueError):
                h.last_words(bad, 1)
        words = h.last_words({1: 1}, 1)
        self.assertEqual((words.taken, words.detail), (False, "MindIO's controller is not running"))


@unittest.skipUnless(HAS_MINDIO, NO_MINDIO)
class AgainstMindio(unittest.TestCase):
    """The host with the real wheel, and stand-ins of MindSpore's training processes."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="taskd-mindio-")
        self.tmp = self._tmp.name
        self.port = free_port()
        self.hosts = []
        self.jobs = []
        self.faults = queue.Queue()

    def tearDown(self):
        for job in self.jobs:
            job.kill_all()
        for host in self.hosts:
            pid = host.pid
            host.close(0)
            if pid:
                self.assertTrue(gone(pid))
        self._tmp.cleanup()

    def host(self, world, **extra):
        h = MindioHost.from_env(pod_env(self.tmp, self.port, world, **extra))
        self.assertIsNotNone(h)
        h.on_fault(lambda rank, why: self.faults.put((rank, why)))
        self.hosts.append(h)
        t0 = time.monotonic()
        h.start()
        measured("host.start (world %d)" % world, time.monotonic() - t0)
        return h

    def job(self, world, **kw):
        j = Job(self.tmp, self.port, world, **kw)
        self.jobs.append(j)
        return j

    def assert_held_after(self, job, ranks, step):
        """Each rank is held inside MindIO with the parameters of ``step``: in the next step's
        start of the optimizer update, or still in this step's end."""
        for rank in ranks:
            held = job.wait(rank, "held")
            self.assertEqual(held["params_step"], step, held)
            self.assertIn((held["call"], held["step"]),
                          [("start_updating", step + 1), ("end_updating", step),
                           ("pause_train", step)], held)

    def assert_checkpoint(self, job, step):
        """The last-words checkpoint MindSpore's handlers write, renamed, with the parameters
        a serial run has after ``step``."""
        self.assertEqual(job.checkpoints(), ["ttp_saved_checkpoints-step_%d" % step])
        files = glob.glob(os.path.join(job.ckpt, "ttp_saved_checkpoints-step_%d" % step, "rank_*",
                                       "*.ckpt"))
        self.assertEqual(len(files), 1, files)  # one saver for the data-parallel group
        rank = int(os.path.basename(os.path.dirname(files[0]))[len("rank_"):])
        self.assertEqual(os.path.basename(files[0]), "ttp_rank_%d-1_%d.ckpt" % (rank, step))
        with open(files[0]) as f:
            saved = json.load(f)
        self.assertTrue(saved["__exception_save__"])
        self.assertEqual((saved["params_step"], saved["global_step"]), (step, step))
        self.assertEqual(saved["params"], standin_train.replay(step))

    def test_the_host_starts_from_the_pods_variables_and_every_processor_connects(self):
        host = self.host(3)
        pid = host.pid
        logs = glob.glob(os.path.join(self.tmp, "mindio", "ttp_log.log.%d" % pid))
        self.assertEqual(len(logs), 1, "MindIO's controller logs under $TASKD_LOG_PATH/mindio")
        job = self.job(3)
        t0 = time.monotonic()
        job.start()
        for rank in range(3):
            job.wait(rank, "processor")
        measured("3 processors connected after their start", time.monotonic() - t0)
        job.wait_stepping(5)
        t0 = time.monotonic()
        host.close()
        measured("host.close with 3 processors connected (MindIO's destroy)", time.monotonic() - t0)
        self.assertTrue(gone(pid), "no controller process is left")
        self.assertFalse(host.running)
        host.close()  # idempotent

    def test_an_address_of_another_host_fails_start_at_once_naming_it(self):
        # 192.0.2.1: TEST-NET-1 (RFC 5737), never an address of this host
        host = MindioHost.from_env(pod_env(self.tmp, self.port, 2, POD_IP="192.0.2.1"))
        self.hosts.append(host)
        t0 = time.monotonic()
        with self.assertRaises(MindioStartError) as cm:
            host.start()
        measured("start refused for an address of another host", time.monotonic() - t0)
        self.assertIn("192.0.2.1 is not an address of this host", str(cm.exception))
        self.assertIn("POD_IP", str(cm.exception))
        self.assertFalse(host.running)

    def test_mindios_own_refusal_to_start_is_reported_and_its_process_reaped(self):
        # from_env refuses 0.0.0.0; given anyway, tft_start_controller raises SystemExit(2)
        logs = os.path.join(self.tmp, "mindio")
        host = MindioHost(MindioConfig("0.0.0.0", self.port, 2, log_dir=logs))
        self.hosts.append(host)
        with self.assertRaises(MindioStartError) as cm:
            host.start()
        self.assertIn("tft_start_controller('0.0.0.0', %d) failed (SystemExit(2))" % self.port,
                      str(cm.exception))
        self.assertFalse(host.running)

    def test_a_busy_port_fails_start_with_the_reason(self):
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", self.port))
        busy.listen(1)
        host = MindioHost.from_env(pod_env(self.tmp, self.port, 2))
        self.hosts.append(host)
        t0 = time.monotonic()
        with self.assertRaises(MindioStartError) as cm:
            host.start()
        measured("start refused for a busy port", time.monotonic() - t0)
        self.assertIn("port %d is in use on 127.0.0.1" % self.port, str(cm.exception))
        self.assertFalse(host.running)

    def test_last_words_after_a_killed_processor_and_a_resume_from_them(self):
        host = self.host(3)
        job = self.job(3)
        job.start()
        job.wait_stepping(10)
        job.kill(2)  # the agent's waitpid: taskd names the fault itself
        words = host.last_words({2: 1}, 15)
        measured("last words after a processor was killed", words.seconds)
        self.assertIsInstance(words, LastWords)
        self.assertTrue(words.taken, words)
        self.assertEqual((words.code, words.strategy, words.fault_ranks), (0, "dump", {2: 1}))
        step = job.wait([0, 1], "saved")["step"]
        self.assert_checkpoint(job, step)
        self.assert_held_after(job, [0, 1], step)
        # SIGKILL: MindIO made SIGTERM a no-op in them
        job.kill_all()
        t0 = time.monotonic()
        host.renew()
        measured("host.renew (destroy, then a new controller)", time.monotonic() - t0)
        job.start(resume=True, steps=step + 15)
        for rank in range(3):
            self.assertEqual(job.wait(rank, "resumed")["step"], step)
            end = job.wait(rank, "end")
            self.assertEqual((end["step"], end["params"]),
                             (step + 15, standin_train.replay(step + 15)))
        self.assertTrue(self.faults.empty(), "the host named rank 2 itself: no fault callback")
        # MindSpore's end calls tft_destroy_processor, which now and then waits for as long as
        # the controller is there (measured: 4 of 27 ranks for more than 150 s): once the job
        # has ended the controller goes, and so does every such wait
        host.close()
        for rank in range(3):
            self.assertEqual(job.wait(rank, "exited")["status"], 0)

    def test_last_words_on_a_fault_free_stop_and_mindio_does_not_end_the_ranks_later(self):
        # MINDIO_WAIT_MINDX_TIME=1: left in its EXIT state MindIO would end every rank 1 s later
        host = self.host(2, MINDIO_WAIT_MINDX_TIME="1")
        job = self.job(2)
        job.start()
        job.wait_stepping(5)
        words = host.last_words({}, 15)
        measured("last words on a fault-free stop", words.seconds)
        self.assertTrue(words.taken, words)
        step = job.wait([0, 1], "saved")["step"]
        self.assert_checkpoint(job, step)
        self.assert_held_after(job, [0, 1], step)
        with self.assertRaises(AssertionError):
            job.wait(0, "exit_handler", timeout_s=3.0)
        self.assertEqual([p.poll() for p in job.procs.values()], [None, None], "both still held")
        again = host.last_words({}, 5)
        self.assertFalse(again.taken)
        self.assertIn("already ended", again.detail)

    def test_last_words_out_of_time_leave_mindio_no_way_to_end_the_ranks(self):
        host = self.host(2, MINDIO_WAIT_MINDX_TIME="1")
        job = self.job(2)
        job.start()
        job.wait_stepping(5)
        job.kill(1)
        words = host.last_words({1: 1}, 0)  # MindIO answers after the call gave up
        self.assertFalse(words.taken)
        self.assertIn("in time", words.detail)
        # MindIO's late answers are met with "exit": its exit handler never runs
        with self.assertRaises(AssertionError):
            job.wait(0, "exit_handler", timeout_s=4.0)
        self.assertIsNone(job.procs[0].poll())

    def test_a_one_rank_job_has_no_last_words(self):
        host = self.host(1)
        job = self.job(1)
        job.start()
        job.wait_stepping(5)
        words = host.last_words({}, 15)
        measured("last words refused for a job of one rank", words.seconds)
        self.assertFalse(words.taken)
        self.assertEqual(words.code, 499)
        self.assertIn("a job of one rank", words.detail)
        self.assertEqual(job.checkpoints(), [])

    def test_a_tsp_only_job_has_no_last_words(self):
        host = self.host(2)
        job = self.job(2, tft="{TSP:1}")
        job.start()
        job.wait_stepping(5)
        job.kill(1)
        words = host.last_words({1: 1}, 15)
        self.assertFalse(words.taken)
        self.assertEqual(words.code, 404)
        self.assertIn("TTP:1", words.detail)
        self.assertEqual(job.checkpoints(), [])

    def test_sigterm_is_a_no_op_after_tft_init_processor(self):
        self.host(1)
        job = self.job(1)
        job.start()
        step = job.wait(0, "step", lambda f: f["step"] >= 3)["step"]
        pid = job.procs[0].pid
        with open("/proc/%d/status" % pid) as f:
            caught = int([line.split()[1] for line in f if line.startswith("SigCgt:")][0], 16)
        self.assertTrue(caught & (1 << (signal.SIGTERM - 1)), "MindIO handles SIGTERM")
        os.kill(pid, signal.SIGTERM)
        job.wait(0, "step", lambda f: f["step"] >= step + 5)
        self.assertIsNone(job.procs[0].poll(), "still training after SIGTERM")
        job.kill(0)
        self.assertEqual(job.procs[0].returncode, -signal.SIGKILL)

    def test_the_module_hosts_the_controller_until_sigterm(self):
        cmd = [sys.executable, "-m", "taskd.python.framework.mindio"]
        bad = subprocess.run(cmd, env=pod_env(self.tmp, self.port, 2, TTP_PORT="ttp"),
                             stderr=subprocess.PIPE, timeout=WAIT_S)
        self.assertEqual(bad.returncode, 2)
        self.assertIn(b"TTP_PORT='ttp' is not a port", bad.stderr)
        p = subprocess.Popen(cmd, env=pod_env(self.tmp, self.port, 2, TASKD_STD_LOG_LEVEL="INFO"),
                             stderr=subprocess.PIPE, start_new_session=True)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x.decode()) for x in p.stderr],
                         daemon=True).start()
        end = time.monotonic() + WAIT_S
        while True:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
            if "MindIO's controller listens on 127.0.0.1:%d" % self.port in line:
                break
        pid = int(line.split("(pid ")[1].split(",")[0])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=WAIT_S), 0)
        self.assertTrue(gone(pid), "the controller's process is gone")

    def test_mindios_own_fault_report_reaches_on_fault(self):
        host = self.host(2)
        job = self.job(2)
        job.start()
        job.wait_stepping(5)
        t0 = time.monotonic()
        job.kill(1)
        rank, why = self.faults.get(timeout=WAIT_S)
        measured("MindIO's own report of a killed processor (heartbeat)", time.monotonic() - t0)
        self.assertEqual(rank, 1)
        self.assertIn("a process fault of rank 1", why)
        words = host.last_words({1: 1}, 15)  # MindIO knows: the dump is asked for directly
        measured("last words after MindIO's own report", words.seconds)
        self.assertTrue(words.taken, words)
        self.assert_checkpoint(job, job.wait(0, "saved")["step"])
        self.assertTrue(self.faults.empty())


FAKES = os.path.join(HERE, "fakes")
#: the taskd command, for the operator's switch (CI sets it; the test is skipped without it)
TASKD_BIN = os.environ.get("TASKD_BIN")
JOB_ID = "mindio-job"
MANAGER = """
import sys
from taskd.api import init_taskd_manager, start_taskd_manager
ok = init_taskd_manager({"job_id": "%s", "node_nums": 1, "proc_per_node": 2}) and start_taskd_manager()
sys.exit(0 if ok else 1)
""" % JOB_ID


class Lines:
    """The lines a process writes to a stream, as they come."""

    def __init__(self, stream):
        self.q = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for raw in iter(stream.readline, b""):
            self.q.put(raw.decode(errors="replace"))
        self.q.put(None)

    def wait(self, pred, what, timeout_s=WAIT_S * 3):
        """The first line, seen already or to come, for which ``pred`` holds."""
        for line in self.seen:
            if pred(line):
                return line
        end = time.monotonic() + timeout_s
        while True:
            try:
                line = self.q.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError("%s never came; got:\n%s" % (what, "".join(self.seen[-60:])))
            self.seen.append(line)
            if pred(line):
                return line

    def text(self, text):
        return self.wait(lambda l: text in l, repr(text))

    def event(self, worker, name, pred=lambda f: True):
        """The fields of the event ``name`` of ``worker`` (``"L.N"``: local rank L, start N)."""
        head = "worker %s EVT %s " % (worker, name)
        line = self.wait(lambda l: l.startswith(head) and pred(json.loads(l[len(head):])),
                         "%s of worker %s" % (name, worker))
        return json.loads(line[len(head):])


def manager_env(tmp, ttp_port, **extra):
    env = dict(os.environ, MINDX_TASK_ID=JOB_ID, POD_IP="127.0.0.1", TTP_PORT=str(ttp_port),
               MS_WORKER_NUM="2", PROCESS_RECOVER="on", TASKD_MANAGER_LISTEN="127.0.0.1:0",
               TASKD_CONTROL_ADDR="127.0.0.1:0", TASKD_LAST_WORDS_TIMEOUT_MS="20000",
               TASKD_LOG_PATH=tmp, TASKD_STD_LOG_LEVEL="INFO", RUST_LOG="info",
               TTP_LOG_PATH=os.path.join(tmp, "ttp-controller"))
    env.pop("TTP_LOG_STDOUT", None)
    env.update(extra)
    return env


@unittest.skipUnless(HAS_MINDIO, NO_MINDIO)
class ManagerHostsMindio(unittest.TestCase):
    """The seed's ``manager.py`` (``start_taskd_manager()``) hosts MindIO's controller for the
    job: stand-ins of MindSpore's Ascend ranks, as MindIO processors and taskd workers under
    taskd's agent (a fake msrun), connect to it; a switch pauses every rank at one step with
    taskd's gate (MindIO idle); a killed rank leads to MindIO's last-words checkpoint, one
    restart of the job and a resume at the checkpoint's step, no step lost."""

    def test_a_controller_address_that_is_wrong_fails_the_managers_start_naming_it(self):
        for extra, variable in (({"POD_IP": "0.0.0.0"}, "POD_IP"),
                                ({"TTP_PORT": "port"}, "TTP_PORT")):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.monotonic()
                p = subprocess.run([sys.executable, "-c", MANAGER], env=manager_env(tmp, free_port(), **extra),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   timeout=WAIT_S)
                measured("a manager refusing a bad %s" % variable, time.monotonic() - t0)
                self.assertEqual(p.returncode, 1)
                self.assertIn(variable, p.stderr.decode())

    @unittest.skipUnless(TASKD_BIN, "set TASKD_BIN to the taskd command (the operator's switch)")
    def test_the_job_switches_and_a_killed_rank_resumes_at_the_last_words_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            ttp_port = free_port()
            manager = subprocess.Popen([sys.executable, "-c", MANAGER],
                                       env=manager_env(tmp, ttp_port), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, start_new_session=True)
            procs = [manager]
            try:
                self.run_job(tmp, ttp_port, manager, procs)
            finally:
                for p in reversed(procs):
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                        try:
                            p.wait(WAIT_S)
                        except subprocess.TimeoutExpired:
                            os.killpg(p.pid, signal.SIGKILL)
                            p.wait(WAIT_S)

    def run_job(self, tmp, ttp_port, manager, procs):
        m = Lines(manager.stderr)
        port = m.text("taskd manager listening on ").strip().rsplit(":", 1)[1]
        m.text("MindIO's controller listens on 127.0.0.1:%d" % ttp_port)
        control = m.text("taskd manager control API on ").strip().rsplit(" ", 1)[1]
        paths = [p for p in (os.environ.get("PYTHONPATH"), FAKES) if p]
        env = dict(os.environ, MINDX_TASK_ID=JOB_ID, MS_SCHED_HOST="127.0.0.1",
                   TASKD_MANAGER_PORT=port, TASKD_PROXY="127.0.0.1:0", PROCESS_RECOVER="on",
                   MS_NODE_RANK="0", TASKD_AGENT_MONITOR_MS="50", MS_TFT_IP="127.0.0.1",
                   MS_TFT_PORT=str(ttp_port), MS_WORKER_NUM="2", MINDIO_FOR_MINDSPORE="1",
                   MS_ENABLE_TFT="{TTP:1,TSP:1}", HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1",
                   STANDIN_CKPT=os.path.join(tmp, "ckpt"), TASKD_LOG_PATH=tmp,
                   TASKD_STD_LOG_LEVEL="INFO", TTP_LOG_PATH=os.path.join(tmp, "ttp-ranks"),
                   PYTHONPATH=os.pathsep.join(paths))
        env.pop("TTP_LOG_STDOUT", None)
        agent = subprocess.Popen([sys.executable, os.path.join(FAKES, "agent_run.py"), "mindio",
                                  os.path.join(tmp, "agent.json")], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
        procs.append(agent)
        a = Lines(agent.stderr)
        pids = {r: a.event("%d.0" % r, "processor")["pid"] for r in (0, 1)}
        m.text("verified: the job runs")

        # A switch there and back: taskd's gate holds every rank at one step; MindIO idle.
        for to in ("backup", "primary"):
            out = subprocess.run([TASKD_BIN, "switch", "--addr", control, "--job", JOB_ID,
                                  "--node", "node-0", "--dev", "0,1", "--to", to, "--wait"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=WAIT_S)
            text = out.stdout.decode()
            self.assertEqual(out.returncode, 0, text)
            self.assertIn("SUCCEEDED", text)
            self.assertIn("every rank held after step", text)
        # MindIO paused nobody: its pause runs the stream-sync handler (TSP:1) at every rank.
        self.assertFalse([l for l in a.seen if " EVT stream_sync " in l], "no double pause")

        # Rank 1 dies: last words from rank 0, one restart of the job, a resume at that step.
        a.event("0.0", "step", lambda f: f["step"] >= 5)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        saved = a.event("0.0", "saved")
        measured("a killed rank to MindIO's last-words checkpoint", time.monotonic() - t0)
        resumed = {r: a.event("%d.1" % r, "resumed") for r in (0, 1)}
        measured("a killed rank to the new processes resumed", time.monotonic() - t0)
        again = m.text("the job runs again after restart 1")
        step = saved["step"]
        for r in (0, 1):
            self.assertEqual(resumed[r]["step"], step, "rank %d resumed at the checkpoint" % r)
            self.assertEqual(resumed[r]["params"], standin_train.replay(step),
                             "rank %d resumed with the serial replay's parameters" % r)
        a.event("0.1", "step", lambda f: f["step"] >= step + 3)
        a.event("1.1", "step", lambda f: f["step"] >= step + 3)

        out = subprocess.run([TASKD_BIN, "status", "--addr", control, "--job", JOB_ID, "--json"],
                             stdout=subprocess.PIPE, timeout=WAIT_S)
        status = json.loads(out.stdout)
        last = status["last_training_stop"]
        self.assertEqual((last["by"], last["then"], last["restart"]), ("fault", "restart", 1), last)
        self.assertTrue(last["last_words"]["taken"], last)
        self.assertEqual(last["trained_to"], step, "the ranks had finished the checkpoint's step")
        self.assertIn("resumes after step %d" % step, last["resume"])
        self.assertIn("no step lost", last["resume"])
        self.assertEqual(status["restarts"]["done"], 1, status["restarts"])
        self.assertEqual(status["state"], "running")
        sys.stderr.write("measured: the manager: %s" % again.split("the job runs again ", 1)[1])
        self.assertFalse(any("(restart 2)" in l for l in a.seen), "one restart")


if __name__ == "__main__":
    unittest.main()
