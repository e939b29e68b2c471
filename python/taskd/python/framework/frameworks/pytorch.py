"""PyTorch (``"pt"``, ``"PyTorch"``): its node rank, its switch functions, and taskd's step gate
without a line in the training loop.

**Node rank:** ``$RANK // $LOCAL_WORLD_SIZE`` (torchrun's), else torchrun's ``$GROUP_RANK`` when
the script's environment lost ``$RANK``.

**Switch:** ``torch_npu.npu._comm_switch_nic(ranks, useBackup)`` where torch_npu is importable
(it synchronises the device itself); without torch_npu, taskd's own switch for Gloo process
groups (``taskd/python/framework/gloo.py``), which moves no HCCL communicator.

**Hooks:** from ``start_taskd_worker()`` on, taskd registers a global optimizer step
post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``, torch 2.0 and later):
after every ``optimizer.step()`` of the process it calls the gate with its own count of steps
(1, 2, ...). The first explicit ``taskd.api.step_completed(step)`` call turns the hook off for
good (the loop's own step numbers win). ``TASKD_PT_OPTIMIZER_HOOK=off`` never installs it.
Several optimizers stepping in one training step count several steps: such loops call
``step_completed`` themselves.
"""

import importlib.util
import itertools
from typing import Callable, Mapping, Optional

from taskd.python.framework.spec import Framework, HookContext, Location, SwitchFunction
from taskd.python.framework.spec import env_int, switched_on

ENV_SWITCH = "TASKD_PT_OPTIMIZER_HOOK"


def node_rank(environ: Mapping[str, str]) -> int:
    if not environ.get("RANK", "").strip() and environ.get("GROUP_RANK", "").strip():
        return env_int(environ, "GROUP_RANK")
    local = env_int(environ, "LOCAL_WORLD_SIZE")
    if local <= 0:
        raise ValueError("$LOCAL_WORLD_SIZE=%d is not positive" % local)
    return env_int(environ, "RANK") // local


def enabled() -> bool:
    """Whether the hook is to be installed (``TASKD_PT_OPTIMIZER_HOOK`` is not off)."""
    return switched_on(ENV_SWITCH)


def install(gate: Callable[[int], None], active: Callable[[], bool]) -> Optional[Callable[[], None]]:
    """Registers the hook; ``active()`` says whether it still gates. Returns how to undo it,
    or ``None`` when this torch has no global optimizer hook."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return None
    steps = itertools.count(1)

    def hook(_optimizer, _args, _kwargs):
        if active():
            gate(next(steps))

    handle = register_optimizer_step_post_hook(hook)
    return handle.remove


def install_hooks(ctx: HookContext) -> Optional[Callable[[], None]]:
    if not enabled():
        return None
    remove = install(ctx.gate, ctx.gating)
    if remove is None:
        ctx.log.warning(
            "this torch has no global optimizer step hook: the training loop must call "
            "taskd.api.step_completed(step) after every step")
    return remove


def _has_torch_npu() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


FRAMEWORK = Framework(
    code="pt",
    name="PyTorch",
    node_rank=node_rank,
    install_hooks=install_hooks,
    switches=(
        SwitchFunction(Location("torch_npu", "npu._comm_switch_nic"), usable=_has_torch_npu),
        SwitchFunction(Location("taskd.python.framework.gloo", "switch_nic"), backend="gloo"),
    ),
    launcher="taskd.python.framework.agent.torchrun",
)
