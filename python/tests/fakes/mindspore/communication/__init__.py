"""FAKE ``mindspore.communication``: the rank is ``$RANK_ID``."""

import os


def init(backend_name=None):
    """Nothing to set up in the fake."""


def get_rank(group=None):
    return int(os.environ.get("RANK_ID", "0"))


def get_group_size(group=None):
    return int(os.environ.get("RANK_SIZE", "1"))
