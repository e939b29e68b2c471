"""The worker of a training process: ``init_taskd_worker``, ``start_taskd_worker``,
``destroy_taskd_worker`` and the step gate ``step_completed``.

The worker connects to its node's proxy at ``$TASKD_PROXY`` (``HOST:PORT``, default
``127.0.0.1:9602``) for the job ``$MINDX_TASK_ID``; ``TSP`` comes from ``$MS_ENABLE_TFT``. When
the manager switches NICs, the worker holds training at the step gate and calls its framework's
``_comm_switch_nic`` with the whole target list (``taskd.python.framework.switch``), on the
training thread, inside the gate. When the manager stops training, the gate raises
``taskd.TrainingStopped``.
"""

import atexit
import dataclasses
import os
import threading
from typing import Callable, List, Optional

from taskd import TrainingStopped
from taskd.python.cython_api import cython_api
from taskd.python.framework import frameworks, switch
from taskd.python.framework.spec import Framework, HookContext
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

#: the ``framework`` argument's values (``taskd/python/framework/frameworks/``)
FRAMEWORKS = frameworks.codes()
#: ``taskd_worker_step_completed``: the manager stopped training (``capi/include/taskd.h``)
TASKD_STOP_TRAINING = 8
#: how long a MindSpore process's first training call waits for every rank of the job to
#: register with the manager (``$TASKD_START_WAIT_MS``; ``0``: it does not wait)
START_WAIT_MS = 120000


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What ``init_taskd_worker`` checked: the rank, the disk quota, the framework and the
    node rank."""

    rank: int
    quota_mb: int
    framework: Framework
    node_rank: int


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.config: Optional[WorkerConfig] = None  # once initialised
        self.start_wait_ms = START_WAIT_MS
        self.worker = None
        self.gate = None  # the native gate while a worker runs: gate(step)
        self.undo: List[Callable[[], None]] = []  # how to remove the framework hooks
        self.hook_gates = True  # the optimizer hook gates until an explicit call
        self.retired = []  # stopped workers: their handles stay valid for late callers
        self.stop_logged = False  # the stop's reason is logged once


_state = _State()


def _non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("%s must be an int >= 0, got %r" % (name, value))
    return value


def _start_wait_ms():
    """``$TASKD_START_WAIT_MS``, checked: an int >= 0 (``START_WAIT_MS`` when unset)."""
    value = os.environ.get("TASKD_START_WAIT_MS", "").strip()
    if not value:
        return START_WAIT_MS
    try:
        ms = int(value)
    except ValueError:
        ms = -1
    if ms < 0:
        raise ValueError("$TASKD_START_WAIT_MS=%r is not a number of milliseconds >= 0" % value)
    return ms


def _worker_config(rank, node_rank, backend="hccl"):
    """The native worker's configuration; ``backend``: the communication library the switch
    function moves (its registry entry's ``backend``: ``"gloo"`` for taskd's Gloo switch, whose
    rank needs nothing of HCCL's L2 retry and RDMA)."""
    return {"rank": rank, "node_rank": node_rank, "backend": backend}


@returns_bool
def init_taskd_worker(rank_id: int, upper_limit_of_disk_in_mb: int = 5000,
                      framework: str = "pt") -> bool:
    """Prepares the worker of global rank ``rank_id``. ``upper_limit_of_disk_in_mb`` is the
    reference's profiling quota (validated, unused). ``framework``: ``"pt"`` or ``"ms"``."""
    rank = _non_negative_int("rank_id", rank_id)
    quota = _non_negative_int("upper_limit_of_disk_in_mb", upper_limit_of_disk_in_mb)
    fw = frameworks.by_code(framework)
    node_rank = fw.node_rank(os.environ)
    start_wait_ms = _start_wait_ms()
    cython_api.check_config("worker", _worker_config(rank, node_rank))
    with _state.lock:
        if _state.worker is not None:
            raise ValueError("a worker already runs in this process (rank %d)" % _state.config.rank)
        _state.config = WorkerConfig(rank, quota, fw, node_rank)
        _state.start_wait_ms = start_wait_ms
    get_logger().info(
        "taskd worker initialised: rank %d, node rank %d, framework %s", rank, node_rank, fw.code
    )
    return True


def checked_gate(fn, handle, last_error):
    """The gate of a training loop: ``fn(handle, step)`` (the library's ``step_completed``), and
    ``TrainingStopped`` with the manager's reason (``last_error()``, the same thread's) when it
    answers ``TASKD_STOP_TRAINING``. The reason is logged once, at ERROR."""

    def gate(step):
        if fn(handle, step) == TASKD_STOP_TRAINING:
            _stopped(step, last_error() or "the manager stopped training")

    return gate


def _stopped(step, reason):
    if not _state.stop_logged:
        _state.stop_logged = True
        get_logger().error("taskd: training stopped at step %d: %s", step, reason)
    raise TrainingStopped(reason)


def _native_reason():
    return cython_api.lib().taskd_last_error().decode("utf-8", "replace")


def _hook_gate(step):
    """The gate as the framework hooks call it: the running worker's, or nothing."""
    gate = _state.gate
    if gate is not None:
        gate(step)


def _wait_job_whole():
    """Before the process's first ``Model.train`` or ``Model.fit`` call: waits until every rank
    of the job has registered with the manager, at most ``$TASKD_START_WAIT_MS``. MindSpore's
    scheduler lets a restarted rank past ``init()`` while a peer of the same restart is still
    starting, and the rank's first collective then sends to an address that does not listen
    yet and fails after 30 s (docs/python.md); a peer registers with taskd only after its
    ``init()``, so once every rank has registered every peer listens."""
    worker, ms = _state.worker, _state.start_wait_ms
    if worker is None or ms == 0:
        return
    log = get_logger()
    try:
        worker.wait_job_whole(0)
        return
    except cython_api.TaskdError as e:
        if e.code != cython_api.TASKD_ERR_TIMEOUT:
            return  # a stopped worker: nothing to wait for
    log.info("taskd: waiting up to %d ms for every rank of the job to register before the first step", ms)
    try:
        worker.wait_job_whole(ms)
    except cython_api.TaskdError as e:
        log.warning("taskd: %s; training starts without it", e)
        return
    log.info("taskd: every rank of the job has registered; training starts")


def _install_hooks(framework, log):
    """The framework's hooks (``taskd/python/framework/frameworks/``); how to remove them."""
    _state.hook_gates = True
    remove = framework.install_hooks(
        HookContext(gate=_hook_gate, before_first_train=_wait_job_whole,
                    gating=lambda: _state.hook_gates, log=log))
    return [] if remove is None else [remove]


#: how long a worker may take to reach its proxy before the training log says it has not
REACH_PROXY_MS = 3000


def _log_registration(worker, rank):
    """Logs the registration; if it takes longer than ``REACH_PROXY_MS``, one warning first."""
    log = get_logger()
    proxy = os.environ.get("TASKD_PROXY", "").strip() or "127.0.0.1:9602"
    try:
        try:
            node = worker.wait_registered(REACH_PROXY_MS)
        except cython_api.TaskdError as e:
            if e.code != cython_api.TASKD_ERR_TIMEOUT:
                raise
            log.warning(
                "taskd worker rank %d cannot reach its proxy at %s (after %d ms; $TASKD_PROXY): "
                "still trying, training is not gated until it does", rank, proxy, REACH_PROXY_MS)
            node = worker.wait_registered()
        log.info("taskd worker rank %d registered on %s", rank, node)
    except cython_api.TaskdError as e:
        if e.code == cython_api.TASKD_ERR_STOPPED:
            log.info("taskd worker rank %d stopped before it registered", rank)
        else:
            log.error("taskd worker rank %d: %s", rank, e)


@returns_bool
def start_taskd_worker() -> bool:
    """Starts the initialised worker on background threads; returns at once."""
    log = get_logger()
    with _state.lock:
        if _state.config is None:
            raise RuntimeError("init_taskd_worker has not succeeded")
        if _state.worker is not None:
            log.warning("start_taskd_worker: the worker already runs")
            return True
        config = _state.config
        rank = config.rank
        chosen = switch.resolve(config.framework)
        worker = cython_api.Worker(
            _worker_config(rank, config.node_rank, backend=chosen.backend),
            switch.callback(chosen.name, chosen.function, log, chosen.sync),
        )
        in_flight = switch.in_flight_of(chosen)
        if in_flight is not None:
            worker.set_in_flight(switch.in_flight_callback(in_flight, log))
        try:
            _state.undo = _install_hooks(config.framework, log)
        except Exception:
            worker.stop()
            raise
        _state.worker, _state.gate = worker, checked_gate(*worker.gate(), _native_reason)
    threading.Thread(
        target=_log_registration, args=(worker, rank), name="taskd-registration", daemon=True
    ).start()
    log.info("taskd worker rank %d started (switches through %s)", rank, chosen.name)
    return True


@returns_bool
def destroy_taskd_worker() -> bool:
    """Stops the worker (a training thread held in the gate is let go)."""
    with _state.lock:
        if _state.config is None:
            raise RuntimeError("no worker was initialised")
        worker, undo = _state.worker, _state.undo
        _state.config, _state.worker, _state.gate, _state.undo = None, None, None, []
        if worker is not None:
            _state.retired.append(worker)
    for fn in undo:
        fn()
    if worker is not None:
        worker.stop()
    get_logger().info("taskd worker destroyed")
    return True


def step_completed(step: int) -> bool:
    """The training loop finished ``step``: returns at once unless taskd holds training here
    for a NIC switch. Without a running worker it does nothing and returns ``False``. Raises
    ``TrainingStopped`` (only that) when the manager stopped training."""
    gate = _state.gate
    if gate is None:
        return False
    _state.hook_gates = False
    try:
        gate(step)
        return True
    except TrainingStopped:
        raise
    except Exception as e:
        get_logger().error("step_completed(%r) failed: %s", step, e)
        return False


@atexit.register
def _stop_at_exit():
    worker = _state.worker
    if worker is not None:
        try:
            worker.stop()
        except Exception:
            pass
