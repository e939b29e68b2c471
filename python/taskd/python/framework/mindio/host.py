"""The manager's side of MindIO's controller: :class:`MindioHost` runs it in a child process
(``controller.py`` beside this file) and talks to it over a pipe.

On an Ascend device MindSpore 2.10.0 with any of ``TTP:1``, ``UCE:1``, ``ARF:1``, ``TSP:1``,
``HCCE:1`` in ``MS_ENABLE_TFT`` makes every rank a MindIO processor that must reach a
controller at ``MS_TFT_IP:MS_TFT_PORT``; without one, every rank ends itself about 85 s after
it started. MindCluster's TaskD manager hosts that controller; taskd's manager does the same,
for two things only: that every rank's processor can connect, and MindIO's last-words
checkpoint (the ``dump``) on the way out. taskd never asks MindIO to pause: its own step gate
does (docs/decisions.md, "Who pauses when MindIO is present").

The manager's Python calls, in order::

    host = MindioHost.from_env(os.environ)   # None: not hosted (logged); MindioConfigError
    if host is not None:
        host.on_fault(lambda rank, why: ...) # MindIO found a dead rank the manager did not name
        host.start(timeout_s=30)             # MindioStartError with the reason
        ...                                  # the workers start, train
        words = host.last_words({3: 1}, 30)  # a rank's process died; {} for a fault-free stop
        ...                                  # kill the workers (SIGKILL: SIGTERM is a no-op)
        host.renew()                         # a new controller before the next generation starts
        ...
        host.close()                         # the manager's end

Every method is safe from any thread. ``last_words`` and ``close`` are bounded; ``on_fault``'s
callbacks run on the host's reader thread and must return quickly. The controller process runs
in a session of its own (a terminal's Ctrl-C does not reach it) and ends by itself when the
manager's process does: the end of its standard input destroys the controller.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Deque, Dict, List, Mapping, Optional, Set

from taskd.python.utils.log import get_logger

#: the features of ``MS_ENABLE_TFT`` for which MindSpore 2.10.0 makes every rank a MindIO
#: processor (``TFTCommValue.NEED_MINDIO``)
NEED_MINDIO = ("TTP:1", "UCE:1", "ARF:1", "TSP:1", "HCCE:1")
#: how long :meth:`MindioHost.start` waits for the controller to listen, by default
START_TIMEOUT_S = 30.0
#: how long :meth:`MindioHost.close` lets the controller's destroy take (measured 2.7-4.9 s)
#: before the child is killed, by default
CLOSE_TIMEOUT_S = 8.0
#: how long :meth:`MindioHost.last_words` takes at most, by default
LAST_WORDS_TIMEOUT_S = 30.0
#: the controller process's own deadline is the call's; the host waits this much longer for its
#: answer before it gives up on it
REPLY_MARGIN_S = 1.0
CONTROLLER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "controller.py")
#: MindIO's fault types in ``report_fault_ranks``
FAULT_TYPES = {0: "a device memory error (UCE)", 1: "a process fault", 2: "an HCCL fault"}


class MindioConfigError(ValueError):
    """A variable MindIO's controller needs is missing or unusable; ``variable`` names it."""

    def __init__(self, variable: str, message: str):
        super().__init__(message)
        self.variable = variable


class MindioStartError(RuntimeError):
    """MindIO's controller did not start; the message says why (the child is reaped)."""


