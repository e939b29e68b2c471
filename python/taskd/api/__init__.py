"""The reference TaskD's Python API (names, arguments, defaults and return values), and
``step_completed``, taskd-rs's step gate. Every ``init_*``, ``start_*`` and ``destroy_*`` returns
a bool and never raises: errors are logged (logger ``taskd``). The gate raises one exception,
``TrainingStopped``, when the manager stopped training."""

from taskd import TrainingStopped

from taskd.api.taskd_agent_api import init_taskd_agent, register_func, start_taskd_agent
from taskd.api.taskd_manager_api import init_taskd_manager, start_taskd_manager
from taskd.api.taskd_proxy_api import destroy_taskd_proxy, init_taskd_proxy
from taskd.api.taskd_worker_api import (
    destroy_taskd_worker,
    init_taskd_worker,
    start_taskd_worker,
    step_completed,
)

__all__ = [
    "init_taskd_worker",
    "start_taskd_worker",
    "destroy_taskd_worker",
    "init_taskd_manager",
    "start_taskd_manager",
    "init_taskd_proxy",
    "destroy_taskd_proxy",
    "init_taskd_agent",
    "start_taskd_agent",
    "register_func",
    "step_completed",
    "TrainingStopped",
]
