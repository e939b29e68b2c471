"""The native library and its C API (``capi/include/taskd.h``) through ctypes.

The library is ``libs/libtaskd.so`` beside this file (the reference's location; scripts may
``LD_PRELOAD`` it), or the file ``$TASKD_LIBRARY`` names. A symbolic link is refused, as the
reference refuses it. Every call releases the GIL (ctypes does), so a training thread held in
the step gate lets the worker's thread call the framework's switch function.
"""

import ctypes
import json
import os
import threading

LIB_NAME = "libtaskd.so"
FOREVER = (1 << 64) - 1

TASKD_OK = 0
TASKD_ERR_ARGUMENT = 1
TASKD_ERR_CONFIG = 2
TASKD_ERR_START = 3
TASKD_ERR_REFUSED = 4
TASKD_ERR_TIMEOUT = 5
TASKD_ERR_STOPPED = 6
TASKD_ERR_PANIC = 7
TASKD_MANAGER_SIGNALS = 1
TASKD_ADDR_LISTEN = 0
TASKD_ADDR_CONTROL = 1

#: ``bool (*)(const uint32_t *ranks, const bool *use_backup, size_t n, uint64_t timeout_ms,
#: void *user, char *err, size_t err_len)``; ``err`` arrives as an address. Called on the
#: training thread, inside ``taskd_worker_step_completed``.
SWITCH_FN = ctypes.CFUNCTYPE(
    ctypes.c_bool,
    ctypes.POINTER(ctypes.c_uint32),
    ctypes.POINTER(ctypes.c_bool),
    ctypes.c_size_t,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
)

#: ``bool (*)(const uint32_t *dead, size_t n, uint64_t timeout_ms, void *user, char *detail,
#: size_t detail_len)``: the manager's last-words host, called on a thread of the library's own
#: before every stop of training (``taskd_manager_set_last_words``).
LAST_WORDS_FN = ctypes.CFUNCTYPE(
    ctypes.c_bool,
    ctypes.POINTER(ctypes.c_uint32),
    ctypes.c_size_t,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
)

#: ``bool (*)(const char *request, char *reply, size_t reply_len, void *user)``: the training
#: process's in-flight side (``taskd_worker_set_in_flight``), one JSON request in, its JSON
#: answer out; called on a thread of the library's, not the training thread.
IN_FLIGHT_FN = ctypes.CFUNCTYPE(
    ctypes.c_bool,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
)

_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int32
_PP = ctypes.POINTER(ctypes.c_void_p)
_PROTOTYPES = {
    "taskd_version": (_S, []),
    "taskd_last_error": (_S, []),
    "taskd_check_config": (_I, [_S, _S]),
    "taskd_manager_start": (_I, [_S, ctypes.c_uint32, _PP]),
    "taskd_manager_addr": (_I, [_P, ctypes.c_int32, _S, ctypes.c_size_t]),
    "taskd_manager_wait_ready": (_I, [_P, ctypes.c_uint64]),
    "taskd_manager_wait": (_I, [_P, ctypes.c_uint64, _S, ctypes.c_size_t]),
    "taskd_manager_set_last_words": (_I, [_P, LAST_WORDS_FN, _P, ctypes.c_uint64]),
    "taskd_manager_report_fault": (_I, [_P, ctypes.c_uint32, _S]),
    "taskd_manager_stop": (_I, [_P]),
    "taskd_manager_free": (None, [_P]),
    "taskd_proxy_start": (_I, [_S, _PP]),
    "taskd_proxy_addr": (_I, [_P, _S, ctypes.c_size_t]),
    "taskd_proxy_wait_registered": (_I, [_P, ctypes.c_uint64, _S, ctypes.c_size_t]),
    "taskd_proxy_next_order": (_I, [_P, ctypes.c_uint64, _S, ctypes.c_size_t]),
    "taskd_proxy_worker_exited": (_I, [_P, ctypes.c_uint32, _S, ctypes.c_bool, ctypes.c_uint32]),
    "taskd_proxy_stop": (_I, [_P]),
    "taskd_proxy_free": (None, [_P]),
    "taskd_worker_start": (_I, [_S, SWITCH_FN, _P, _PP]),
    "taskd_worker_step_completed": (_I, [_P, ctypes.c_uint64]),
    "taskd_worker_set_in_flight": (_I, [_P, IN_FLIGHT_FN, _P]),
    "taskd_worker_wait_registered": (_I, [_P, ctypes.c_uint64, _S, ctypes.c_size_t]),
    "taskd_worker_wait_job_whole": (_I, [_P, ctypes.c_uint64]),
    "taskd_worker_stop": (_I, [_P]),
    "taskd_worker_free": (None, [_P]),
}

