"""taskd: NIC failover and switchback for running Ascend training jobs, in the training process.

``import taskd`` alone gives ``taskd.__version__`` and ``taskd.TrainingStopped``; the API is
``taskd.api`` (the reference TaskD's names, arguments and conventions). The work is done by the
native library ``taskd/python/cython_api/libs/libtaskd.so`` (taskd-rs, crate ``taskd-capi``).
"""

__version__ = "0.1.0"


class TrainingStopped(RuntimeError):
    """The job's manager stopped training (a switch that could not be undone, an operator's
    ``taskd recover --stop-training``, ClusterD's stop): raised by the step gate in the training
    thread, with the manager's one-line reason as its message. Let it propagate: the training
    loop ends, the process exits non-zero, and the launcher starts it again (msrun's taskd agent
    with ``PROCESS_RECOVER=on``, torchrun with ``--max-restarts``), on its default NIC."""
