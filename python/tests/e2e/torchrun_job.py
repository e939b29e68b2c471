"""The seed's PyTorch job with real torch under real torchrun (Gloo, one node of two processes)
and a stand-in torch_npu: runs where torch is importable.

The seed's ``manager.py`` (``manager_1x2.py``), the node's proxy in a management process of its
own (``management.py``: plain torchrun has no taskd agent), and ``torchrun --max-restarts 1``
of ``torchrun_train.py``. ``taskd switch --wait`` moves both ranks to the backup NIC and back
while they train; every rank's framework function got one call per operation, the ranks were
held after the same step, the parameters are equal at the end, torchrun exits 0 and no process
of the job is left. ``stop``: first, rank 1's stand-in fails every call in the first
incarnation: the switch and its rollback fail, ``taskd recover --stop-training`` stops training,
both workers raise ``taskd.TrainingStopped``, torchrun restarts them (``--max-restarts 1``), and
the job runs again on its default NIC; then the same switches.

``agent``: torchrun under taskd's node agent, the reference's way (``import
taskd.python.adaptor.patch`` before torchrun's own code, as MindCluster's images insert it into
``torch/distributed/run.py``): the proxy runs in torchrun's process (no management process),
a worker is SIGKILLed mid-training, taskd's agent (not torch's loop) restarts both workers
within ``--max-restarts 1``, they register again as the second incarnation, the job switches,
and torchrun exits 0.

    python torchrun_job.py [switch|stop|agent] --taskd target/debug/taskd --python VENV/bin/python
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
from jobs import WAIT, Proc, describe, job_processes, reaping, switch, switch_there_and_back, taskd

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(os.path.dirname(HERE), "standin")
JOB = "torchrun-job"


def start_job(args, env, tmp, procs):
    manager, port, control = jobs.start_manager(args, env, procs)
    node = Proc("node-0", [args.python, os.path.join(HERE, "management.py"), port, "0"], env, stdin=True)
    procs.append(node)
    proxy = node.wait_line("taskd proxy listening on ").split(" on ", 1)[1].split()[0]
    torchrun = os.path.join(os.path.dirname(args.python), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
           os.path.join(HERE, "torchrun_train.py")]
    run = Proc("torchrun", cmd, dict(env, TASKD_PROXY=proxy))
    procs.append(run)
    manager.wait_line("verified: the job runs")  # the first verification (one more per restart)
    return manager, node, run, control


#: torchrun's own code after ``import taskd.python.adaptor.patch``: what torchrun runs once
#: that line is in ``torch/distributed/run.py``
PATCHED_TORCHRUN = ("import taskd.python.adaptor.patch, runpy; "
                    "runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)")


def start_agent_job(args, env, procs):
    """The manager, and torchrun with taskd's patch: its node's proxy runs in its process."""
    manager, port, control = jobs.start_manager(args, env, procs)
    cmd = [args.python, "-c", PATCHED_TORCHRUN, "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", os.path.join(HERE, "torchrun_train.py")]
    run = Proc("torchrun", cmd, dict(env, MASTER_ADDR="127.0.0.1", TASKD_MANAGER_PORT=port,
                                     TASKD_PROXY="127.0.0.1:0"))
    procs.append(run)
    run.wait_line("taskd agent: started 2 workers (global ranks [0, 1]; torchrun)")
    manager.wait_line("verified: the job runs")
    return manager, run, control


def worker_pid(mark, rank):
    for pid, cmd in job_processes(mark):
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read().split(b"\0")
        if ("RANK=%d" % rank).encode() in env and "torchrun_train.py" in cmd:
            return pid
    raise AssertionError("no worker of rank %d runs" % rank)


def kill_and_restart(mark, torchrun, manager):
    """A worker SIGKILLed: taskd's agent restarts both, once; they register again."""
    os.kill(worker_pid(mark, 1), signal.SIGKILL)
    line = torchrun.wait_line("restarting every worker of this node (restart 1 of 1)")
    assert "lost rank 1 (killed by SIGKILL)" in line, line
    manager.wait_line("verified: the job runs")
    return line


def check_ranks(out_dir, pairs, restarts):
    """``jobs.check_ranks``, and each rank the incarnation ``restarts`` restarts made."""
    reports, held, step_ms = jobs.check_ranks(out_dir, pairs)
    for r, rep in enumerate(reports):
        assert rep["restart"] == restarts, "rank %d is incarnation %d" % (r, rep["restart"])
    return held, reports[0]["steps"], step_ms


def stop_and_restart(args, control, torchrun, manager):
    """Rank 1's stand-in fails every call: the switch and its rollback fail; the operator stops
    training; both workers raise TrainingStopped and exit; torchrun restarts them."""
    code, out = switch(args, control, "backup", manager, JOB)
    assert code != 0 and "rank 1" in out and "HcclCommWorkingDevNicSet" in out, out
    code, out = taskd(args, ["recover", "--addr", control, "--job", JOB, "--stop-training"])
    assert code == 0, out
    torchrun.wait_count("training stopped at step", 2)
    manager.wait_line("verified: the job runs")


def run(args):
    mark = uuid.uuid4().hex
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        path = [STANDIN] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, MINDX_TASK_ID=JOB, TASKD_LOG_PATH=tmp, TASKD_TEST_JOB=mark,
                   HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1", MS_ENABLE_TFT="{TTP:1,TSP:1}",
                   PYTHONPATH=os.pathsep.join(path),
                   TRAIN_STOP_FILE=stop, TRAIN_OUT=tmp)
        if args.scenario == "stop":
            env["STANDIN_FAIL_RANK"] = "1"
        procs = []
        with reaping(procs, mark):
            node = None
            if args.scenario == "agent":
                manager, torchrun, control = start_agent_job(args, env, procs)
                kill_and_restart(mark, torchrun, manager)
            else:
                manager, node, torchrun, control = start_job(args, env, tmp, procs)
            if args.scenario == "stop":
                stop_and_restart(args, control, torchrun, manager)
            stalls = switch_there_and_back(args, control, manager, JOB)
            open(stop, "w").close()
            code = torchrun.p.wait(WAIT)
            assert code == 0, "torchrun exited %s:\n%s" % (code, torchrun.output())
            held, steps, step_ms = check_ranks(tmp, args.pairs, 0 if args.scenario == "switch" else 1)
            if node is not None:
                node.p.stdin.close()
                assert node.p.wait(WAIT) == 0, node.output()
            else:
                out = torchrun.output()
                assert "will restart worker group" not in out, "torch's own loop restarted:\n" + out
                assert "every worker of this node ended with status 0" in out, out
                for line in out.splitlines():
                    if "taskd agent" in line or "taskd proxy" in line:
                        print("torchrun job (agent): %s" % line.strip(), flush=True)
            manager.p.send_signal(signal.SIGTERM)
            assert manager.p.wait(WAIT) == 0, manager.output()
            left = job_processes(mark)
            assert not left, "processes of the job are left: %s" % left
    print("torchrun job (%s, %.0f s): held after steps %s of %d (%.2f ms a step); %s"
          % (args.scenario, time.monotonic() - started, held, steps, step_ms, describe(stalls)),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskd", required=True, help="the taskd command")
    ap.add_argument("--python", default=sys.executable, help="a Python with torch and taskd")
    ap.add_argument("--pairs", type=int, default=1, help="switches to the backup NIC and back")
    ap.add_argument("scenario", nargs="?", choices=["switch", "stop", "agent"], default="switch")
    args = ap.parse_args()
    run(args)
    print("torchrun job (%s): every check holds" % args.scenario)


if __name__ == "__main__":
    main()
