"""The rig's scenarios. Each returns its report entry (``name``, ``passed``, ``operations``,
``bytes_while_switched``, ``fault_to_backup_ms``, ``steps``, ``params_match_replay``, phases,
stall, checks) and leaves nothing running."""

from __future__ import annotations

import glob
import os
import re
import time
from typing import Callable, Dict, List

from taskd_netrig import net
from taskd_netrig.job import Job, RigError, Sampler
from taskd_netrig.rig import (PROBE_COUNT, PROBE_SIZE, Rig, bytes_between, bytes_within, now, params_check,
                           phase_bytes, plane_bytes, stall_ms, step_series)

#: Bytes on an interface that are not training traffic while it is not used: ARP.
SLACK = 2048


def op_ok(summary: dict) -> bool:
    """``taskd switch --json``'s result event says it succeeded (and the command exited 0)."""
    result = summary.get("result") or {}
    return summary.get("exit_status") == 0 and result.get("result") == "succeeded"


def probe_budget(sc: "Scenario", seconds: float) -> int:
    """What the Linux HAL's probe may send and receive on one interface in ``seconds``: the
    automatic failover's rounds, else the link check of an operation or two. Each round sends
    a train to every peer and answers every peer's train (requests and replies both ways)."""
    rig = sc.rig
    if rig.hal != "linux":
        return 0
    auto = sc.job.auto
    rounds = (int(seconds * 1000 / auto["link_probe_ms"]) if auto else 0) + 2
    return rounds * (rig.nodes - 1) * PROBE_COUNT * 4 * (PROBE_SIZE + 42)


class Scenario:
    """A job's run with marks on the clock, the counters sampled, and the report's checks."""

    def __init__(self, rig: Rig, name: str, **job):
        self.rig, self.name = rig, name
        self.job: Job = rig.job(name, **job)
        self.marks: List[tuple] = []
        self.checks: Dict[str, bool] = {}
        self.operations: List[dict] = []
        self.extra: dict = {}
        self.sampler = None

    def mark(self, name: str) -> float:
        t = now()
        self.marks.append((name, t))
        return t

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        return ok

    def switch(self, targets: List[tuple], expect_ok: bool = True) -> dict:
        s = self.job.switch(targets)
        self.operations.append(s)
        self.check("operation %d %s" % (len(self.operations), "succeeded" if expect_ok else "refused"),
                   op_ok(s) == expect_ok)
        return s

    def run(self, body: Callable[["Scenario"], None]) -> dict:
        self.sampler = Sampler(self.rig.nodes)
        error = None
        try:
            self.job.start()
            self.mark("start")
            body(self)
            self.mark("end")
            codes = self.job.stop()
            self.check("every process exited 0", codes == [0] * len(codes))
        except RigError as e:
            error = str(e)
        finally:
            self.job.close()
            self.sampler.stop()
        return self.report(error)

    def report(self, error) -> dict:
        series = step_series(self.job)
        params = params_check(self.job, self.rig.world) if error is None else {"params_match_replay": False}
        if error is None:
            self.check("parameters equal the serial replay", params["params_match_replay"])
        out = {"name": self.name, "passed": error is None and all(self.checks.values()),
               "error": error, "checks": self.checks, "operations": self.operations,
               "steps": params.get("steps", self.job.last_step()),
               "params_match_replay": params["params_match_replay"], "params": params,
               "phases": phase_bytes(self.sampler.samples, self.marks),
               "marks": [{"name": n, "t": round(t, 3)} for n, t in self.marks],
               "step_ms_median": _median([x["ms"] for x in series]),
               "restarts": restarts(self.job, self.rig.world), "steps_lost": steps_lost(self.job)}
        out["gloo_rebuild_ms"] = _rebuilds(self.job.results())
        if error is None and "t_fault" in self.extra:
            # The ranks write what they did when they exit: read after the job's end.
            self.extra["in_flight"] = in_flight_report(self, self.extra["t_fault"])
            self.check("no process restarted", self.extra["in_flight"]["restarts"] == 0)
            self.check("no step lost", self.extra["in_flight"]["steps_lost"] == 0)
            # The first step finished on the backup, from the step log (the interfaces' byte
            # counters are read every 100 ms and judged in half seconds: kept beside it).
            if self.extra["in_flight"].get("training_on_backup_ms") is not None:
                self.extra["first_backup_bytes_ms"] = self.extra.get("fault_to_backup_ms")
                self.extra["fault_to_backup_ms"] = self.extra["in_flight"]["training_on_backup_ms"]
            out["passed"] = all(self.checks.values())
        out.update(self.extra)
        out["series"] = {"steps": [[round(x["t"], 3), round(x["ms"], 2)] for x in series],
                         "bytes": _plane_series(self.sampler.samples, self.rig.nodes)}
        return out