@dataclasses.dataclass(frozen=True)
class LastWords:
    """The outcome of :meth:`MindioHost.last_words`."""

    #: MindIO wrote its last-words checkpoint (``report_result(0, "do dump success", ...)``)
    taken: bool
    #: one line for people: what MindIO did, or why there is no checkpoint
    detail: str
    #: MindIO's last code (``report_result``'s, or ``report_stop_complete``'s when it ended there)
    code: Optional[int] = None
    #: the strategy MindIO ran (``"dump"``)
    strategy: Optional[str] = None
    #: the faults MindIO's result names, ``{rank: type}`` (0 UCE, 1 process, 2 HCCL)
    fault_ranks: Dict[int, int] = dataclasses.field(default_factory=dict)
    #: how long the call took
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class MindioConfig:
    """What the controller is started with; :meth:`from_env` reads it as the reference does."""

    #: the address it listens on (``POD_IP``); the workers' ``MS_TFT_IP``
    ip: str
    #: its port (``TTP_PORT``); the workers' ``MS_TFT_PORT``
    port: int
    #: the job's ranks (``WORLD_SIZE``, else ``MS_WORKER_NUM``)
    world: int
    #: ``PROCESS_RECOVER=on``: ``enable_arf`` in ``tft_init_controller``, as the reference
    process_recover: bool = False
    #: ``elastic-training`` in ``HIGH_AVAILABILITY``
    elastic: bool = False
    #: MindIO's log directory (``TTP_LOG_PATH``): ``ttp_log.log.<pid>`` of each controller
    log_dir: str = os.path.join(".", "taskd_log", "mindio")
    #: the controller process's environment (``None``: the manager's)
    env: Optional[Mapping[str, str]] = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "MindioConfig":
        """Reads ``POD_IP``, ``TTP_PORT``, ``WORLD_SIZE`` / ``MS_WORKER_NUM``,
        ``PROCESS_RECOVER``, ``HIGH_AVAILABILITY`` and the log directory
        (``$TTP_LOG_PATH``, else ``$TASKD_LOG_PATH/mindio``, default ``./taskd_log/mindio``);
        :class:`MindioConfigError` names a variable that is missing or unusable."""
        taskd_logs = environ.get("TASKD_LOG_PATH", "").strip() or "./taskd_log/"
        log_dir = environ.get("TTP_LOG_PATH", "").strip() or os.path.join(taskd_logs, "mindio")
        ha = [x.strip() for x in environ.get("HIGH_AVAILABILITY", "").split(",")]
        return cls(
            ip=_pod_ip(environ),
            port=_port(environ),
            world=_world(environ),
            process_recover=environ.get("PROCESS_RECOVER", "").strip().lower() == "on",
            elastic="elastic-training" in ha,
            log_dir=log_dir,
            env=dict(environ),
        )


def _pod_ip(environ: Mapping[str, str]) -> str:
    raw = environ.get("POD_IP", "").strip()
    if not raw:
        raise MindioConfigError(
            "POD_IP", "POD_IP is not set: MindIO's controller listens on this pod's address (the "
            "job's YAML takes it from the downward API, status.podIP), where the training "
            "processes reach it as MS_TFT_IP")
    text = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise MindioConfigError("POD_IP", "POD_IP=%r is not an IP address" % raw) from None
    if addr.is_unspecified:
        raise MindioConfigError(
            "POD_IP", "POD_IP=%r is every address, not this pod's: MindIO's controller refuses "
            "it (tft_start_controller), and the training processes could not reach it" % raw)
    return str(addr)


def _port(environ: Mapping[str, str]) -> int:
    raw = environ.get("TTP_PORT", "").strip()
    if not raw:
        raise MindioConfigError(
            "TTP_PORT", "TTP_PORT is not set: the port of MindIO's controller (the training "
            "processes get it as MS_TFT_PORT)")
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise MindioConfigError("TTP_PORT", "TTP_PORT=%r is not a port (1-65535)" % raw)
    return port


def _world(environ: Mapping[str, str]) -> int:
    for var in ("WORLD_SIZE", "MS_WORKER_NUM"):
        raw = environ.get(var, "").strip()
        if raw:
            try:
                world = int(raw)
            except ValueError:
                world = 0
            if world < 1:
                raise MindioConfigError(var, "%s=%r is not a positive number of ranks" % (var, raw))
            return world
    raise MindioConfigError(
        "WORLD_SIZE", "neither WORLD_SIZE nor MS_WORKER_NUM is set: MindIO's controller needs the "
        "number of ranks of the job")


def mindio_location() -> Optional[str]:
    """The folder holding ``mindio_ttp`` for this Python, found without importing it, or
    ``None``."""
    try:
        spec = importlib.util.find_spec("mindio_ttp")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or [])
    return os.path.dirname(places[0] if places else spec.origin or "") or None


def tft_features(environ: Mapping[str, str]) -> List[str]:
    """The features of ``$MS_ENABLE_TFT`` that need ``mindio_ttp``."""
    tft = environ.get("MS_ENABLE_TFT", "")
    return [f for f in NEED_MINDIO if f in tft]


class _Pending:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Optional[dict] = None


