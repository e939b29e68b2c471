"""MindSpore (``"ms"``, ``"MindSpore"``): its node rank, its switch function, and taskd's step
gate as a step-end callback of every ``Model.train`` and ``Model.fit`` call.

**Node rank:** ``$MS_NODE_RANK`` (MindCluster's platform sets it; msrun's taskd agent sets it
for the workers it starts).

**Switch:** ``mindspore.communication.management._comm_switch_nic(global_ranks, use_backup)``
after ``mindspore.runtime.synchronize()`` (the stream synchronisation MindIO's TSP path runs).

**Hooks:** from ``start_taskd_worker()`` on, ``mindspore.train.Model.train`` and ``Model.fit``
are wrapped: each call gets one more callback, last in its list, whose ``on_train_step_end``
(MindSpore's ``Callback`` protocol) calls the gate. The gate's step is the process's own count
of step ends, 1, 2, 3, ... across every call: ``cur_step_num`` starts again at every
``Model.train`` call (a per-epoch loop of ``model.train(1, ...)``), and in sink mode it rises by
``sink_size`` per callback, while the count rises by one per boundary that every rank of a job
in lockstep reaches. The user's callbacks are kept, in their order; a list that already holds
the gate is left alone. The first call of either in the process first waits until every rank
of the job has registered with the manager (``before_first_train``, at most
``$TASKD_START_WAIT_MS``): a restarted rank must not run its first collective ahead of a peer
still starting. ``destroy_taskd_worker()`` restores both methods.
``TASKD_MS_STEP_CALLBACK=off`` leaves them alone (the training loop then calls
``taskd.api.step_completed(step)`` itself).
"""

import functools
import inspect
import itertools
from typing import Callable, Mapping, Optional

from taskd.python.framework.spec import Framework, HookContext, Location, SwitchFunction
from taskd.python.framework.spec import env_int, switched_on

ENV_SWITCH = "TASKD_MS_STEP_CALLBACK"
#: the methods of ``mindspore.train.Model`` that train and take ``callbacks``
GATED = ("train", "fit")


def node_rank(environ: Mapping[str, str]) -> int:
    if not environ.get("MS_NODE_RANK", "").strip():
        raise ValueError(
            "$MS_NODE_RANK is not set: set it to this node's rank (msrun's --node_rank); "
            "msrun's taskd agent (MS_ENABLE_TFT with TSP:1) sets it for its workers")
    return env_int(environ, "MS_NODE_RANK")


def enabled() -> bool:
    """Whether the callback is to be injected (``TASKD_MS_STEP_CALLBACK`` is not off)."""
    return switched_on(ENV_SWITCH)


def _callback_class(base, gate):
    steps = itertools.count(1)  # one count for the process, over every call

    class TaskdStepCallback(base):
        """taskd's step gate (added by taskd to ``Model.train`` and ``Model.fit``;
        ``TASKD_MS_STEP_CALLBACK=off`` turns that off). Holds training at the end of a step
        while taskd switches NICs."""

        def on_train_step_end(self, run_context):
            gate(next(steps))

    return TaskdStepCallback


def _with_gate(callbacks, cls):
    if callbacks is None:
        return [cls()]
    listed = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if any(isinstance(c, cls) for c in listed):
        return callbacks
    return listed + [cls()]


def _gated(original, cls, first):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(*args, **kwargs):
        if first:  # once per process, over every wrapped method
            first.pop()()
        bound = signature.bind(*args, **kwargs)
        bound.arguments["callbacks"] = _with_gate(bound.arguments.get("callbacks"), cls)
        return original(*bound.args, **bound.kwargs)

    method.taskd_step_callback = cls
    return method


def install(gate: Callable[[int], None], before_first: Callable[[], None]) -> Callable[[], None]:
    """Wraps ``Model.train`` and ``Model.fit`` (those this MindSpore has): every call gets the
    gate, and the process's first call runs ``before_first()`` before training. Returns how to
    undo it."""
    from mindspore.train import Callback, Model

    cls = _callback_class(Callback, gate)
    first = [before_first]
    wrapped = {}
    for name in GATED:
        original = getattr(Model, name, None)
        if original is not None:
            wrapped[name] = (original, _gated(original, cls, first))
            setattr(Model, name, wrapped[name][1])

    def uninstall():
        for name, (original, method) in wrapped.items():
            if getattr(Model, name) is method:
                setattr(Model, name, original)

    return uninstall


def install_hooks(ctx: HookContext) -> Optional[Callable[[], None]]:
    if not enabled():
        ctx.log.info("%s=off: the training loop calls taskd.api.step_completed", ENV_SWITCH)
        return None
    return install(ctx.gate, ctx.before_first_train)


FRAMEWORK = Framework(
    code="ms",
    name="MindSpore",
    node_rank=node_rank,
    install_hooks=install_hooks,
    switches=(
        SwitchFunction(Location("mindspore.communication.management", "_comm_switch_nic"),
                       sync=Location("mindspore.runtime", "synchronize")),
    ),
    launcher="taskd.python.framework.agent.msrun",
)
