"""``python -m taskd.python.framework.mindio``: MindIO's controller for the job, from the
job's environment (:meth:`MindioHost.from_env`), until SIGTERM or SIGINT; for a job whose
manager is the ``taskd manager`` binary, beside it (``deploy/mindcluster/taskd-launcher.sh``
starts it on the Scheduler pod). It only keeps the controller: no last words.

Exit status 0 after the signal, or at once when hosting is off or ``mindio_ttp`` is not
importable (logged); 2 when a variable is missing or unusable or the controller does not start
(logged, naming it); 1 when the controller's process ends by itself.
"""

import signal
import sys
import threading

from taskd.python.framework.mindio.host import MindioConfigError, MindioHost, MindioStartError
from taskd.python.utils.log import get_logger


def main() -> int:
    log = get_logger()
    try:
        host = MindioHost.from_env()
    except MindioConfigError as e:
        log.error("MindIO's controller is not hosted: %s", e)
        return 2
    if host is None:
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        host.start()
    except MindioStartError as e:
        log.error("%s", e)
        return 2
    try:
        while not stop.wait(1.0):
            if not host.running:
                return 1  # the host logged why
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
