"""What taskd's comm hook costs a DDP step in the steady state (no move): the rig's model and
step (an MLP of 74k parameters, a batch of 16, 20 ms of simulated compute, one stop-flag
all-reduce) on Gloo over loopback, ``WORLD`` processes, with the hook (every bucket numbered,
its input kept, the all-reduce through taskd's sequencer) and without it (DDP's own all-reduce
hook, ``TASKD_GLOO_IN_FLIGHT=off``, the flag through ``torch.distributed.all_reduce``).
Alternating runs of ``STEPS`` steps; prints the median step time of each and the difference.

    PYTHONPATH=python:python/netrig TORCH_PYTHON python3 python/bench/comm_hook.py [WORLD ...]

Needs torch; BENCHMARKS.md has the figures.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time

STEPS, RUNS, COMPUTE_MS = 150, 3, 20.0


def rank_main():
    import datetime

    import torch
    import torch.distributed as dist

    from taskd.python.framework import gloo
    from taskd_netrig import model as problem

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    hook = gloo.in_flight_enabled()
    ddp = torch.nn.parallel.DistributedDataParallel(problem.make_model())
    gloo.register_ddp(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=problem.LR)
    flag = torch.zeros(1)
    times = []
    for step in range(1, STEPS + 1):
        t0 = time.perf_counter()
        if hook:
            gloo.all_reduce(flag, op=dist.ReduceOp.MAX)
        else:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        time.sleep(COMPUTE_MS / 1000.0)
        loss = problem.loss_of(ddp, step, rank)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
    if rank == 0:
        print(json.dumps(times[20:]))
    dist.destroy_process_group()


def run(world, hook):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                   TASKD_GLOO_IN_FLIGHT="on" if hook else "off", TASKD_STD_LOG_LEVEL="WARNING")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    out = [p.communicate(timeout=600)[0] for p in procs]
    return json.loads(out[0].decode().strip().splitlines()[-1])


def main(worlds):
    for world in worlds:
        with_hook, without = [], []
        for _ in range(RUNS):
            without += run(world, False)
            with_hook += run(world, True)
        a, b = statistics.median(without), statistics.median(with_hook)
        print("world %d: step %.2f ms without the hook, %.2f ms with it: %+.2f ms (%+.2f %%)" % (
            world, a, b, b - a, 100 * (b - a) / a), flush=True)


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main()
    else:
        main([int(w) for w in sys.argv[1:]] or [4, 6, 8])
