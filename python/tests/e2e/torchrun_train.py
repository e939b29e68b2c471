"""A training process of the torchrun job (``torchrun_job.py``): real torch, DDP over Gloo, the
seed's worker lines with ``"pt"`` after ``torch.distributed`` is initialised, and the stand-in
``torch_npu`` (``python/tests/standin``). taskd's optimizer hook is the gate. Training ends on
every rank at the same step once ``$TRAIN_STOP_FILE`` exists on any rank; then the process
writes ``$TRAIN_OUT/rank-R.json`` (steps, the framework's calls, parameters, incarnation)."""

import json
import os
import time

import torch
import torch.distributed as dist
import torch_npu
from torch.nn.parallel import DistributedDataParallel

from taskd.api import init_taskd_worker, start_taskd_worker


def init_process_group():
    """Gloo's group, its rendezvous keys under this incarnation's prefix in torchrun's store: a
    restarted process must not read the addresses its predecessors left there."""
    env = os.environ
    world = int(env["WORLD_SIZE"])
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False)
    prefix = "incarnation-%s" % env.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=int(env["RANK"]),
                            world_size=world)


def main():
    init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)

    init_taskd_worker(int(os.environ["RANK"]), 5000, "pt")
    start_taskd_worker()
    stop_file = os.environ["TRAIN_STOP_FILE"]
    steps = 0
    first = last = None  # when the first and the last step ended
    while True:
        x = torch.randn(4, 8, generator=data)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # taskd's optimizer hook: the gate
        steps += 1
        torch_npu.npu.step = steps
        last = time.monotonic()
        first = last if first is None else first
        stop = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
    out = os.path.join(os.environ["TRAIN_OUT"], "rank-%d.json" % rank)
    with open(out, "w") as f:
        json.dump({"steps": steps, "seconds": last - first, "calls": torch_npu.npu.calls,
                   "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                   "params": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
    dist.destroy_process_group()


main()
