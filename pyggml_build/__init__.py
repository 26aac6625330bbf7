"""pyggml's build: upstream ggml compiled with CMake, then the cffi extension generated from its
headers. Build-time only: this package is not installed with pyggml.

``python build_ggml.py`` (in place, for development) and ``pip install .`` (through ``setup.py``)
both call :func:`build`, which runs the steps in order, each a module:

1. :mod:`~pyggml_build.source` — the pinned upstream source (:mod:`~pyggml_build.pins`: one row
   per ggml version, fetched from PyPI, hash-checked, cached, unpacked into ``vendor/ggml-<version>/``);
2. :mod:`~pyggml_build.config` and :mod:`~pyggml_build.toolchains` — which backends, and what
   each needs (checked before anything long runs); :mod:`~pyggml_build.vecmath` — glibc's vector
   ``erff`` for ggml's GELU-erf loops where the compilers and the C library offer it;
3. :mod:`~pyggml_build.cmake` — ggml's libraries and backend modules into ``pyggml/lib``;
4. :mod:`~pyggml_build.declarations` — the cffi extension ``pyggml/_ggml*.so`` and the generated
   ``pyggml/raw/_callback_table.py`` and ``pyggml/_enums.py``; with :mod:`~pyggml_build.stubs`,
   what type checkers read: ``pyggml/_ggml.pyi`` (the extension's stub) and
   ``pyggml/core/_unchecked_ops.py`` (typed methods for the op constructors without checks).
   ``--generate-only`` rewrites just these generated Python files of a finished build.

Environment: ``PYGGML_GGML_VERSION`` (a version of :data:`~pyggml_build.pins.PINS`),
``PYGGML_BACKENDS``, ``CMAKE_ARGS``, ``PYGGML_GGML_SRC``, ``PYGGML_CACHE_DIR`` (default
``~/.cache/pyggml``), ``PYGGML_CUDA_ARCHITECTURES``, ``CUDACXX``, ``PYGGML_VULKAN_PREFIX`` or
``VULKAN_SDK``, ``PIP_INDEX_URL``, ``PYGGML_VECTOR_MATH`` (0: off).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from . import cmake, declarations, pins, source
from .common import BuildError, log
from .config import Config, resolve_config
from .toolchains import backend_args
from .vecmath import vector_math_args

__all__ = ["build", "mirror", "main", "BuildError", "ROOT"]

ROOT = source.ROOT


def build(pkg_dir: Path = ROOT / "pyggml", *, ggml_src: str | None = None, version: str | None = None,
          build_dir: Path = ROOT / "build", jobs: int | None = None,
          cmake_extra: list[str] | None = None, config: Config | None = None) -> list[Path]:
    """Run every step; ``pkg_dir`` is the ``pyggml`` package folder that receives the outputs.
    ``version`` defaults to ``$PYGGML_GGML_VERSION`` / :data:`~pyggml_build.pins.DEFAULT_VERSION`,
    ``config`` to :func:`~pyggml_build.config.resolve_config` of the environment. Returns the
    files written. Raises BuildError."""
    t0 = time.monotonic()
    try:
        pin = pins.selected_version(version)
    except ValueError as e:
        raise BuildError(str(e)) from None
    config = config or resolve_config()
    log(f"ggml {pin.version}; backends: {', '.join(config.backends)}; CPU: {config.cpu}; "
        f"{'each backend a loadable module (GGML_BACKEND_DL)' if config.dl else 'linked into libggml'}")
    cache = source.cache_dir()
    backend, rpath = backend_args(config, cache)  # checks prerequisites before anything long
    backend += vector_math_args(cache, config.user_args)
    src, pin = source.resolve_source(pin, ggml_src, cache)
    ggml_build = build_dir / f"ggml-{pin.version}{config.tag}"
    args = cmake.cmake_args(config, backend, rpath, cmake_extra or [])
    stage = cmake.build_libraries(src, ggml_build, args, jobs or os.cpu_count() or 2)
    out = cmake.copy_outputs(src, stage, ggml_build, config, pkg_dir)
    out.append(cmake.write_build_info(pkg_dir, src, pin, config, args, out, time.monotonic() - t0))
    t1 = time.monotonic()
    headers = [Path(h).name for h in cmake.headers_for(config.backends)]
    out.append(declarations.compile_extension(
        pkg_dir, build_dir / f"ffi-{pin.version}{config.tag}", headers, pin.version,
        backends=config.backends, dl=config.dl, undefined=pin.undefined_functions))
    log(f"cffi extension {out[-1].name} built in {time.monotonic() - t1:.0f} s")
    out += [pkg_dir / rel for rel in declarations.GENERATED]
    log(f"done in {time.monotonic() - t0:.0f} s")
    return out


def mirror(files: list[Path], pkg_dir: Path, into: Path = ROOT / "pyggml") -> None:
    """Copy the built ``files`` (paths under ``pkg_dir``) to the same places under ``into``,
    the source tree's package: after ``pip install .`` from a clone, ``python -m pyggml`` run in
    the clone (whose ``pyggml/`` comes first on ``sys.path``) finds the same build as the
    installed package. Files there from an older build are replaced; git ignores them all."""
    pkg_dir, into = Path(os.path.abspath(pkg_dir)), Path(os.path.abspath(into))  # not resolve(): lib/ holds symlinks
    files = [Path(os.path.abspath(f)) for f in files]
    if pkg_dir.resolve() == into.resolve() or not (into / "__init__.py").is_file():
        return
    new = {into / f.relative_to(pkg_dir) for f in files}
    for folder in ("lib", "include", "licenses"):  # whole folders of build outputs: drop what this build lacks
        for old in (into / folder).glob("*") if (into / folder).is_dir() else ():
            if old not in new and (old.is_file() or old.is_symlink()):
                old.unlink()
    for f in files:
        dest = into / f.relative_to(pkg_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        shutil.copy2(f, dest, follow_symlinks=False)
    log(f"the build copied into {into} too (the clone's package imports it)")


def main(argv: list[str] | None = None) -> int:
    """``python build_ggml.py [--ggml-version V] [--ggml-src DIR] [-j N] [-- CMAKE ARGS]``."""
    p = argparse.ArgumentParser(prog="build_ggml.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ggml-version", choices=sorted(pins.PINS),
                   help=f"ggml version to build (default: $PYGGML_GGML_VERSION, else {pins.DEFAULT_VERSION})")
    p.add_argument("--ggml-src", help="a ggml source tree of a pinned version (default: $PYGGML_GGML_SRC, "
                                      "else vendor/ggml-<version>, fetched from PyPI if needed)")
    p.add_argument("--build-dir", type=Path, default=ROOT / "build", help="default: ./build")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel build jobs (default: all cores)")
    p.add_argument("--fetch-only", action="store_true", help="only fill vendor/ggml-<version> and stop")
    p.add_argument("--generate-only", action="store_true",
                   help="only rewrite the generated Python files (enums, callback table, the stub of the "
                        "extension, the unchecked op methods) of the in-place build, without compiling")
    p.add_argument("cmake_args", nargs="*", help="extra CMake arguments, after `--`")
    a = p.parse_args(argv)
    try:
        if a.generate_only:
            try:
                for path in declarations.generate(ROOT / "pyggml"):
                    log(f"wrote {path}")
            except (RuntimeError, OSError) as e:
                raise BuildError(str(e)) from None
        elif a.fetch_only:
            try:
                pin = pins.selected_version(a.ggml_version)
            except ValueError as e:
                raise BuildError(str(e)) from None
            source.resolve_source(pin, a.ggml_src)
        else:
            build(ggml_src=a.ggml_src, version=a.ggml_version, build_dir=a.build_dir, jobs=a.jobs,
                  cmake_extra=a.cmake_args)
    except BuildError as e:
        print(f"build_ggml: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0
