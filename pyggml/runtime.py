"""What a model runs on, in one place: backends opened by device name (:func:`open_backend`,
:class:`BackendSet`), and, re-exported from :mod:`pyggml.backends`, the graphs built once per
shape (:class:`~pyggml.backends.graph_cache.GraphCache`) and weights loaded into backend
buffers (:func:`~pyggml.backends.weights.load_tensors`)::

    with BackendSet(["CUDA0"], n_threads=4) as bs, \\
            load_tensors(gguf, bs.homes[0]) as w, \\
            GraphCache(build, backends=bs.backends) as graphs:
        out = graphs.compute(key, tokens=ids)

Device names are ggml's (``CPU``, ``CUDA0``, ``Vulkan0``, ``RPC0``...; ``python -m pyggml
info`` lists them, case insensitive) and pyggml's Python backends' (``numpy``, ``TORCH0``),
which are registered on first use.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Sequence

from .backends.backend import Backend
from .backends.cpu import CPUBackend
from .backends.device import Device, device_by_name
from .backends.graph_cache import GraphCache, GraphParts
from .backends.weights import Weights, load_tensors
from .impl import register_builtin
from .raw import lib

__all__ = ["default_threads", "bf16_products_fast", "find_device", "open_backend", "BackendSet", "GraphCache",
           "GraphParts", "model_graphs", "Weights", "load_tensors"]


def default_threads() -> int:
    """The CPU cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``):
    the CPU backend's threads when none are given."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, n or 1)


def _is_cpu(name: str) -> bool:
    return name.lower() == "cpu"


def bf16_products_fast(name: str) -> bool:
    """Whether BF16 weights are the fast type for matrix products on the device ``name``: the
    CPU backend (``"cpu"``) when ggml's CPU code has AVX512-BF16 (``ggml_cpu_has_avx512_bf16``:
    the features of the CPU variant ggml loaded for this machine), whose BF16 products run at
    about twice the F32 rate; False for every other device."""
    return _is_cpu(name) and bool(lib.ggml_cpu_has_avx512_bf16())


def find_device(name: str) -> Device:
    """The ggml device ``name`` (see the module's docstring; a Python backend's is registered
    first). Raises :class:`~pyggml.errors.BackendNotAvailableError` (a KeyError) naming the
    devices there are, ImportError when a Python backend's dependency (torch) is missing."""
    register_builtin(name)
    return device_by_name(name)


def open_backend(name: str, n_threads: int | None = None, *, interruptible: bool = True) -> Backend:
    """A new backend on the device ``name`` (see the module's docstring), owned by the caller
    (``close()``). ``n_threads``: the CPU backend's threads (default :func:`default_threads`),
    and those of a device that has a setting for it (BLAS); a GPU ignores it.
    ``interruptible``: a CPU backend keeps pyggml's Ctrl-C check during computes (see
    :class:`~pyggml.backends.cpu.CPUBackend`). Raises ValueError for ``n_threads < 1``,
    :class:`~pyggml.errors.BackendNotAvailableError` (a KeyError) naming the devices there
    are, ImportError when a Python backend's dependency (torch) is missing."""
    if _is_cpu(name):
        return _cpu(n_threads, interruptible)
    backend = find_device(name).init()
    backend.set_n_threads(_cpu_threads(n_threads))
    return backend


def _cpu_threads(n_threads: int | None) -> int:
    if n_threads is not None and n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, not {n_threads}")
    return n_threads or default_threads()


def _cpu(n_threads: int | None, interruptible: bool) -> CPUBackend:
    return CPUBackend(n_threads=_cpu_threads(n_threads), interruptible=interruptible)


class BackendSet:
    """The backends a model runs on: one per device in ``devices`` (``"cpu"`` is the CPU
    backend), in :attr:`homes`, and the CPU backend (:attr:`cpu`, ``n_threads``) that ggml's
    scheduler needs last: :attr:`backends` is the scheduler's list. :meth:`close` (or ``with``)
    closes every backend it opened. Raises ValueError for no devices, a device named twice, or
    the CPU anywhere but first; what :func:`open_backend` raises (nothing stays open then)."""

    def __init__(self, devices: Sequence[str] = ("cpu",), n_threads: int | None = None, *,
                 interruptible: bool = True):
        names = list(devices)
        if not names:
            raise ValueError("give one or more devices")
        if len({n.lower() for n in names}) != len(names) or any(_is_cpu(n) for n in names[1:]):
            raise ValueError(f"devices must be distinct, the CPU at most first: {names}")
        self._stack = contextlib.ExitStack()
        try:
            #: the CPU backend (``n_threads`` threads), last in :attr:`backends` (and first in
            #: :attr:`homes` where ``"cpu"`` is named first)
            self.cpu = self._stack.enter_context(_cpu(n_threads, interruptible))
            #: one backend per device name, in order
            self.homes: list[Backend] = [self.cpu if _is_cpu(n) else self._stack.enter_context(
                open_backend(n, self.cpu.n_threads)) for n in names]
        except BaseException:
            self._stack.close()
            raise
        self.names = names

    @property
    def backends(self) -> list[Backend]:
        """The backends in a scheduler's order: the devices' (the CPU's left out), then the CPU's."""
        return [b for b in self.homes if b is not self.cpu] + [self.cpu]

    @property
    def n_threads(self) -> int:
        return self.cpu.n_threads

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "BackendSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def model_graphs(build: Any, backends: Sequence[Backend], **kwargs: Any) -> GraphCache:
    """A model's :class:`~pyggml.backends.graph_cache.GraphCache` over ``backends`` (a
    scheduler's order, the CPU last, as :attr:`BackendSet.backends`): on one backend alone (the
    CPU) each graph is placed by a graph allocator of its own, so that a graph computed after
    another places nothing again and a compute goes through less Python; over several, one
    scheduler of the cache's own places them all. ``kwargs``: the cache's other arguments.
    ValueError for no backends, and what GraphCache raises."""
    bs = list(backends)
    if not bs:
        raise ValueError("give one or more backends")
    if len(bs) == 1:
        return GraphCache(build, backend=bs[0], **kwargs)
    return GraphCache(build, backends=bs, **kwargs)
