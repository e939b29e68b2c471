"""taskd's node agent: ``start_taskd_agent()`` runs one node's training processes.

``core``: the launcher-neutral agent (:class:`NodeAgent`), the typed worker states and the
:class:`Launcher` protocol a launcher implements. One module per launcher adapts it: ``msrun``
(MindSpore's, through the callbacks msrun registers) and ``torchrun`` (torch's elastic agent,
through ``taskd.python.adaptor.patch``). A framework names its launcher's module
(``Framework.launcher``, ``taskd/python/framework/frameworks/``); each launcher module has
``check_init(config, cls)``, ``make(callbacks, cls, log)``, ``MANAGER_HOST`` and ``NO_RESTART``.
"""

from taskd.python.framework.agent.core import (  # noqa: F401
    CHILD_GRACE_S,
    KILL_WAIT_S,
    LOST,
    RESTART_COUNT,
    STOPPED_GRACE_S,
    AgentError,
    Decision,
    FailurePolicy,
    Launcher,
    NodeAgent,
    Outcome,
    WorkerState,
    WorkerStatus,
    child_pids,
    end_children,
    local_budget,
)
