"""The reference's conventions: the names taskd.api exports, bools that never raise with the
reason logged (logger ``taskd``), a no-op step gate without a worker, the library's location."""

import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import support  # noqa: F401 - the fakes on the path
import taskd
import taskd.api as api
from taskd.api import taskd_agent_api, taskd_manager_api, taskd_worker_api
from taskd.python.cython_api import cython_api

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Conventions(support.TaskdTestCase):
    def test_the_api_exports_the_references_ten_functions_the_gate_and_its_exception(self):
        self.assertEqual(
            sorted(api.__all__),
            sorted([
                "init_taskd_worker", "start_taskd_worker", "destroy_taskd_worker",
                "init_taskd_manager", "start_taskd_manager", "init_taskd_proxy",
                "destroy_taskd_proxy", "init_taskd_agent", "start_taskd_agent",
                "register_func", "step_completed", "TrainingStopped",
            ]),
        )
        self.assertIs(api.step_completed, taskd_worker_api.step_completed)
        self.assertIs(api.init_taskd_worker, taskd_worker_api.init_taskd_worker)
        self.assertEqual(taskd.__version__, cython_api.version())

    def assert_false_with_reason(self, call, reason):
        with self.assertLogs("taskd", "ERROR") as logs:
            self.assertIs(call(), False)
        self.assertIn(reason, "\n".join(logs.output))

    def test_bad_worker_calls_return_false_and_say_why(self):
        f = api.init_taskd_worker
        self.assert_false_with_reason(lambda: f("0"), "rank_id must be an int >= 0, got '0'")
        self.assert_false_with_reason(lambda: f(True), "rank_id must be an int >= 0")
        self.assert_false_with_reason(lambda: f(-1), "got -1")
        self.assert_false_with_reason(lambda: f(0, -5), "upper_limit_of_disk_in_mb")
        self.assert_false_with_reason(lambda: f(0, 5000, "tf"), "framework must be 'pt' or 'ms'")
        self.assert_false_with_reason(lambda: f(0, 5000, "ms"), "$MS_NODE_RANK is not set")
        os.environ["MS_NODE_RANK"] = "one"
        self.assert_false_with_reason(lambda: f(0, 5000, "ms"), "$MS_NODE_RANK='one'")
        os.environ.update(RANK="3", LOCAL_WORLD_SIZE="0")
        self.assert_false_with_reason(lambda: f(3), "$LOCAL_WORLD_SIZE=0 is not positive")
        del os.environ["MINDX_TASK_ID"]
        os.environ["LOCAL_WORLD_SIZE"] = "2"
        self.assert_false_with_reason(lambda: f(3), "job_id may also come from $MINDX_TASK_ID")
        self.assert_false_with_reason(api.start_taskd_worker, "init_taskd_worker has not succeeded")
        self.assert_false_with_reason(api.destroy_taskd_worker, "no worker was initialised")

    def test_bad_manager_proxy_and_agent_calls_return_false_and_say_why(self):
        self.assert_false_with_reason(
            lambda: api.init_taskd_manager("job"), "config must be a dict, got str")
        self.assert_false_with_reason(
            lambda: api.init_taskd_manager({"job_id": "j", "node_nums": 2, "proc_per_node": 0}),
            "invalid value '0' for 'procs_per_node")
        self.assert_false_with_reason(
            lambda: api.init_taskd_manager({"job_id": "j", "nodes_num": 2}),
            'unknown key "nodes_num"')
        saved, taskd_manager_api._config = taskd_manager_api._config, None
        try:
            self.assert_false_with_reason(api.start_taskd_manager, "init_taskd_manager has not succeeded")
        finally:
            taskd_manager_api._config = saved
        self.assert_false_with_reason(
            lambda: api.init_taskd_proxy({"UpstreamPort": "http"}), "UpstreamPort: \"http\" is not a port")
        self.assert_false_with_reason(lambda: api.init_taskd_proxy(None), "config must be a dict")
        self.assert_false_with_reason(
            lambda: api.init_taskd_agent({"Framework": "TF"}), "Framework must be PyTorch or MindSpore")
        self.assert_false_with_reason(
            lambda: api.init_taskd_agent({"Framework": "MindSpore"}), "$MS_SCHED_HOST is not set")
        saved = taskd_agent_api._framework
        taskd_agent_api._framework = None
        try:
            self.assert_false_with_reason(api.start_taskd_agent, "init_taskd_agent has not succeeded")
        finally:
            taskd_agent_api._framework = saved
        self.assert_false_with_reason(lambda: api.register_func("STOP", print), "unknown operator")
        self.assertIs(api.register_func("KILL_WORKER", print), True)
        self.assertIs(api.init_taskd_agent({"Framework": "PyTorch"}), True)

    def test_the_gate_does_nothing_without_a_worker(self):
        self.assertIs(api.step_completed(1), False)
        self.assertIs(api.step_completed("not a step"), False)
        from taskd.api.taskd_worker_api import step_completed
        self.assertIs(step_completed(2), False)

    def test_a_library_that_does_not_load_is_named(self):
        code = textwrap.dedent("""
            import taskd.api as api
            print(api.init_taskd_manager({"job_id": "j", "node_nums": 1, "proc_per_node": 1}))
        """)
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, "libtaskd.so")
            os.symlink(cython_api.library_path(), link)
            for lib, reason in (
                (os.path.join(tmp, "missing.so"), "cannot open shared object file"),
                (link, "is a symbolic link"),
            ):
                env = dict(os.environ, TASKD_LIBRARY=lib, TASKD_LOG_PATH=tmp,
                           PYTHONPATH=PYTHON_DIR)
                out = subprocess.run([sys.executable, "-c", code], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
                self.assertEqual(out.stdout.decode().strip(), "False")
                err = out.stderr.decode()
                self.assertIn("the libtaskd.so has not been loaded", err)
                self.assertIn(reason, err)
            with open(os.path.join(tmp, "taskd.log")) as f:
                self.assertIn("the libtaskd.so has not been loaded", f.read())


class LaunchersEnvironment(support.TaskdTestCase):
    def test_the_node_rank_comes_from_what_the_launcher_gives(self):
        f = api.init_taskd_worker
        os.environ["GROUP_RANK"] = "2"  # torchrun's, when the script's environment lost $RANK
        self.assertTrue(f(5))
        self.assertEqual(taskd_worker_api._state.config.node_rank, 2)
        self.assertTrue(api.destroy_taskd_worker())
        with self.assertLogs("taskd", "ERROR") as logs:
            self.assertFalse(f(0, 5000, "ms"))
        self.assertIn("set it to this node's rank (msrun's --node_rank)", "\n".join(logs.output))

    def test_a_worker_that_cannot_reach_its_proxy_says_so_once(self):
        os.environ["MS_NODE_RANK"] = "0"  # $TASKD_PROXY: nothing listens there
        seen = threading.Event()
        lines = []

        class Watch(logging.Handler):
            def emit(self, record):
                lines.append(record.getMessage())
                if "cannot reach its proxy" in record.getMessage():
                    seen.set()

        handler = Watch(logging.WARNING)
        logging.getLogger("taskd").addHandler(handler)
        try:
            self.assertTrue(api.init_taskd_worker(0, 5000, "ms"))
            self.assertTrue(api.start_taskd_worker())
            self.assertTrue(seen.wait(60), lines)
        finally:
            logging.getLogger("taskd").removeHandler(handler)
        self.assertEqual(len(lines), 1, "one line, then quiet: %s" % lines)
        self.assertIn("127.0.0.1:1", lines[0])
