#!/usr/bin/env python3
"""A STAND-IN for a MindSpore 2.10.0 training process on an Ascend device with MindIO TTP (not
MindSpore): it makes the MindIO calls MindSpore 2.10.0 makes, in the same order and with the
same arguments, with ``MINDIO_FOR_MINDSPORE=1`` and the FAKE ``mindspore`` of ``fakems/`` (the
one MindSpore symbol MindIO touches). The real ``mindio_ttp`` wheel does the rest.

What it mirrors, call for call (MindSpore 2.10.0's wheel, ``mindspore/...``):

``utils/utils.py``
  ``TftHandle.init`` (:264-339): ``int(MS_TFT_PORT)``, ``MS_TFT_IP`` (:288-289); ``from
  mindio_ttp import framework_ttp`` (:295); ``MS_WORKER_NUM``, ``MS_NODE_ID`` (:299-300); rank 0
  starts a controller of its own only when ``MINDX_TASK_ID`` is unset (:305-313; with this
  MindIO that aborts rank 0: a second logger in one process); ``tft_init_processor(rank, world,
  False, False, "", enable_arf=...)`` (:317-318); ``tft_start_processor(ip, port)`` (:319);
  ``tft_is_reboot_node()`` and, for a re-launched ARF rank, ``tft_report_error(RS_INIT_FINISH)``
  and ``tft_wait_next_action()`` (:322-339).
  ``TftHandle.unregister_tft`` (:222-227): ``tft_destroy_processor()``.
``train/callback/_train_fault_tolerance.py``
  ``TrainFaultTolerance.__init__`` (:647-688): ``MS_ENABLE_TFT`` exactly ``{TSP:1}`` registers
  only the stream-sync handler (:654-658, :761-767); otherwise ``_tft_register`` (:875-885):
  save, rename, exit, stop, clean, repair, rebuild-group handlers, and stream sync with TSP:1.
  The handlers as MindSpore writes them: ``_get_ckpt_dir`` (:51-55),
  ``_save_checkpoint_on_failure`` (:58-99, the default path: no ``ckpt_save_fn``),
  ``_rename_save_result`` (:102-112), ``_tft_exit_cb`` (:115-119: ``os._exit(1)``),
  ``_tft_repair_callback`` (:122-149), ``_tft_clean_callback`` (:152-173),
  ``_tft_stop_callback`` (:176-186), ``_tft_rebuild_groups`` (:189-198).
  ``on_train_begin`` (:981-1008): ``tft_set_step_args(cb_params)`` (:1007).
  ``on_train_step_end`` (:909-942): ``{TSP:1}`` only: ``tft_pause_train(cur_step_num)``
  (:932-935); otherwise at the first step ``tft_set_optimizer_replica(rank, [{"type": 1,
  "rank_list": dp, "replica_cnt": len(dp), "replica_shift": 0}])`` (:936-940, :798-819;
  data-parallel: every rank), then ``_end_update_report`` (:952-972): if the optimizer's flag
  is not 1 -- an all-reduce sum of ones (:845-848), so never with one rank --
  ``tft_end_updating_os(cur_step_num + initial_step)`` (:963-964) and, with TSP:1 or ARF:1,
  ``tft_pause_train(cur_step_num + initial_step)`` (:967-970).
  ``end`` (:1010-1028): ``unregister_tft()``.
``lib/plugin/ascend/libmindspore_ascend_res_manager.so``
  ``TensorReportUtils::ReportReceiveData``: the TFT optimizer wrapper's ``TensorReport`` op
  (:845-850) calls MindIO's C ``MindioTtpSetOptimStatusUpdating(-1)`` before each optimizer
  update; here through ctypes on ``mindio_ttp/mindspore_api/libttp_c_api.so``.

Not modelled: the device flag ``tft_g_one_flag`` that ``_is_params_consistent`` (:791-796)
reads before a save (the stand-in has no device); its parameters are a list of floats.

**Training.** ``PARAMS0`` updated by :func:`train_step` once per global step, deterministic, so
a test compares what a run ends with, or what a checkpoint holds, with :func:`replay`. Every
rank holds the same parameters (data parallel), without collectives: a rank whose peer died
trains on until MindIO holds it. ``--resume`` starts from the newest
``ttp_saved_checkpoints-step_N`` under ``--ckpt-dir`` (the job's own code loads it, as with
MindSpore's default save) with ``initial_step`` N.

**What it says**: one line per event on standard output, ``EVT <name> <json>``: ``processor``
(connected), ``step`` (every global step, after its step-end calls), ``held`` (the training
thread has been inside one MindIO call for ``HELD_S``), ``saved``, ``renamed``, ``exit_handler``,
``end`` (training is over, with the parameters), ``finished`` (after MindSpore's ``end``); the
parameters of a save are in its file.

**taskd** (``--taskd``): the seed's worker lines (``init_taskd_worker(rank, 5000, "ms")``,
``start_taskd_worker()``) before training, and taskd's step gate at every step's end, after
MindSpore's own step-end calls (the order taskd's MindSpore callback has: last in the list,
after ``TrainFaultTolerance``), through ``step_completed`` (``TASKD_MS_STEP_CALLBACK=off``:
there is no ``Model``). The manager's stop of training ends the process with status 1.

Usage: ``standin_train.py --ckpt-dir DIR [--steps N] [--step-ms MS] [--resume] [--taskd]``; the
rank and world come from ``MS_NODE_ID`` and ``MS_WORKER_NUM``, the controller from
``MS_TFT_IP`` and ``MS_TFT_PORT``, the features from ``MS_ENABLE_TFT``, as in MindSpore.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_MINDSPORE = os.path.join(HERE, "fakems")

#: the parameters before step 1
PARAMS0 = (0.5, -1.25, 2.0, 3.75)
#: steps in an epoch (``cb_params.batch_num``): the run is one epoch
BATCH_NUM = 100000
#: how long the training thread stays in one MindIO call before the stand-in says it is held
HELD_S = 0.5
CKPT_DIR = re.compile(r"^ttp_saved_checkpoints-step_(\d+)$")


def train_step(params, step):
    """The optimizer update of global step ``step``."""
    return [p * 0.75 + ((step * (i + 3)) % 13) / 8.0 for i, p in enumerate(params)]


def replay(steps, params=PARAMS0):
    """The parameters after global step ``steps``, trained serially from ``PARAMS0``."""
    params = list(params)
    for step in range(1, steps + 1):
        params = train_step(params, step)
    return params


def ckpt_dir(step, ckpt_save_path, is_tmp_file):
    """MindSpore's ``_get_ckpt_dir``."""
    tmp = "_tmp" if is_tmp_file else ""
    return os.path.join(ckpt_save_path, f"ttp_saved_checkpoints-step_{step}{tmp}")


