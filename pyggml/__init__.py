"""pyggml: the ggml tensor library (pinned to ggml v0.20.2) from Python.

Two layers:

* **raw** — ``from pyggml import ffi, lib``: every function, enum value and integer/string
  constant declared in ggml.h, ggml-alloc.h, ggml-backend.h, ggml-cpu.h, gguf.h, ggml-opt.h and
  the internal ggml-backend-impl.h (and, in builds with those backends, ggml-cuda.h,
  ggml-vulkan.h, ggml-rpc.h) under its C name, exactly as in C (and as unchecked: a failed
  ``GGML_ASSERT`` aborts the process). C callbacks in Python: :mod:`pyggml.callbacks`.
* **Pythonic** — :class:`Context`, :class:`Tensor`, :class:`Graph`, :class:`Backend`,
  :class:`Buffer`, :class:`BufferType`, :class:`Event`, :class:`Device`, :class:`Registry`,
  :class:`Scheduler`, :class:`GraphAllocator`, :class:`CPUBackend`, :mod:`pyggml.types`,
  :mod:`pyggml.gguf`: objects that own or borrow their C object explicitly (``close()``,
  ``with``), check what ggml would assert on and raise Python exceptions instead.

**Shapes:** ggml's ``ne[0]`` is the fastest-varying dimension, so a NumPy shape is ``ne``
reversed (NumPy ``(rows, cols)`` = ggml ``ne [cols, rows]``).

Builds with several backends (``PYGGML_BACKENDS=cpu,cuda,vulkan,rpc``) load them as modules at
import; :mod:`pyggml.dl` and ``python -m pyggml info`` say what loaded and why not, and
:class:`BackendNotAvailableError` is raised for a backend that is missing. :mod:`pyggml.rpc`:
ggml's RPC client and server.

Importing pyggml sets ``GGML_NO_BACKTRACE=1`` (unless already set), so a failed ``GGML_ASSERT``
aborts without forking a debugger, and sends ggml's log to :mod:`logging` (:mod:`pyggml.log`).
"""
from __future__ import annotations

from ._loader import INCLUDE_DIR, LIB_DIR, PACKAGE_DIR, ffi, lib
from . import log as _log
from ._base import ClosedError, GGMLError
from .alloc import GraphAllocator
from .backend import Backend, Buffer, BufferType, Event
from .context import Context
from .cpu import CPUBackend, Threadpool
from .device import Device, Registry, devices, registries
from .graph import Graph
from .sched import Scheduler
from .tensor import Tensor
from .types import GGMLType
from . import utils

__version__ = "0.1.0"

#: The upstream ggml release the bindings are generated from.
GGML_VERSION = "0.20.2"

_log.install()
from . import dl  # noqa: E402
dl.load_modules()  # GGML_BACKEND_DL builds: load pyggml/lib's backend modules, report failures
from .dl import BackendNotAvailableError  # noqa: E402

__all__ = ["ffi", "lib", "GGML_VERSION", "LIB_DIR", "INCLUDE_DIR", "__version__",
           "GGMLError", "ClosedError", "Context", "Tensor", "Graph", "GraphAllocator", "Backend",
           "Buffer", "BufferType", "Event", "CPUBackend", "Threadpool", "Device", "Registry",
           "devices", "registries", "Scheduler", "GGMLType", "PACKAGE_DIR", "utils",
           "BackendNotAvailableError", "dl"]
