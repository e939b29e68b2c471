"""What taskd needs to know of a training framework, as types: one :class:`Framework` per
framework (``taskd/python/framework/frameworks/``), each with its switch functions
(:class:`SwitchFunction`, one per communication backend), its node-rank rule and its step-gate
hooks. Nothing here imports a framework."""

import dataclasses
import logging
import os
from typing import Callable, Mapping, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a function is: its module, and the attribute path inside it (``"npu.fn"``)."""

    module: str
    attr: str

    def __str__(self) -> str:
        return "%s.%s" % (self.module, self.attr)


def always() -> bool:
    return True


#: the communication libraries a switch function can move, as the native worker's ``backend``
#: key names them (``SwitchBackend`` in ``capi/src/worker.rs``): what the rank's switch needs of
#: its process follows from it (HCCL: L2 retry and RDMA links; Gloo: nothing to check)
BACKENDS = ("hccl", "gloo")


@dataclasses.dataclass(frozen=True)
class SwitchFunction:
    """A function that moves a framework's communicators to other NICs, as the worker calls it:
    ``function(ranks, use_backup)`` (or with a third argument, the deadline in ms).

    ``sync``: the stream synchronisation to run before it, or ``None``. ``backend``: the
    communication library whose communicators it moves, one of :data:`BACKENDS` (``"hccl"``:
    the rank then needs HCCL's L2 retry and RDMA links). ``usable()``: whether it is the one for
    this process (the first usable entry of a framework's ``switches`` is used).
    ``moves_hccl``: deprecated, ``False`` for ``backend="gloo"``."""

    function: Location
    sync: Optional[Location] = None
    backend: str = "hccl"
    usable: Callable[[], bool] = always
    moves_hccl: Optional[bool] = None

    def __post_init__(self):
        if self.moves_hccl is not None:
            if self.backend != "hccl" and self.moves_hccl:
                raise ValueError("%s: moves_hccl=True contradicts backend=%r" % (
                    self.function, self.backend))
            if not self.moves_hccl:
                object.__setattr__(self, "backend", "gloo")
        if self.backend not in BACKENDS:
            raise ValueError("%s: backend %r is none of %s" % (
                self.function, self.backend, ", ".join(BACKENDS)))

    @property
    def name(self) -> str:
        return str(self.function)


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a framework's hooks get from the worker: ``gate(step)`` (the step gate; raises
    ``taskd.TrainingStopped``), ``before_first_train()`` (waits for the whole job, bounded),
    ``gating()`` (whether a hook still gates: the loop's own ``step_completed`` calls turn the
    hooks off), and the logger."""

    gate: Callable[[int], None]
    before_first_train: Callable[[], None]
    gating: Callable[[], bool]
    log: logging.Logger


#: installs a framework's hooks; returns how to remove them, or ``None`` when it installed none
InstallHooks = Callable[[HookContext], Optional[Callable[[], None]]]
#: a framework's node rank from the training process's environment; ``ValueError`` naming the
#: variable to set when it cannot
NodeRank = Callable[[Mapping[str, str]], int]


@dataclasses.dataclass(frozen=True)
class Framework:
    """One training framework.

    ``code``: the worker API's spelling (``init_taskd_worker(..., framework="ms")``); ``name``:
    the agent API's (``init_taskd_agent({"Framework": "MindSpore"})``); ``aliases``: other
    spellings :func:`taskd.python.framework.frameworks.lookup` accepts. ``launcher``: the module
    of the launcher adapter whose node agent runs this framework's processes
    (``taskd/python/framework/agent/``)."""

    code: str
    name: str
    node_rank: NodeRank
    install_hooks: InstallHooks
    switches: Tuple[SwitchFunction, ...]
    launcher: str
    aliases: Tuple[str, ...] = ()

    def spellings(self) -> Tuple[str, ...]:
        return (self.code, self.name) + tuple(self.aliases)


def env_int(environ: Mapping[str, str], name: str) -> int:
    """``$name`` as an int; ``ValueError`` naming the variable when it is unset or not one."""
    value = environ.get(name, "").strip()
    if not value:
        raise ValueError("$%s is not set" % name)
    try:
        return int(value)
    except ValueError:
        raise ValueError("$%s=%r is not an integer" % (name, value))


_OFF = ("off", "0", "false", "no")


def switched_on(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the on/off variable ``name`` is on (unset: on)."""
    env = os.environ if environ is None else environ
    return env.get(name, "on").strip().lower() not in _OFF
