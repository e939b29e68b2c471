"""The ``taskd`` logger: a file under ``$TASKD_LOG_PATH`` (default ``./taskd_log/``) at
``$TASKD_FILE_LOG_LEVEL`` and standard error at ``$TASKD_STD_LOG_LEVEL`` (both default INFO).
Set up on first use, not on import."""

import logging
import os
import sys
import threading

LOGGER_NAME = "taskd"
LOG_FILE = "taskd.log"
_lock = threading.Lock()
_FORMAT = "%(asctime)s %(levelname)s taskd[%(process)d] %(message)s"


def _level(var, default):
    name = os.environ.get(var, "").strip().upper() or default
    level = logging.getLevelName(name)
    return level if isinstance(level, int) else logging.getLevelName(default)


def get_logger():
    """The ``taskd`` logger, with its handlers."""
    logger = logging.getLogger(LOGGER_NAME)
    with _lock:
        if getattr(logger, "_taskd_configured", False):
            return logger
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        formatter = logging.Formatter(_FORMAT)
        std = logging.StreamHandler(sys.stderr)
        std.setLevel(_level("TASKD_STD_LOG_LEVEL", "INFO"))
        std.setFormatter(formatter)
        logger.addHandler(std)
        path = os.environ.get("TASKD_LOG_PATH", "").strip() or "./taskd_log/"
        try:
            os.makedirs(path, exist_ok=True)
            handler = logging.FileHandler(os.path.join(path, LOG_FILE))
            handler.setLevel(_level("TASKD_FILE_LOG_LEVEL", "INFO"))
            handler.setFormatter(formatter)
            logger.addHandler(handler)
        except OSError as e:
            logger.warning("no log file under %s (%s): logging to stderr only", path, e)
        logger._taskd_configured = True
    return logger
