"""torchrun under taskd's node agent, the reference's way: ``SimpleElasticAgent._invoke_run``
becomes :func:`invoke_run`, which calls ``init_taskd_agent({"Framework": "PyTorch"}, self)``,
registers the agent's own ``_stop_workers``, ``_initialize_workers``, ``_monitor_workers`` and
``_restart_workers`` with ``register_func``, and returns ``start_taskd_agent()`` (torch's
``RunResult``). Only ``_invoke_run`` is replaced: torch starts, stops and watches its workers
its own way (``taskd/python/framework/agent/torchrun.py`` drives them). When
``init_taskd_agent`` fails, torch's own loop runs, as without taskd.
"""

from typing import Any

from taskd.api.taskd_agent_api import init_taskd_agent, register_func, start_taskd_agent
from taskd.python.utils.log import get_logger

DEFAULT_ROLE = "default"  # torch's
#: where the patched class keeps torch's own ``_invoke_run`` (run when init fails)
ORIGINAL = "_taskd_original_invoke_run"


def invoke_run(self, role: str = DEFAULT_ROLE) -> Any:
    """``SimpleElasticAgent._invoke_run`` through taskd's node agent."""
    if not init_taskd_agent({"Framework": "PyTorch"}, self):
        get_logger().error("taskd agent: init failed: torchrun manages its workers itself")
        return getattr(type(self), ORIGINAL)(self, role)
    register_func("KILL_WORKER", self._stop_workers)
    register_func("START_ALL_WORKER", self._initialize_workers)
    register_func("MONITOR", self._monitor_workers)
    register_func("RESTART", self._restart_workers)
    return start_taskd_agent()


def patch_torch_method(agent_class: Any = None) -> None:
    """Replaces ``_invoke_run`` of ``agent_class`` (torch's ``SimpleElasticAgent`` by default;
    once)."""
    if agent_class is None:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent as agent_class
    if agent_class._invoke_run is invoke_run:
        return
    setattr(agent_class, ORIGINAL, agent_class._invoke_run)
    agent_class._invoke_run = invoke_run
