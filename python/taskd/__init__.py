"""taskd: NIC failover and switchback for running Ascend training jobs, in the training process.

``import taskd`` alone gives ``taskd.__version__``; the API is ``taskd.api`` (the reference
TaskD's names, arguments and conventions). The work is done by the native library
``taskd/python/cython_api/libs/libtaskd.so`` (taskd-rs, crate ``taskd-capi``).
"""

__version__ = "0.1.0"
