"""FAKE ``mindspore.train``: ``Model.train`` and ``Model.fit`` run steps and call callbacks the
way MindSpore does (``on_train_step_end(run_context)`` after each step, or after each sink of
``sink_size`` steps in sink mode; ``run_context.original_args().cur_step_num`` counting steps
from 1 over all epochs of one call; ``request_stop()`` ending training after the current step);
the base ``Callback.on_train_step_end`` calls ``step_end``."""

import fake_framework


class Callback:
    def on_train_begin(self, run_context):
        self.begin(run_context)

    def on_train_epoch_begin(self, run_context):
        self.epoch_begin(run_context)

    def on_train_step_begin(self, run_context):
        self.step_begin(run_context)

    def on_train_step_end(self, run_context):
        self.step_end(run_context)

    def on_train_epoch_end(self, run_context):
        self.epoch_end(run_context)

    def on_train_end(self, run_context):
        self.end(run_context)

    def begin(self, run_context):
        pass

    def epoch_begin(self, run_context):
        pass

    def step_begin(self, run_context):
        pass

    def step_end(self, run_context):
        pass

    def epoch_end(self, run_context):
        pass

    def end(self, run_context):
        pass


class _Params:
    cur_epoch_num = 0
    cur_step_num = 0


class RunContext:
    def __init__(self, original_args):
        self._original_args = original_args
        self._stop_requested = False

    def original_args(self):
        return self._original_args

    def request_stop(self):
        self._stop_requested = True

    def get_stop_requested(self):
        return self._stop_requested


def _callbacks(callbacks):
    if callbacks is None:
        return []
    listed = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    for c in listed:
        if not isinstance(c, Callback):
            raise TypeError("a callback must be a mindspore.train.Callback, got %r" % (c,))
    return listed


_OLD_METHODS = {"begin", "end", "epoch_begin", "epoch_end", "step_begin", "step_end"}
warnings = []  # what train() warned about, as MindSpore logs it


def _check_methods(callbacks, mode):
    """MindSpore's check: a custom callback defining an old-style method is warned about by
    ``train`` and refused by ``fit``."""
    for c in callbacks:
        old = set(type(c).__dict__) & _OLD_METHODS
        if old and mode == "fit":
            raise ValueError("For %s callback, %s methods may not be supported" % (type(c).__name__, old))
        if old:
            warnings.append("For %s callback, %s methods may not be supported" % (type(c).__name__, old))


class Model:
    def __init__(self, network, loss_fn=None, optimizer=None, **kwargs):
        self._network = network

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1,
              initial_epoch=0):
        cbs = _callbacks(callbacks)
        _check_methods(cbs, "train")
        self._train(epoch, train_dataset, cbs, dataset_sink_mode, sink_size, initial_epoch)

    def fit(self, epoch, train_dataset, valid_dataset=None, valid_frequency=1, callbacks=None,
            dataset_sink_mode=False, valid_dataset_sink_mode=False, sink_size=-1, initial_epoch=0):
        """As MindSpore's: ``self._train`` directly, never ``self.train``."""
        cbs = _callbacks(callbacks)
        _check_methods(cbs, "fit")
        self._train(epoch, train_dataset, cbs, dataset_sink_mode, sink_size, initial_epoch)

    def _train(self, epoch, train_dataset, cbs, sink, sink_size, initial_epoch):
        """``cur_step_num`` from 0 at every call; in sink mode (Ascend's) one step-end callback
        per ``sink_size`` steps, with ``cur_step_num`` risen by ``sink_size``."""
        data = list(train_dataset)
        per_callback = sink_size if sink and sink_size > 0 else (len(data) if sink else 1)
        params = _Params()
        ctx = RunContext(params)
        for c in cbs:
            c.on_train_begin(ctx)
        for ep in range(initial_epoch, epoch):
            params.cur_epoch_num = ep + 1
            for c in cbs:
                c.on_train_epoch_begin(ctx)
            for i in range(0, len(data), per_callback):
                for c in cbs:
                    c.on_train_step_begin(ctx)
                for item in data[i:i + per_callback]:
                    with fake_framework.training_step():
                        self._network(item)
                params.cur_step_num += len(data[i:i + per_callback])
                for c in cbs:
                    c.on_train_step_end(ctx)
                if ctx.get_stop_requested():
                    break
            for c in cbs:
                c.on_train_epoch_end(ctx)
            if ctx.get_stop_requested():
                break
        for c in cbs:
            c.on_train_end(ctx)
