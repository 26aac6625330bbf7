"""The exceptions pyggml raises of its own (a leaf module: every layer imports it).

Beside these, bad arguments raise the usual ``ValueError``/``TypeError``, a full context or a
failed allocation ``MemoryError``, and an exception a Python callback raised while C ran is
re-raised as itself by the call that entered C (:mod:`pyggml.raw.boundary`).
"""
from __future__ import annotations

__all__ = ["GGMLError", "ClosedError", "BackendNotAvailableError"]


class GGMLError(RuntimeError):
    """ggml reported a failure: a NULL result or a failed ``enum ggml_status`` (:attr:`status`,
    None where ggml gives no status)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  #: the failed ``enum ggml_status``, or None


class ClosedError(ValueError):
    """The C object was freed (``close()``, its owner closed, or the memory it lived in was
    freed or reused) and may not be used any more."""


class BackendNotAvailableError(KeyError):
    """A device, registry or backend this pyggml was built without, or that was built but did
    not load (no driver, no GPU): the message says which and why. A KeyError, as a failed lookup."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""
