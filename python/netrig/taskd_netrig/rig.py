"""What every scenario shares: the rig's size and tools, the report of one scenario, the byte
accounting per phase and the check of the parameters against a serial replay."""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional

from taskd_netrig import model as problem
from taskd_netrig import net
from taskd_netrig.job import Job

#: Bytes per probe round the Linux HAL's probe sends and receives on one interface per peer
#: (see ``Rig.proxy_hal``): echo requests and their replies.
PROBE_COUNT, PROBE_SIZE = 8, 1400


class Rig:
    def __init__(self, nodes: int, per_node: int, taskd: str, python: str, compute_ms: float,
                 workdir: str, hal: str, lib: Optional[str]):
        self.nodes, self.per_node = nodes, per_node
        self.world = nodes * per_node
        self.taskd, self.python, self.compute_ms = taskd, python, compute_ms
        self.workdir, self.hal = workdir, hal
        self.env: Dict[str, str] = {}
        if lib:
            self.env["TASKD_LIBRARY"] = lib
        pkg = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.env["PYTHONPATH"] = os.pathsep.join(
            [pkg] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

    def proxy_hal(self, k: int) -> dict:
        """The proxy's node HAL, by its ``node_hal`` value: the kernel's view of the node's
        interfaces (``linux``, with the file naming them), or every link up (``sim``)."""
        if self.hal == "sim":
            return {"node_hal": "sim"}
        path = os.path.join(self.workdir, "links-node-%d.json" % k)
        peers = {side: [net.addr(side, j) for j in range(self.nodes) if j != k] for side in net.DATA}
        with open(path, "w") as f:
            json.dump({
                "devices": {str(d): {"primary": "pri", "backup": "bak"} for d in range(self.per_node)},
                "probe": {"primary_peers": peers["pri"], "backup_peers": peers["bak"],
                          "count": PROBE_COUNT, "size": PROBE_SIZE, "timeout_ms": 150,
                          "max_loss": 0.25, "max_rtt_ms": 60},
            }, f, indent=1)
        return {"node_hal": "linux", "linux_links": path}

    def job(self, name: str, **kw) -> Job:
        return Job(self, os.path.join(self.workdir, name), **kw)

    def devices(self) -> List[int]:
        return list(range(self.per_node))


def bytes_between(samples: List, t0: float, t1: float) -> Dict[str, int]:
    """Bytes per interface between the samples nearest ``t0`` (at or before) and ``t1`` (at or
    after)."""
    before = [s for s in samples if s[0] <= t0] or samples[:1]
    after = [s for s in samples if s[0] >= t1] or samples[-1:]
    return net.delta(before[-1][1], after[0][1])


def bytes_within(samples: List, t0: float, t1: float) -> Dict[str, int]:
    """Bytes per interface between the first sample at or after ``t0`` and the last at or
    before ``t1``: only what moved inside the window (the sampler's period would otherwise
    count traffic from before it)."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return {k: 0 for k in (samples[-1][1] if samples else {})}
    return net.delta(inside[0][1], inside[-1][1])


def plane_bytes(b: Dict[str, int], nodes: List[int], plane: str) -> int:
    return sum(b.get("n%d/%s" % (k, plane), 0) for k in nodes)


def params_check(job: Job, world: int) -> dict:
    """Whether every rank ended with the same parameters and they equal a serial replay of the
    same steps (the largest difference, for the record)."""
    import torch

    results = job.results()
    if len(results) != world:
        return {"params_match_replay": False, "why": "%d of %d ranks wrote results" % (len(results), world)}
    steps = {r["steps"] for r in results}
    if len(steps) != 1:
        return {"params_match_replay": False, "why": "ranks ended at different steps: %s" % sorted(steps)}
    step = steps.pop()
    got = [torch.load(os.path.join(job.run_dir, "params%d.pt" % r)) for r in range(world)]
    identical = all(all(torch.equal(a, b) for a, b in zip(got[0], g)) for g in got[1:])
    want = problem.replay(step, world)
    diff = max(float((a - b).abs().max()) for a, b in zip(got[0], want))
    return {"params_match_replay": identical and diff <= 1e-5, "ranks_identical": identical,
            "replay_max_abs_diff": diff, "steps": step}


def step_series(job: Job) -> List[dict]:
    s = job.steps()
    return [{"step": b["step"], "t": b["t"], "ms": (b["t"] - a["t"]) * 1000} for a, b in zip(s, s[1:])]


def stall_ms(series: List[dict], t0: float, t1: float) -> float:
    """The longest step around ``[t0, t1]`` minus the median step: what the job lost."""
    if not series:
        return 0.0
    median = sorted(x["ms"] for x in series)[len(series) // 2]
    around = [x["ms"] for x in series if t0 <= x["t"] <= t1 + 1.0]
    return max(0.0, max(around, default=median) - median)


def phase_bytes(samples: List, marks: List[tuple]) -> List[dict]:
    """Bytes per interface in each phase between consecutive marks ``(name, t)``."""
    out = []
    for (name, t0), (_, t1) in zip(marks, marks[1:]):
        out.append({"phase": name, "seconds": round(t1 - t0, 3), "bytes": bytes_between(samples, t0, t1)})
    return out


def now() -> float:
    return time.time()
