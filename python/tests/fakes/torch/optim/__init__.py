"""FAKE ``torch.optim``."""

from torch.optim.optimizer import Optimizer, SGD  # noqa: F401
