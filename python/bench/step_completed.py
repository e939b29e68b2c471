"""What ``taskd.api.step_completed`` costs a Python training loop with no operation pending:
nanoseconds per call, median of 50 batches of 200,000 calls, beside an empty Python function
called the same way. BENCHMARKS.md has the figures.

    TASKD_LIBRARY=target/release/libtaskd_capi.so PYTHONPATH=python python3 python/bench/step_completed.py

(or with the installed package, without the two variables). The worker connects to nothing
(``$TASKD_PROXY`` points at a closed port): its gate is open, as between two operations.
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "fakes"))  # a fake torch_npu
os.environ.update(MINDX_TASK_ID="bench", RANK="0", LOCAL_WORLD_SIZE="1",
                  TASKD_PROXY="127.0.0.1:1", TASKD_PT_OPTIMIZER_HOOK="off",
                  TASKD_STD_LOG_LEVEL="WARNING")

from taskd.api import destroy_taskd_worker, init_taskd_worker, start_taskd_worker, step_completed  # noqa: E402
from taskd.python.cython_api import cython_api  # noqa: E402

BATCHES, CALLS = 50, 200_000


def per_call_ns(fn):
    """Median over batches of the time per call, in ns."""
    samples = []
    step = 1
    for _ in range(BATCHES):
        t = time.perf_counter_ns()
        for _ in range(CALLS):
            fn(step)
            step += 1
        samples.append((time.perf_counter_ns() - t) / CALLS)
    return statistics.median(samples)


def empty(step):
    return True


def main():
    no_worker = per_call_ns(step_completed)
    assert init_taskd_worker(0, 5000, "pt") and start_taskd_worker()
    with_worker = per_call_ns(step_completed)
    baseline = per_call_ns(empty)
    destroy_taskd_worker()
    print("library %s (%s)" % (cython_api.version(), cython_api.library_path()))
    print("taskd.api.step_completed, no operation pending: %.0f ns per call (median), "
          "%.0f ns over an empty Python function (%.0f ns); without a worker: %.0f ns"
          % (with_worker, with_worker - baseline, baseline, no_worker))


main()
