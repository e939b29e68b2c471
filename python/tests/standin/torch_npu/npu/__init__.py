"""STAND-IN ``torch_npu.npu._comm_switch_nic(ranks, useBackup)``: checks its arguments as
torch_npu does, records the call (``calls``, with the step the training loop set in ``step``)
and answers ``True``. ``$STANDIN_FAIL_RANK=R``: rank R's first incarnation
(``$TORCHELASTIC_RESTART_COUNT`` 0) raises on every call, as when HCCL cannot switch."""

import os

calls = []
step = 0  # the training loop's last completed step, set by the loop


def _comm_switch_nic(ranks, useBackup):
    if len(ranks) != len(useBackup) or not all(isinstance(b, bool) for b in useBackup):
        raise ValueError("ranks and useBackup must be lists of equal length, of int and bool")
    calls.append({"ranks": list(ranks), "use_backup": list(useBackup), "step": step})
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if first and os.environ.get("STANDIN_FAIL_RANK") == os.environ["RANK"]:
        raise RuntimeError("HcclCommWorkingDevNicSet failed on every process group")
    return True
