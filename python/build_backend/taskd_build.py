"""The ``taskd`` package's PEP 517 build backend: the Python standard library and cargo.

``pip install python/`` (from the repository) calls ``build_wheel``: it builds the native
library with ``cargo build -p taskd-capi`` (release; ``$TASKD_CARGO_PROFILE`` picks another
cargo profile, e.g. ``dev``), and writes a wheel holding the ``taskd`` package with the library
at ``taskd/python/cython_api/libs/libtaskd.so``. Nothing is fetched from PyPI.
"""

import base64
import hashlib
import json
import os
import re
import subprocess
import sysconfig
import zipfile

NAME = "taskd"
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
LIB_IN_WHEEL = "taskd/python/cython_api/libs/libtaskd.so"


def _workspace():
    root = os.path.dirname(PYTHON_DIR)
    if not os.path.exists(os.path.join(root, "capi", "Cargo.toml")):
        raise RuntimeError(
            "taskd's wheel is built from the taskd-rs repository (%s has no capi/): "
            "run pip install on the python/ directory of a checkout" % root
        )
    return root


def _version():
    with open(os.path.join(PYTHON_DIR, "taskd", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _tag():
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + platform


def build_native_library():
    """Runs cargo; returns the path of the shared library it built."""
    profile = os.environ.get("TASKD_CARGO_PROFILE", "release").strip() or "release"
    cmd = [
        os.environ.get("CARGO", "cargo"),
        "build",
        "-p",
        "taskd-capi",
        "--lib",
        "--profile",
        profile,
        "--message-format=json-render-diagnostics",
    ]
    out = subprocess.run(cmd, cwd=_workspace(), stdout=subprocess.PIPE, check=True).stdout
    for line in out.decode().splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "taskd_capi":
            for path in msg["filenames"]:
                if path.endswith(".so"):
                    return path
    raise RuntimeError("cargo built no shared library for taskd-capi")


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _metadata(version):
    return (
        "Metadata-Version: 2.1\n"
        "Name: %s\n"
        "Version: %s\n"
        "Summary: NIC failover and switchback for running Ascend training jobs (taskd-rs)\n"
        "Requires-Python: >=3.8\n"
        "License: Apache-2.0\n" % (NAME, version)
    )


def _package_files():
    root = os.path.join(PYTHON_DIR, "taskd")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield path, os.path.relpath(path, PYTHON_DIR).replace(os.sep, "/")


def _write(zf, records, arcname, data, mode=0o644):
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    records.append(_record_line(arcname, data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 517: the wheel, with the native library."""
    library = build_native_library()
    version = _version()
    dist_info = "%s-%s.dist-info" % (NAME, version)
    wheel_name = "%s-%s-%s.whl" % (NAME, version, _tag())
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w") as zf:
        for path, arcname in _package_files():
            with open(path, "rb") as f:
                _write(zf, records, arcname, f.read())
        with open(library, "rb") as f:
            _write(zf, records, LIB_IN_WHEEL, f.read(), mode=0o755)
        wheel = "Wheel-Version: 1.0\nGenerator: taskd_build\nRoot-Is-Purelib: false\nTag: %s\n"
        _write(zf, records, dist_info + "/WHEEL", (wheel % _tag()).encode())
        _write(zf, records, dist_info + "/METADATA", _metadata(version).encode())
        _write(zf, records, dist_info + "/top_level.txt", b"taskd\n")
        records.append(dist_info + "/RECORD,,")
        _write(zf, [], dist_info + "/RECORD", ("\n".join(records) + "\n").encode())
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    """PEP 517: nothing beyond the standard library (and cargo on the path)."""
    return []


def build_sdist(sdist_directory, config_settings=None):
    """PEP 517: not offered; the wheel is built from the repository, which holds the Rust
    workspace the native library comes from."""
    raise RuntimeError("taskd has no source distribution: build the wheel from the repository")
