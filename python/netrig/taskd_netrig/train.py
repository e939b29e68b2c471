"""A training process of the rig's job: torch.distributed on Gloo over the node's primary
interface, the worker lines (``init_taskd_worker(rank, 5000, "pt")``, ``start_taskd_worker()``),
a DDP model registered with taskd's Gloo switch (its comm hook lets an in-flight move finish
the step on the backup), and taskd's optimizer hook as the step gate. The stop flag's
all-reduce goes through ``gloo.all_reduce`` for the same reason.

It trains until every rank saw the stop file (the ranks agree on the step through a one-int
all-reduce), logs each step's end time (rank 0), checkpoints every ``--checkpoint-every`` steps
(rank 0) and writes its parameters at the end. ``--resume`` starts from the checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

from taskd.api import init_taskd_worker, start_taskd_worker
from taskd.python.framework import gloo
from taskd_netrig import model as problem


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="the run's directory")
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--collective-timeout-s", type=float, default=60.0)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--resume", action="store_true")
    return ap.parse_args()


def load_checkpoint(run, ddp):
    path = os.path.join(run, "checkpoint.pt")
    saved = torch.load(path)
    with torch.no_grad():
        for p, v in zip(ddp.module.parameters(), saved["params"]):
            p.copy_(v)
    return saved["step"]


def save_checkpoint(run, ddp, step):
    tmp = os.path.join(run, "checkpoint.pt.tmp")
    torch.save({"step": step, "params": [p.detach().clone() for p in ddp.module.parameters()]}, tmp)
    os.replace(tmp, os.path.join(run, "checkpoint.pt"))


def main():
    a = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.collective_timeout_s))
    rank = dist.get_rank()
    with open(os.path.join(a.run, "starts.jsonl"), "a") as f:
        f.write(json.dumps({"rank": rank, "t": time.time(), "resume": a.resume}) + "\n")
    init_taskd_worker(rank, 5000, "pt")
    start_taskd_worker()
    ddp = torch.nn.parallel.DistributedDataParallel(problem.make_model())
    gloo.register_ddp(ddp)
    step = load_checkpoint(a.run, ddp) if a.resume else 0
    opt = torch.optim.SGD(ddp.parameters(), lr=problem.LR)
    log = open(os.path.join(a.run, "steps.jsonl"), "a") if rank == 0 else None
    stop_file = os.path.join(a.run, "stop")
    flag = torch.zeros(1)
    while True:
        flag[0] = 1.0 if os.path.exists(stop_file) else 0.0
        gloo.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag[0] > 0:
            break
        step += 1
        time.sleep(a.compute_ms / 1000.0)  # the step's compute, simulated
        loss = problem.loss_of(ddp, step, rank)
        opt.zero_grad()
        loss.backward()
        opt.step()  # taskd's optimizer hook: the step gate
        if log is not None:
            log.write(json.dumps({"step": step, "t": time.time(), "loss": float(loss.detach())}) + "\n")
            log.flush()
            if step % a.checkpoint_every == 0:
                save_checkpoint(a.run, ddp, step)
    torch.save([p.detach().clone() for p in ddp.module.parameters()],
               os.path.join(a.run, "params%d.pt" % rank))
    with open(os.path.join(a.run, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "steps": step, "sides": gloo.sides(),
                   "switches": gloo.history(), "in_flight": gloo.moves()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
