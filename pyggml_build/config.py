"""Step 2, what to build: ``$PYGGML_BACKENDS`` and ``$CMAKE_ARGS`` combined into a :class:`Config`.

``cpu`` alone builds the CPU backend into ``libggml-cpu.so``, tuned for this machine
(``GGML_NATIVE``). Anything more builds with ``GGML_BACKEND_DL``: every backend is a module that
pyggml loads at import. ``GGML_NATIVE`` cannot be combined with modules: the CPU module is then
built for x86-64-v3, or with ``cpu-all-variants`` as ggml's x86 variants chosen at run time.
Contradictions are refused here, before CMake runs.
"""
from __future__ import annotations

import os
import re
import shlex

from .common import BuildError
from .pins import BACKEND_HEADERS, OTHER_BACKENDS

__all__ = ["Config", "resolve_config", "cmake_bools", "cmake_value"]

_TRUE, _FALSE = {"1", "on", "yes", "true", "y"}, {"0", "off", "no", "false", "n", ""}


def cmake_bools(args: list[str]) -> dict[str, bool]:
    """``-DGGML_X=ON`` / ``-DGGML_X:BOOL=OFF`` in ``args``: {"GGML_X": True/False} (last one wins)."""
    out = {}
    for a in args:
        m = re.fullmatch(r"-D(GGML_[A-Z0-9_]+)(?::BOOL)?=(.*)", a.strip())
        if m and m.group(2).lower() in _TRUE | _FALSE:
            out[m.group(1)] = m.group(2).lower() in _TRUE
    return out


def cmake_value(args: list[str], name: str) -> str | None:
    val = None
    for a in args:
        m = re.fullmatch(rf"-D{name}(?::\w+)?=(.*)", a.strip())
        if m:
            val = m.group(1)
    return val


class Config:
    """What to build: the backends, whether as loadable modules (``GGML_BACKEND_DL``), which CPU
    flavour (``"native"``, ``"x86-64-v3"`` or ``"all-variants"``), and the user's CMake arguments."""

    def __init__(self, backends: list[str], dl: bool, cpu: str, user_args: list[str]):
        self.backends, self.dl, self.cpu, self.user_args = backends, dl, cpu, user_args

    @property
    def tag(self) -> str:
        """Build folder suffix: ``""`` for the default CPU build, else e.g. ``"-cpu-cuda-rpc"``."""
        if self.backends == ["cpu"] and self.cpu == "native":
            return ""
        names = [("cpu-all-variants" if b == "cpu" and self.cpu == "all-variants" else b)
                 for b in self.backends]
        return "-" + "-".join(names)

    def as_dict(self) -> dict:
        return {"backends": self.backends, "backend_dl": self.dl, "cpu": self.cpu}


def resolve_config(backends_env: str | None = None, cmake_args_env: str | None = None) -> Config:
    """Combine ``$PYGGML_BACKENDS`` and ``$CMAKE_ARGS`` into a :class:`Config`.

    Raises BuildError for an unknown backend name, for a backend both requested and switched off,
    and for ``GGML_NATIVE=ON`` or ``GGML_BACKEND_DL=OFF`` together with more than one backend.
    """
    if backends_env is None:
        backends_env = os.environ.get("PYGGML_BACKENDS", "")
    if cmake_args_env is None:
        cmake_args_env = os.environ.get("CMAKE_ARGS", "")
    user_args = shlex.split(cmake_args_env)
    flags = cmake_bools(user_args)
    known = list(BACKEND_HEADERS) + OTHER_BACKENDS
    requested: list[str] = []
    all_variants = False
    for tok in (t.strip().lower() for t in backends_env.split(",")):
        if not tok:
            continue
        if tok == "cpu-all-variants":
            tok, all_variants = "cpu", True
        if tok not in known:
            raise BuildError(f"PYGGML_BACKENDS: unknown backend {tok!r}; pyggml builds "
                             f"{', '.join(['cpu', 'cpu-all-variants'] + list(BACKEND_HEADERS)[1:])} "
                             f"(and {', '.join(OTHER_BACKENDS)} through CMAKE_ARGS, unchecked)")
        if flags.get(f"GGML_{tok.upper()}") is False:
            raise BuildError(f"PYGGML_BACKENDS asks for {tok} but CMAKE_ARGS has "
                             f"-DGGML_{tok.upper()}=OFF: drop one of them")
        if tok not in requested:
            requested.append(tok)
    for name in known:
        if flags.get(f"GGML_{name.upper()}") and name not in requested:
            requested.append(name)
    if flags.get("GGML_CPU") is False:
        raise BuildError("-DGGML_CPU=OFF is not supported: ggml's scheduler and pyggml's host "
                         "buffers need the CPU backend")
    if flags.get("GGML_CPU_ALL_VARIANTS"):
        all_variants = True
    backends = ["cpu"] + sorted(b for b in requested if b != "cpu")
    dl = len(backends) > 1 or all_variants or bool(flags.get("GGML_BACKEND_DL"))
    if dl and flags.get("GGML_BACKEND_DL") is False:
        raise BuildError(f"CMAKE_ARGS has -DGGML_BACKEND_DL=OFF, but {', '.join(backends)} need "
                         "it: pyggml builds every backend as a module when there is more than one")
    if dl and flags.get("GGML_NATIVE"):
        raise BuildError(
            "CMAKE_ARGS has -DGGML_NATIVE=ON, which ggml refuses together with GGML_BACKEND_DL "
            f"(needed for {', '.join(backends)}). Drop it: the CPU module is then built for "
            "x86-64-v3 (AVX2), or use PYGGML_BACKENDS=cpu-all-variants,... for ggml's 14 x86 "
            "variants chosen at run time. Only a CPU-only build can be tuned with GGML_NATIVE.")
    cpu = "all-variants" if all_variants else ("x86-64-v3" if dl else "native")
    return Config(backends, dl, cpu, user_args)
