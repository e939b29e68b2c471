"""A FAKE ``torch_npu`` for taskd's tests (not torch_npu): ``torch_npu.npu._comm_switch_nic``."""

import torch  # noqa: F401 - the real package needs torch too
from torch_npu import npu  # noqa: F401