def _rebuilds(results: List[dict]) -> List[float]:
    """Each Gloo switch's rebuild time, the slowest rank's (ms), in the order they ran."""
    per_rank = [[h["rebuild_ms"] for h in r.get("switches", [])] for r in results]
    if not per_rank:
        return []
    return [round(max(col), 2) for col in zip(*per_rank)]


def _median(xs: List[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def _plane_series(samples: List, nodes: int) -> Dict[str, List]:
    """Bytes per second per plane (every node's interfaces) between consecutive samples."""
    out: Dict[str, List] = {p: [] for p in net.DATA}
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        d = net.delta(a, b)
        for p in net.DATA:
            out[p].append([round(t1, 3), round(plane_bytes(d, list(range(nodes)), p) / (t1 - t0))])
    return out


def switched_bytes(sc: Scenario, nodes: List[int], t0: float, t1: float) -> dict:
    b = bytes_within(sc.sampler.samples, t0, t1)
    return {"primary": plane_bytes(b, nodes, "pri"), "backup": plane_bytes(b, nodes, "bak")}


def _quiet_primary(sc: Scenario, moved: Dict[str, int], seconds: float, nodes: int) -> bool:
    budget = probe_budget(sc, seconds) * nodes + SLACK * nodes
    sc.extra["primary_budget_bytes"] = budget
    return moved["primary"] <= budget and moved["backup"] > 0


def maintenance(rig: Rig) -> dict:
    """Every device to its backup NIC, the primary cables pulled, training, the cables back,
    every device back to its primary NIC."""
    every = list(range(rig.nodes))

    def body(sc: Scenario) -> None:
        sc.job.wait_steps(20)
        sc.mark("switch to backup")
        sc.switch([(k, rig.devices(), "backup") for k in every])
        t_on = sc.mark("on backup")
        for k in every:
            net.set_cable(k, "pri", False)
        sc.mark("primary cables pulled")
        sc.job.wait_steps(60)
        for k in every:
            net.set_cable(k, "pri", True)
        wait_until(lambda: all(net.link_up(k, "pri") for k in every), 30, "the primaries up again")
        sc.mark("primary cables back")
        sc.job.wait_steps(10)
        t_off = sc.mark("switch back")
        sc.switch([(k, rig.devices(), "primary") for k in every])
        sc.mark("on primary")
        sc.job.wait_steps(30)
        moved = switched_bytes(sc, every, t_on, t_off)
        sc.extra["bytes_while_switched"] = moved
        sc.check("no training bytes on the primary interfaces while switched",
                 _quiet_primary(sc, moved, t_off - t_on, rig.nodes))
        back = bytes_between(sc.sampler.samples, sc.marks[-1][1], now())
        sc.check("training back on the primary plane", plane_bytes(back, every, "pri") > plane_bytes(back, every, "bak"))
        sc.extra["stall_ms"] = [stall_ms(step_series(sc.job), m[1], m[1]) for m in sc.marks
                                if m[0] in ("switch to backup", "switch back")]

    return Scenario(rig, "maintenance").run(body)


def subset(rig: Rig) -> dict:
    """Part of one node refused up front; then one node's devices alone to the backup NIC
    (its routes follow) and back."""
    k = rig.nodes - 1

    def body(sc: Scenario) -> None:
        sc.job.wait_steps(20)
        if rig.per_node > 1:
            refused = sc.switch([(k, [0], "backup")], expect_ok=False)
            sc.check("the partial node's refusal says what moves", "share node" in str(refused))
        sc.job.wait_steps(10)
        sc.mark("switch node to backup")
        sc.switch([(k, rig.devices(), "backup")])
        t_on = sc.mark("node on backup")
        sc.job.wait_steps(60)
        t_off = sc.mark("switch back")
        sc.switch([(k, rig.devices(), "primary")])
        sc.mark("on primary")
        sc.job.wait_steps(20)
        moved = switched_bytes(sc, [k], t_on, t_off)
        sc.extra["bytes_while_switched"] = moved
        sc.extra["switched_nodes"] = ["node-%d" % k]
        sc.check("no training bytes on the switched node's primary while switched",
                 _quiet_primary(sc, moved, t_off - t_on, 1))

    return Scenario(rig, "subset").run(body)


def link_dies(rig: Rig) -> dict:
    """A node's primary cable pulled for good while its all-reduces run, the automatic failover
    on with ``abort_in_flight``: the failover sees the carrier go, the move aborts the
    collectives stuck on the dead link, rebuilds the groups on the backup and finishes the step
    there. No process restarts, no step is lost; the parameters equal the serial replay."""
    k = rig.nodes - 1

    def body(sc: Scenario) -> None:
        sc.job.wait_steps(30)
        t_fault = sc.mark("primary cable of node-%d pulled" % k)
        net.set_cable(k, "pri", False)
        wait_until(lambda: auto_ops(sc.job, "to_backup"), 60, "the automatic failover", period=0.1)
        sc.mark("moved by the automatic failover")
        sc.job.wait_steps(30)
        t_end = sc.mark("trained on the backup")
        ops = auto_ops(sc.job, "to_backup")
        sc.operations.extend(ops)
        sc.check("the in-flight move succeeded", any(o.get("result") == "succeeded" for o in ops))
        moved = switched_bytes(sc, [k], sc.marks[-2][1], t_end)
        sc.extra.update(bytes_while_switched=moved, switched_nodes=["node-%d" % k],
                        fault_to_backup_ms=_first_bytes_ms(sc, k, "bak", t_fault, t_fault))
        sc.check("node-%d's dead primary carries nothing" % k, moved["primary"] <= SLACK)
        sc.extra["t_fault"] = t_fault

    sc = Scenario(rig, "link-dies", collective_timeout_s=60.0, auto=AUTO_IN_FLIGHT)
    try:
        return sc.run(body)
    finally:
        net.set_cable(k, "pri", True)


def in_flight_report(sc: Scenario, t_fault: float) -> dict:
    """What the ranks and the manager say of the in-flight move after ``t_fault``: when the
    abort started, how long it, the rebuild and the redo took, how long the training threads
    waited mid-step, the first step finished on the backup, restarts and steps lost."""
    results = sc.job.results()
    # Each rank's first move after the fault is the one that answers it (a later one moves
    # what the fault's consequences moved: with two nodes, the survivor's probe has lost its
    # only peer on the primary plane and calls its own primary degraded).
    firsts = [[m for m in r.get("in_flight", []) if m.get("t_abort", 0) >= t_fault][:1] for r in results]
    moves = [m for ms in firsts for m in ms]
    out: dict = {"ranks_moved": len(moves),
                 "moves_after_fault": sum(len(r.get("in_flight", [])) for r in results)}
    if moves:
        t_abort = min(m["t_abort"] for m in moves)
        t_switched = max(m.get("t_switched", t_abort) for m in moves)
        out.update(
            abort_started_ms=round((t_abort - t_fault) * 1000),
            abort_ms=round(max(m["abort_ms"] for m in moves), 1),
            sockets_shut=sum(m.get("sockets_shut", 0) for m in moves),
            rebuild_ms=round(max(m.get("rebuild_ms", 0.0) for m in moves), 1),
            switched_ms=round((t_switched - t_fault) * 1000),
            redone_collectives=[m.get("redone") for m in moves],
            waited_mid_step_ms=round(max(m.get("waited_ms", 0.0) for m in moves), 1))
        after = [x for x in sc.job.steps() if x["t"] > t_switched]
        if after:
            out["training_on_backup_ms"] = round((after[0]["t"] - t_fault) * 1000)
    ops = [o for o in sc.operations if o.get("direction") == "to_backup"]
    if ops:
        out["operation_phases_ms"] = ops[0].get("phases_ms")
    out["detected_ms"] = _decided_ms(sc.job, t_fault)
    out["restarts"] = restarts(sc.job, sc.rig.world)
    out["steps_lost"] = steps_lost(sc.job)
    return out


def restarts(job: Job, world: int) -> int:
    """Training processes started again: every start past the first of each rank."""
    path = os.path.join(job.run_dir, "starts.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return max(0, sum(1 for line in f if line.strip()) - world)


def steps_lost(job: Job) -> int:
    """Steps rank 0 logged more than once or never, between its first and last (a restart from
    a checkpoint logs the steps since it twice: they were lost)."""
    steps = [x["step"] for x in job.steps()]
    if not steps:
        return 0
    want = set(range(steps[0], steps[-1] + 1))
    return (len(steps) - len(set(steps))) + len(want - set(steps))


def _decided_ms(job: Job, t_fault: float):
    """From the fault to the manager's first automatic decision after it (its log line)."""
    import datetime as _dt

    with open(job.manager.log.name, errors="replace") as f:
        for line in f:
            if "automatic failover:" not in line or "to_backup" not in line:
                continue
            m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z?", line)
            if not m:
                continue
            t = _dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=_dt.timezone.utc).timestamp()
            if t >= t_fault - 1:
                return round((t - t_fault) * 1000)
    return None


def _auto_results(job: Job) -> List[dict]:
    """The automatic operations' results the manager still reports (none if it cannot)."""
    try:
        return [r for r in job.status().get("recent", []) if r.get("trigger") == "auto"]
    except (RigError, ValueError):
        return []


def _auto_lines(job: Job) -> List[str]:
    """The automatic failover's decisions, as the manager logged them."""
    out = []
    with open(job.manager.log.name, errors="replace") as f:
        for line in f:
            if "automatic failover:" in line or "automatic operation" in line:
                out.append(re.sub(r"\x1b\[[0-9;]*m", "", line).strip()[:300])
    return out


def _first_error(job: Job) -> str:
    for path in sorted(glob.glob(job.run_dir + "/node-*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                if "Timed out" in line or "Connection closed" in line or "Error" in line:
                    return line.strip()[:300]
    return ""


def _first_bytes_ms(sc: Scenario, k: int, plane: str, after: float, t_fault: float):
    """From the fault to the first half second after ``after`` in which node k's ``plane``
    interface carried training traffic: more than three times what the probe may send."""
    key = "n%d/%s" % (k, plane)
    samples = [s for s in sc.sampler.samples if s[0] >= after]
    for i, (t0, a) in enumerate(samples):
        later = [s for s in samples[i:] if s[0] >= t0 + 0.5]
        if not later:
            break
        t1, b = later[0]
        moved = (b[key]["rx"] - a[key]["rx"]) + (b[key]["tx"] - a[key]["tx"])
        if moved > max(200_000, 3 * probe_budget(sc, t1 - t0)):
            return round((t0 - t_fault) * 1000)
    return None


def wait_until(pred: Callable[[], bool], timeout: float, what: str, period: float = 0.1) -> float:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RigError("%s did not happen within %.0f s" % (what, timeout))
        time.sleep(period)
    return now()


#: The automatic failover's knobs in the degraded scenario: probe every 500 ms, act after 3
#: degraded probes, a 6 s hold before the switchback.
AUTO = {"auto_failover": True, "link_probe_ms": 500, "down_after": 3, "coalesce_ms": 200,
        "switchback_after_ms": 6000, "min_interval_ms": 1000, "max_flaps": 6,
        "flap_window_ms": 10000}
#: The same with the moves off a failed link made in flight (``abort_in_flight``).
AUTO_IN_FLIGHT = dict(AUTO, abort_in_flight=True)
RATE = "1mbit"


def auto_ops(job: Job, direction: str) -> List[dict]:
    """The automatic operations in ``direction`` the manager reports."""
    recent = job.status().get("recent", [])
    return [r for r in recent if r.get("trigger") == "auto" and r.get("direction") == direction]


def degraded(rig: Rig) -> dict:
    """The last node's primary link rate-limited (``tc tbf``): its probe calls it degraded, the
    automatic failover moves the node's devices to their backup NIC, step time recovers; the
    limit goes, and the switchback follows the hold time."""
    k = rig.nodes - 1
    hold_s = AUTO["switchback_after_ms"] / 1000.0

    def body(sc: Scenario) -> None:
        sc.job.wait_steps(40)
        base = _median([x["ms"] for x in step_series(sc.job)][-30:])
        t_fault = sc.mark("node-%d primary limited to %s" % (k, RATE))
        net.limit(k, "pri", RATE)
        wait_until(lambda: auto_ops(sc.job, "to_backup"), 90, "the automatic failover", period=0.4)
        sc.mark("moved by the automatic failover")
        sc.job.wait_steps(40)
        moved_at = sc.marks[-1][1]
        after = _median([x["ms"] for x in step_series(sc.job) if x["t"] > moved_at + 0.5])
        t_heal = sc.mark("limit removed")
        net.unlimit(k, "pri")
        wait_until(lambda: auto_ops(sc.job, "to_primary"), hold_s + 60, "the switchback", period=0.4)
        t_back = sc.mark("switched back")
        sc.job.wait_steps(20)
        ops = auto_ops(sc.job, "to_backup") + auto_ops(sc.job, "to_primary")
        sc.operations.extend(ops)
        sc.check("the automatic failover moved the degraded node",
                 any(any(t["node"] == "node-%d" % k for t in o.get("targets", [])) for o in ops))
        sc.check("every automatic operation succeeded", all(o.get("result") == "succeeded" for o in ops))
        sc.check("step time recovered on the backup", after <= 1.5 * base + 5)
        sc.check("the switchback came after the hold", t_back - t_heal >= hold_s)
        nodes = sorted({int(t["node"].split("-")[1]) for o in ops for t in o.get("targets", [])})
        moved = switched_bytes(sc, nodes, moved_at, t_heal)
        sc.extra.update(bytes_while_switched=moved, switched_nodes=["node-%d" % n for n in nodes],
                        fault_to_backup_ms=_first_bytes_ms(sc, k, "bak", t_fault, t_fault),
                        step_ms_before=base, step_ms_on_backup=after,
                        heal_to_switchback_ms=round((t_back - t_heal) * 1000))
        sc.check("no training bytes on the moved nodes' primaries while switched",
                 _quiet_primary(sc, moved, t_heal - moved_at, len(nodes)))
        sc.extra["t_fault"] = t_fault

    return Scenario(rig, "degraded", auto=AUTO_IN_FLIGHT).run(body)


SCENARIOS = {"maintenance": maintenance, "degraded": degraded, "link-dies": link_dies,
             "subset": subset}
