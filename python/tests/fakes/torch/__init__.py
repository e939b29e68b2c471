"""A FAKE ``torch`` for taskd's tests (not PyTorch): ``torch.optim`` with an ``Optimizer`` whose
``step()`` runs the global optimizer step post-hooks, as torch 2.x does."""

from torch import optim  # noqa: F401
