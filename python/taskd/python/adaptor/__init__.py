"""What taskd adds to a launcher from the outside: ``torchrun`` (torch's elastic agent under
taskd's node agent), applied by ``patch``, the reference's module path
(torchrun: ``import taskd.python.adaptor.patch`` in ``torch/distributed/run.py``)."""
