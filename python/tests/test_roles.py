"""The manager and the proxy through the API: ``start_taskd_manager`` blocks until SIGTERM or
SIGINT and returns True; ``init_taskd_proxy`` blocks until admitted, once per process; a refusal
or a ``destroy_taskd_proxy`` ends it with False; the MindSpore agent starts the proxy."""

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import support
import taskd.api as api
from taskd.api import taskd_proxy_api
from taskd.python.cython_api import cython_api

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = 60  # seconds: a bound on what must happen long before


def lines(stream, q):
    for line in iter(stream.readline, b""):
        q.put(line.decode())
    q.put(None)


def wait_line(q, text):
    seen = []
    while True:
        line = q.get(timeout=WAIT)
        if line is None:
            raise AssertionError("%r never came; got:\n%s" % (text, "".join(seen)))
        seen.append(line)
        if text in line:
            return line


MANAGER = textwrap.dedent("""
    import os
    from taskd.api import init_taskd_manager, start_taskd_manager
    init_taskd_manager({"job_id": os.getenv("MINDX_TASK_ID"), "node_nums": 1, "proc_per_node": 1})
    print("returned", start_taskd_manager(), flush=True)
""")


class ManagerProcess(support.TaskdTestCase):
    def run_manager_until(self, sig):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TASKD_MANAGER_LISTEN="127.0.0.1:0",
                       TASKD_CONTROL_ADDR="127.0.0.1:0", TASKD_LOG_PATH=tmp,
                       TASKD_STD_LOG_LEVEL="INFO", PYTHONPATH=PYTHON_DIR)
            p = subprocess.Popen([sys.executable, "-c", MANAGER], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            q = queue.Queue()
            threading.Thread(target=lines, args=(p.stderr, q), daemon=True).start()
            wait_line(q, "taskd manager listening on 127.0.0.1:")
            wait_line(q, "taskd manager control API on 127.0.0.1:")
            p.send_signal(sig)
            code = p.wait(WAIT)  # bounded: a manager that does not stop fails the test
            out = p.stdout.read().decode()  # stderr is the reader thread's
            self.assertEqual((code, out), (0, "returned True\n"))
            wait_line(q, "taskd manager stopped: %s" % sig.name)

    def test_sigterm_ends_start_taskd_manager_with_true(self):
        self.run_manager_until(signal.SIGTERM)

    def test_sigint_ends_it_the_same_way(self):
        self.run_manager_until(signal.SIGINT)

    def manager_log(self, **env):
        """The log of the seed's manager started with ``env`` (no control address given) and
        stopped with SIGTERM once it listens."""
        with tempfile.TemporaryDirectory() as tmp:
            full = dict(os.environ, TASKD_MANAGER_LISTEN="127.0.0.1:0", TASKD_LOG_PATH=tmp,
                        TASKD_STD_LOG_LEVEL="INFO", PYTHONPATH=PYTHON_DIR, **env)
            if "TASKD_CONTROL_ADDR" not in env:
                full.pop("TASKD_CONTROL_ADDR", None)
            p = subprocess.Popen([sys.executable, "-c", MANAGER], env=full,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            q = queue.Queue()
            threading.Thread(target=lines, args=(p.stderr, q), daemon=True).start()
            seen = []
            while True:
                line = q.get(timeout=WAIT)
                if line is None:
                    self.assertEqual(p.wait(WAIT), 0, "".join(seen))
                    return "".join(seen)
                seen.append(line)
                if "taskd manager listening on 127.0.0.1:" in line:
                    p.send_signal(signal.SIGTERM)

    def test_the_control_api_is_on_loopback_by_default_on_a_free_port_if_that_one_is_taken(self):
        from taskd.api.taskd_manager_api import DEFAULT_CONTROL_ADDR

        host, port = DEFAULT_CONTROL_ADDR.rsplit(":", 1)
        busy = socket.socket()
        try:
            busy.bind((host, int(port)))
            busy.listen()
        except OSError:
            pass  # taken already: the same case
        with busy:
            log = self.manager_log()
        self.assertIn("the default control port (%s) is taken" % DEFAULT_CONTROL_ADDR, log)
        self.assertRegex(log, r"taskd manager control API on 127\.0\.0\.1:\d+")
        self.assertNotIn("control API on %s" % DEFAULT_CONTROL_ADDR, log)

    def test_off_serves_no_control_api(self):
        log = self.manager_log(TASKD_CONTROL_ADDR="off")
        self.assertNotIn("control API on", log)


class Proxy(support.TaskdTestCase):
    def setUp(self):
        super().setUp()
        self.manager = cython_api.Manager(
            {"job_id": "pytest-job", "nodes": 1, "procs_per_node": 1, "listen": "127.0.0.1:0"},
            signals=False,
        )
        self.port = self.manager.addr(cython_api.TASKD_ADDR_LISTEN).rsplit(":", 1)[1]

    def tearDown(self):
        api.destroy_taskd_proxy()
        self.manager.free()
        super().tearDown()

    def config(self, **extra):
        cfg = {"UpstreamAddr": "127.0.0.1", "UpstreamPort": self.port,
               "ListenAddr": "127.0.0.1", "ListenPort": "0", "ServerRank": "0"}
        cfg.update(extra)
        return cfg

    def test_init_blocks_until_admitted_and_runs_once(self):
        with self.assertLogs("taskd", "INFO") as logs:
            self.assertTrue(api.init_taskd_proxy(self.config()))
        self.assertIn("taskd proxy registered as node-0", "\n".join(logs.output))
        self.assertTrue(api.init_taskd_proxy(self.config(ListenPort="1")), "a no-op")
        self.assertTrue(api.destroy_taskd_proxy())
        with self.assertLogs("taskd", "WARNING"):
            self.assertFalse(api.destroy_taskd_proxy())

    def test_a_refused_proxy_returns_false_with_the_reason(self):
        with self.assertLogs("taskd", "ERROR") as logs:
            self.assertFalse(api.init_taskd_proxy(self.config(job_id="another-job")))
        self.assertIn("refused", "\n".join(logs.output))
        self.assertIn("another-job", "\n".join(logs.output))

    def test_destroy_ends_an_init_still_waiting_for_the_manager(self):
        self.manager.free()  # nobody to join
        result = []
        t = threading.Thread(target=lambda: result.append(api.init_taskd_proxy(self.config())))
        t.start()
        proxy = None
        while proxy is None:  # init publishes its proxy before it blocks
            proxy = getattr(api.taskd_proxy_api, "_proxy")
            if proxy is None and not t.is_alive():
                self.fail("init_taskd_proxy returned without waiting")
        self.assertTrue(api.destroy_taskd_proxy())
        t.join(WAIT)
        self.assertEqual(result, [False])
        self.manager = cython_api.Manager(
            {"job_id": "x", "nodes": 1, "procs_per_node": 1, "listen": "127.0.0.1:0"}, False)

    def test_the_mindspore_agent_starts_the_proxy_from_the_launchers_environment(self):
        os.environ.update(MS_SCHED_HOST="10.0.0.1", MS_NODE_RANK="1", TASKD_MANAGER_PORT="9700",
                          TASKD_PROXY="127.0.0.1:0")
        started = queue.Queue()
        real = taskd_proxy_api.init_taskd_proxy
        taskd_proxy_api.init_taskd_proxy = started.put
        try:
            self.assertTrue(api.init_taskd_agent({"Framework": "MindSpore"}))
        finally:
            taskd_proxy_api.init_taskd_proxy = real
        self.assertEqual(started.get(timeout=WAIT), {
            "UpstreamAddr": "10.0.0.1", "UpstreamPort": "9700", "ListenAddr": "127.0.0.1",
            "ListenPort": "0", "ServerRank": "1"})

    def test_the_node_rank_comes_from_the_launcher(self):
        from taskd.api.taskd_proxy_api import _server_rank

        self.assertEqual(_server_rank(["torchrun", "--node_rank", "2", "train.py"]), "2")
        self.assertEqual(_server_rank(["torchrun", "--node-rank=3", "train.py"]), "3")
        os.environ["GROUP_RANK"] = "4"
        self.assertEqual(_server_rank(["torchrun", "--node-rank=3"]), "4")
        os.environ["MS_NODE_RANK"] = "5"
        self.assertEqual(_server_rank([]), "5")
        del os.environ["GROUP_RANK"], os.environ["MS_NODE_RANK"]
        with self.assertLogs("taskd", "WARNING") as logs:
            self.assertEqual(_server_rank(["msrun", "--node_rank", "-1"]), "0")
        self.assertIn("set ServerRank or $MS_NODE_RANK", "\n".join(logs.output))
