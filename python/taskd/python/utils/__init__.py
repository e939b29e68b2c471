"""Logging of the ``taskd`` logger."""