class _Child:
    """One controller process: its pipes, the threads that read them, its pending requests."""

    def __init__(self, config: MindioConfig, python: str,
                 on_fault: Callable[[Dict[int, int], Dict[int, str]], None]):
        log = get_logger()
        env = dict(os.environ if config.env is None else config.env)
        env["TTP_LOG_PATH"] = config.log_dir
        env.pop("TTP_LOG_STDOUT", None)  # MindIO's log goes to its file, not the manager's stderr
        env["PYTHONUNBUFFERED"] = "1"
        where = mindio_location()
        if where:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), where) if p)
        cfg = {"ip": config.ip, "port": config.port, "world": config.world,
               "arf": config.process_recover, "elastic": config.elastic}
        self.log = log
        self.lock = threading.Lock()
        self.started = threading.Event()
        self.start_error: Optional[str] = None
        self.pending: Dict[int, _Pending] = {}
        self.ids = 0
        self.closing = False
        self.ended: Optional[str] = None  # why the process ended, once it did
        self.stderr_tail: Deque[str] = collections.deque(maxlen=20)
        self.on_fault = on_fault
        self.proc = subprocess.Popen(
            [python, CONTROLLER, json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True)
        self.pid = self.proc.pid
        self.readers = [
            threading.Thread(target=self._read, name="mindio-host", daemon=True),
            threading.Thread(target=self._stderr, name="mindio-host-stderr", daemon=True),
        ]
        for t in self.readers:
            t.start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and self.ended is None

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                line = raw.decode(errors="replace").rstrip()
                self.log.debug("MindIO controller[%d]: %s", self.pid, line)
                continue
            try:
                self._handle(msg)
            except Exception as e:  # never ends the reader
                self.log.error("MindIO controller[%d]: %r while handling %s", self.pid, e, msg)
        status = self.proc.wait()
        with self.lock:
            self.ended = "the controller process ended (status %s)" % status
            pending, self.pending = self.pending, {}
            closing = self.closing
        self.started.set()
        for p in pending.values():
            p.done.set()
        if not closing:
            tail = " | ".join(self.stderr_tail)
            self.log.error(
                "MindIO's controller (pid %d) ended unexpectedly with status %s: the training "
                "processes lose their controller (they train on without it); renew() starts "
                "another for the next generation of workers%s",
                self.pid, status, ("; its last words: " + tail) if tail else "")

    def _stderr(self) -> None:
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.stderr_tail.append(line)
                self.log.debug("MindIO controller[%d]: %s", self.pid, line)

    def _handle(self, msg: dict) -> None:
        ev = msg.get("ev")
        if ev == "listening":
            self.started.set()
        elif ev == "start_failed":
            self.start_error = msg.get("reason") or "no reason given"
            self.started.set()
        elif ev == "log":
            level = {"error": 40, "warning": 30}.get(msg.get("level"), 20)
            self.log.log(level, "MindIO controller[%d]: %s", self.pid, msg.get("msg"))
        elif ev == "fault":
            ranks = {int(r): int(t) for r, t in (msg.get("ranks") or {}).items()}
            codes = {int(r): str(c) for r, c in (msg.get("codes") or {}).items()}
            self.on_fault(ranks, codes)
        elif ev == "reply":
            with self.lock:
                p = self.pending.pop(msg.get("id"), None)
            if p is not None:
                p.reply = msg
                p.done.set()

    def request(self, msg: dict, wait_s: float) -> Optional[dict]:
        with self.lock:
            if self.ended is not None:
                return None
            self.ids += 1
            msg = dict(msg, id=self.ids)
            p = self.pending[self.ids] = _Pending()
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            with self.lock:
                self.pending.pop(msg["id"], None)
            return None
        p.done.wait(max(0.0, wait_s))
        with self.lock:
            self.pending.pop(msg["id"], None)
        return p.reply

    def stop(self, timeout_s: float) -> str:
        """Destroys the controller (its process ends), killing it after ``timeout_s``; reaps it.
        Returns how it went."""
        t0 = time.monotonic()
        with self.lock:
            self.closing = True
        how = "destroyed"
        if timeout_s > 0:
            try:
                self.proc.stdin.write(b'{"op": "close"}\n')
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            how = "killed"
            if timeout_s > 0:
                how = "killed after %g s without its destroy ending" % timeout_s
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        for t in self.readers:
            t.join(timeout=2.0)
        return "%s in %.2f s" % (how, time.monotonic() - t0)


class MindioHost:
    """MindIO's controller for one job, in a child process of the manager's (a new one after
    each :meth:`renew`). See the module's description for the calls and their order."""

    def __init__(self, config: MindioConfig, python: Optional[str] = None):
        self.config = config
        self.python = python or sys.executable
        self._life = threading.RLock()  # start, renew, close
        self._words = threading.Lock()  # one last words at a time
        self._lock = threading.Lock()  # the callbacks and the named ranks
        self._callbacks: List[Callable[[int, str], None]] = []
        self._child: Optional[_Child] = None
        # the ranks of this controller's job the manager named, or that were passed on to it
        self._named: Set[int] = set()

    # ---- construction
    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["MindioHost"]:
        """The host the job's environment (default ``os.environ``; also the controller
        process's environment) asks for, or ``None``: hosting is off
        (``TASKD_PROCESS_ENABLE=off``) or ``mindio_ttp`` is not importable in this Python (with
        one WARNING when the job's ``MS_ENABLE_TFT`` needs it). :class:`MindioConfigError` names
        a variable that is missing or unusable."""
        environ = os.environ if environ is None else environ
        log = get_logger()
        if environ.get("TASKD_PROCESS_ENABLE", "").strip().lower() == "off":
            log.info("TASKD_PROCESS_ENABLE=off: taskd does not host MindIO's controller")
            return None
        if mindio_location() is None:
            features = tft_features(environ)
            if features:
                log.warning(
                    "mindio_ttp is not importable in %s, so taskd does not host MindIO's "
                    "controller: with MS_ENABLE_TFT=%s on an Ascend device every rank would exit "
                    "about 85 s after it started, for want of a controller; install MindIO's wheel "
                    "into this Python (pip install mindio_ttp-*.whl, from MindCluster's MindIO "
                    "package)",
                    sys.executable, environ.get("MS_ENABLE_TFT"))
            else:
                log.debug("mindio_ttp is not importable: MindIO's controller is not hosted")
            return None
        return cls(MindioConfig.from_env(environ))

    # ---- state
    @property
    def pid(self) -> Optional[int]:
        """The controller process's id while it runs."""
        child = self._child
        return child.pid if child is not None and child.alive else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def address(self) -> str:
        """``IP:PORT`` (``[IP]:PORT`` for IPv6): what the workers' ``MS_TFT_IP`` and
        ``MS_TFT_PORT`` say."""
        ip = self.config.ip
        return ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, self.config.port)

    # ---- the controller's life
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the controller's process and waits until the controller listens. A busy
        port, an address not of this host, or any other failure raises
        :class:`MindioStartError` with the controller's reason, the process reaped. Does
        nothing while one runs."""
        with self._life:
            if self._child is not None:
                if self._child.alive:
                    return
                self._child.stop(0)  # ended by itself: its pipes are closed here
                self._child = None
            log = get_logger()
            t0 = time.monotonic()
            try:
                os.makedirs(self.config.log_dir, exist_ok=True)
            except OSError as e:
                raise MindioStartError(
                    "MindIO's log directory %s (TTP_LOG_PATH): %s" % (self.config.log_dir, e))
            try:
                child = _Child(self.config, self.python, self._faults)
            except OSError as e:
                raise MindioStartError("the controller process cannot start (%s %s): %s"
                                       % (self.python, CONTROLLER, e))
            listening = (child.started.wait(max(0.0, timeout_s)) and child.start_error is None
                         and child.alive)
            if not listening:
                if child.start_error:
                    why = child.start_error
                elif child.ended:
                    tail = " | ".join(child.stderr_tail)
                    why = child.ended + ((": " + tail) if tail else "")
                else:
                    why = "it did not listen within %g s" % timeout_s
                child.stop(0)
                raise MindioStartError("MindIO's controller did not start on %s (POD_IP, "
                                       "TTP_PORT): %s" % (self.address, why))
            with self._lock:
                self._named = set()
            self._child = child
            log.info("MindIO's controller listens on %s for %d ranks (pid %d, log in %s), "
                     "started in %.0f ms", self.address, self.config.world, child.pid,
                     self.config.log_dir, (time.monotonic() - t0) * 1000)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Destroys the controller: its process ends (killed if its destroy takes longer than
        ``timeout_s``; 0 kills it at once) and is reaped. Idempotent."""
        with self._life:
            child, self._child = self._child, None
        if child is not None:
            how = child.stop(timeout_s)
            get_logger().info("MindIO's controller (pid %d) %s", child.pid, how)

    def renew(self, timeout_s: float = START_TIMEOUT_S,
              close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """A new controller for a new generation of workers: the processors of a generation
        never come back to the controller they left, and a controller whose state machine
        ended serves nobody. Call it after the old workers are gone and before the new ones
        start. Raises as :meth:`start`."""
        with self._life:
            self.close(close_timeout_s)
            self.start(timeout_s)

    # ---- faults and last words
    def on_fault(self, callback: Callable[[int, str], None]) -> None:
        """``callback(rank, why)`` for each rank MindIO's ``report_fault_ranks`` names that the
        manager did not name itself (MindIO's heartbeat check finds a dead process 9-12 s after
        it died): the manager treats it as that rank's process having died. Called once per
        rank per controller, on the host's reader thread."""
        with self._lock:
            self._callbacks.append(callback)

    def _faults(self, ranks: Dict[int, int], codes: Dict[int, str]) -> None:
        with self._lock:
            new = [r for r in sorted(ranks) if r not in self._named]
            self._named.update(new)
            callbacks = list(self._callbacks)
        for rank in new:
            code = codes.get(rank, "")
            why = "MindIO's controller reports %s of rank %d%s" % (
                FAULT_TYPES.get(ranks[rank], "a fault of type %s" % ranks[rank]), rank,
                " (code %s)" % code if code else " (no heartbeat, or its processor reported it)")
            get_logger().warning("%s", why)
            for cb in callbacks:
                try:
                    cb(rank, why)
                except Exception as e:
                    get_logger().error("a MindIO fault callback failed: %r", e)

    def last_words(self, faults: Dict[int, int],
                   timeout_s: float = LAST_WORDS_TIMEOUT_S) -> LastWords:
        """MindIO's last-words checkpoint, within ``timeout_s``. ``faults`` are the ranks whose
        process died, ``{rank: 1}`` (0 UCE, 1 process, 2 HCCL), or ``{}`` for a fault-free
        stop (the ranks held at taskd's gate). Afterwards MindIO's state machine is ended and
        the surviving ranks are held inside MindIO until killed (SIGKILL); :meth:`renew` before
        the next generation. Never raises for MindIO's answers: ``taken`` is ``False`` with the
        reason (no dump offered, a job of one rank or without ``TTP:1``, a timeout, the
        controller not running). ``ValueError`` for faults that are not ``{rank: type}``."""
        faults = self._check(faults)
        t0 = time.monotonic()
        log = get_logger()

        def fail(detail: str) -> LastWords:
            words = LastWords(False, detail, seconds=round(time.monotonic() - t0, 4))
            log.warning("MindIO's last words: none: %s", detail)
            return words

        if not self._words.acquire(timeout=max(0.0, timeout_s)):
            return fail("another last words did not end within %g s" % timeout_s)
        try:
            child = self._child
            with self._lock:
                self._named.update(faults)
            if child is None or not child.alive:
                ended = " (%s)" % child.ended if child is not None and child.ended else ""
                return fail("MindIO's controller is not running" + ended)
            left = timeout_s - (time.monotonic() - t0)
            ask = {"op": "last_words", "faults": {str(r): t for r, t in faults.items()},
                   "timeout_s": left}
            reply = child.request(ask, left + REPLY_MARGIN_S)
            if reply is None:
                return fail(child.ended
                            or "no answer from MindIO's controller within %g s" % timeout_s)
            ranks = reply.get("fault_ranks") or {}
            words = LastWords(
                taken=bool(reply.get("taken")), detail=str(reply.get("detail", "")),
                code=reply.get("code"), strategy=reply.get("strategy"),
                fault_ranks={int(r): int(t) for r, t in ranks.items()},
                seconds=round(time.monotonic() - t0, 4))
        finally:
            self._words.release()
        if words.taken:
            log.info("MindIO's last words: taken in %.3f s: %s", words.seconds, words.detail)
        else:
            log.warning("MindIO's last words: none: %s", words.detail)
        return words

    def _check(self, faults: Dict[int, int]) -> Dict[int, int]:
        if not isinstance(faults, dict):
            raise ValueError("faults must be a dict {rank: type}, got %s" % type(faults).__name__)
        out = {}
        for rank, kind in faults.items():
            world = self.config.world
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
                raise ValueError("fault rank %r is not a rank of this job (0-%d)"
                                 % (rank, world - 1))
            if isinstance(kind, bool) or kind not in FAULT_TYPES:
                raise ValueError("fault type %r of rank %d is not 0 (UCE), 1 (process) or 2 (HCCL)"
                                 % (kind, rank))
            out[rank] = kind
        return out
