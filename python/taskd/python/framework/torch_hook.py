"""PyTorch: taskd's step gate without a line in the training loop.

From ``start_taskd_worker()`` on (framework ``"pt"``), taskd registers a global optimizer step
post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``, torch 2.0 and later):
after every ``optimizer.step()`` of the process it calls the gate with its own count of steps
(1, 2, ...). The first explicit ``taskd.api.step_completed(step)`` call turns the hook off for
good (the loop's own step numbers win). ``TASKD_PT_OPTIMIZER_HOOK=off`` never installs it.
Several optimizers stepping in one training step count several steps: such loops call
``step_completed`` themselves.
"""

import itertools
import os

ENV_SWITCH = "TASKD_PT_OPTIMIZER_HOOK"
_OFF = ("off", "0", "false", "no")


def enabled():
    """Whether the hook is to be installed (``TASKD_PT_OPTIMIZER_HOOK`` is not off)."""
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in _OFF


def install(gate, active):
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