def newest_checkpoint(ckpt_save_path):
    """``(step, file)`` of the newest renamed checkpoint under the directory, or ``None``."""
    best = None
    for name in os.listdir(ckpt_save_path) if os.path.isdir(ckpt_save_path) else []:
        m = CKPT_DIR.match(name)
        if m and (best is None or int(m.group(1)) > best[0]):
            files = glob.glob(os.path.join(ckpt_save_path, name, "rank_*", "ttp_rank_*.ckpt"))
            if files:
                best = (int(m.group(1)), sorted(files)[0])
    return best


_out = threading.Lock()


def evt(name, **fields):
    fields["t"] = time.time()
    with _out:
        sys.stdout.write(f"EVT {name} {json.dumps(fields)}\n")
        sys.stdout.flush()


class Training:
    """The training thread's state, as the watchdog and MindIO's save thread see it."""

    def __init__(self, params, initial_step):
        self.params = list(params)
        self.params_step = initial_step  # the global step whose update ``params`` hold
        self.call = None  # (MindIO call, global step, since) while the thread is in one

    def enter(self, call, step):
        self.call = (call, step, time.monotonic())

    def leave(self):
        self.call = None


def watchdog(training):
    reported = None
    while True:
        time.sleep(0.05)
        call = training.call
        if call and call is not reported and time.monotonic() - call[2] >= HELD_S:
            reported = call
            evt("held", call=call[0], step=call[1], params_step=training.params_step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=0, help="the last global step (0: train on)")
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--taskd", action="store_true", help="taskd's worker and step gate")
    args = ap.parse_args()

    os.environ["MINDIO_FOR_MINDSPORE"] = "1"
    sys.path.insert(0, FAKE_MINDSPORE)
    tft_env = os.getenv("MS_ENABLE_TFT", "")

    # ---- TftHandle.init (utils.py:264-339)
    if "ARF:1" in tft_env:
        os.environ["MS_ENABLE_RECOVERY"] = "1"
    ctrl_port = int(os.getenv("MS_TFT_PORT"))
    ctrl_ip = os.getenv("MS_TFT_IP", "")
    from mindio_ttp import framework_ttp as tft

    world_size = int(os.getenv("MS_WORKER_NUM"))
    cur_rank = int(os.getenv("MS_NODE_ID"))
    enable_arf = "ARF:1" in tft_env
    if cur_rank == 0 and os.getenv("MINDX_TASK_ID") is None:
        tft.tft_init_controller(cur_rank, world_size, False, enable_arf=enable_arf)
        tft.tft_start_controller(ctrl_ip, ctrl_port, False, "")
    tft.tft_init_processor(cur_rank, world_size, False, False, "", enable_arf=enable_arf)
    tft.tft_start_processor(ctrl_ip, ctrl_port)  # failing: sleep 10 s, os._exit(2)
    evt("processor", rank=cur_rank, world=world_size, pid=os.getpid())
    if tft.tft_is_reboot_node():
        tft.tft_report_error(tft.ReportState.RS_INIT_FINISH.value)
        if tft.tft_get_reboot_type() == "arf":
            if tft.tft_wait_next_action() != tft.Action.RETRY.value:
                raise RuntimeError("ARF init failed!")

    # ---- the job's own code: resume from the newest checkpoint
    params, initial_step = list(PARAMS0), 0
    if args.resume:
        found = newest_checkpoint(args.ckpt_dir)
        if found:
            initial_step, path = found
            with open(path) as f:
                params = json.load(f)["params"]
    training = Training(params, initial_step)
    evt("resumed", step=initial_step, params=params)

    # ---- TrainFaultTolerance.__init__ (:647-688)
    others = ("TTP:1", "UCE:1", "ARF:1", "TRE:1")
    tsp_only = "TSP:1" in tft_env and not any(f in tft_env for f in others)
    cb_params = types.SimpleNamespace(cur_step_num=0, cur_epoch_num=1, batch_num=BATCH_NUM,
                                      net_outputs=None, optimizer=None, network=None)
    ctx = types.SimpleNamespace(cur_step_num=0, cur_epoch_num=0, global_step=None, save_cb=None,
                                ckpt_save_path=os.path.abspath(args.ckpt_dir), device_id=0,
                                initial_step=initial_step, is_uce_rank=False, tft=tft)

    def save_checkpoint_on_failure(step, save_info, cb_args, cb_ctx):  # :58-99
        cb_args.cur_step_num = cb_ctx.cur_step_num
        cb_args.cur_epoch_num = cb_ctx.cur_epoch_num
        step_num_in_epoch = int((cb_args.cur_step_num - 1) % cb_args.batch_num + 1)
        append_dict = {"__exception_save__": True, "epoch_num": cb_args.cur_epoch_num,
                       "step_num": cb_args.cur_step_num, "cur_rank": cur_rank,
                       "batch_num": cb_args.batch_num, "global_step": cb_ctx.global_step}
        ckpt_file = f"ttp_rank_{cur_rank}-{cb_args.cur_epoch_num}_{step_num_in_epoch}.ckpt"
        cur_ckpt_dir = os.path.join(ckpt_dir(step, cb_ctx.ckpt_save_path, True), f"rank_{cur_rank}")
        os.makedirs(cur_ckpt_dir, exist_ok=True)
        cur_file = os.path.join(cur_ckpt_dir, ckpt_file)
        # save_checkpoint(train_network, cur_file, append_dict=...): the parameters and the dict
        with open(cur_file + ".part", "w") as f:
            json.dump(dict(append_dict, params=training.params,
                           params_step=training.params_step), f)
        os.rename(cur_file + ".part", cur_file)
        evt("saved", step=step, save_info=save_info, file=cur_file,
            params_step=training.params_step)

    def rename_save_result(step, cb_ctx):  # :102-112
        os.rename(ckpt_dir(step, cb_ctx.ckpt_save_path, True),
                  ckpt_dir(step, cb_ctx.ckpt_save_path, False))
        evt("renamed", step=step)

    def exit_cb(cb_ctx):  # :115-119
        evt("exit_handler")
        os._exit(1)

    def stop_callback(cb_args, cb_ctx):  # :176-186
        evt("stop_handler", repair_type=cb_ctx.tft.tft_get_repair_type())

    def clean_callback(is_uce_error, cb_args, cb_ctx):  # :152-173
        evt("clean_handler", is_uce_error=is_uce_error)
        return 0

    def repair_callback(step, need_rebuild, error_ranks, repair_info, cb_args, cb_ctx):  # :122-149
        evt("repair_handler", step=step)

    def rebuild_groups(fault_ranks, cb_args, cb_ctx):  # :189-198
        evt("rebuild_handler")

    def synchronize():  # mindspore.runtime.synchronize
        evt("stream_sync")

    if tsp_only:
        tft.tft_register_stream_sync_handler(synchronize, ctx)
    else:  # _tft_register (:875-885)
        tft.tft_register_save_ckpt_handler(save_checkpoint_on_failure, ctx)
        tft.tft_register_rename_handler(rename_save_result, ctx)
        tft.tft_register_exit_handler(exit_cb, ctx)
        tft.tft_register_stop_handler(stop_callback, ctx)
        tft.tft_register_clean_handler(clean_callback, ctx)
        tft.tft_register_repair_handler(repair_callback, ctx)
        tft.tft_register_rebuild_group_handler(rebuild_groups, ctx)
        if "TSP:1" in tft_env:
            tft.tft_register_stream_sync_handler(synchronize, ctx)
        tft.tft_set_step_args(cb_params)  # on_train_begin (:1007)

    import mindio_ttp

    capi = ctypes.CDLL(os.path.join(os.path.dirname(mindio_ttp.__file__), "mindspore_api",
                                    "libttp_c_api.so"))
    capi.MindioTtpSetOptimStatusUpdating.argtypes = [ctypes.c_int64]
    capi.MindioTtpSetOptimStatusUpdating.restype = ctypes.c_int

    gate = None
    if args.taskd:  # the seed's two lines, right before training
        os.environ["TASKD_MS_STEP_CALLBACK"] = "off"
        from taskd.api import init_taskd_worker, start_taskd_worker, step_completed
        from taskd import TrainingStopped

        if not (init_taskd_worker(cur_rank, 5000, "ms") and start_taskd_worker()):
            raise RuntimeError("taskd's worker did not start")
        gate = step_completed
        evt("taskd_worker", rank=cur_rank)

    threading.Thread(target=watchdog, args=(training,), daemon=True).start()
    pause_too = "TSP:1" in tft_env or "ARF:1" in tft_env
    has_init_replica = False
    step_s = args.step_ms / 1000.0
    cur = 0
    while args.steps <= 0 or initial_step + cur < args.steps:
        cur += 1
        step = initial_step + cur
        time.sleep(step_s)  # forward and backward
        if not tsp_only:  # the optimizer's TensorReport op
            training.enter("start_updating", step)
            capi.MindioTtpSetOptimStatusUpdating(-1)
            training.leave()
        training.params = train_step(training.params, step)
        training.params_step = step
        # ---- on_train_step_end (:909-942)
        cb_params.cur_step_num = cur
        ctx.cur_step_num, ctx.cur_epoch_num, ctx.global_step = cur, 1, step
        if tsp_only:
            training.enter("pause_train", cur)
            tft.tft_pause_train(cur)
            training.leave()
        else:
            if not has_init_replica:
                has_init_replica = True
                dp = list(range(world_size))
                replica = {"type": 1, "rank_list": dp, "replica_cnt": len(dp), "replica_shift": 0}
                tft.tft_set_optimizer_replica(cur_rank, [replica])
            if world_size != 1:  # _end_update_report (:952-972)
                training.enter("end_updating", step)
                tft.tft_end_updating_os(cur + initial_step)
                if pause_too:
                    training.enter("pause_train", step)
                    tft.tft_pause_train(cur + initial_step)
                training.leave()
        evt("step", step=step)
        if gate is not None:  # taskd's callback, last at the step's end
            training.enter("taskd_gate", step)
            try:
                gate(step)
            except TrainingStopped as e:
                evt("stopped", step=step, reason=str(e))
                sys.stdout.flush()
                os._exit(1)
            training.leave()
    evt("end", step=initial_step + cur, params=training.params)
    if not tsp_only:  # TrainFaultTolerance.end (:1010-1028)
        tft.tft_destroy_processor()
    evt("finished", step=initial_step + cur)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
