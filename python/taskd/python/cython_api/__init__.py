"""The native library, ``libs/libtaskd.so``, loaded with ctypes (the reference's location)."""
