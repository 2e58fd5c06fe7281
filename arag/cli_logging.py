"""How the command line logs: arag's own progress lines always, other libraries' notices only with `-v`."""

from __future__ import annotations

import logging
import os

# Loggers whose records are noise at a command's default verbosity: grpc's server logs, with a traceback, the
# NotImplementedError that Milvus Lite's embedded server raises for a client probe it does not implement.
QUIET_LOGGERS = ("grpc",)

# Read by the libraries when they load, so set before any of them is imported (a user's own setting wins).
QUIET_ENVIRONMENT = {
    "GRPC_VERBOSITY": "NONE",  # grpc's C core: keepalive notices on Milvus Lite's local channel
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bar at every model load
    "TRANSFORMERS_VERBOSITY": "error",
}


def configure_logging(verbose: bool) -> None:
    """arag's INFO lines (index builds, LM set-up) always; everything at INFO, library notices included, with
    `verbose`; otherwise only other libraries' warnings, less those known to be noise."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("arag").setLevel(logging.INFO)
    if verbose:
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
