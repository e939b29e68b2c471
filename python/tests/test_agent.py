"""taskd's node agent over a FAKE msrun with msrun's callbacks (the real msrun runs in .ci/run)
and over a FAKE torchrun elastic agent patched as ``taskd.python.adaptor.patch`` patches torch's
(the real torchrun runs in test_torchrun.py where torch is importable): it starts the workers,
watches them, ends with their status, restarts them within the budget, ends with 128 + a
signal, and leaves no process behind."""

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import support
import fake_msrun
from fake_msrun import RUN, exits
from taskd.python.framework.agent import Decision, NodeAgent
from taskd.python.framework.agent.msrun import Msrun

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
WAIT = 120  # seconds: a bound on what takes a fraction of one


class AgentRun(support.TaskdTestCase):
    """Runs one scenario of ``RUNNER`` (under fakes/) in a process of its own."""

    RUNNER = "agent_run.py"

    def run_agent(self, scenario, until=None, **env):
        """Runs ``scenario``; its report. ``until``: a line of the agent's log to wait for, then
        call ``until``'s second item, before the agent's end is waited for."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "report.json")
            full = dict(os.environ, MS_SCHED_HOST="127.0.0.1", TASKD_MANAGER_PORT="1",
                        TASKD_PROXY="127.0.0.1:0", TASKD_AGENT_MONITOR_MS="20",
                        TASKD_LOG_PATH=tmp, TASKD_STD_LOG_LEVEL="INFO",
                        PYTHONPATH=os.pathsep.join([PYTHON_DIR, support.FAKES]))
            full.pop("MS_NODE_RANK", None)
            full.update(env)
            p = subprocess.Popen([sys.executable, os.path.join(support.FAKES, self.RUNNER), scenario, out],
                                 env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            seen = []
            if until is not None:
                line, then = until
                for raw in iter(p.stderr.readline, b""):
                    seen.append(raw)
                    if line in raw.decode(errors="replace"):
                        then()
                        break
            try:
                _, rest = p.communicate(timeout=WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
                _, rest = p.communicate()
                raise AssertionError("%s did not end within %d s:\n%s" % (
                    scenario, WAIT, b"".join(seen + [rest]).decode(errors="replace")))
            with open(out) as f:
                report = json.load(f)
        report["status"] = p.returncode
        report["log"] = b"".join(seen + [rest]).decode(errors="replace")
        self.assertTrue(report["init"], report["log"])
        self.assertEqual(report["alive"], [], "no process of the job is left")
        return report


class Agent(AgentRun):
    """msrun's."""

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

    def test_an_unknown_node_rank_is_an_error_naming_what_to_set(self):
        r = self.run_agent("node-rank-unknown")
        self.assertEqual(r["status"], 1, r["log"])
        self.assertEqual(r["calls"], [], "no worker was started")
        self.assertIn("set $MS_NODE_RANK to this node's rank, or give msrun --node_rank", r["log"])

    def test_a_failed_worker_ends_the_job_with_status_1_and_kills_the_others(self):
        r = self.run_agent("fail")
        self.assertEqual(r["status"], 1, r["log"])
        self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER"])
        self.assertIn("lost rank 0 (status 3)", r["log"])
        self.assertIn("PROCESS_RECOVER=on restarts the workers", r["log"])

    def test_with_process_recover_every_worker_starts_again(self):
        r = self.run_agent("recover", PROCESS_RECOVER="on", TASKD_AGENT_COORDINATED="off")
        self.assertEqual(r["status"], 0, r["log"])
        self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER", "START_ALL_WORKER", "KILL_WORKER"])
        self.assertIn("restarting every worker of this node (restart 1 of 3)", r["log"])
        for out in r["outputs"].values():
            self.assertEqual(json.loads(out)["TASKD_RESTART_COUNT"], "1", "the second incarnation")

    def test_a_restart_waits_until_the_killed_workers_have_ended(self):
        # KILL_WORKER's SIGKILL reaches the workers 0.3 s late: the new ones start after.
        r = self.run_agent("slow-kill", PROCESS_RECOVER="on", TASKD_AGENT_COORDINATED="off")
        self.assertEqual(r["status"], 0, r["log"])
        self.assertEqual(r["overlaps"], [], "no worker started beside its killed predecessor")
        self.assertIn("restarting every worker of this node (restart 1 of 3)", r["log"])

    def test_restarts_are_bounded(self):
        r = self.run_agent("bounded", PROCESS_RECOVER="on", TASKD_AGENT_COORDINATED="off", TASKD_AGENT_MAX_RESTARTS="2")
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
        log = logging.getLogger("taskd.test")
        agent = NodeAgent(Msrun(launcher.callbacks(), log), log, 0, 0.01)
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

    def test_a_restart_decided_elsewhere_is_one_call_from_another_thread(self):
        # The failure policy reports and waits (a coordinated restart); another thread, as a
        # controller would, restarts the node's workers as one new incarnation.
        launcher = fake_msrun.FakeMsrun({0: [exits(3), exits(0)], 1: [RUN, exits(0)]})
        log = logging.getLogger("taskd.test")
        reported = []
        asked = threading.Event()

        def report_and_wait(lost, restarts_done):
            reported.append(([s.describe() for s in lost], restarts_done))
            asked.set()
            return Decision.WAIT

        agent = NodeAgent(Msrun(launcher.callbacks(), log), log, 0, 0.01, policy=report_and_wait)
        controller = threading.Thread(
            target=lambda: asked.wait(WAIT) and agent.restart("the job restarts as one"))
        controller.start()
        with self.assertLogs("taskd.test", "WARNING") as logs:
            outcome = agent.run(handle_signals=False)
        controller.join(WAIT)
        self.assertEqual(outcome.code, 0, outcome)
        self.assertEqual(reported, [(["rank 0 (status 3)"], 0)])
        self.assertEqual([c for c, _ in launcher.calls if c != "MONITOR"],
                         ["START_ALL_WORKER", "KILL_WORKER", "START_ALL_WORKER", "KILL_WORKER"],
                         "one stop after the failure, none more for the restart")
        self.assertEqual((agent.incarnation, agent.restarts), (1, 0), "not counted in the budget")
        self.assertIn("the job restarts as one: restarting every worker", "\n".join(logs.output))
        self.assertEqual(launcher.alive(), [])

    def ordered_restart(self, grace_s, end_first):
        """The first start's workers run until their standard input closes; the manager's
        order restarts the job as incarnation 1 (after closing it when ``end_first``: the
        workers end on their own, as workers whose training was stopped do); the second
        start's workers exit 0. The first start's exit codes, and the agent's log."""
        launcher = fake_msrun.FakeMsrun({0: [RUN, exits(0)], 1: [RUN, exits(0)]})
        log = logging.getLogger("taskd.test")
        agent = NodeAgent(Msrun(launcher.callbacks(), log), log, 0, 0.01, stopped_grace_s=grace_s)

        def order(launcher):
            if launcher.started != 1:
                return
            if end_first:
                for p in launcher.workers:
                    p.stdin.close()
            agent.restart("the job's restart 1", incarnation=1)

        launcher.on_start = order
        with self.assertLogs("taskd.test", "INFO") as logs:
            outcome = agent.run(handle_signals=False)
        self.assertEqual(outcome.code, 0, outcome)
        self.assertEqual(agent.incarnation, 1)
        self.assertEqual(launcher.alive(), [])
        return [p.returncode for p in launcher.workers[:2]], "\n".join(logs.output)

    def test_an_ordered_restart_lets_workers_whose_training_stopped_end_on_their_own(self):
        codes, log = self.ordered_restart(WAIT, end_first=True)
        self.assertEqual(codes, [0, 0], "ended on their own, not killed:\n" + log)
        self.assertIn("the workers ended on their own", log)

    def test_an_ordered_restart_stops_workers_that_do_not_end_within_the_grace(self):
        codes, log = self.ordered_restart(0.05, end_first=False)
        self.assertEqual(codes, [-signal.SIGKILL] * 2, log)
        self.assertIn("did not end within 0.1 s of the restart order: stopping them", log)


