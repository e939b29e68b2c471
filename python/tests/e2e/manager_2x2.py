import os
from taskd.api import init_taskd_manager, start_taskd_manager

init_taskd_manager({"job_id": os.getenv("MINDX_TASK_ID"), "node_nums": 2, "proc_per_node": 2})
start_taskd_manager()
