"""taskd's internals: the native library (``cython_api``), logging and the frameworks' hooks."""
