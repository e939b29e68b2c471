"""One run of the rig's job: the manager in node 0's namespace, a launcher (proxy + training
processes) in every node's, the operator's ``taskd`` command in node 0's; a sampler of every
interface's byte counters; and the end of it all, whatever happened."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Dict, List, Optional

from taskd_netrig import net

MANAGER_PORT = 9601
PROXY_PORT = 9602
CONTROL = "127.0.0.1:9700"
MASTER_PORT = 29500
JOB_ID = "tdrig-job"
WAIT_S = 120.0  # a bound on events that take milliseconds to seconds


class RigError(Exception):
    """The job did not do what a scenario needed; the text says what and where."""


class Proc:
    """A child process whose stderr lines are kept and can be waited for."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str], log_path: str):
        self.name = name
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                  stderr=subprocess.PIPE, start_new_session=True)
        self.lines: "queue.Queue" = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in iter(self.p.stderr.readline, b""):
            line = raw.decode(errors="replace")
            self.log.write(line)
            self.log.flush()
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, text: str, timeout: float = WAIT_S) -> str:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise RigError("%s: %r never came (see %s)" % (self.name, text, self.log.name))
            if text in line:
                return line

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def close_log(self) -> None:
        """Once the process is gone: the rest of its stderr into the log, and the log closed."""
        self._reader.join(10)
        self.log.close()

    def wait(self, timeout: float = WAIT_S) -> Optional[int]:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class Sampler:
    """Every interface's counters every ``period`` seconds, with their time."""

    def __init__(self, nodes: int, period: float = 0.1):
        self.nodes, self.period = nodes, period
        self.samples: List = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), net.counters(self.nodes)))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


