"""The frameworks taskd runs in: one module each, one line each in :data:`REGISTRY`.

A framework's module exports ``FRAMEWORK``, a :class:`taskd.python.framework.spec.Framework`:
its spellings (the worker API's ``"pt"``, the agent API's ``"PyTorch"``), its node-rank rule,
its step-gate hooks, its switch functions (one per communication backend, the first usable one
is used) and its launcher adapter. Nothing else in the package branches on a framework.
"""

from typing import Tuple

from taskd.python.framework.frameworks import mindspore, pytorch
from taskd.python.framework.spec import Framework

#: every framework, in the order their spellings are listed in messages
REGISTRY: Tuple[Framework, ...] = (
    pytorch.FRAMEWORK,
    mindspore.FRAMEWORK,
)


def codes() -> Tuple[str, ...]:
    """The worker API's spellings: ``("pt", "ms")``."""
    return tuple(f.code for f in REGISTRY)


def names() -> Tuple[str, ...]:
    """The agent API's spellings: ``("PyTorch", "MindSpore")``."""
    return tuple(f.name for f in REGISTRY)


def _listed(spellings: Tuple[str, ...], quote: bool) -> str:
    shown = [repr(s) if quote else s for s in spellings]
    return " or ".join(shown) if len(shown) <= 2 else ", ".join(shown[:-1]) + " or " + shown[-1]


def by_code(code: str) -> Framework:
    """The framework ``init_taskd_worker(..., framework=code)`` names; ``ValueError`` listing
    the codes otherwise."""
    for f in REGISTRY:
        if f.code == code:
            return f
    raise ValueError("framework must be %s, got %r" % (_listed(codes(), True), code))


def by_name(name: str) -> Framework:
    """The framework ``init_taskd_agent({"Framework": name})`` names; ``ValueError`` listing
    the names otherwise."""
    for f in REGISTRY:
        if f.name == name:
            return f
    raise ValueError("Framework must be %s, got %r" % (_listed(names(), False), name))


def lookup(spelling: str) -> Framework:
    """The framework any of its spellings names (code, name or alias)."""
    for f in REGISTRY:
        if spelling in f.spellings():
            return f
    raise ValueError("no framework is called %r (known: %s)" % (
        spelling, ", ".join(s for f in REGISTRY for s in f.spellings())))
