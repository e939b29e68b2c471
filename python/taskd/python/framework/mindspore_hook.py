"""MindSpore: taskd's step gate as a step-end callback of every ``Model.train`` call.

From ``start_taskd_worker()`` on (framework ``"ms"``), ``mindspore.train.Model.train`` is
wrapped: each call gets one more callback, last in its list, whose ``on_train_step_end``
(MindSpore's ``Callback`` protocol; ``step_end`` for versions that call that instead) calls
the gate with ``run_context.original_args().cur_step_num``. The user's callbacks are kept, in
their order; a list that already holds the gate is left alone. ``destroy_taskd_worker()``
restores ``Model.train``. ``TASKD_MS_STEP_CALLBACK=off`` leaves ``Model.train`` alone (the
training loop then calls ``taskd.api.step_completed(step)`` itself).
"""

import functools
import os

ENV_SWITCH = "TASKD_MS_STEP_CALLBACK"
_OFF = ("off", "0", "false", "no")


def enabled():
    """Whether the callback is to be injected (``TASKD_MS_STEP_CALLBACK`` is not off)."""
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in _OFF


def _callback_class(base, gate):
    class TaskdStepCallback(base):
        """taskd's step gate (added by taskd to ``Model.train``; ``TASKD_MS_STEP_CALLBACK=off``
        turns that off). Holds training at the end of a step while taskd switches NICs."""

        def on_train_step_end(self, run_context):
            gate(run_context.original_args().cur_step_num)

        def step_end(self, run_context):
            gate(run_context.original_args().cur_step_num)

    return TaskdStepCallback


def _with_gate(callbacks, cls):
    if callbacks is None:
        return [cls()]
    listed = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if any(isinstance(c, cls) for c in listed):
        return callbacks
    return listed + [cls()]


def install(gate):
    """Wraps ``mindspore.train.Model.train``; returns how to undo it."""
    from mindspore.train import Callback, Model

    cls = _callback_class(Callback, gate)
    original = Model.train

    @functools.wraps(original)
    def train(self, epoch, train_dataset, callbacks=None, *args, **kwargs):
        return original(self, epoch, train_dataset, _with_gate(callbacks, cls), *args, **kwargs)

    train.taskd_step_callback = cls
    Model.train = train

    def uninstall():
        if Model.train is train:
            Model.train = original

    return uninstall