class Job:
    """The job of ``nodes`` x ``per_node`` ranks, configured by ``opts``."""

    def __init__(self, rig, run_dir: str, auto: Optional[dict] = None, resume: bool = False,
                 collective_timeout_s: float = 60.0, start_on_backup: bool = False):
        self.rig, self.run_dir = rig, run_dir
        self.auto, self.resume = auto, resume
        self.collective_timeout_s = collective_timeout_s
        self.start_on_backup = start_on_backup
        self.manager: Optional[Proc] = None
        self.launchers: List[Proc] = []
        os.makedirs(run_dir, exist_ok=True)

    # ---- starting ------------------------------------------------------------------------

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(self.rig.env)
        # The rig's own processes (python -m taskd_netrig.roles, .train, .route) find it here.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in paths if p != here])
        env.update(MINDX_TASK_ID=JOB_ID, TASKD_LOG_PATH=self.run_dir, TASKD_STD_LOG_LEVEL="INFO",
                   MS_ENABLE_TFT="{TTP:1,TSP:1}", PYTHONUNBUFFERED="1")
        return env

    def start(self) -> None:
        cfg = {"job_id": JOB_ID, "node_nums": self.rig.nodes, "proc_per_node": self.rig.per_node,
               "listen": "%s:%d" % (net.addr("mg", 0), MANAGER_PORT), "control_addr": CONTROL}
        if self.auto:
            cfg.update(self.auto)
        argv = net.exec_argv(0, [self.rig.python, "-m", "taskd_netrig.roles", "manager", json.dumps(cfg)])
        self.manager = Proc("manager", argv, self._env(), os.path.join(self.run_dir, "manager.log"))
        self.manager.wait_line("taskd manager control API on")
        for k in range(self.rig.nodes):
            argv = net.exec_argv(k, [self.rig.python, "-m", "taskd_netrig.roles", "launcher",
                                     json.dumps(self._launcher(k))])
            self.launchers.append(Proc("node-%d" % k, argv, self._env(),
                                       os.path.join(self.run_dir, "node-%d.log" % k)))
        self.manager.wait_line("every worker registered, the job is verified")

    def _launcher(self, k: int) -> dict:
        proxy = {"UpstreamAddr": net.addr("mg", 0), "UpstreamPort": str(MANAGER_PORT),
                 "ListenAddr": "127.0.0.1", "ListenPort": str(PROXY_PORT), "ServerRank": str(k)}
        proxy.update(self.rig.proxy_hal(k))
        start = "bak" if self.start_on_backup else "pri"
        ranks = []
        for local in range(self.rig.per_node):
            rank = k * self.rig.per_node + local
            ranks.append({
                "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(self.rig.world),
                "LOCAL_WORLD_SIZE": str(self.rig.per_node), "GROUP_RANK": str(k),
                "MASTER_ADDR": net.addr("mg", 0), "MASTER_PORT": str(MASTER_PORT),
                "GLOO_SOCKET_IFNAME": start, "TASKD_PROXY": "127.0.0.1:%d" % PROXY_PORT,
                "TASKD_GLOO_PRIMARY_IFNAME": "pri", "TASKD_GLOO_BACKUP_IFNAME": "bak",
                "TASKD_GLOO_ROUTE_CMD": "%s -S -m taskd_netrig.route --src %s" % (
                    self.rig.python, net.addr("bak", k)),
            })
        argv = [self.rig.python, "-m", "taskd_netrig.train", "--run", self.run_dir,
                "--compute-ms", str(self.rig.compute_ms),
                "--collective-timeout-s", str(self.collective_timeout_s)]
        if self.resume:
            argv.append("--resume")
        return {"proxy": proxy, "ranks": ranks, "argv": argv}

    # ---- while it runs -------------------------------------------------------------------

    def steps(self) -> List[dict]:
        path = os.path.join(self.run_dir, "steps.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def last_step(self) -> int:
        s = self.steps()
        return s[-1]["step"] if s else 0

    def wait_steps(self, more: int, timeout: float = WAIT_S) -> int:
        """Until rank 0 finished ``more`` steps past now (polling its step log)."""
        target = self.last_step() + more
        end = time.monotonic() + timeout
        while self.last_step() < target:
            if time.monotonic() > end or self.exited():
                raise RigError("training did not reach step %d (at %d)" % (target, self.last_step()))
            time.sleep(0.05)
        return self.last_step()

    def exited(self) -> bool:
        return any(p.p.poll() is not None for p in self.launchers)

    def taskd(self, *args: str) -> subprocess.CompletedProcess:
        argv = net.exec_argv(0, [self.rig.taskd, *args])
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=WAIT_S)

    def switch(self, targets: List[tuple]) -> dict:
        """``taskd switch --wait --json`` with ``(node, devs, to)`` targets; its result line."""
        args = ["switch", "--addr", CONTROL, "--job", JOB_ID]
        for node, devs, to in targets:
            args += ["--node", "node-%d" % node, "--dev", ",".join(map(str, devs)), "--to", to]
        p = self.taskd(*(args + ["--wait", "--json"]))
        events = [json.loads(line) for line in p.stdout.decode().splitlines() if line.startswith("{")]
        if not events:
            raise RigError("taskd switch printed no result (exit %d): %s" % (
                p.returncode, p.stderr.decode(errors="replace").strip()))
        summary = events[-1]
        summary["exit_status"] = p.returncode
        return summary

    def status(self) -> dict:
        p = self.taskd("status", "--addr", CONTROL, "--job", JOB_ID, "--json")
        if p.returncode != 0:
            raise RigError("taskd status: %s" % p.stderr.decode(errors="replace").strip())
        return json.loads(p.stdout.decode())

    # ---- the end -------------------------------------------------------------------------

    def stop(self) -> List[Optional[int]]:
        """Asks training to stop (every rank at the same step); the launchers' exit statuses."""
        open(os.path.join(self.run_dir, "stop"), "w").close()
        return [p.wait() for p in self.launchers]

    def results(self) -> List[dict]:
        out = []
        for r in range(self.rig.world):
            path = os.path.join(self.run_dir, "rank%d.json" % r)
            if os.path.exists(path):
                with open(path) as f:
                    out.append(json.load(f))
        return out

    def close(self) -> None:
        """Ends every process of the job that still runs (training, proxies, manager)."""
        for p in self.launchers:
            p.signal(signal.SIGTERM)
        for p in self.launchers:
            if p.wait(10) is None:
                p.signal(signal.SIGKILL)
                p.wait(10)
        if self.manager is not None:
            self.manager.signal(signal.SIGTERM)
            if self.manager.wait(10) is None:
                self.manager.signal(signal.SIGKILL)
                self.manager.wait(10)
        for p in self.launchers + ([self.manager] if self.manager else []):
            if not p.log.closed:
                p.close_log()

