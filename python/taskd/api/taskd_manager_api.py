"""The job's manager (the reference's ``manager.py``): ``init_taskd_manager`` and
``start_taskd_manager``.

The configuration's keys are the reference's (``job_id``, ``node_nums``, ``proc_per_node``,
``fault_recover`` (``"on"``: the manager coordinates process recovery; ``PROCESS_RECOVER=on``
sets it); ``plugin_dir``, ``taskd_enable``, ``cluster_infos`` are accepted and not used) and
every flag of ``taskd manager`` with underscores (``listen``, ``control_addr``,
``metrics_addr``, ``rank_table``, ``switch_timeout_ms``, ...). ``$TASKD_CONTROL_ADDR`` and
``$TASKD_MANAGER_LISTEN`` give ``control_addr`` and ``listen`` when the keys are absent.

The operators' control API is served on loopback by default, at :data:`DEFAULT_CONTROL_ADDR`
(what ``taskd status``, ``switch`` and ``recover`` reach without ``--addr`` on the manager's
host), or on a free loopback port when that one is taken (the log says which);
``TASKD_CONTROL_ADDR=off`` (or ``"control_addr": "off"``) serves none.

**MindIO's controller.** Where ``mindio_ttp`` is importable and ``TASKD_PROCESS_ENABLE`` is not
``off``, the manager hosts MindIO's controller as the reference's does (in a child process,
``taskd/python/framework/mindio/``), from the pod's ``POD_IP``, ``TTP_PORT``, ``WORLD_SIZE`` or
``MS_WORKER_NUM`` and ``PROCESS_RECOVER``: on an Ascend device every rank of a job with
``MS_ENABLE_TFT`` TTP/TSP is a MindIO processor that must reach it. A missing or unusable
variable fails ``init_taskd_manager``, naming it, and a controller that cannot start fails
``start_taskd_manager``, with the reason: not every rank dying 85 s later. Before every stop of
training (a restart after a lost process, the hold policy, an operator, ClusterD) the manager
asks it for MindIO's last-words checkpoint (within ``$TASKD_LAST_WORDS_TIMEOUT_MS``, default
300000), and a rank MindIO finds dead is a lost rank. MindIO never pauses: taskd's step gate
does (docs/decisions.md).
"""

import os
import signal
import threading

from taskd.python.cython_api import cython_api
from taskd.python.framework.mindio.host import MindioHost
from taskd.python.utils.convention import returns_bool
from taskd.python.utils.log import get_logger

_config = None
_mindio = None  # MindIO's controller host, when the manager hosts one
#: how long MindIO's last-words checkpoint may take before a stop goes out anyway
LAST_WORDS_TIMEOUT_MS = 300000
_SIGNALS = [s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]
#: where the control API is served when nothing says otherwise (the CLI's default ``--addr``)
DEFAULT_CONTROL_ADDR = "127.0.0.1:9603"


def _with_control(cfg):
    """The control API's address: the key, ``$TASKD_CONTROL_ADDR``, else loopback; ``off``:
    none. Whether it is the default (a taken port then falls back to a free one)."""
    given = cfg.get("control_addr", os.environ.get("TASKD_CONTROL_ADDR", "").strip() or None)
    if isinstance(given, str) and given.strip().lower() == "off":
        cfg.pop("control_addr", None)
        return False
    if given is None:
        cfg["control_addr"] = DEFAULT_CONTROL_ADDR
        return True
    return False


def _with_reference_env(config):
    cfg = dict(config)
    if os.environ.get("PROCESS_RECOVER", "").strip().lower() == "on":
        cfg["fault_recover"] = "on"
    off = os.environ.get("TASKD_PROCESS_ENABLE", "").strip().lower() == "off"
    cfg["taskd_enable"] = "off" if off else "on"
    return cfg


