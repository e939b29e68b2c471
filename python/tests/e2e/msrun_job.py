"""The seed's MindSpore job for real: the real ``mindspore`` (the CPU build) under its real
``msrun``, with taskd's agent as msrun's process manager.

The seed's ``manager.py`` (``manager_1x2.py``, for this job's one node of two processes), and
``msrun`` with ``MS_ENABLE_TFT='{TTP:1,TSP:1}'`` and ``MS_SCHED_HOST`` set, which hands its
workers to ``start_taskd_agent()``; the training processes are ``msrun_train.py``, the seed's
worker lines before data-parallel training. Scenarios (each a job of its own):

- ``train``, ``epochs``, ``fit``: one ``model.train`` call, a per-epoch loop of
  ``model.train(1, ...)``, ``model.fit``. ``taskd switch --wait`` moves both ranks to the
  backup NIC and back while it trains.
- ``restart``: ``PROCESS_RECOVER=on`` (the manager coordinates restarts); a worker is
  SIGKILLed mid-training, the manager orders the job's restart, the agent restarts every
  worker, they register again, and a switch to the backup NIC and back succeeds. The
  restarted rank 0 starts 8 s late: msrun's scheduler lets rank 1 past ``init()`` at once, and
  only taskd's wait for the whole job before the first step keeps its first collective from
  failing (docs/python.md). One restart must do.
- ``stop``: ``PROCESS_RECOVER=on``; rank 1's framework function fails every call in the first
  incarnation (the framework's own error when it cannot switch): the switch and its rollback
  fail, ``taskd recover --stop-training`` stops training and orders the job's restart, both
  workers raise ``taskd.TrainingStopped`` and exit, the agent restarts them, the job runs
  again on its default NIC and switches to the backup NIC and back.
- ``two-nodes``: two msruns on this machine (``--node_rank`` 0 and 1, two workers each) under
  one manager coordinating restarts (``PROCESS_RECOVER=on``): a worker of node 1 is SIGKILLed;
  every node restarts its workers exactly once, together, and the job trains again. Prints
  the time from the kill to training again (every rank's first step of the new incarnation).
- ``sigterm``: SIGTERM to msrun while it trains: msrun exits with 143 and no process of the
  job is left (the other checks do not apply).

Checks, for every scenario: MindSpore warned about no callback of taskd's, every rank's
framework function was called once per operation with the whole list, on the training thread, every rank held after the same step, training went on after the last
operation, the parameters are equal on every rank at the end, msrun exits 0, and no process of
the job is left. Prints each switch's stall (the manager's pause-to-resume time).

    python msrun_job.py --taskd target/debug/taskd --python VENV/bin/python [SCENARIO...]
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid

import jobs
from jobs import WAIT, Proc, describe, free_port, job_processes, reaping, switch, switch_there_and_back, taskd

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = "msrun-job"
SCENARIOS = ("train", "epochs", "fit", "restart", "stop", "sigterm", "two-nodes")


def worker_pid(mark, rank):
    for pid, cmd in job_processes(mark):
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read().split(b"\0")
        if b"MS_ROLE=MS_WORKER" in env and ("RANK_ID=%d" % rank).encode() in env and "msrun_train.py" in cmd:
            return pid
    raise AssertionError("no worker of rank %d runs" % rank)


def check_ranks(out_dir, pairs, ranks=(0, 1)):
    """``jobs.check_ranks``, and every call on the training thread."""
    reports, held, step_ms = jobs.check_ranks(out_dir, pairs, ranks)
    assert all(c["training_thread"] for rep in reports for c in rep["calls"]), \
        "a switch call was not on the training thread: %s" % [rep["calls"] for rep in reports]
    return held, reports[0]["steps"], step_ms


def start_msrun(args, env, tmp, procs, nodes=1, node_rank=0, port=None):
    """msrun for node ``node_rank`` of a job of ``nodes`` nodes of two workers each, its
    scheduler on ``port``."""
    msrun = os.path.join(os.path.dirname(args.python), "msrun")
    cmd = [msrun, "--worker_num", str(2 * nodes), "--local_worker_num", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()),
           "--log_dir", os.path.join(tmp, "log-%d" % node_rank), "--join", "True"]
    if nodes > 1:
        cmd += ["--node_rank", str(node_rank)]
    p = Proc("msrun-%d" % node_rank if nodes > 1 else "msrun", cmd + [os.path.join(HERE, "msrun_train.py")], env)
    procs.append(p)
    return p


def end_manager(manager):
    manager.p.send_signal(signal.SIGTERM)
    assert manager.p.wait(WAIT) == 0, manager.output()


def restarted(msrun, manager):
    """The manager ordered the job's restart, the agent restarted the workers and both
    trained a step."""
    line = msrun.wait_seen("the manager restarts the job (restart 1)")
    msrun.wait_count("trained its first step (incarnation 1)", 2)
    manager.wait_line("verified: the job runs")
    return line


def restarted_once(msrun):
    """After the job: the workers were restarted no second time, by the manager or alone."""
    again = [l for l in msrun.seen
             if "(restart 2)" in l or "restarting this node on its own" in l]
    assert not again, "the restarted workers failed and were restarted again:\n%s" % msrun.output()


def restart_a_worker(mark, msrun, manager):
    os.kill(worker_pid(mark, 1), signal.SIGKILL)
    restarted(msrun, manager)


def sigterm(msrun, manager, mark):
    msrun.p.send_signal(signal.SIGTERM)
    code = msrun.p.wait(WAIT)
    assert code == 128 + signal.SIGTERM, "msrun exited %s:\n%s" % (code, msrun.output())
    msrun.wait_line("SIGTERM: every worker was killed")
    end_manager(manager)
    assert not job_processes(mark), "processes of the job are left: %s" % job_processes(mark)
    print("msrun job (sigterm): msrun exited %d, nothing left" % code, flush=True)


def stop_and_restart(args, control, msrun, manager):
    """Rank 1's framework fails every call: the switch and its rollback fail; the operator stops
    training; both workers raise TrainingStopped and exit; the agent restarts them."""
    code, out = switch(args, control, "backup", manager, JOB)
    assert code != 0 and "rank 1" in out and "device_comm_lib_instance_" in out, out
    failed = out
    code, out = taskd(args, ["recover", "--addr", control, "--job", JOB, "--stop-training",
                             "--reason", "the switch failed on rank 1 and could not be undone"])
    assert code == 0, out
    stopped = msrun.wait_count("training stopped at step", 2)
    restarting = restarted(msrun, manager)
    print("".join(["msrun job (stop): the failed switch:\n", failed, out] + stopped + [restarting]),
          flush=True)


def disturb(args, scenario, mark, msrun, manager, control):
    """What the scenario does to the running job before it switches there and back."""
    if scenario == "restart":
        restart_a_worker(mark, msrun, manager)
    elif scenario == "stop":
        stop_and_restart(args, control, msrun, manager)


def run(args, scenario):
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        env = dict(os.environ, MINDX_TASK_ID=JOB, TASKD_LOG_PATH=tmp, TASKD_TEST_JOB=mark,
                   PATH=os.path.dirname(args.python) + os.pathsep + os.environ.get("PATH", ""),
                   HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1", GLOG_v="3",
                   TRAIN_LOOP=scenario if scenario in ("epochs", "fit") else "train",
                   TRAIN_STOP_FILE=stop, TRAIN_OUT=tmp)
        procs = []
        with reaping(procs, mark):
            if scenario in ("restart", "stop"):
                env["PROCESS_RECOVER"] = "on"  # the manager's and the agent's
            manager, port, control = jobs.start_manager(args, env, procs)
            env.update(MS_ENABLE_TFT="{TTP:1,TSP:1}", MS_SCHED_HOST="127.0.0.1",
                       TASKD_MANAGER_PORT=port, TASKD_PROXY="127.0.0.1:0")
            if scenario == "restart":
                env["TRAIN_SLOW_RESTART_RANK"] = "0"
            if scenario == "stop":
                env["TRAIN_FAIL_SWITCH_RANK"] = "1"
            started = time.monotonic()
            msrun = start_msrun(args, env, tmp, procs)
            # The manager's own line for each verification that finds the job running: the
            # first now, one more after every restart (the Python line may come before it).
            manager.wait_line("verified: the job runs")
            if scenario == "sigterm":
                return sigterm(msrun, manager, mark)
            disturb(args, scenario, mark, msrun, manager, control)
            stalls = switch_there_and_back(args, control, manager, JOB)
            code, out = taskd(args, ["status", "--addr", control, "--job", JOB, "--json"])
            status = json.loads(out)
            assert status["state"] == "running" and status["ranks_on_backup"] == [], status
            open(stop, "w").close()
            code = msrun.p.wait(WAIT)
            assert code == 0, "msrun exited %s:\n%s" % (code, msrun.output())
            msrun.output()
            restarted_once(msrun)
            warned = [l for l in msrun.seen if "TaskdStepCallback" in l]
            assert not warned, "MindSpore warned about taskd's callback: %s" % warned
            held, steps, step_ms = check_ranks(tmp, args.pairs)
            end_manager(manager)
            left = job_processes(mark)
            assert not left, "processes of the job are left: %s" % left
    print("msrun job (%s, %.0f s): held after steps %s of %d (%.2f ms a step); %s"
          % (scenario, time.monotonic() - started, held, steps, step_ms, describe(stalls)), flush=True)


def run_two_nodes(args):
    """``two-nodes``: see the module's doc."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        env = dict(os.environ, MINDX_TASK_ID=JOB, TASKD_LOG_PATH=tmp, TASKD_TEST_JOB=mark,
                   PATH=os.path.dirname(args.python) + os.pathsep + os.environ.get("PATH", ""),
                   HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1", GLOG_v="3", TRAIN_LOOP="train",
                   TRAIN_STOP_FILE=stop, TRAIN_OUT=tmp, PROCESS_RECOVER="on")
        procs = []
        with reaping(procs, mark):
            manager, port, control = jobs.start_manager(args, env, procs, "manager_2x2.py", 4)
            env.update(MS_ENABLE_TFT="{TTP:1,TSP:1}", MS_SCHED_HOST="127.0.0.1",
                       TASKD_MANAGER_PORT=port, TASKD_PROXY="127.0.0.1:0")
            sched = free_port()
            msruns = [start_msrun(args, dict(env, MS_NODE_RANK=str(k)), tmp, procs, 2, k, sched)
                      for k in (0, 1)]
            manager.wait_line("verified: the job runs")
            killed = time.monotonic()
            os.kill(worker_pid(mark, 3), signal.SIGKILL)
            for m in msruns:
                m.wait_line("the manager restarts the job (restart 1)")
            for m in msruns:
                m.wait_count("trained its first step (incarnation 1)", 2)
            training = time.monotonic() - killed
            # Said right after the round that verified the new processes.
            again = manager.wait_line("the job runs again after restart 1")
            stalls = switch_there_and_back(args, control, manager, JOB)
            open(stop, "w").close()
            for m in msruns:
                code = m.p.wait(WAIT)
                assert code == 0, "%s exited %s:\n%s" % (m.name, code, m.output())
                m.output()
                restarted_once(m)
            held, steps, step_ms = check_ranks(tmp, args.pairs, (0, 1, 2, 3))
            end_manager(manager)
            left = job_processes(mark)
            assert not left, "processes of the job are left: %s" % left
    print("msrun job (two-nodes): a worker of node 1 killed; every node restarted once; training "
          "again %.1f s after the kill (the manager: %s); held after steps %s of %d (%.2f ms a "
          "step); %s" % (training, again.strip().rsplit(": ", 1)[-1], held, steps, step_ms,
                         describe(stalls)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskd", required=True, help="the taskd command")
    ap.add_argument("--python", default=sys.executable, help="a Python with mindspore and taskd")
    ap.add_argument("--pairs", type=int, default=1,
                    help="switches to the backup NIC and back per job (more: a measurement)")
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    for scenario in args.scenarios:
        if scenario not in SCENARIOS:
            ap.error("unknown scenario %r (%s)" % (scenario, ", ".join(SCENARIOS)))
        if scenario == "two-nodes":
            run_two_nodes(args)
        else:
            run(args, scenario)
    print("msrun job: every check holds (%s)" % ", ".join(args.scenarios))


if __name__ == "__main__":
    main()
