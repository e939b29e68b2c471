"""FAKE framework state shared by the fake ``mindspore`` and ``torch_npu`` packages of taskd's
tests. Not MindSpore, not torch_npu: it records every ``_comm_switch_nic`` call and whether a
training step was running during it, whether the streams were synchronised first and on
which thread it ran, and can be told to answer ``False``."""

import contextlib
import os
import threading

_lock = threading.Lock()
in_step = False  # a training step is running
last_step = 0  # the last step the fake training loop completed
calls = []  # every _comm_switch_nic call: dicts with ranks, use_backup, in_step, step, synced
synced = False  # mindspore.runtime.synchronize() ran since the last switch call
fail_next = 0  # answer False to this many calls (tests in one process)
_consumed = set()  # failure tokens of $FAKE_FRAMEWORK_FAIL_FILE already used


@contextlib.contextmanager
def training_step():
    """Marks one training step as running."""
    global in_step, last_step
    in_step = True
    try:
        yield
    finally:
        in_step = False
        last_step += 1


def synchronized():
    """The fake ``mindspore.runtime.synchronize()``."""
    global synced
    synced = True


def _fail_from_file(rank):
    """``$FAKE_FRAMEWORK_FAIL_FILE`` holds ``TOKEN RANK...``: those ranks answer False once
    per token (a test in another process makes one call fail)."""
    path = os.environ.get("FAKE_FRAMEWORK_FAIL_FILE", "")
    if not path or not os.path.exists(path):
        return False
    with open(path) as f:
        words = f.read().split()
    if not words or words[0] in _consumed or str(rank) not in words[1:]:
        return False
    _consumed.add(words[0])
    return True


def switch(framework, rank, ranks, use_backup):
    """One fake ``_comm_switch_nic`` call: checks the arguments as the framework does, records
    the call, answers True unless told to fail."""
    global fail_next, synced
    if not isinstance(ranks, (list, tuple)) or not isinstance(use_backup, (list, tuple)):
        raise ValueError("ranks and use_backup must be lists or tuples")
    if len(ranks) != len(use_backup) or len(set(ranks)) != len(ranks):
        raise ValueError("ranks and use_backup differ in length, or a rank is repeated")
    if not all(isinstance(r, int) for r in ranks) or not all(isinstance(b, bool) for b in use_backup):
        raise ValueError("ranks must be ints and use_backup bools")
    with _lock:
        calls.append(
            {
                "framework": framework,
                "ranks": list(ranks),
                "use_backup": list(use_backup),
                "in_step": in_step,
                "step": last_step,
                "synced": synced,
                "thread": threading.current_thread().name,
            }
        )
        synced = False
        if fail_next > 0:
            fail_next -= 1
            return False
    return not _fail_from_file(rank)
