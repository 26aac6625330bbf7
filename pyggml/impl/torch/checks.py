"""Errors a step finds on the device and the backend raises later: row indices out of range.

On ``cpu`` GET_ROWS and SET_ROWS check their row indices on the host and raise ValueError at
once. On a CUDA device that check would wait for the GPU at each such node and forbid a CUDA
graph (:mod:`pyggml.impl.torch.capture`); there the backend has a ``DeviceChecks`` instead, and the
step, on the device, sets the flag of that error when an index is out of range and clamps the
indices into range (torch's gather and scatter stay inside the tensor; that node's result is then
wrong, as ggml-cuda's is undefined). The backend's ``synchronize`` raises ValueError for the flags
set since the last one (:meth:`DeviceChecks.raise_pending`). ggml's ``ggml_backend_graph_compute``
and the scheduler's ``compute`` end with ``synchronize``, so the error is still raised by the call
that computed the graph.
"""
from __future__ import annotations

import torch

__all__ = ["DeviceChecks"]


class DeviceChecks:
    """Error flags on torch device ``device`` (``capacity`` of them, one per message; more
    messages share the last flag, with a message of their own)."""

    def __init__(self, device: torch.device, capacity: int = 64):
        self.device = device
        self.capacity = capacity
        self.messages: list[str] = []
        self.flags = torch.zeros(capacity, dtype=torch.bool, device=device)

    def flag(self, message: str) -> torch.Tensor:
        """The flag (a 0-d ``bool`` view, stays at its address) a step sets on the device
        (``flag.logical_or_(bad)``) for the error ``message``."""
        if message in self.messages:
            return self.flags[self.messages.index(message)]
        if len(self.messages) < self.capacity - 1:
            self.messages.append(message)
            return self.flags[len(self.messages) - 1]
        return self.flags[self.capacity - 1]

    def raise_pending(self) -> None:
        """Raise ValueError naming the errors flagged since the last call (reads the flags:
        call it after the work that sets them is done) and clear the flags."""
        if not self.messages:
            return
        set_ = self.flags.tolist()
        if not any(set_):
            return
        self.flags.zero_()
        found = [m for m, s in zip(self.messages, set_) if s]
        if set_[-1] and len(self.messages) < len(set_):
            found.append("a row index out of range (more checks than flags)")
        raise ValueError("; ".join(found))
