"""What this pyggml installation is: ggml version, how it was built, which backends loaded,
which devices exist. ``python -m pyggml info`` prints it; :func:`info` returns it as data."""
from __future__ import annotations

import json
from typing import Any

from ._loader import LIB_DIR, PACKAGE_DIR, ffi, lib

__all__ = ["info", "format_info"]


def _build_info() -> dict[str, Any]:
    path = PACKAGE_DIR / "_build_info.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def info() -> dict[str, Any]:
    """A dict: ``ggml_version``, ``build`` (what build_ggml.py recorded: CMake arguments,
    libraries), ``libraries`` (the ``libggml*.so`` files in the package), ``registries`` (the
    loaded backend registries) and ``devices`` (name, description, type, memory in bytes)."""
    from .device import devices, registries

    return {
        "ggml_version": ffi.string(lib.ggml_version()).decode(),
        "package_dir": str(PACKAGE_DIR),
        "build": _build_info(),
        "libraries": sorted(p.name for p in LIB_DIR.glob("*.so")),
        "registries": [r.name for r in registries()],
        "devices": [{"name": d.name, "description": d.description, "type": d.type,
                     "memory_free": d.memory[0], "memory_total": d.memory[1]} for d in devices()],
    }


def format_info(data: dict[str, Any]) -> str:
    """Human-readable text of :func:`info`'s result."""
    build = data["build"]
    lines = [f"ggml {data['ggml_version']} (pyggml at {data['package_dir']})"]
    if build:
        lines.append(f"built {build.get('built', '?')} with CMake arguments: {' '.join(build.get('cmake_args', []))}")
    lines.append(f"libraries: {', '.join(data['libraries'])}")
    lines.append(f"backend registries loaded: {', '.join(data['registries']) or 'none'}")
    lines.append("devices:")
    for d in data["devices"]:
        mem = f"{d['memory_free'] / 2**30:.1f}/{d['memory_total'] / 2**30:.1f} GiB free" if d["memory_total"] else "memory n/a"
        lines.append(f"  {d['name']:<8} {d['type']:<6} {d['description']} ({mem})")
    return "\n".join(lines)
