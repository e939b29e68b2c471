"""A training process of the end-to-end job, with the seed's worker lines, against the FAKE
frameworks of python/tests/fakes. It trains until its standard input closes, then prints what
its framework was asked (one JSON object) and exits.

    python train.py ms      # MindFormers: init_taskd_worker(get_rank(), 5000, "ms") before model.train
                            # ($TRAIN_SINK_SIZE=N: in sink mode, a step-end callback every N steps)
    python train.py pt      # MindSpeed-LLM: the same lines with "pt" after torch.distributed init;
                            # $TRAIN_STEP_CALLS=1: the loop calls taskd.api.step_completed itself,
                            # otherwise taskd's optimizer step hook is the gate
"""

import json
import os
import sys
import threading
import time

import fake_framework

stop = threading.Event()


def watch_stdin():
    sys.stdin.read()
    stop.set()


def compute(_data):
    time.sleep(0.002)  # the step's simulated compute


def train_mindspore():
    from mindspore.communication import get_rank
    from mindspore.train import Callback, Model

    from taskd.api import init_taskd_worker, start_taskd_worker

    class StopWhenTold(Callback):  # the script's own callback
        def on_train_step_end(self, run_context):
            if stop.is_set():
                run_context.request_stop()

    model = Model(compute)
    init_taskd_worker(get_rank(), 5000, "ms")
    start_taskd_worker()
    sink = int(os.environ.get("TRAIN_SINK_SIZE") or 0)
    if sink:  # Ascend's sink mode: one step-end callback every `sink` steps
        model.train(10 ** 9, range(100), callbacks=[StopWhenTold()], dataset_sink_mode=True,
                    sink_size=sink)
    else:
        model.train(10 ** 9, range(100), callbacks=[StopWhenTold()])


def train_pytorch():
    import torch
    import torch_npu  # noqa: F401

    import taskd.api
    from taskd.api import init_taskd_worker, start_taskd_worker

    init_taskd_worker(int(os.environ["RANK"]), 5000, "pt")
    start_taskd_worker()
    explicit = os.environ.get("TRAIN_STEP_CALLS") == "1"
    optimizer = torch.optim.SGD()
    step = 0
    while not stop.is_set():
        with fake_framework.training_step():
            compute(step)
        optimizer.step()
        step += 1
        if explicit:
            taskd.api.step_completed(step)


def main():
    threading.Thread(target=watch_stdin, daemon=True).start()
    if sys.argv[1] == "ms":
        train_mindspore()
    else:
        train_pytorch()
    print(json.dumps({"calls": fake_framework.calls, "steps": fake_framework.last_step}), flush=True)


main()