_lock = threading.Lock()
_lib = None


class TaskdError(Exception):
    """A call of the native library failed: ``code`` (``TASKD_ERR_*``) and its message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def library_path():
    """Where the library is loaded from."""
    explicit = os.environ.get("TASKD_LIBRARY", "").strip()
    if explicit:
        return explicit
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libs", LIB_NAME)


def lib():
    """The loaded library (loaded on first use); ``TaskdError`` when it cannot be."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if os.path.islink(path):
            raise TaskdError(
                TASKD_ERR_START,
                "the libtaskd.so has not been loaded: %s is a symbolic link" % path,
            )
        try:
            dll = ctypes.CDLL(path)
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(dll, name)
                fn.restype = restype
                fn.argtypes = argtypes
        except (OSError, AttributeError) as e:
            raise TaskdError(
                TASKD_ERR_START, "the libtaskd.so has not been loaded: %s (%s)" % (e, path)
            )
        _lib = dll
        return dll


def version():
    """The native library's version."""
    return lib().taskd_version().decode()


def _check(code):
    if code != TASKD_OK:
        message = lib().taskd_last_error().decode("utf-8", "replace")
        raise TaskdError(code, message)


def _text(fn, *args):
    buf = ctypes.create_string_buffer(512)
    _check(fn(*args, buf, len(buf)))
    return buf.value.decode()


def _json(config):
    return json.dumps(config).encode()


def check_config(role, config):
    """Checks a role's configuration (a dict) without starting anything."""
    _check(lib().taskd_check_config(role.encode(), _json(config)))


class Manager:
    """A job's manager in this process (``taskd_manager_*``)."""

    def __init__(self, config, signals):
        self._h = ctypes.c_void_p()
        flags = TASKD_MANAGER_SIGNALS if signals else 0
        _check(lib().taskd_manager_start(_json(config), flags, ctypes.byref(self._h)))

    def addr(self, which):
        """``TASKD_ADDR_LISTEN`` or ``TASKD_ADDR_CONTROL`` ("" when not served)."""
        return _text(lib().taskd_manager_addr, self._h, which)

    def wait_ready(self, timeout_ms=FOREVER):
        """Every worker registered and the job verified."""
        _check(lib().taskd_manager_wait_ready(self._h, timeout_ms))

    def wait(self, timeout_ms=FOREVER):
        """Until the manager stopped; why."""
        return _text(lib().taskd_manager_wait, self._h, timeout_ms)

    def set_last_words(self, last_words, timeout_ms):
        """Asks ``last_words(dead_ranks, timeout_s) -> (taken, detail)`` for a last-words
        checkpoint before every stop of training (on a thread of the library's own; an
        exception is a checkpoint not taken, with its message)."""

        def call(dead, n, timeout, _user, detail, detail_len):
            try:
                taken, why = last_words([dead[i] for i in range(n)], timeout / 1000.0)
            except Exception as e:  # a host's failure must not cross into the library
                taken, why = False, "the last-words host failed: %s" % e
            raw = str(why).encode("utf-8", "replace")[: max(0, detail_len - 1)]
            ctypes.memmove(detail, raw + b"\0", len(raw) + 1)
            return bool(taken)

        self._last_words = LAST_WORDS_FN(call)  # kept alive while the library may call it
        _check(lib().taskd_manager_set_last_words(self._h, self._last_words, None, timeout_ms))

    def report_fault(self, rank, why):
        """The process of ``rank`` died, as something outside taskd's transport saw it."""
        _check(lib().taskd_manager_report_fault(self._h, rank, why.encode()))

    def stop(self):
        _check(lib().taskd_manager_stop(self._h))

    def free(self):
        """Stops it if it runs and frees it: the handle's last call."""
        h, self._h = self._h, None
        lib().taskd_manager_free(h)


