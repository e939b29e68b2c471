"""A training process of the real-MindSpore job (``msrun_job.py``): data-parallel training of a
small network on the CPU, with the seed's worker lines right before training.

    msrun --worker_num 2 --local_worker_num 2 ... msrun_train.py

``$TRAIN_LOOP``: ``train`` (one ``model.train`` call), ``epochs`` (one ``model.train(1, ...)``
call per epoch) or ``fit`` (``model.fit``). Training ends on every rank at the same step once
``$TRAIN_STOP_FILE`` exists on any rank (the ranks agree through an all-reduce at each step).
Then the process writes ``$TRAIN_OUT/rank-R.json``: the steps it trained, every call of the
framework's ``_comm_switch_nic`` (at which step, on which thread, with what) and its
parameters. ``$TRAIN_FAIL_SWITCH_RANK=R``: rank R's framework function fails every call in the first
incarnation (``$TASKD_RESTART_COUNT`` 0), with the framework's own error when it cannot switch.
``$TRAIN_SLOW_RESTART_RANK=R``: rank R's restarted processes start ``SLOW_RESTART_S`` late, as a
peer slow to come back (loading a checkpoint) does.
"""

import json
import os
import threading
import time

import numpy as np

import mindspore as ms
import mindspore.communication.management as management
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops
from mindspore.communication import get_rank, init
from mindspore.train import Callback, Model

from taskd.api import init_taskd_worker, start_taskd_worker


class Steps(Callback):
    """The script's own callback: counts the process's steps and stops every rank at once."""

    def __init__(self, stop_file, rank):
        super().__init__()
        self.rank = rank
        self.done = 0
        self.first = self.last = None  # when the first and the last step ended
        self.stop_file = stop_file
        self.stopped = False
        self.sum = ops.AllReduce()

    def on_train_step_end(self, run_context):
        self.done += 1
        self.last = time.monotonic()
        if self.first is None:
            self.first = self.last
        mine = 1.0 if os.path.exists(self.stop_file) else 0.0
        if self.sum(Tensor(np.array([mine], np.float32))).asnumpy()[0] > 0:
            self.stopped = True
            run_context.request_stop()
        if self.done == 1:  # the collectives of this incarnation work
            print("rank %d trained its first step (incarnation %s)" % (
                self.rank, os.environ.get("TASKD_RESTART_COUNT", "0")), flush=True)


def record_switches(steps, rank):
    """Wraps the framework's switch function: what it is asked, when, on which thread."""
    real = management._comm_switch_nic
    calls = []
    first = os.environ.get("TASKD_RESTART_COUNT", "0") == "0"  # set by taskd's agent
    fail = first and os.environ.get("TRAIN_FAIL_SWITCH_RANK", "") == str(rank)

    def switch(ranks, use_backup):
        calls.append({"ranks": list(ranks), "use_backup": list(use_backup), "step": steps.done,
                      "training_thread": threading.current_thread() is threading.main_thread()})
        if fail:
            raise RuntimeError("The pointer[device_comm_lib_instance_] is null.")
        return real(ranks, use_backup)

    management._comm_switch_nic = switch
    return calls


def dataset(rank):
    def samples():
        rng = np.random.default_rng(rank)
        for _ in range(32):
            x = rng.standard_normal(8).astype(np.float32)
            yield x, np.array([x.sum()], np.float32)

    return ds.GeneratorDataset(samples, ["x", "y"], shuffle=False).batch(4)


#: How late ``$TRAIN_SLOW_RESTART_RANK``'s restarted process starts (before MindSpore's
#: ``init()``). MindSpore's CPU collectives connect to a peer once, at the first collective, and
#: fail after their send timeout (``Ring ReduceScatter wait sending 1 failed``, 30 s) when nobody
#: listens there yet; msrun's scheduler lets the punctual rank past ``init()`` at once after a
#: restart. The delay must outlast the punctual rank's way from ``init()`` to its first collective,
#: so that without taskd's wait for the whole job that collective always fails: with 3 s it did not
#: always, with 4 s it always did (docs/python.md, "Why a restart waits for the whole job"); 8 s
#: leaves room on a loaded machine.
SLOW_RESTART_S = 8


def main():
    restarted = os.environ.get("TASKD_RESTART_COUNT", "0") != "0"
    if restarted and os.environ.get("RANK_ID") == os.environ.get("TRAIN_SLOW_RESTART_RANK"):
        time.sleep(SLOW_RESTART_S)  # a slow start, before MindSpore's init()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank = get_rank()
    net = nn.Dense(8, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))
    steps = Steps(os.environ["TRAIN_STOP_FILE"], rank)
    calls = record_switches(steps, rank)
    data = dataset(rank)
    loop = os.environ.get("TRAIN_LOOP", "train")

    init_taskd_worker(get_rank(), 5000, "ms")
    start_taskd_worker()
    if loop == "train":
        model.train(10 ** 6, data, callbacks=[steps])
    elif loop == "fit":
        model.fit(10 ** 6, data, callbacks=[steps])
    else:
        while not steps.stopped:
            model.train(1, data, callbacks=[steps])

    params = [p.asnumpy().ravel().tolist() for p in net.trainable_params()]
    out = os.path.join(os.environ["TRAIN_OUT"], "rank-%d.json" % rank)
    with open(out, "w") as f:
        json.dump({"steps": steps.done, "seconds": steps.last - steps.first, "calls": calls,
                   "params": params}, f)


main()
