"""A FAKE ``mindspore`` (not MindSpore), for MindIO's processor side only: with
``MINDIO_FOR_MINDSPORE=1``, ``mindio_ttp/framework_ttp/ttp_decorator.py`` imports ``mindspore``
instead of torch and torch_npu, and the one thing it uses is
``mindspore.context.get_context("device_id")`` (in ``tft_init_processor``), kept as the rank's
device. Nothing else of MindSpore is touched by MindIO; the stand-in training process
(``standin_train.py``, beside this folder) makes MindSpore's own calls itself. With
``--taskd``, taskd's worker in the stand-in finds the framework's switch function here too
(``communication.management._comm_switch_nic``, ``runtime.synchronize``), as the CPU build
answers it."""

import types

__version__ = "0.0-fake"


def _get_context(key):
    return 0 if key == "device_id" else None


context = types.SimpleNamespace(get_context=_get_context)
