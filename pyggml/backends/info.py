"""What this pyggml installation is: ggml version, how it was built, which backends loaded,
which devices exist. ``python -m pyggml info`` prints it; :func:`info` returns it as data."""
from __future__ import annotations

from typing import Any

from .device import devices
from ..raw import GGML_VERSION, LIB_DIR, PACKAGE_DIR, dl
from .registry import registries

__all__ = ["info", "format_info"]


def info() -> dict[str, Any]:
    """A dict:

    - ``ggml_version``, ``package_dir``;
    - ``build``: what build_ggml.py recorded (``backends``, ``backend_dl``, ``cpu``: ``"native"``,
      ``"x86-64-v3"`` or ``"all-variants"``, CMake arguments, libraries, build time in seconds);
    - ``backends``: for each built backend, ``loaded``, the ``module`` file ggml loaded (None when
      linked into libggml), its number of ``devices``, and ``error``: what kept it from loading,
      or why it found no device (None otherwise);
    - ``libraries``: the ``libggml*.so`` files in the package;
    - ``registries``: the registered backend registries (Python backends included);
    - ``devices``: name, description, type, memory in bytes, and ``extra_buffer_types``: for each
      one ggml lists, its ``name``, the weight ``types`` whose products the device takes in it, and
      ``error``: why pyggml does not use it (its trial failed), or None
      (:attr:`pyggml.Device.extra_buffer_type_trials`).
    """
    return {
        "ggml_version": GGML_VERSION,
        "package_dir": str(PACKAGE_DIR),
        "build": dl.build_info(),
        "backends": {k: v.as_dict() for k, v in dl.status().items()},
        "libraries": sorted(p.name for p in LIB_DIR.glob("*.so")),
        "registries": [r.name for r in registries()],
        "devices": [{"name": d.name, "description": d.description, "type": d.type.name.lower(),
                     "memory_free": d.memory[0], "memory_total": d.memory[1],
                     "extra_buffer_types": [{"name": t.name, "types": [k.name for k in t.types], "error": t.error}
                                            for t in d.extra_buffer_type_trials]} for d in devices()],
    }


def format_info(data: dict[str, Any]) -> str:
    """Human-readable text of :func:`info`'s result."""
    build = data["build"]
    lines = [f"ggml {data['ggml_version']} (pyggml at {data['package_dir']})"]
    if build:
        how = ("each a module loaded at run time (GGML_BACKEND_DL)" if build.get("backend_dl")
               else "linked into libggml")
        lines.append(f"built {build.get('built', '?')}: backends {', '.join(build.get('backends', ['cpu']))}, "
                     f"{how}; CPU code: {build.get('cpu', 'native')}")
        lines.append(f"CMake arguments: {' '.join(build.get('cmake_args', []))}")
    lines.append("backends:")
    for name, st in data["backends"].items():
        if st["loaded"]:
            where = f"from {st['module'].rsplit('/', 1)[-1]}" if st["module"] else "linked in"
            lines.append(f"  {name:<8} loaded ({where}), {st['devices']} device(s)"
                         + (f": {st['error']}" if st["error"] else ""))
        else:
            lines.append(f"  {name:<8} NOT LOADED: {st['error']}")
    lines.append(f"libraries: {', '.join(data['libraries'])}")
    lines.append(f"backend registries: {', '.join(data['registries']) or 'none'}")
    lines.append("devices:")
    for d in data["devices"]:
        mem = f"{d['memory_free'] / 2**30:.1f}/{d['memory_total'] / 2**30:.1f} GiB free" if d["memory_total"] else "memory n/a"
        lines.append(f"  {d['name']:<8} {d['type']:<6} {d['description']} ({mem})")
        for x in d["extra_buffer_types"]:
            state = f"NOT USED: {x['error']}" if x["error"] else "in use"
            lines.append(f"           extra buffer type {x['name']} ({', '.join(x['types']) or 'no weight type'}): {state}")
    return "\n".join(lines)
