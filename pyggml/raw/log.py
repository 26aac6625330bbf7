"""ggml's log, sent to Python :mod:`logging`.

:func:`install` routes every message ggml prints (``ggml_log_set``) to a logger named after the
ggml subsystem that wrote it: ``pyggml.ggml.gguf``, ``pyggml.ggml.backend``, ``pyggml.ggml.sched``,
``pyggml.ggml.alloc``, ``pyggml.ggml.cpu``, ``pyggml.ggml.opt``, else ``pyggml.ggml``. The
subsystem is read from the ``function:`` prefix ggml puts on its lines. Lines written in pieces
(``GGML_LOG_LEVEL_CONT``) are joined before they are logged. pyggml calls :func:`install` at import;
:func:`uninstall` gives ggml back its default (stderr).
"""
from __future__ import annotations

import atexit
import logging
import re
from typing import Any

from . import callbacks
from . import ffi, lib

__all__ = ["install", "uninstall", "logger_for"]

_LEVELS = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}

#: function-name prefix -> logger suffix, first match wins
_SUBSYSTEMS = [
    ("gguf", "gguf"), ("ggml_backend_sched", "sched"), ("ggml_gallocr", "alloc"),
    ("ggml_tallocr", "alloc"), ("ggml_backend_cpu", "cpu"), ("ggml_graph_compute", "cpu"),
    ("ggml_opt", "opt"), ("ggml_backend", "backend"), ("ggml_dyn", "backend"),
    ("load_backend", "backend"), ("register_", "backend"),
]

_state: dict[str, Any] = {"callback": None, "pending": None}


def logger_for(text: str) -> logging.Logger:
    """The logger for a ggml log line, chosen by its ``function:`` prefix."""
    m = re.match(r"\s*(\w+)\s*:", text)
    func = m.group(1) if m else ""
    for prefix, name in _SUBSYSTEMS:
        if func.startswith(prefix):
            return logging.getLogger(f"pyggml.ggml.{name}")
    return logging.getLogger("pyggml.ggml")


def _emit(level: int, text: str) -> None:
    text = text.rstrip("\n")
    if text:
        logger_for(text).log(_LEVELS.get(level, logging.INFO), "%s", text)


def _on_log(level: int, text: Any, user_data: Any) -> None:
    s = ffi.string(text).decode("utf-8", "replace")
    pending = _state["pending"]
    if level == lib.GGML_LOG_LEVEL_CONT and pending is not None:
        pending[1] += s
    else:
        if pending is not None:
            _emit(*pending)
        pending = _state["pending"] = [level, s]
    if pending[1].endswith("\n"):
        _emit(*pending)
        _state["pending"] = None


def install() -> None:
    """Send ggml's log to :mod:`logging` (wraps ``ggml_log_set``). Idempotent."""
    if _state["callback"] is None:
        _state["callback"] = callbacks.Callback("ggml_log_callback", _on_log)
    cb = _state["callback"]
    lib.ggml_log_set(cb.fn, cb.user_data)


def uninstall() -> None:
    """Give ggml back its default logger (stderr); wraps ``ggml_log_set(NULL, NULL)``."""
    lib.ggml_log_set(ffi.NULL, ffi.NULL)
    if _state["pending"] is not None:
        _emit(*_state["pending"])
        _state["pending"] = None


# never leave ggml pointing at a Python callback while the interpreter is torn down
atexit.register(uninstall)
