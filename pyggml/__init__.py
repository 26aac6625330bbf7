"""pyggml: the ggml tensor library from Python.

Three layers, each a folder or a set of modules (ARCHITECTURE.md draws them):

* **raw** (:mod:`pyggml.raw`) — ``from pyggml import ffi, lib``: every function, enum value and
  integer/string constant of the pinned headers (ggml.h, ggml-alloc.h, ggml-backend.h,
  ggml-cpu.h, gguf.h, ggml-opt.h, the internal ggml-backend-impl.h, and each built backend's
  header) under its C name, exactly as in C (and as unchecked: a failed ``GGML_ASSERT`` aborts
  the process). C callbacks in Python: :mod:`pyggml.raw.callbacks`; the rule for their exceptions:
  :mod:`pyggml.raw.boundary`; backend modules: :mod:`pyggml.raw.dl`.
* **Pythonic** — one module per ggml concept: :class:`Context`, :class:`Tensor` (and the op
  constructors of :mod:`pyggml.core.ops`), :class:`Graph`, :class:`GraphAllocator`,
  :class:`BufferType`, :class:`Buffer`, :class:`Backend` (compute), :class:`Event`,
  :class:`Device`, :class:`Registry`, :class:`Scheduler`, :class:`CPUBackend`,
  :class:`GraphCache` (graphs built once per shape, computed again with new inputs); plus
  :mod:`pyggml.types`, :mod:`pyggml.enums`, :mod:`pyggml.core.gguf`, :mod:`pyggml.rpc`,
  :mod:`pyggml.opt` (training with ggml-opt; ``from pyggml import opt``). Objects own
  or borrow their C object explicitly (``close()``, ``with``; :mod:`pyggml._cobject`) and check
  what ggml would assert on, raising Python exceptions instead.
* **Python backends** (:mod:`pyggml.impl`) — ggml backends written in Python, the NumPy
  reference backend (:mod:`pyggml.impl.numpy`) and loadable backend modules.

**Shapes:** ggml's ``ne[0]`` is the fastest-varying dimension, so a NumPy shape is ``ne``
reversed (NumPy ``(rows, cols)`` = ggml ``ne [cols, rows]``).

Builds with several backends (``PYGGML_BACKENDS=cpu,cuda,vulkan,rpc``) load them as modules at
import; :mod:`pyggml.raw.dl` and ``python -m pyggml info`` say what loaded and why not, and
:class:`BackendNotAvailableError` is raised for a backend that is missing.

Importing pyggml sets ``GGML_NO_BACKTRACE=1`` (unless already set), so a failed ``GGML_ASSERT``
aborts without forking a debugger, and sends ggml's log to :mod:`logging` (:mod:`pyggml.raw.log`).
"""
from __future__ import annotations

import sys

from .raw import GGML_VERSION, INCLUDE_DIR, LIB_DIR, PACKAGE_DIR, ffi, lib
from .raw import callbacks, dl, log as _log
from .errors import BackendNotAvailableError, ClosedError, GGMLError
from . import enums, types
from .enums import GGMLType
from .core.tensor import Tensor
from .core.graph import Graph
from .core.context import Context
from .memory.buffer import Buffer
from .memory.buffer_type import BufferType
from .backends.alloc import GraphAllocator
from .backends.backend import Backend
from .backends.event import Event
from .backends.device import Device, devices
from .backends.registry import Registry, registries
from .backends.cpu import CPUBackend, Threadpool
from .backends.blas import BLASBackend
from .backends.sched import Scheduler
from .backends.graph_cache import GraphCache
from .backends.utils import from_dlpack

__version__ = "0.1.0"

_log.install()
dl.load_modules()  # GGML_BACKEND_DL builds: load pyggml/lib's backend modules, report failures

__all__ = ["ffi", "lib", "GGML_VERSION", "LIB_DIR", "INCLUDE_DIR", "PACKAGE_DIR", "__version__",
           "GGMLError", "ClosedError", "BackendNotAvailableError", "Context", "Tensor", "Graph",
           "GraphAllocator", "Backend", "Buffer", "BufferType", "Event", "CPUBackend", "Threadpool", "BLASBackend",
           "Device", "Registry", "devices", "registries", "Scheduler", "GraphCache", "GGMLType", "enums", "types", "from_dlpack",
           "callbacks", "dl"]
