"""The end-to-end job: every role a process of its own, through the Python package.

The seed's ``manager.py``; two management processes starting their node's proxy with
``init_taskd_proxy``; four training processes with the seed's worker lines (``train.py``, over
the fake frameworks). Then ``taskd switch --wait`` moves node-1's devices to the backup NIC and
back through the control API, and a third switch fails on rank 1's framework and rolls back.
Checks: each rank's framework got exactly one call per operation (two for the failed one: the
switch and the rollback), with the whole target list, on the training thread (MindSpore's after
``mindspore.runtime.synchronize()``); no training step ran during a call;
training went on after each; the manager's NIC table is empty and the job running at the end;
every rank's framework was last told the same state; every process exits cleanly.

    python run_job.py --framework ms --taskd target/debug/taskd [--python PYTHON]

The package is the one ``PYTHON`` imports (a virtual environment's, or ``$PYTHONPATH``'s);
the fakes are put on the path here. Exit status 0 when every check holds.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

from jobs import WAIT, Proc, reaping, taskd

HERE = os.path.dirname(os.path.abspath(__file__))
FAKES = os.path.join(os.path.dirname(HERE), "fakes")
JOB = "e2e-job"
NODES, PER_NODE = 2, 2


def addr_after(proc, text):
    """The address after ``text`` in the process's next line holding it (another writer may
    share the line: the proxy's native part writes to the same stderr)."""
    return proc.wait_line(text).split(text, 1)[1].split()[0]


