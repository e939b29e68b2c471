"""FAKE ``mindspore.communication`` (see the package)."""
