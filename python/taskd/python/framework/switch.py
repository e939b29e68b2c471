"""The framework's switch function, as the native worker calls it: on the training thread,
inside the step gate, while that thread is held.

Every worker calls its framework with the WHOLE target list of an operation (global ranks and
their flags, the same on every rank): the framework maps them onto each of its communicators.
``False`` or an exception is this rank's failure; its text goes back to the manager.

Each framework is one entry of ``SWITCH_FUNCTIONS``: the switch function, and the stream
synchronisation to run before it (MindSpore's ``mindspore.runtime.synchronize()``, as MindIO's
TSP path does; torch_npu's function synchronises the device itself). A function that takes a
third argument gets the call's deadline in milliseconds (the time this call has, shorter than
the manager's switch phase); MindSpore's and torch_npu's ``(ranks, flags)`` do not.
"""

import collections
import ctypes
import importlib
import importlib.util
import inspect

from taskd.python.cython_api.cython_api import SWITCH_FN

#: where a framework's function is: module and attribute path
Location = collections.namedtuple("Location", "module attr")
#: a framework's switch function, and the synchronisation to run first (or ``None``)
FrameworkSwitch = collections.namedtuple("FrameworkSwitch", "function sync")

SWITCH_FUNCTIONS = {
    "ms": FrameworkSwitch(Location("mindspore.communication.management", "_comm_switch_nic"),
                          Location("mindspore.runtime", "synchronize")),
    "pt": FrameworkSwitch(Location("torch_npu", "npu._comm_switch_nic"), None),
}


class FrameworkError(Exception):
    """The framework or its switch function is missing."""


def _find(location):
    name = "%s.%s" % location
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


def resolve(framework):
    """``(name, function, sync)`` of the framework's switch function; ``sync`` is the function
    to call before it, or ``None``. ``"pt"`` without torch_npu is taskd's own switch for Gloo
    process groups (``taskd/python/framework/gloo.py``)."""
    if framework == "pt" and importlib.util.find_spec("torch_npu") is None:
        from taskd.python.framework import gloo

        return gloo.NAME, gloo.switch_nic, None
    entry = SWITCH_FUNCTIONS[framework]
    name, function = _find(entry.function)
    sync = _find(entry.sync)[1] if entry.sync is not None else None
    return name, function, sync


def moves_hccl(name):
    """Whether the switch function ``name`` (as :func:`resolve` names it) moves HCCL
    communicators, so that the rank needs HCCL's L2 retry and RDMA links for it."""
    from taskd.python.framework import gloo

    return name != gloo.NAME


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
