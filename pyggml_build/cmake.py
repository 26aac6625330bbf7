"""Step 3, CMake: configure, build and install ggml as shared libraries, then copy the libraries,
the backend modules and the pinned headers into the package, and record what was built.

Shared libraries, Release, one build folder per ggml version and backend set. ``$CMAKE_ARGS``
comes after pyggml's own arguments, so it can override any of them. The libraries are installed
with an ``$ORIGIN`` rpath and without versioned sonames: one file each, in ``pyggml/lib/``.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from .common import BuildError, log, run
from .config import Config
from .pins import BACKEND_HEADERS, HEADERS, INTERNAL_HEADERS, Pin
from .source import ROOT

__all__ = ["cmake_args", "build_libraries", "modules", "headers_for", "copy_outputs", "write_build_info"]


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        try:
            import cmake  # the PyPI package, a build requirement; only needed when not on PATH
            exe = str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
        except ImportError:
            raise BuildError("cmake not found: pip install cmake") from None
    return exe


def cmake_args(config: Config, backend: list[str], rpath: list[str], extra: list[str]) -> list[str]:
    """Every CMake argument, in order: pyggml's defaults, the backend selection, ``$CMAKE_ARGS``
    (so the user's win, as in llama-cpp-python), then ``extra`` (command line)."""
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_BUILD_TESTS=OFF",
        "-DGGML_BUILD_EXAMPLES=OFF",
        # one file per library: no libggml.so -> .so.0 -> .so.0.20.2 chains
        "-DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON",
        "-DCMAKE_INSTALL_RPATH=" + ";".join(["$ORIGIN"] + rpath),
        # the modules of a GGML_BACKEND_DL build are copied from the build tree, not installed
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_LIBDIR=lib",
        # llamafile's tinyBLAS sgemm for the CPU's mul_mat (F32, F16, BF16, Q8_0, Q4_0... with
        # batches): standalone ggml leaves it OFF, llama.cpp (and llama-cpp-python, whose sdist
        # is pinned) turns it ON; MiniLM at batch 64 and prompt processing depend on it
        "-DGGML_LLAMAFILE=ON",
    ] + backend
    ninja = shutil.which("ninja")
    if ninja:
        # explicit path: pip's isolated build environments move ninja between builds
        args += ["-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    return args + config.user_args + extra


def build_libraries(src: Path, build_dir: Path, args: list[str], jobs: int) -> Path:
    """Configure, build and install ggml; return the staging prefix."""
    stage = build_dir / "stage"
    t0 = time.monotonic()
    cache = build_dir / "CMakeCache.txt"
    text = cache.read_text() if cache.is_file() else ""
    if text and f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n" not in text:
        log(f"{build_dir} was configured for another source tree: starting it afresh")
        shutil.rmtree(build_dir)
    elif text and any(not Path(p).exists() for p in _cached_tools(text)):
        # pip builds in a throw-away environment whose cmake and ninja the build files name:
        # the next `pip install .` finds them gone (ninja's rule that configures again fails)
        log(f"{build_dir} was configured with a cmake or ninja that is gone: starting it afresh")
        shutil.rmtree(build_dir)
    run([_cmake(), "-S", str(src), "-B", str(build_dir)] + args)
    run([_cmake(), "--build", str(build_dir), "--config", "Release", "-j", str(jobs)])
    if stage.exists():
        shutil.rmtree(stage)
    run([_cmake(), "--install", str(build_dir), "--prefix", str(stage)])
    log(f"ggml built in {time.monotonic() - t0:.0f} s")
    return stage


def _cached_tools(cache_text: str) -> list[str]:
    """The cmake and make program a CMakeCache.txt names (CMAKE_COMMAND, CMAKE_MAKE_PROGRAM)."""
    return re.findall(r"^(?:CMAKE_COMMAND|CMAKE_MAKE_PROGRAM):[A-Z]+=(.+)$", cache_text, flags=re.M)


def modules(build_dir: Path) -> list[Path]:
    """The backend modules of a ``GGML_BACKEND_DL`` build (``bin/libggml-*.so``; CMake does not
    install them)."""
    return sorted(p for p in (build_dir / "bin").glob("libggml-*.so") if not p.is_symlink())


def headers_for(backends: list[str]) -> list[str]:
    """:data:`~pyggml_build.pins.HEADERS` plus the headers of ``backends`` (paths in the ggml
    tree, in that order)."""
    return HEADERS + [BACKEND_HEADERS[b] for b in backends
                      if b in BACKEND_HEADERS and BACKEND_HEADERS[b] not in HEADERS]


def copy_outputs(src: Path, stage: Path, build_dir: Path, config: Config, pkg_dir: Path) -> list[Path]:
    """Copy the shared libraries, the backend modules and the headers into the package."""
    lib_dir, inc_dir = pkg_dir / "lib", pkg_dir / "include"
    for d in (lib_dir, inc_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    out = []
    libs = [f for f in sorted((stage / "lib").glob("*.so*")) if not f.is_symlink()]
    if config.dl:
        libs += modules(build_dir)
    for f in libs:
        out.append(Path(shutil.copy2(f, lib_dir / f.name)))
    if not out:
        raise BuildError(f"no shared libraries were installed into {stage / 'lib'}")
    if config.dl:
        for name in config.backends:
            if not any(p.name == f"libggml-{name}.so" or p.name.startswith(f"libggml-{name}-") for p in out):
                raise BuildError(f"the {name} backend module (libggml-{name}*.so) was not built")
    for h in headers_for(config.backends) + INTERNAL_HEADERS:
        out.append(Path(shutil.copy2(src / h, inc_dir / Path(h).name)))
    out += write_licenses(src, pkg_dir / "licenses")
    for f in out:
        log(f"  {f.relative_to(pkg_dir.parent)}")
    return out


#: sources compiled into the libraries that carry a copyright notice of their own (MIT, which
#: asks for the notice in every copy): their leading comment is shipped in NOTICES
NOTICE_SOURCES = ["src/ggml-cpu/llamafile/sgemm.cpp"]


def write_licenses(src: Path, dest: Path) -> list[Path]:
    """ggml's LICENSE (MIT, the ggml authors) as ``dest/ggml-LICENSE``, and ``dest/NOTICES``:
    the notices of :data:`NOTICE_SOURCES`, each file's leading comment as it stands."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if not (src / "LICENSE").is_file():
        raise BuildError(f"{src} has no LICENSE file: the package must ship ggml's license "
                         "(add it to the pin's extras)")
    out = [Path(shutil.copy2(src / "LICENSE", dest / "ggml-LICENSE"))]
    notices = []
    for rel in NOTICE_SOURCES:
        f = src / rel
        if f.is_file():
            head = []
            for line in f.read_text(encoding="utf-8").splitlines():
                if not line.startswith("//"):
                    break
                head.append(line[2:].removeprefix(" "))
            notices.append(f"{rel} (compiled into libggml-cpu):\n\n" + "\n".join(head).strip() + "\n")
    (dest / "NOTICES").write_text("Notices of third-party code in ggml's libraries\n\n" + "\n\n".join(notices))
    out.append(dest / "NOTICES")
    return out


def _portable(text: str) -> str:
    """``text`` (a path or ``-DKEY=value``) without the building machine's absolute paths, which
    mean nothing where the package is installed (pip's temporary build environment...): a path
    inside the source tree is given relative to it, any other as ``.../<its last part>``."""
    key, sep, value = text.rpartition("=") if text.startswith("-D") else ("", "", text)
    if not value.startswith("/"):
        return text
    p = Path(value)
    try:
        value = str(p.relative_to(ROOT))
    except ValueError:
        value = f".../{p.name}"
    return f"{key}{sep}{value}"


def write_build_info(pkg_dir: Path, src: Path, pin: Pin, config: Config, args: list[str],
                     libs: list[Path], seconds: float) -> Path:
    """Record what was built in ``pyggml/_build_info.json``, read once by the package's loader
    (``python -m pyggml info``, the backend-module loader, the header audit)."""
    info = {
        "ggml_version": pin.version,
        "source": _portable(str(src)),
        "archive": pin.archive.filename,
        **config.as_dict(),
        "headers": [Path(h).name for h in headers_for(config.backends)],
        "backend_headers": {b: Path(h).name for b, h in BACKEND_HEADERS.items() if b in config.backends},
        "undefined_functions": pin.undefined_functions,
        "cmake_args": [_portable(a) for a in args],
        "libraries": sorted(p.name for p in libs if p.suffix == ".so"),
        "build_seconds": round(seconds),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = pkg_dir / "_build_info.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path
