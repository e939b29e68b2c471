"""One rank of a real Gloo job for test_gloo.py (needs torch): trains a DDP model on the
loopback interface, calls taskd's Gloo switch between steps as the worker would, and prints one
JSON line with what happened.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python job.py CASE
"""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from taskd.python.framework import gloo

CASE = sys.argv[1]


def train_step(ddp, opt, step):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    x = torch.randn(8, 16, generator=g)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def params_agree(ddp, group):
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    got = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(got, flat, group=group)
    return all(torch.equal(got[0], t) for t in got)


def attempt(ranks, flags, timeout_ms=None):
    t0 = time.monotonic()
    try:
        ok, why = gloo.switch_nic(ranks, flags, timeout_ms), ""
    except gloo.GlooSwitchError as e:
        ok, why = False, str(e)
    return {"ok": ok, "why": why, "s": time.monotonic() - t0}


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    gloo.register_ddp(ddp)
    mine = gloo.new_group()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    before = (id(dist.group.WORLD), id(ddp.process_group), id(mine.current()))
    out = {"rank": rank, "attempts": []}
    for step in range(1, 7):
        train_step(ddp, opt, step)
        if step == 2:
            if CASE == "whole":
                out["attempts"].append(attempt(list(range(world)), [True] * world))
            elif CASE == "subset":
                out["attempts"].append(attempt([0], [True]))
            elif CASE == "one-fails":
                out["attempts"].append(attempt(list(range(world)), [True] * world, 20000))
        if step == 4 and CASE == "whole":
            out["attempts"].append(attempt(list(range(world)), [False] * world))
            out["attempts"].append(attempt(list(range(world)), [False] * world))  # nothing to do
    after = (id(dist.group.WORLD), id(ddp.process_group), id(mine.current()))
    out["replaced"] = [a != b for a, b in zip(before, after)]
    out["ddp_is_world"] = ddp.process_group is dist.group.WORLD
    out["agree_world"] = params_agree(ddp, None)
    out["agree_own"] = params_agree(ddp, mine.current())
    t = torch.ones(1)
    dist.broadcast(t, 0)
    dist.barrier()
    out["sides"] = gloo.sides()
    out["timings"] = (gloo.history() or [{}])[-1]
    out["history"] = gloo.history()
    gloo._reg.reaper.drain()
    out["reaped"] = gloo._reg.reaper.destroyed
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


main()
