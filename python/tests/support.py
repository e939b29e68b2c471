"""What taskd's Python tests share: the fake frameworks on the path, a clean environment for
each test, and taskd's state put back between tests."""

import os
import sys
import unittest

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakes")
if FAKES not in sys.path:
    sys.path.insert(0, FAKES)

import fake_framework  # noqa: E402
from taskd.api import taskd_worker_api  # noqa: E402

#: The environment a training process of the tests' job gets.
JOB_ENV = {
    "MINDX_TASK_ID": "pytest-job",
    "MS_ENABLE_TFT": "{TTP:1,TSP:1}",
    "HCCL_OP_RETRY_ENABLE": "L0:0, L1:1, L2:1",
    # Nothing listens there: a worker started against it keeps retrying in the background.
    "TASKD_PROXY": "127.0.0.1:1",
    # No manager ever makes the job whole: the first training call does not wait for it.
    "TASKD_START_WAIT_MS": "0",
}
_VARS = list(JOB_ENV) + [
    "MS_NODE_RANK", "RANK", "LOCAL_WORLD_SIZE", "RANK_ID", "TASKD_MS_STEP_CALLBACK",
    "TASKD_PT_OPTIMIZER_HOOK", "MS_SCHED_HOST", "PROCESS_RECOVER", "TASKD_PROCESS_ENABLE",
    "GROUP_RANK", "PET_NODE_RANK", "TASKD_MANAGER_PORT", "TASKD_AGENT_MAX_RESTARTS",
    "TASKD_AGENT_MONITOR_MS", "TASKD_RESTART_COUNT", "MASTER_ADDR",
]


class TaskdTestCase(unittest.TestCase):
    """Sets the job's environment for the test and restores it; stops a worker left running."""

    def setUp(self):
        self._saved = {k: os.environ.get(k) for k in _VARS}
        for k in _VARS:
            os.environ.pop(k, None)
        os.environ.update(JOB_ENV)
        fake_framework.calls.clear()
        fake_framework.fail_next = 0

    def tearDown(self):
        if taskd_worker_api._state.config is not None:
            taskd_worker_api.destroy_taskd_worker()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def record_gate(test):
    """Replaces the running worker's native gate by a recorder; returns the steps it gets."""
    steps = []
    native = taskd_worker_api._state.gate
    test.assertIsNotNone(native, "a worker runs")

    def gate(step):
        steps.append(step)
        native(step)

    taskd_worker_api._state.gate = gate
    return steps
