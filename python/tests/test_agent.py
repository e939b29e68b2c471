"""taskd's agent as msrun's process manager, over a FAKE msrun with msrun's callbacks (the real
msrun runs in .ci/run): it starts the workers, watches them, ends with their status, restarts
them with PROCESS_RECOVER=on a bounded number of times, and leaves no process behind."""

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile

import support
import fake_msrun
from fake_msrun import RUN, exits
from taskd.python.framework.agent import ProcessAgent

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
WAIT = 120  # seconds: a bound on what takes a fraction of one


class Agent(support.TaskdTestCase):
    def run_agent(self, scenario, **env):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "report.json")
            full = dict(os.environ, MS_SCHED_HOST="127.0.0.1", TASKD_MANAGER_PORT="1",
                        TASKD_PROXY="127.0.0.1:0", TASKD_AGENT_MONITOR_MS="20",
                        TASKD_LOG_PATH=tmp, TASKD_STD_LOG_LEVEL="INFO",
                        PYTHONPATH=os.pathsep.join([PYTHON_DIR, support.FAKES]))
            full.pop("MS_NODE_RANK", None)
            full.update(env)
            p = subprocess.run([sys.executable, os.path.join(support.FAKES, "agent_run.py"), scenario, out],
                               env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=WAIT)
            with open(out) as f:
                report = json.load(f)
        report["status"] = p.returncode
        report["log"] = p.stderr.decode()
        self.assertTrue(report["init"], report["log"])
        self.assertEqual(report["alive"], [], "no process of the job is left")
        return report

    def test_a_clean_end_returns_true_with_status_0_and_the_workers_got_the_proxy(self):
        r = self.run_agent("clean")
        self.assertEqual((r["status"], r["result"]), (0, True), r["log"])
        self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER"])
        self.assertEqual(r["kills"], [[-1]])
        for out in r["outputs"].values():
            env = json.loads(out)
            self.assertEqual((env["MS_NODE_RANK"], env["TASKD_RESTART_COUNT"]), ("0", "0"))
            host, port = env["TASKD_PROXY"].rsplit(":", 1)
            self.assertEqual(host, "127.0.0.1")
            self.assertNotEqual(port, "0", "the proxy's real port")
        self.assertIn("every worker of this node ended with status 0", r["log"])

    def test_without_ms_node_rank_the_node_rank_is_msruns(self):
        r = self.run_agent("node-rank")
        self.assertEqual(r["status"], 0, r["log"])
        for out in r["outputs"].values():
            self.assertEqual(json.loads(out)["MS_NODE_RANK"], "1")
        self.assertIn("node rank 1", r["log"])

    def test_a_failed_worker_ends_the_job_with_status_1_and_kills_the_others(self):
        r = self.run_agent("fail")
        self.assertEqual(r["status"], 1, r["log"])
        self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER"])
        self.assertIn("lost rank 0 (status 3)", r["log"])
        self.assertIn("PROCESS_RECOVER=on restarts the workers", r["log"])

    def test_with_process_recover_every_worker_starts_again(self):
        r = self.run_agent("recover", PROCESS_RECOVER="on")
        self.assertEqual(r["status"], 0, r["log"])
        self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER", "START_ALL_WORKER", "KILL_WORKER"])
        self.assertIn("restarting every worker of this node (restart 1 of 3)", r["log"])
        for out in r["outputs"].values():
            self.assertEqual(json.loads(out)["TASKD_RESTART_COUNT"], "1", "the second incarnation")

    def test_a_restart_waits_until_the_killed_workers_have_ended(self):
        # KILL_WORKER's SIGKILL reaches the workers 0.3 s late: the new ones start after.
        r = self.run_agent("slow-kill", PROCESS_RECOVER="on")
        self.assertEqual(r["status"], 0, r["log"])
        self.assertEqual(r["overlaps"], [], "no worker started beside its killed predecessor")
        self.assertIn("restarting every worker of this node (restart 1 of 3)", r["log"])

    def test_restarts_are_bounded(self):
        r = self.run_agent("bounded", PROCESS_RECOVER="on", TASKD_AGENT_MAX_RESTARTS="2")
        self.assertEqual(r["status"], 1, r["log"])
        self.assertEqual(r["calls"].count("START_ALL_WORKER"), 3)
        self.assertIn("no restart left (2 done)", r["log"])

    def test_sigterm_kills_the_workers_and_exits_with_the_signal(self):
        r = self.run_agent("sigterm")
        self.assertEqual(r["status"], 128 + 15, r["log"])
        self.assertEqual(r["kills"], [[-1]])
        self.assertIn("SIGTERM: every worker was killed", r["log"])

    def test_the_launchers_other_children_do_not_outlive_the_job(self):
        r = self.run_agent("scheduler")
        self.assertEqual(r["status"], 0, r["log"])
        self.assertIn("outlived the job: terminating it", r["log"])

    def test_without_ms_sched_host_init_fails_and_says_why(self):
        os.environ.pop("MS_SCHED_HOST", None)
        from taskd.api import init_taskd_agent

        with self.assertLogs("taskd", "ERROR") as logs:
            self.assertFalse(init_taskd_agent({"Framework": "MindSpore"}))
        self.assertIn("$MS_SCHED_HOST is not set", "\n".join(logs.output))


class AgentLoop(support.TaskdTestCase):
    """The agent's loop in this process, over the fake msrun, whose SIGKILLs arrive late."""

    def run_loop(self, codes, stop):
        launcher = fake_msrun.FakeMsrun(codes, kill_delay_s=0.5)
        agent = ProcessAgent(launcher.callbacks(), logging.getLogger("taskd.test"), 0, 0.01)
        if stop:
            launcher.on_start = lambda _launcher: agent.request_stop(signal.SIGTERM)
        outcome = agent.run()
        return outcome, launcher.alive()

    def test_every_way_out_waits_until_the_killed_workers_have_ended(self):
        for codes, stop, code in (({0: [RUN], 1: [RUN]}, True, 128 + signal.SIGTERM),
                                  ({0: [exits(3)], 1: [RUN]}, False, 1)):
            outcome, alive = self.run_loop(codes, stop)
            self.assertEqual(outcome.code, code, outcome)
            self.assertEqual(alive, [], "the agent returned before its killed workers ended")
