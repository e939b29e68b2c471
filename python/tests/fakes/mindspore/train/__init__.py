"""FAKE ``mindspore.train``: ``Model.train`` runs steps and calls callbacks the way MindSpore
does (``on_train_step_end(run_context)`` after each step, ``run_context.original_args()
.cur_step_num`` counting steps from 1 over all epochs, ``request_stop()`` ending training after
the current step); the base ``Callback.on_train_step_end`` calls ``step_end``."""

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


class Model:
    def __init__(self, network, loss_fn=None, optimizer=None, **kwargs):
        self._network = network

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1,
              initial_epoch=0):
        cbs = _callbacks(callbacks)
        params = _Params()
        ctx = RunContext(params)
        for c in cbs:
            c.on_train_begin(ctx)
        for ep in range(initial_epoch, epoch):
            params.cur_epoch_num = ep + 1
            for c in cbs:
                c.on_train_epoch_begin(ctx)
            for data in train_dataset:
                for c in cbs:
                    c.on_train_step_begin(ctx)
                with fake_framework.training_step():
                    self._network(data)
                params.cur_step_num += 1
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