MANAGER = textwrap.dedent("""
    from taskd.api import init_taskd_manager, start_taskd_manager
    init_taskd_manager({"job_id": "agents", "node_nums": 2, "proc_per_node": 2})
    start_taskd_manager()
""")


class Coordinated(AgentRun):
    """Two nodes' agents under one manager with process recovery: one fault, one restart of the
    whole job, decided by the manager."""

    def test_a_failed_worker_restarts_every_node_once_as_the_jobs_restart(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TASKD_MANAGER_LISTEN="127.0.0.1:0", TASKD_LOG_PATH=tmp,
                       TASKD_STD_LOG_LEVEL="INFO", PROCESS_RECOVER="on",
                       PYTHONPATH=PYTHON_DIR)
            manager = subprocess.Popen([sys.executable, "-c", MANAGER], env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                port = self.manager_port(manager)
                common = dict(PROCESS_RECOVER="on", TASKD_MANAGER_PORT=str(port),
                              MINDX_TASK_ID="agents", MS_WORKER_NUM="4")
                runs = {}
                # Node 1's worker fails at once: node 1 starts once node 0's proxy registered,
                # so the job's restart reaches both (a node whose workers register only after
                # the restart began is stopped then: core/tests/restart.rs).
                node1 = threading.Thread(target=lambda: runs.__setitem__(
                    1, self.run_agent("coordinated-node-1", MS_NODE_RANK="1", **common)))
                node0 = threading.Thread(target=lambda: runs.__setitem__(
                    0, self.run_agent("coordinated-node-0", MS_NODE_RANK="0",
                                      until=("taskd proxy registered as node-0", node1.start),
                                      **common)))
                node0.start()
                node0.join(2 * WAIT)
                node1.join(WAIT)
            finally:
                manager.terminate()
                manager.wait(WAIT)
        for n in (0, 1):
            r = runs[n]
            self.assertEqual(r["status"], 0, r["log"])
            self.assertEqual(r["calls"], ["START_ALL_WORKER", "KILL_WORKER", "START_ALL_WORKER",
                                          "KILL_WORKER"], "node %d: one restart, no more" % n)
            self.assertIn("the manager restarts the job (restart 1)", r["log"])
            self.assertNotIn("\x1b[", r["log"], "colour codes only on a terminal")
            for out in r["outputs"].values():
                self.assertEqual(json.loads(out)["TASKD_RESTART_COUNT"], "1",
                                 "node %d: the job's first restart" % n)
        # Node 1 lost rank 2 and waited for the manager's order (which may come before its own
        # monitor saw the death): it never restarted on its own.
        self.assertNotIn("of this node (restart", runs[1]["log"], "node 1 restarted on its own")
        self.assertNotIn("taskd agent: lost", runs[0]["log"], "node 0 restarted on the manager's order only")

    def manager_port(self, manager):
        """The port the manager listens on, from its log."""
        for raw in iter(manager.stderr.readline, b""):
            line = raw.decode()
            if "taskd manager listening on " in line:
                threading.Thread(target=manager.stderr.read, daemon=True).start()
                return int(line.rsplit(":", 1)[1])
        raise AssertionError("the manager never listened")


class Torchrun(AgentRun):
    """The same agent as torchrun's: ``start_taskd_agent()`` returns torch's ``RunResult``."""

    RUNNER = "torchrun_run.py"

    def run_agent(self, scenario, **env):
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MS_SCHED_HOST", "")
        return super().run_agent(scenario, **env)

    def envs(self, r):
        return [(o["TASKD_RESTART_COUNT"], o["TORCHELASTIC_RESTART_COUNT"]) for o in r["outputs"]]

    def test_a_clean_end_returns_torchs_result_after_its_exit_barrier(self):
        r = self.run_agent("clean")
        self.assertEqual((r["status"], r["state"]), (0, "SUCCEEDED"), r["log"])
        self.assertNotIn("torch's own loop", r["calls"])
        self.assertEqual(r["calls"][:3], ["_initialize_workers", "rendezvous", "_start_workers"])
        self.assertIn("_exit_barrier", r["calls"])
        for out in r["outputs"]:
            host, port = out["TASKD_PROXY"].rsplit(":", 1)
            self.assertEqual((host, out["GROUP_RANK"]), ("127.0.0.1", "0"))
            self.assertNotEqual(port, "0", "the proxy's real port")
        self.assertIn("taskd agent initialised for PyTorch", r["log"])
        self.assertIn("no restart (PROCESS_RECOVER is not on)", r["log"])

    def test_a_killed_worker_is_restarted_by_taskds_agent_within_max_restarts(self):
        r = self.run_agent("killed")
        self.assertEqual((r["status"], r["state"]), (0, "SUCCEEDED"), r["log"])
        self.assertIn("lost rank 0 (killed by SIGKILL)", r["log"])
        self.assertIn("restarting every worker of this node (restart 1 of 1)", r["log"])
        self.assertEqual(r["calls"].count("_initialize_workers"), 2)
        self.assertEqual(r["overlaps"], [], "no worker started beside its stopped predecessor")
        self.assertEqual(self.envs(r), [("0", "0"), ("1", "1"), ("1", "1")],
                         "the killed worker's, then both of the second incarnation's")

    def test_restarts_are_bounded_by_max_restarts_then_torch_gets_a_failed_result(self):
        r = self.run_agent("bounded")
        self.assertEqual((r["status"], r["state"]), (1, "FAILED"), r["log"])
        self.assertEqual(r["failures"].get("0"), -9, r["failures"])
        self.assertEqual(r["calls"].count("_initialize_workers"), 2)
        self.assertIn("no restart left (1 done)", r["log"])

    def test_without_max_restarts_nothing_restarts_and_the_log_says_why(self):
        r = self.run_agent("no-restart")
        self.assertEqual((r["status"], r["state"]), (1, "FAILED"), r["log"])
        self.assertIn("torchrun's --max-restarts is 0", r["log"])

    def test_with_process_recover_taskds_budget_replaces_torchruns(self):
        r = self.run_agent("recover", PROCESS_RECOVER="on", TASKD_AGENT_COORDINATED="off", TASKD_AGENT_MAX_RESTARTS="2")
        self.assertEqual((r["status"], r["state"]), (0, "SUCCEEDED"), r["log"])
        self.assertIn("restarting every worker of this node (restart 2 of 2)", r["log"])
        self.assertEqual(self.envs(r)[-2:], [("2", "2"), ("2", "2")])

    def test_sigterm_stops_the_workers_and_exits_with_the_signal_over_torchs_handler(self):
        r = self.run_agent("sigterm")
        self.assertEqual((r["status"], r["exit"]), (128 + 15, 128 + 15), r["log"])
        self.assertIn("SIGTERM: every worker was killed", r["log"])
        self.assertNotIn("SignalException", r["log"])

    def test_a_dynamic_rendezvous_gives_the_node_rank_once_then_once_per_restart(self):
        r = self.run_agent("dynamic")
        self.assertEqual((r["status"], r["state"]), (0, "SUCCEEDED"), r["log"])
        self.assertIn("node rank 1", r["log"])
        self.assertEqual(r["rounds"], 2, "one round before the first start, one per restart")
        self.assertEqual([o["GROUP_RANK"] for o in r["outputs"]], ["1", "1", "1"])

    def test_a_node_waiting_to_join_restarts_the_workers_without_counting(self):
        r = self.run_agent("rejoin")
        self.assertEqual((r["status"], r["state"]), (0, "SUCCEEDED"), r["log"])
        self.assertIn("1 nodes wait to join the rendezvous: restarting every worker", r["log"])
        self.assertEqual(self.envs(r), [("1", "1"), ("1", "1")])
