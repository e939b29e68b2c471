"""One process of a real Gloo job of one rank for test_gloo.py (needs torch): whether DDP will
rebuild its buckets, a broadcast outside taskd's sequencer, after its group is moved by taskd
(``gloo._move_ddp``) and after DDP's own ``_update_process_group``. Prints one JSON line.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=p python ddp_move.py
"""

import json

import torch
import torch.distributed as dist

from taskd.python.framework import gloo


def steps(ddp, n):
    for _ in range(n):
        ddp(torch.ones(4, 8)).sum().backward()


def main():
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    steps(ddp, 3)  # DDP rebuilds its buckets once, at the second forward
    out = {"rebuilt_before": ddp._has_rebuilt_buckets}
    gloo._move_ddp(ddp, dist.new_group(backend="gloo"))
    steps(ddp, 3)
    out["rebuilt_after_taskds_move"] = ddp._has_rebuilt_buckets
    out["rebuilds_after_taskds_move"] = ddp.reducer._rebuild_buckets()
    ddp._update_process_group(dist.new_group(backend="gloo"))
    steps(ddp, 1)
    out["rebuilds_after_ddps_own_update"] = ddp.reducer._rebuild_buckets()
    print(json.dumps(out), flush=True)


main()
