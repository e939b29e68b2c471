"""One rank of a real Gloo job for test_gloo.py's in-flight tests (needs torch): trains a DDP
model on the loopback interface with taskd's comm hook; in step ``STUCK`` the last rank is late
to its backward, so the others block in the gradient all-reduce; a thread of each rank then
does what the worker does for an in-flight move: aborts (``in_flight_request({"op":
"abort"})``), agrees on the redo point through the store (the manager's part,
``taskd_core::inflight::agree``: the least completed prefix), and switches with it. Prints one
JSON line: the parameters' digest, the serial replay's, the figures.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python in_flight_job.py CASE

CASE ``move``: the move above; ``give_up``: the abort, then the give-up (the training thread
gets the collective's error); ``none``: no move (the steady state, the hook's plain path).
"""

import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from taskd.python.framework import gloo

CASE = sys.argv[1]
STEPS, STUCK, LATE_S = 12, 6, 1.0
LR = 0.05


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g)


def replay(world):
    m = model()
    ps = list(m.parameters())
    for step in range(1, STEPS + 1):
        acc = [torch.zeros_like(p) for p in ps]
        for r in range(world):
            m.zero_grad()
            m(batch(step, r)).pow(2).mean().backward()
            for a, p in zip(acc, ps):
                a += p.grad
        with torch.no_grad():
            for p, a in zip(ps, acc):
                p -= LR * a / world
    return ps


def control(store, rank, world, out):
    """The worker's and the manager's part of the move, on a thread of its own."""
    time.sleep(LATE_S / 3)
    t0 = time.perf_counter()
    positions = gloo.in_flight_request({"op": "abort", "ranks": list(range(world)),
                                        "use_backup": [True] * world})["collectives"]
    out["abort_ms"] = (time.perf_counter() - t0) * 1000
    store.set("pos/%d" % rank, json.dumps(positions))
    store.wait(["pos/%d" % r for r in range(world)], datetime.timedelta(seconds=30))
    every = [json.loads(store.get("pos/%d" % r)) for r in range(world)]
    redo = {}
    for group in {p["group"] for ps in every for p in ps}:
        redo[group] = min(p["completed"] for ps in every for p in ps if p["group"] == group)
    out["redo"] = redo
    out["positions"] = positions
    if CASE == "give_up":
        gloo.in_flight_request({"op": "give_up", "reason": "the test gives up"})
        return
    gloo.in_flight_request({"op": "switch", "ranks": list(range(world)),
                            "use_backup": [True] * world, "timeout_ms": 20000,
                            "redo": [{"group": g, "from": f} for g, f in redo.items()]})
    out["switched_ms"] = (time.perf_counter() - t0) * 1000


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    ddp = torch.nn.parallel.DistributedDataParallel(model())
    gloo.register_ddp(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    out = {"rank": rank, "case": CASE}
    flag = torch.zeros(1)
    error = None
    t_stuck = None
    for step in range(1, STEPS + 1):
        flag[0] = float(step)
        gloo.all_reduce(flag, op=dist.ReduceOp.MAX)
        assert flag[0] == step, flag
        loss = ddp(batch(step, rank)).pow(2).mean()
        opt.zero_grad()
        if step == STUCK and CASE != "none":
            t = threading.Thread(target=control, args=(store, rank, world, out), daemon=True)
            t.start()
            if rank == world - 1:
                time.sleep(LATE_S)
            t_stuck = time.perf_counter()
        try:
            loss.backward()
        except RuntimeError as e:
            error = str(e)[:200]
            break
        if t_stuck is not None and "backward_ms" not in out:
            out["backward_ms"] = (time.perf_counter() - t_stuck) * 1000
        opt.step()
    if CASE != "none":
        t.join(30)
    out["error"] = error
    out["moves"] = gloo.moves()
    out["sides"] = gloo.sides()
    if error is None:
        got = [p.detach() for p in ddp.module.parameters()]
        want = replay(world)
        out["replay_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(got, want))
        flat = torch.cat([p.reshape(-1) for p in got])
        every = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        out["ranks_agree"] = all(torch.equal(every[0], x) for x in every)
    print(json.dumps(out), flush=True)
    if error is None:
        dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
