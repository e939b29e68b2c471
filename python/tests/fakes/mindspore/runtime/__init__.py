"""FAKE ``mindspore.runtime``: ``synchronize()`` only marks that the streams were synchronised
(see fake_framework: the next switch call records it)."""

import fake_framework


def synchronize():
    fake_framework.synchronized()
