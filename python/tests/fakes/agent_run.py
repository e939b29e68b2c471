"""One scenario of taskd's agent as msrun's process manager, in a process of its own (as msrun
is): ``python agent_run.py SCENARIO OUT``. The agent gets the FAKE msrun's callbacks; ``OUT``
receives what happened (JSON) whatever the exit."""

import json
import os
import signal
import sys

import fake_msrun
from fake_msrun import RUN, exits
from taskd.api import init_taskd_agent, register_func, start_taskd_agent
from taskd.python.framework.agent import core


def terminate_me(_launcher):
    os.kill(os.getpid(), signal.SIGTERM)


#: the stand-in of MindSpore's Ascend training processes with MindIO (tests/mindio/)
STANDIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindio",
                       "standin_train.py")


def standin(local, resume):
    """A worker running the stand-in as local rank ``local`` (its rank: a job of one node),
    with taskd's worker; ``resume``: from the newest checkpoint, as a restarted job does."""
    argv = ["standin_train.py", "--ckpt-dir", "$STANDIN_CKPT", "--step-ms", "20", "--taskd"]
    argv += ["--resume"] if resume else []
    return ("import os, runpy, sys; os.environ['MS_NODE_ID'] = '%d'; "
            "sys.argv = [os.path.expandvars(a) for a in %r]; "
            "runpy.run_path(%r, run_name='__main__')" % (local, argv, STANDIN))


SCENARIOS = {
    "clean": dict(codes={0: [exits(0)], 1: [exits(0)]}),
    "node-rank": dict(codes={0: [exits(0)], 1: [exits(0)]}, node_rank=1),
    "node-rank-unknown": dict(codes={0: [exits(0)], 1: [exits(0)]}, node_rank=-1),
    "fail": dict(codes={0: [exits(3)], 1: [RUN]}),
    "recover": dict(codes={0: [exits(3), exits(0)], 1: [RUN, exits(0)]}),
    "slow-kill": dict(codes={0: [exits(3), exits(0)], 1: [RUN, exits(0)]}, kill_delay_s=0.3),
    "bounded": dict(codes={0: [exits(3)], 1: [RUN]}),
    "sigterm": dict(codes={0: [RUN], 1: [RUN]}, on_start=terminate_me),
    "scheduler": dict(codes={0: [exits(0)], 1: [exits(0)]}),
    # Two nodes of one job whose manager coordinates restarts: node 1's first worker fails,
    # node 0's run until the manager's restart; the second incarnation ends cleanly.
    "coordinated-node-0": dict(codes={0: [RUN, exits(0)], 1: [RUN, exits(0)]}),
    "coordinated-node-1": dict(codes={0: [exits(3), exits(0)], 1: [RUN, exits(0)]}, node_rank=1),
    # MindSpore's Ascend ranks with MindIO (stand-ins), the second incarnation resuming from the
    # newest checkpoint; what they say goes on to stderr as it comes.
    "mindio": dict(codes={r: [standin(r, False), standin(r, True)] for r in (0, 1)}, relay=True),
}


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    launcher = fake_msrun.FakeMsrun(**SCENARIOS[scenario])
    if scenario == "node-rank":  # msrun's own options, then the script's
        sys.argv[1:] = ["--worker_num=4", "--local_worker_num", "2", "--node_rank", "1", "train.py",
                        "--node_rank", "7"]
    if scenario == "node-rank-unknown":
        sys.argv[1:] = ["--worker_num", "4", "--local_worker_num", "2", "train.py", "--node_rank", "1"]
    if scenario == "scheduler":
        core.CHILD_GRACE_S = 0.0
        launcher.spawn_other(RUN)  # never ends on its own
    report = {"init": init_taskd_agent({"Framework": "MindSpore"})}
    try:
        for name, fn in launcher.callbacks().items():
            register_func(name, fn)
        report["result"] = start_taskd_agent()
        report["exit"] = 0
    except SystemExit as e:
        report["exit"] = e.code
        raise
    finally:
        report["calls"] = [name for name, _ in launcher.calls if name != "MONITOR"]
        report["kills"] = [arg for name, arg in launcher.calls if name == "KILL_WORKER"]
        report["outputs"] = launcher.worker_output() if launcher.started else {}
        report["alive"] = launcher.alive()
        report["overlaps"] = launcher.overlaps
        with open(out, "w") as f:
            json.dump(report, f)


main()