class Proxy:
    """A node's proxy in this process (``taskd_proxy_*``)."""

    def __init__(self, config):
        self._h = ctypes.c_void_p()
        _check(lib().taskd_proxy_start(_json(config), ctypes.byref(self._h)))

    def addr(self):
        return _text(lib().taskd_proxy_addr, self._h)

    def wait_registered(self, timeout_ms=FOREVER):
        """The node's name once the manager admitted the proxy."""
        return _text(lib().taskd_proxy_wait_registered, self._h, timeout_ms)

    def next_order(self, timeout_ms):
        """The manager's next order for the node's launcher as a dict (``{"order": "restart",
        "number": N, "reason": ...}`` or ``{"order": "end", "reason": ...}``), or ``None`` when
        none came within ``timeout_ms``."""
        buf = ctypes.create_string_buffer(4096)
        code = lib().taskd_proxy_next_order(self._h, timeout_ms, buf, len(buf))
        if code == TASKD_ERR_TIMEOUT:
            return None
        _check(code)
        return json.loads(buf.value.decode())

    def worker_exited(self, rank, status, clean, generation):
        """The launcher saw the process of ``rank`` end (``status`` for people; ``clean``: exit
        status 0), started for restart ``generation`` of the job."""
        _check(lib().taskd_proxy_worker_exited(self._h, rank, status.encode(), clean, generation))

    def stop(self):
        _check(lib().taskd_proxy_stop(self._h))

    def free(self):
        h, self._h = self._h, None
        lib().taskd_proxy_free(h)


class Worker:
    """A training process's worker (``taskd_worker_*``), switching through ``switch_fn``."""

    def __init__(self, config, switch_fn):
        self._switch_fn = switch_fn  # kept alive while the library may call it
        self._h = ctypes.c_void_p()
        _check(lib().taskd_worker_start(_json(config), switch_fn, None, ctypes.byref(self._h)))

    def set_in_flight(self, fn):
        """Registers the process's in-flight side, an ``IN_FLIGHT_FN`` (kept alive here)."""
        self._in_flight_fn = fn
        _check(lib().taskd_worker_set_in_flight(self._h, fn, None))

    def gate(self):
        """The step gate, ``(fn, handle)``: ``fn(handle, step)`` is the library's
        ``taskd_worker_step_completed`` (its code), called with no Python frame between."""
        return lib().taskd_worker_step_completed, self._h

    def wait_registered(self, timeout_ms=FOREVER):
        """The node's name once the proxy admitted the worker."""
        return _text(lib().taskd_worker_wait_registered, self._h, timeout_ms)

    def wait_job_whole(self, timeout_ms=FOREVER):
        """Returns once every rank of the job has registered with the manager (which then asked
        this one in a verification round); ``TaskdError`` ``TASKD_ERR_TIMEOUT`` when
        ``timeout_ms`` passed first, ``TASKD_ERR_STOPPED`` for a stopped worker."""
        _check(lib().taskd_worker_wait_job_whole(self._h, timeout_ms))

    def stop(self):
        """Opens the gate for good and stops the worker; the handle stays valid."""
        _check(lib().taskd_worker_stop(self._h))
