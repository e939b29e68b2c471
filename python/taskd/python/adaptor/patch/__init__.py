"""``import taskd.python.adaptor.patch``: torchrun's elastic agent hands its workers to taskd's
node agent (the reference's line for ``torch/distributed/run.py``, which MindCluster's images
insert with ``sed -i '/import os/i import taskd.python.adaptor.patch' .../torch/distributed/run.py``).
Importing it patches torch (``taskd/python/adaptor/torchrun.py``)."""

from taskd.python.adaptor.torchrun import patch_torch_method

patch_torch_method()
