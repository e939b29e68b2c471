"""FAKE ``torch_npu.npu`` with ``_comm_switch_nic(ranks, useBackup)`` (see fake_framework); like
the real one it needs ``$RANK``."""

import os

import fake_framework


def _comm_switch_nic(ranks, useBackup):
    rank = int(os.environ["RANK"])
    return fake_framework.switch("pt", rank, ranks, useBackup)
