"""The reference's convention for every ``init_*``, ``start_*`` and ``destroy_*``: a bool, never
an exception; the reason for ``False`` is logged (logger ``taskd``)."""

import functools

from taskd.python.utils.log import get_logger


def returns_bool(fn):
    """``fn`` returns ``True`` or raises with the reason; the wrapped function logs the reason
    and returns ``False`` instead."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return bool(fn(*args, **kwargs))
        except Exception as e:
            get_logger().error("%s failed: %s", fn.__name__, e)
            return False

    return wrapper
