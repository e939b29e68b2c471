"""A FAKE ``mindspore`` for taskd's tests (not MindSpore): ``mindspore.train`` (Model,
Callback, RunContext) and ``mindspore.communication`` (get_rank, management._comm_switch_nic)."""
