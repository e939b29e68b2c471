"""The framework's switch function, as the native worker calls it.

Every worker calls its framework with the WHOLE target list of an operation (global ranks and
their flags, the same on every rank): the framework maps them onto each of its communicators.
``False`` or an exception is this rank's failure; its text goes back to the manager.
"""

import ctypes
import importlib
import importlib.util

from taskd.python.cython_api.cython_api import SWITCH_FN

#: framework -> (module, attribute path) of its switch function
SWITCH_FUNCTIONS = {
    "ms": ("mindspore.communication.management", "_comm_switch_nic"),
    "pt": ("torch_npu", "npu._comm_switch_nic"),
}


class FrameworkError(Exception):
    """The framework or its switch function is missing."""


def resolve(framework):
    """``(name, function)`` of the framework's switch function (``"pt"`` without torch_npu:
    taskd's own switch for Gloo process groups)."""
    if framework == "pt" and importlib.util.find_spec("torch_npu") is None:
        from taskd.python.framework import gloo

        return gloo.NAME, gloo.switch_nic
    module_name, attr = SWITCH_FUNCTIONS[framework]
    name = "%s.%s" % (module_name, attr)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise FrameworkError("cannot import %s for %s: %s" % (module_name, name, e))
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise FrameworkError(
                "%s does not exist: this version of the framework cannot switch NICs" % name
            )
    return name, obj


def _write_reason(err, err_len, reason):
    if not err or err_len == 0:
        return
    data = reason.encode("utf-8", "replace")[: err_len - 1]
    ctypes.memmove(err, data, len(data))
    ctypes.memset(err + len(data), 0, 1)


def callback(name, function, logger):
    """The ctypes callback calling ``function(ranks, use_backup)`` (lists of int and bool)."""

    def switch(ranks_p, flags_p, n, _user, err, err_len):
        ranks, flags = [], []
        try:
            ranks = [int(ranks_p[i]) for i in range(n)]
            flags = [bool(flags_p[i]) for i in range(n)]
            logger.info("switching NICs through %s: ranks %s, use_backup %s", name, ranks, flags)
            result = function(ranks, flags)
            if result:
                return True
            reason = "%s(%s, %s) returned %r" % (name, ranks, flags, result)
        except BaseException as e:  # noqa: B902 - nothing may escape into the library
            reason = "%s(%s, %s) raised %s: %s" % (name, ranks, flags, type(e).__name__, e)
        logger.error("NIC switch failed: %s", reason)
        _write_reason(err, err_len, reason)
        return False

    return SWITCH_FN(switch)
