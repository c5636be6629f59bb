"""What the commands share: the one-line error a command stops with (CliError: exit code 2), the
wording of an exception as one line naming the user's own code, and quieting torch's chatter."""
from __future__ import annotations

import contextlib
import logging
import os
import sysconfig
import traceback
import warnings

# qbackend's own source tree: frames there are not the user's code.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACEBACK_HINT = " [--traceback shows where]"


class CliError(Exception):
    """A one-line error for the user (exit code 2)."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    text = text[0] if text else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """"Type: first line of the message (file:line)", the location being the deepest frame of the
    user's own code (not the standard library, site-packages or qbackend) where there is one."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    skip = tuple(os.path.realpath(p) + os.sep for p in
                 {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                  sysconfig.get_paths()["platlib"], PACKAGE_DIR})
    own = [f for f in frames if not os.path.realpath(f.filename).startswith(skip) and not f.filename.startswith("<")]
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({rel_path(exc.filename)}:{exc.lineno})"
    elif own:
        where = f" ({rel_path(own[-1].filename)}:{own[-1].lineno})"
    msg = first_line(exc) if not isinstance(exc, SyntaxError) else (exc.msg or "invalid syntax")
    return f"{type(exc).__name__}: {msg}{where}" if msg else f"{type(exc).__name__}{where}"


def rel_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(".." + os.sep + "..") else rel


@contextlib.contextmanager
def quiet_torch():
    """Silence torch's own chatter that says nothing about the user's model: torch.export's note
    that an 8x8 input's size-1 channel dimension was specialized, and pytree's LeafSpec
    deprecation warning when a converted model is pickled. qbackend's warnings still show."""
    logger = logging.getLogger("torch._export.non_strict_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)
