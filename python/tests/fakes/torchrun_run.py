"""One scenario of taskd's agent under a FAKE torchrun, in a process of its own (as torchrun
is): ``python torchrun_run.py SCENARIO OUT``. The fake elastic agent's ``_invoke_run`` is
patched as ``import taskd.python.adaptor.patch`` patches torch's; ``OUT`` receives what
happened (JSON) whatever the exit. The exit status is torchrun's: 1 for a failed
``RunResult`` (torch's launcher raises ``ChildFailedError``)."""

import json
import os
import signal
import sys

import fake_torchrun
from fake_torchrun import KILLED, RUN, DynamicRendezvous, FakeElasticAgent, StaticRendezvous, exits
from taskd.python.adaptor import torchrun as torch_patch


def terminate_me(_agent):
    os.kill(os.getpid(), signal.SIGTERM)


def a_node_waits_once(agent):
    if agent.started == 1:
        agent._worker_group.spec.rdzv_handler.waiting = 1


SCENARIOS = {
    "clean": dict(codes={0: [exits(0)], 1: [exits(0)]}),
    "killed": dict(codes={0: [KILLED, exits(0)], 1: [RUN, exits(0)]}, max_restarts=1),
    "bounded": dict(codes={0: [KILLED], 1: [RUN]}, max_restarts=1),
    "no-restart": dict(codes={0: [KILLED], 1: [RUN]}),
    "recover": dict(codes={0: [KILLED, KILLED, exits(0)], 1: [RUN, RUN, exits(0)]}),
    "sigterm": dict(codes={0: [RUN], 1: [RUN]}, max_restarts=3),
    "dynamic": dict(codes={0: [KILLED, exits(0)], 1: [RUN, exits(0)]}, max_restarts=1,
                    rdzv=DynamicRendezvous(assigned=1), nodes=2),
    "rejoin": dict(codes={0: [RUN, exits(0)], 1: [RUN, exits(0)]}),
}
ON_START = {"sigterm": terminate_me, "rejoin": a_node_waits_once}


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    agent = FakeElasticAgent(**SCENARIOS[scenario])
    agent.on_start = ON_START.get(scenario)
    torch_patch.patch_torch_method(FakeElasticAgent)
    report = {}
    code = 0
    try:
        result = agent.run()
        report["state"] = result.state.value
        report["failures"] = {str(g): f.exitcode for g, f in result.failures.items()}
        code = 1 if result.is_failed() else 0
    except SystemExit as e:
        report["exit"] = e.code
        raise
    finally:
        handler = agent._worker_group.spec.rdzv_handler
        report["calls"] = agent.calls
        report["rounds"] = getattr(handler, "rounds", None)
        report["outputs"] = [json.loads(o) for o in agent.worker_outputs().values() if o.strip()]
        report["alive"] = agent.alive()
        report["overlaps"] = agent.overlaps
        report["init"] = True
        with open(out, "w") as f:
            json.dump(report, f)
    sys.exit(code)


main()
