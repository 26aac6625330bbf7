"""The order of the torch backend's work on a CUDA device: each backend's stream, and the rule
for the buffers' synchronous copies.

A backend on a CUDA device queues all its work on one ``torch.cuda.Stream`` of the device (a
``BackendStream``): the steps of its plans and their CUDA graphs, the copies of
``set_tensor_async`` / ``get_tensor_async`` / ``cpy_tensor_async``, the records of and waits for
events (``torch.cuda.Event``). Its ``synchronize`` waits for the stream.

The buffers' synchronous slots (``set_tensor``, ``get_tensor``, ``memset_tensor``,
``cpy_tensor``, ``clear``, and ``free_buffer``, of a ``TorchBuffer`` on a CUDA device) run on
the device's default stream inside :func:`synchronous` (named, not torch's current stream: while
a backend captures a CUDA graph its stream is the current one, and a buffer freed then by the
garbage collector must not synchronize it): the default stream first waits (on the GPU) for
everything queued so far on the device's backend streams that are not capturing, and is
synchronized before the slot returns, so the slot sees the results of earlier computes and is
complete when later work is queued. ggml calls these slots only after a backend's ``synchronize`` or an
``event_synchronize`` anyway (its scheduler does, as ggml-cuda's buffers require); the rule
makes them correct without it, for one event per live backend stream of the device.
"""
from __future__ import annotations

import weakref
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch

__all__ = ["BackendStream", "current_stream", "synchronous"]

#: the backend streams alive in this process (what :func:`synchronous` waits for)
_LIVE: "weakref.WeakSet[BackendStream]" = weakref.WeakSet()


class BackendStream:
    """A new ``torch.cuda.Stream`` on the CUDA ``device`` (``stream``), on which one backend
    queues its work, with the backend's asynchronous copies and events. Raises RuntimeError
    (torch's) when CUDA is not available."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        _LIVE.add(self)

    def context(self) -> Any:
        """``torch.cuda.stream(stream)``: torch calls made inside are queued on it."""
        return torch.cuda.stream(self.stream)

    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""
        self.stream.synchronize()

    def set_async(self, dst: torch.Tensor, data: memoryview) -> None:
        """Copy host bytes ``data`` into the ``uint8`` device tensor ``dst`` (as many bytes),
        queued on the stream (``non_blocking``: ``data`` must stay valid until
        :meth:`synchronize`)."""
        with self.context():
            dst.copy_(torch.frombuffer(data, dtype=torch.uint8), non_blocking=True)

    def get_async(self, out: memoryview, src: torch.Tensor) -> None:
        """Copy the ``uint8`` device tensor ``src`` into host memory ``out``, queued on the
        stream (``out`` holds the bytes after :meth:`synchronize`)."""
        with self.context():
            torch.frombuffer(out, dtype=torch.uint8).copy_(src, non_blocking=True)

    def copy_from(self, other: "BackendStream", dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy ``src`` (memory of ``other``'s device, written by work queued on ``other``)
        into ``dst`` (memory of this device) after the work queued so far on both streams;
        work queued later on either stream runs after the copy. As ggml-cuda's
        ``cpy_tensor_async``: the copy is queued on ``other``'s stream, this stream waits for it."""
        if other is self:
            with self.context():
                dst.copy_(src, non_blocking=True)
            return
        if other.device == self.device:
            other.stream.wait_stream(self.stream)      # dst's earlier readers and writers first
            with other.context():
                dst.copy_(src, non_blocking=True)
            self.stream.wait_stream(other.stream)
            return
        # another GPU: torch copies on the source device's current stream, with a barrier
        # between it and the destination device's current stream in both directions
        with other.context(), self.context():
            dst.copy_(src, non_blocking=True)

    def record(self, event: torch.cuda.Event) -> None:
        """Record ``event`` at the current end of the stream."""
        event.record(self.stream)

    def wait(self, event: torch.cuda.Event) -> None:
        """Make work queued later on the stream wait for ``event`` (a no-op if it was never
        recorded)."""
        self.stream.wait_event(event)

    def capturing(self) -> bool:
        """Whether a CUDA graph capture is under way on the stream."""
        with self.context():
            return bool(torch.cuda.is_current_stream_capturing())

    def close(self) -> None:
        """Wait for the stream and stop counting it as live."""
        self.synchronize()
        _LIVE.discard(self)


def current_stream(device: torch.device) -> "torch.cuda.Stream | None":
    """Torch's current stream of ``device`` (a backend's while it computes), None off CUDA."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


@contextmanager
def synchronous(*devices: torch.device) -> Iterator[None]:
    """Run the body as a synchronous buffer slot on ``devices`` (see the module's rule): on each
    CUDA device, the default stream is made current, first waits for the device's live backend
    streams that are not capturing, and after the body it is synchronized. Nothing on other
    devices."""
    cuda = [d for d in devices if d.type == "cuda"]
    defaults = [torch.cuda.default_stream(d) for d in cuda]
    for d, default in zip(cuda, defaults):
        for s in list(_LIVE):
            if s.device == d and not s.capturing():
                default.wait_stream(s.stream)
    with ExitStack() as stack:
        for default in defaults:
            stack.enter_context(torch.cuda.stream(default))
        yield
    for default in defaults:
        default.synchronize()
