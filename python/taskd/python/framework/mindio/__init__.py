"""MindIO TTP's controller, hosted by taskd's manager: :class:`MindioHost` (``host.py``, the
manager's side) runs it in a child process (``controller.py``), so that every rank's MindIO
processor can connect, and for MindIO's last-words checkpoint on the way out."""

from taskd.python.framework.mindio.host import (
    LastWords,
    MindioConfig,
    MindioConfigError,
    MindioHost,
    MindioStartError,
)

__all__ = ["LastWords", "MindioConfig", "MindioConfigError", "MindioHost", "MindioStartError"]
