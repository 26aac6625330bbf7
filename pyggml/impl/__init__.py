"""Write ggml backends in Python: the five interfaces of ggml-backend-impl.h as base classes.

Subclass :class:`PyRegistry`, :class:`PyDevice`, :class:`PyBufferType`, :class:`PyBuffer` (or
use :class:`HostBuffer`) and :class:`PyBackend`; pyggml fills ggml's C vtables with its generated
``extern "Python"`` trampolines (:mod:`pyggml.impl._vtable`). A slot whose method the subclass
does not define stays NULL, so ggml's own fallback applies (e.g. no ``synchronize``: a
synchronous backend). Abstract methods are the slots ggml calls unconditionally. ``api_version``
is ``GGML_BACKEND_API_VERSION``.

Methods receive pyggml objects, lent for the call: :class:`~pyggml.core.tensor.Tensor` (``ne``,
``nb``, ``op``, ``src``, ``op_params`` and ``params``, the op parameters decoded per op;
:func:`pyggml.core.ops.host_array` gives a NumPy view of host data), :class:`~pyggml.core.graph.Graph`,
:class:`~pyggml.memory.buffer_type.BufferType`, ``memoryview`` for raw bytes.

**Failures**: an exception in any method becomes that slot's failure value (``graph_compute``
-> ``GGML_STATUS_FAILED``, allocation -> NULL, ``supports_op`` -> false...) and is re-raised by
the pyggml call that made ggml call the method (:mod:`pyggml.raw.boundary`). Where ggml cannot
survive the failure value (a NULL name, an alignment of 0, a NULL base), pyggml asks once and
keeps the answer, or gives ggml a safe value and still raises.

**Lifetimes**: a registered registry, its devices and buffer types live until
:func:`unregister` or interpreter exit, where the registration is undone before Python tears
down. Backends, buffers and events live until ggml frees them (``free``/``free_buffer``).

**Threads**: every callback takes the GIL; computing from any thread works.

Also here: :mod:`pyggml.impl.numpy`, the NumPy reference backend, :mod:`pyggml.impl.torch`, a
backend over torch tensors, what both are built on (:mod:`pyggml.impl.kernel_table`: a kernel
table keyed by op and a device's cached ``supports_op``), and :mod:`pyggml.impl.module`, which
turns a Python backend into a ggml backend module any ggml program can load.
"""
from __future__ import annotations

import importlib

from .backend import GraphOptimizeParams, PyBackend
from .buffer import HostBuffer, PyBuffer, PyBufferType
from .device import PyDevice
from .kernel_table import KernelTable, SupportCache
from .registry import PyRegistry, register, unregister

__all__ = ["PyRegistry", "PyDevice", "PyBufferType", "PyBuffer", "HostBuffer", "PyBackend",
           "GraphOptimizeParams", "KernelTable", "SupportCache", "register", "unregister", "register_builtin",
           "BUILTIN"]

#: pyggml's own Python backends: device-name prefix -> module (each has ``register()``)
BUILTIN = {"NUMPY": "pyggml.impl.numpy", "TORCH": "pyggml.impl.torch"}


def register_builtin(device_name: str) -> bool:
    """Register the pyggml Python backend whose devices ``device_name`` names (``numpy``,
    ``TORCH0``...; case insensitive) and return True; False for any other name (ggml's own
    devices need no registration). Idempotent. Raises ImportError when that backend's optional
    dependency (torch) is missing."""
    upper = device_name.upper()
    for prefix, module in BUILTIN.items():
        if upper.startswith(prefix):
            importlib.import_module(module).register()
            return True
    return False
