"""Backend modules (``GGML_BACKEND_DL``): what this build has, what loaded, and why not.

A build with more than one backend (``PYGGML_BACKENDS=cpu,cuda,...`` or ``CMAKE_ARGS=-DGGML_CUDA=on``)
makes every backend a module in ``pyggml/lib`` (``libggml-cuda.so``, ``libggml-vulkan.so``,
``libggml-rpc.so``, ``libggml-cpu*.so``). Importing pyggml loads them with
``ggml_backend_load_all_from_path(<pyggml/lib>)`` (:func:`load_modules`, run once), binds the
backend-specific C functions of their headers (``lib.ggml_backend_cpu_init``,
``lib.ggml_backend_rpc_add_server``...) to the module ggml chose, and records for each built
backend whether it loaded and, if not, why (:func:`status`). A module that cannot load (no driver,
no GPU, a CPU without the instruction set) is logged as a warning on the ``pyggml`` logger; it is
never fatal, and pyggml never falls back to another backend without saying so: asking for a
device or registry that is missing raises :class:`BackendNotAvailableError` with the reason.

A CPU-only build links the CPU backend into ``libggml.so``: nothing is loaded at run time.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import BackendNotAvailableError
from . import BUILD_INFO, LIB_DIR, ffi, lib

__all__ = ["BackendStatus", "BackendNotAvailableError", "build_info", "built_backends",
           "status", "load_modules", "explain", "require", "is_bound", "is_dl"]

_logger = logging.getLogger("pyggml")

#: ggml registry names of the backends pyggml knows (``ggml_backend_reg_name``), by build name
REGISTRY_NAMES = {"cpu": "CPU", "cuda": "CUDA", "vulkan": "Vulkan", "rpc": "RPC", "blas": "BLAS",
                  "hip": "ROCm", "sycl": "SYCL", "metal": "MTL", "opencl": "OpenCL", "cann": "CANN",
                  "musa": "MUSA", "webgpu": "WebGPU", "zdnn": "zDNN", "zendnn": "ZenDNN",
                  "openvino": "OpenVINO", "virtgpu": "VirtGPU", "hexagon": "HTP"}


@dataclass(frozen=True)
class BackendStatus:
    """One built backend. ``module``: the file ggml loaded (None if linked in or not loaded);
    ``devices``: how many devices its registry has; ``error``: why it did not load, or why it
    found no device (ggml's own error messages while loading), else None."""
    name: str
    loaded: bool
    module: str | None
    devices: int
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_status: dict[str, BackendStatus] = {}
_loaded = False


def build_info() -> dict[str, Any]:
    """What the build recorded in ``pyggml/_build_info.json`` ({} if absent)."""
    return dict(BUILD_INFO)


def built_backends() -> list[str]:
    """The backends this pyggml was built with (build names: ``"cpu"``, ``"cuda"``...)."""
    return list(build_info().get("backends", ["cpu"]))


def is_dl() -> bool:
    """True if the backends are modules loaded at run time (``GGML_BACKEND_DL``)."""
    return bool(build_info().get("backend_dl", False))


def is_bound(function: str) -> bool:
    """Whether C function ``function`` of a backend header can be called: always in a build
    that links its backends; in a ``GGML_BACKEND_DL`` build, once its module loaded (calling an
    unbound one aborts the process)."""
    return not is_dl() or lib.pyggml_dl_is_bound(function.encode()) == 1


def _module_files(name: str) -> list[str]:
    files = [LIB_DIR / f"libggml-{name}.so"] + sorted(LIB_DIR.glob(f"libggml-{name}-*.so"))
    return [str(p) for p in files if p.is_file()]


def _registered() -> dict[str, Any]:
    regs = {}
    for i in range(lib.ggml_backend_reg_count()):
        r = lib.ggml_backend_reg_get(i)
        regs[ffi.string(lib.ggml_backend_reg_name(r)).decode()] = r
    return regs


def _why_not(name: str) -> str:
    files = _module_files(name)
    if not files:
        return f"no module libggml-{name}*.so in {LIB_DIR}"
    errors = []
    for f in files:
        err = lib.pyggml_dl_open_error(f.encode())
        if err != ffi.NULL:
            errors.append(ffi.string(err).decode())
    if len(errors) == len(files):
        return "; ".join(dict.fromkeys(errors))  # e.g. "libcuda.so.1: cannot open shared object file"
    if name == "cpu":
        return "no CPU module variant supports this processor's instruction set"
    return ("the module loads, but ggml did not register it (its ggml_backend_init failed or it "
            "reported score 0; see the pyggml.ggml log)")


def load_modules() -> dict[str, BackendStatus]:
    """Load the backend modules of a ``GGML_BACKEND_DL`` build (once; imported pyggml has done it)
    and return :func:`status`. Logs a warning for each built backend that did not load."""
    global _loaded
    if _loaded:
        return dict(_status)
    _loaded = True
    built = built_backends()
    messages = _Collect()
    ggml_logger = logging.getLogger("pyggml.ggml")
    ggml_logger.addHandler(messages)
    try:
        if is_dl():
            lib.ggml_backend_load_all_from_path(str(LIB_DIR).encode())
    finally:
        ggml_logger.removeHandler(messages)
    regs = _registered()
    for name in built:
        reg = regs.get(REGISTRY_NAMES.get(name, name))
        if reg is None:
            why = _why_not(name) if is_dl() else "not registered"
            _status[name] = BackendStatus(name, False, None, 0, why)
            _logger.warning("pyggml: the %s backend was built but did not load: %s", name, why)
            continue
        module = None
        if is_dl():
            for f in _module_files(name):
                if lib.pyggml_dl_bind(name.encode(), f.encode()) >= 0:
                    module = f
                    break
        n = lib.ggml_backend_reg_dev_count(reg)
        err: str | None = None
        if n == 0 and name != "rpc":  # RPC devices come from servers (pyggml.rpc.add_server)
            err = "; ".join(messages.lines) or _NO_DEVICE.get(name, "ggml found no device")
            _logger.warning("pyggml: the %s backend loaded but found no device: %s", name, err)
        _status[name] = BackendStatus(name, True, module, n, err)
    return dict(_status)


_NO_DEVICE = {
    "vulkan": "ggml found no Vulkan device (it skips CPU-type devices such as Mesa's lavapipe "
              "unless GGML_VK_VISIBLE_DEVICES lists them, e.g. GGML_VK_VISIBLE_DEVICES=0)",
    "cuda": "ggml found no CUDA device",
}


class _Collect(logging.Handler):
    """ggml's warnings and errors while the modules load (e.g. why CUDA found no device)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().strip())


def status() -> dict[str, BackendStatus]:
    """{build name: :class:`BackendStatus`} for every backend this pyggml was built with."""
    return load_modules()


def require(backend: str) -> None:
    """Raise :class:`BackendNotAvailableError` (with :func:`explain`'s reason) unless the built
    backend ``backend`` (``"cpu"``, ``"cuda"``...) is loaded: its C functions would abort."""
    st = status().get(backend)
    if st is None or not st.loaded:
        raise BackendNotAvailableError(explain(REGISTRY_NAMES.get(backend, backend)))


def backend_of(name: str) -> str | None:
    """The build name (``"cuda"``) for a registry or device name (``"CUDA"``, ``"CUDA0"``,
    ``"Vulkan1"``, ``"RPC[127.0.0.1:50052]"``), or None if it is no backend pyggml knows."""
    base = re.sub(r"(\[.*\]|\d+)$", "", name).lower()
    for build, reg in REGISTRY_NAMES.items():
        if base in (build, reg.lower()):
            return build
    return None


def explain(name: str) -> str:
    """Why no registry/device named ``name`` exists, in one sentence."""
    backend = backend_of(name)
    built = built_backends()
    if backend is None:
        return f"{name!r} is not a ggml backend pyggml knows"
    if backend not in built:
        with_it = ",".join(dict.fromkeys(built + [backend]))
        return (f"this pyggml was built without the {backend} backend (built: {', '.join(built)}); "
                f"rebuild it with PYGGML_BACKENDS={with_it} pip install ... (see the README)")
    st = status().get(backend)
    if st is not None and not st.loaded:
        return f"the {backend} backend was built but did not load: {st.error}"
    if st is not None and st.devices == 0 and st.error:
        return f"the {backend} backend loaded but found no device: {st.error}"
    return f"the {backend} backend is loaded, but has no device named {name!r}"