@returns_bool
def init_taskd_manager(config):
    """Checks and keeps the manager's configuration (a dict)."""
    global _config
    if not isinstance(config, dict):
        raise TypeError("config must be a dict, got %s" % type(config).__name__)
    global _mindio
    cfg = _with_reference_env(config)
    cfg["_default_control"] = _with_control(cfg)
    cython_api.check_config("manager", _native(cfg))
    # MindioConfigError names the pod's variable that is missing or unusable.
    host = MindioHost.from_env(os.environ) if cfg["taskd_enable"] == "on" else None
    if _mindio is not None:
        _mindio.close()
    _config, _mindio = cfg, host
    get_logger().info(
        "taskd manager initialised for job %s", cfg.get("job_id") or "$MINDX_TASK_ID"
    )
    return True


class _PythonSignals:
    """While the native manager owns SIGINT, SIGTERM and SIGHUP, Python's own handlers (which
    run once the call returns) must not raise KeyboardInterrupt; restored afterwards."""

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for name in _SIGNALS:
                sig = getattr(signal, name)
                self.saved[sig] = signal.getsignal(sig)
                signal.signal(sig, lambda *_: None)
        return self

    def __exit__(self, *_):
        for sig, handler in self.saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _native(cfg):
    """The configuration the native library reads (without this module's own keys)."""
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _start(cfg, log):
    """The native manager; on the default control port, a free loopback one if it is taken."""
    try:
        return cython_api.Manager(_native(cfg), signals=True)
    except cython_api.TaskdError as e:
        if not cfg.get("_default_control") or "control" not in str(e):
            raise
        log.warning("taskd manager: the default control port (%s) is taken (%s): serving the "
                    "control API on a free loopback port instead", DEFAULT_CONTROL_ADDR, e)
        return cython_api.Manager(dict(_native(cfg), control_addr="127.0.0.1:0"), signals=True)


def _log_ready(manager, log):
    try:
        manager.wait_ready()
        log.info("taskd manager: every worker registered, the job is verified")
    except cython_api.TaskdError:
        pass


@returns_bool
def start_taskd_manager():
    """Runs the manager until SIGTERM or SIGINT (or SIGHUP), then returns ``True``. Blocks, with
    the GIL released."""
    log = get_logger()
    if _config is None:
        raise RuntimeError("init_taskd_manager has not succeeded")
    host = _mindio
    if host is not None:
        host.start()  # MindioStartError with MindIO's reason: the manager does not start
        log.info("taskd manager: MindIO's controller listens on %s", host.address)
    with _PythonSignals():
        try:
            manager = _start(_config, log)
        except Exception:
            if host is not None:
                host.close()
            raise
        if host is not None:
            _serve_mindio(manager, host, log)
        try:
            log.info("taskd manager listening on %s", manager.addr(cython_api.TASKD_ADDR_LISTEN))
            control = manager.addr(cython_api.TASKD_ADDR_CONTROL)
            if control:
                log.info("taskd manager control API on %s", control)
            ready = threading.Thread(
                target=_log_ready, args=(manager, log), name="taskd-ready", daemon=True
            )
            ready.start()
            why = manager.wait()
            ready.join()
            log.info("taskd manager stopped: %s", why)
        finally:
            if host is not None:  # first: its fault reports go to the manager
                host.close()
            manager.free()
    return True


def _serve_mindio(manager, host, log):
    """MindIO's last words before every stop of training, a new controller for the next
    generation of workers after it, and MindIO's fault reports to the manager."""
    timeout_ms = int(os.environ.get("TASKD_LAST_WORDS_TIMEOUT_MS", "").strip() or LAST_WORDS_TIMEOUT_MS)

    def last_words(dead, timeout_s):
        words = host.last_words({int(r): 1 for r in dead}, timeout_s)
        # The old processors never come back to this controller, and a new processor that
        # reached it before it was destroyed would end with it: the next generation gets a
        # fresh one before the stop goes out (the old one is killed, not destroyed: its
        # processors are about to be).
        try:
            host.renew(close_timeout_s=0)
        except Exception as e:
            log.error("taskd manager: MindIO's controller could not start again for the restarted "
                      "processes: %s", e)
        return words.taken, words.detail

    def fault(rank, why):
        try:
            manager.report_fault(rank, "MindIO: %s" % why)
        except cython_api.TaskdError as e:
            log.warning("taskd manager: MindIO's fault report of rank %d was not taken: %s", rank, e)

    manager.set_last_words(last_words, timeout_ms)
    host.on_fault(fault)
