"""The framework's switch function, as the native worker calls it: on the training thread,
inside the step gate, while that thread is held.

Every worker calls its framework with the WHOLE target list of an operation (global ranks and
their flags, the same on every rank): the framework maps them onto each of its communicators.
``False`` or an exception is this rank's failure; its text goes back to the manager.

Which function, and the stream synchronisation to run before it (MindSpore's
``mindspore.runtime.synchronize()``, as MindIO's TSP path does; torch_npu's function
synchronises the device itself), is the framework's entry
(``taskd/python/framework/frameworks/``): :func:`resolve` finds the first usable one. A
function that takes a third argument gets the call's deadline in milliseconds (the time this
call has, shorter than the manager's switch phase); MindSpore's and torch_npu's
``(ranks, flags)`` do not.
"""

import ctypes
import dataclasses
import importlib
import inspect
import json
from typing import Any, Callable, Optional, Tuple

from taskd.python.cython_api.cython_api import IN_FLIGHT_FN, SWITCH_FN
from taskd.python.framework.spec import Framework, Location


class FrameworkError(Exception):
    """The framework or its switch function is missing."""


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A switch function found in this process: its name (as logs and reasons say it), the
    function, the synchronisation to call first (or ``None``), and the communication library it
    moves (``"hccl"``, ``"gloo"``: the native worker's ``backend``)."""

    name: str
    function: Callable[..., Any]
    sync: Optional[Callable[[], Any]]
    backend: str

    @property
    def moves_hccl(self) -> bool:
        """Deprecated: whether :attr:`backend` is ``"hccl"``."""
        return self.backend == "hccl"


def _find(location: Location) -> Tuple[str, Any]:
    name = str(location)
    try:
        obj = importlib.import_module(location.module)
    except ImportError as e:
        raise FrameworkError("cannot import %s for %s: %s" % (location.module, name, e))
    for part in location.attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise FrameworkError(
                "%s does not exist: this version of the framework cannot switch NICs" % name
            )
    return name, obj


def resolve(framework: Framework) -> Resolved:
    """The framework's first usable switch function (``"pt"`` without torch_npu: taskd's own
    switch for Gloo process groups), found; ``FrameworkError`` naming what is missing."""
    for entry in framework.switches:
        if entry.usable():
            name, function = _find(entry.function)
            sync = _find(entry.sync)[1] if entry.sync is not None else None
            return Resolved(name, function, sync, entry.backend)
    raise FrameworkError("%s has no switch function usable in this process (%s)" % (
        framework.name, ", ".join(e.name for e in framework.switches)))


def in_flight_of(resolved: Resolved) -> Optional[Callable[[dict], dict]]:
    """The in-flight side of the switch function's module (``in_flight_request``, which
    taskd's Gloo switch has), or ``None``."""
    module = importlib.import_module(getattr(resolved.function, "__module__", "") or "builtins")
    fn = getattr(module, "in_flight_request", None)
    return fn if callable(fn) else None


def in_flight_callback(function, logger):
    """The ctypes callback of an in-flight side: the JSON request to ``function(dict)``, its
    dict back as JSON; an exception is the call's failure, its text the reason."""

    def call(request, reply, reply_len, _user):
        req = {}
        try:
            req = json.loads(request.decode("utf-8"))
            answer = function(req)
            _write_reason(reply, reply_len, json.dumps(answer if answer is not None else {}))
            return True
        except BaseException as e:  # noqa: B902 - nothing may escape into the library
            reason = "%s: %s" % (type(e).__name__, e)
            logger.error("in-flight %s failed: %s", req.get("op", "request"), reason)
            _write_reason(reply, reply_len, reason)
            return False

    return IN_FLIGHT_FN(call)


def takes_deadline(function):
    """Whether ``function`` accepts a third positional argument (the deadline)."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _write_reason(err, err_len, reason):
    if not err or err_len == 0:
        return
    data = reason.encode("utf-8", "replace")[: err_len - 1]
    ctypes.memmove(err, data, len(data))
    ctypes.memset(err + len(data), 0, 1)


def callback(name, function, logger, sync=None):
    """The ctypes callback: ``sync()``, then ``function(ranks, use_backup)`` (lists of int and
    bool), or ``function(ranks, use_backup, timeout_ms)`` when it takes the deadline."""
    deadline = takes_deadline(function)

    def switch(ranks_p, flags_p, n, timeout_ms, _user, err, err_len):
        ranks, flags = [], []
        try:
            ranks = [int(ranks_p[i]) for i in range(n)]
            flags = [bool(flags_p[i]) for i in range(n)]
            logger.info("switching NICs through %s: ranks %s, use_backup %s (%d ms)", name, ranks,
                        flags, timeout_ms)
            if sync is not None:
                sync()
            result = function(ranks, flags, timeout_ms) if deadline else function(ranks, flags)
            if result:
                return True
            reason = "%s(%s, %s) returned %r" % (name, ranks, flags, result)
        except BaseException as e:  # noqa: B902 - nothing may escape into the library
            reason = "%s(%s, %s) raised %s: %s" % (name, ranks, flags, type(e).__name__, e)
        logger.error("NIC switch failed: %s", reason)
        _write_reason(err, err_len, reason)
        return False

    return SWITCH_FN(switch)