def start_job(args, env, procs):
    """Starts every process (listed in ``procs`` as they start) and waits until the manager
    says the job is ready."""
    manager = Proc("manager", [args.python, os.path.join(HERE, "manager.py")],
                   dict(env, TASKD_MANAGER_LISTEN="127.0.0.1:0", TASKD_CONTROL_ADDR="127.0.0.1:0"))
    procs.append(manager)
    port = addr_after(manager, "taskd manager listening on ").rsplit(":", 1)[1]
    control = addr_after(manager, "taskd manager control API on ")
    proxies, proxy_addrs = [], []
    for k in range(NODES):
        p = Proc("node-%d" % k, [args.python, os.path.join(HERE, "management.py"), port, str(k)], env,
                 stdin=True, merged=False)
        procs.append(p)
        proxy_addrs.append(addr_after(p, "taskd proxy listening on "))
        p.wait_line("taskd proxy registered as node-%d" % k)
        proxies.append(p)
    trainers = []
    for r in range(NODES * PER_NODE):
        k = r // PER_NODE
        renv = dict(env, TASKD_PROXY=proxy_addrs[k], RANK_ID=str(r), MS_NODE_RANK=str(k),
                    RANK=str(r), LOCAL_WORLD_SIZE=str(PER_NODE),
                    TRAIN_STEP_CALLS="1" if r % 2 else "0")
        trainers.append(Proc("rank-%d" % r, [args.python, os.path.join(HERE, "train.py"), args.framework], renv,
                             stdin=True, merged=False))
        procs.append(trainers[-1])
    for r, t in enumerate(trainers):
        t.wait_line("taskd worker rank %d registered on node-%d" % (r, r // PER_NODE))
    manager.wait_line("every worker registered, the job is verified")
    return manager, proxies, trainers, control


def operations(args, control, fail_file):
    def switch(node, devs, to):
        return taskd(args, ["switch", "--addr", control, "--job", JOB, "--node", node,
                            "--dev", devs, "--to", to, "--wait"])

    code, out = switch("node-1", "1,0", "backup")
    assert code == 0 and "SUCCEEDED" in out, out
    code, out = switch("node-1", "1,0", "primary")
    assert code == 0 and "SUCCEEDED" in out, out
    with open(fail_file, "w") as f:
        f.write("op3 1")
    code, out = switch("node-0", "0", "backup")
    assert code == 1, out
    assert "rank 1" in out and "returned False" in out, out
    code, out = taskd(args, ["status", "--addr", control, "--job", JOB, "--json"])
    assert code == 0, out
    status = json.loads(out)
    assert status["state"] == "running" and status["ranks_on_backup"] == [], status
    last = status["recent"][-1]
    assert last["result"] == "failed" and last["rolled_back"] is True, last
    assert [e["rank"] for e in last["rank_errors"]] == [1], last


EXPECTED = [
    ([3, 2], [True, True]),  # node-1 devices 1,0 to the backup NIC, in the operator's order
    ([3, 2], [False, False]),  # and back
    ([0], [True]),  # the failed switch (rank 1's framework answers False) ...
    ([0], [False]),  # ... and its rollback
]


def check_rank(r, summary):
    calls = summary["calls"]
    got = [(c["ranks"], c["use_backup"]) for c in calls]
    assert got == EXPECTED, "rank %d: %s" % (r, got)
    assert not any(c["in_step"] for c in calls), "rank %d: a step ran during a call: %s" % (r, calls)
    threads = {c["thread"] for c in calls}
    assert threads == {"MainThread"}, "rank %d: not on the training thread: %s" % (r, threads)
    frameworks = {c["framework"] for c in calls}
    assert frameworks != {"ms"} or all(c["synced"] for c in calls), \
        "rank %d: MindSpore's streams not synchronised before a call: %s" % (r, calls)
    steps = [c["step"] for c in calls]
    assert steps == sorted(steps) and steps[1] > steps[0] and steps[2] > steps[1], (r, steps)
    assert summary["steps"] > steps[-1], "rank %d did not train after the last operation" % r
    return got[-1]


def check_installed(python):
    """The package and the library come from site-packages, not from the repository."""
    code = ("from taskd.python.cython_api import cython_api as c; c.lib(); "
            "print(c.library_path())")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TASKD_LIBRARY")}
    out = subprocess.run([python, "-c", code], env=env, stdout=subprocess.PIPE, check=True,
                         cwd=tempfile.gettempdir(), timeout=WAIT)
    path = out.stdout.decode().strip()
    wanted = "site-packages/taskd/python/cython_api/libs/libtaskd.so"
    assert path.endswith(wanted) and os.path.isfile(path) and not os.path.islink(path), path
    os.environ.pop("PYTHONPATH", None)
    os.environ.pop("TASKD_LIBRARY", None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["ms", "pt"], required=True)
    ap.add_argument("--taskd", required=True, help="the taskd command")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--sink-size", type=int, default=0,
                    help="MindSpore: train in (emulated) sink mode, a step-end callback every N steps")
    ap.add_argument("--installed", action="store_true",
                    help="check that PYTHON imports an installed package and its libtaskd.so")
    args = ap.parse_args()
    if args.installed:
        check_installed(args.python)
    with tempfile.TemporaryDirectory() as tmp:
        fail_file = os.path.join(tmp, "fail")
        path = [FAKES] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, MINDX_TASK_ID=JOB, TASKD_LOG_PATH=tmp, TASKD_STD_LOG_LEVEL="INFO",
                   MS_ENABLE_TFT="{TTP:1,TSP:1}", HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1",
                   FAKE_FRAMEWORK_FAIL_FILE=fail_file, PYTHONPATH=os.pathsep.join(path),
                   TRAIN_SINK_SIZE=str(args.sink_size))
        env["TASKD_TEST_JOB"] = "%s-%d" % (JOB, os.getpid())
        procs = []
        with reaping(procs, env["TASKD_TEST_JOB"]):
            manager, proxies, trainers, control = start_job(args, env, procs)
            operations(args, control, fail_file)
            last, held = set(), set()
            for r, t in enumerate(trainers):
                code, out = t.finish()
                assert code == 0, "rank %d exited %s:\n%s" % (r, code, t.output())
                summary = json.loads(out)
                last.add(json.dumps(check_rank(r, summary)))
                steps = [c["step"] for c in summary["calls"]]
                held.add(tuple(steps))
                assert all(s % max(1, args.sink_size) == 0 for s in steps), (r, steps)
            assert len(held) == 1, "the ranks were held after different steps: %s" % held
            # Every communication group agrees on its NIC configuration: one framework state.
            assert len(last) == 1, last
            for p in proxies:
                code, out = p.finish()
                assert (code, out) == (0, "destroy_taskd_proxy True\n"), (code, out, p.output())
            manager.p.send_signal(signal.SIGTERM)
            assert manager.p.wait(WAIT) == 0, manager.output()
            manager.wait_line("taskd manager stopped: SIGTERM")
    sink = " in sink mode (%d steps a callback)" % args.sink_size if args.sink_size else ""
    print("end-to-end job (%s%s): every check holds" % (args.framework, sink))


if __name__ == "__main__":
    main()
