#!/usr/bin/env python3
"""Build upstream ggml (pinned to v0.20.2) and the pyggml cffi extension.

    python build_ggml.py                 # build in place, for development (CPU, tuned for this machine)
    python build_ggml.py --ggml-src DIR  # use your own ggml checkout (must be v0.20.2)
    PYGGML_BACKENDS=cpu,vulkan,rpc python build_ggml.py   # more backends, each a loadable module
    CMAKE_ARGS="-DGGML_CUDA=on" python build_ggml.py       # the same, llama-cpp-python style

``pip install .`` runs the same steps through ``setup.py``.

Steps, each printed as it runs:

1. **Source.** ``--ggml-src DIR`` or ``$PYGGML_GGML_SRC``; otherwise ``vendor/ggml/``, filled from the
   PyPI source distribution ``libggml-python==0.20.2.post1`` (its ``ggml/`` folder is the upstream
   tree). The download is checked against a pinned sha256; a mismatch is a hard error.
2. **Backends.** ``$PYGGML_BACKENDS`` (comma-separated: ``cpu``, ``cpu-all-variants``, ``cuda``,
   ``vulkan``, ``rpc``, ``blas``; default ``cpu``) together with the ``-DGGML_<NAME>=ON|OFF`` found
   in ``$CMAKE_ARGS`` (a contradiction between the two is an error). ``cpu`` alone builds the CPU
   backend into ``libggml-cpu.so``, tuned for this machine (``GGML_NATIVE``). Anything more builds
   with ``GGML_BACKEND_DL``: every backend is a module (``libggml-cuda.so``, ``libggml-vulkan.so``,
   ``libggml-rpc.so``, ``libggml-cpu*.so``) that pyggml loads at import, and a module that cannot
   load (no driver, no GPU) is reported by ``python -m pyggml info``, not fatal. ``GGML_NATIVE``
   cannot be combined with modules: the CPU module is then built for x86-64-v3 (AVX2, FMA, F16C),
   or, with ``cpu-all-variants``, as ggml's 14 x86 variants of which the best is chosen at run time
   (for portable wheels). Each requested backend's prerequisites are checked before CMake runs:
   for CUDA ``nvcc`` and cuBLAS (taken from the toolkit, the installed ``nvidia-cublas`` package,
   or the pinned ``nvidia-cublas`` wheel); for Vulkan ``glslc``, SPIRV-Headers and Vulkan headers
   >= 1.3.261 (``scripts/vulkan_sdk.sh`` installs them on Debian 12).
3. **CMake.** Shared libraries, Release, one build folder per backend set (``build/ggml`` for the
   default, e.g. ``build/ggml-cpu-vulkan`` otherwise). ``$CMAKE_ARGS`` is appended, so it can
   override any of these. The libraries are installed with an ``$ORIGIN`` rpath and without
   versioned sonames: one file each, in ``pyggml/lib/``.
4. **Declarations.** The pinned headers (and the internal ``src/ggml-backend-impl.h``, and the
   header of each extra backend: ``ggml-cuda.h``, ``ggml-vulkan.h``, ``ggml-rpc.h``...) are copied
   to ``pyggml/include/``, preprocessed, and compiled by cffi in API (out-of-line) mode into
   ``pyggml/_ggml*.so`` (see ``pyggml/_ffi_build.py``).

Environment: ``PYGGML_BACKENDS``, ``CMAKE_ARGS``, ``PYGGML_GGML_SRC``, ``PYGGML_CACHE_DIR`` (default
``~/.cache/pyggml``), ``PYGGML_CUDA_ARCHITECTURES`` (default ``native`` with a GPU, else ``90``), ``CUDACXX`` (nvcc),
``PYGGML_VULKAN_PREFIX`` or ``VULKAN_SDK`` (where the Vulkan headers are), ``PIP_INDEX_URL``.
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


def _fetch_pinned(project: str, filename: str, sha256: str, cache_dir: Path) -> Path:
    """Return the path of ``filename`` from ``project`` on the package index, downloading it into
    ``cache_dir`` if needed. The file is verified against ``sha256`` whether it came from the cache
    or the network; a mismatch deletes it and raises BuildError."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / filename
    if not path.exists():
        url = f"{_index_url()}/{project}/"
        log(f"looking up {filename} at {url}")
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == filename), None)
        if entry is None:
            raise BuildError(f"{filename} is not listed at {url}")
        log(f"downloading {entry['url']}")
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(entry["url"], timeout=600) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        tmp.replace(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    if digest != sha256:
        path.unlink()
        raise BuildError(
            f"sha256 mismatch for {filename}: expected {sha256}, got {digest}. "
            f"The file was deleted; refusing to build from unverified files.")
    log(f"{filename}: sha256 OK")
    return path


def download_sdist(cache_dir: Path) -> Path:
    """Return the path of the pinned ggml sdist (see :func:`_fetch_pinned`)."""
    return _fetch_pinned(SDIST_PROJECT, SDIST_FILENAME, SDIST_SHA256, cache_dir)


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
# 2. backends
# --------------------------------------------------------------------------------------------

#: ``$PYGGML_BACKENDS`` tokens pyggml builds and binds, with the header of each (if any).
BACKEND_HEADERS = {"cpu": "include/ggml-cpu.h", "cuda": "include/ggml-cuda.h",
                   "vulkan": "include/ggml-vulkan.h", "rpc": "include/ggml-rpc.h",
                   "blas": "include/ggml-blas.h"}
#: other ggml backends: accepted from ``CMAKE_ARGS`` (``-DGGML_HIP=ON``...) and built as modules,
#: but pyggml neither checks their prerequisites nor binds their headers.
OTHER_BACKENDS = ["cann", "hip", "metal", "musa", "opencl", "sycl", "webgpu", "zdnn", "zendnn",
                  "openvino", "virtgpu", "hexagon"]
VULKAN_MIN_HEADER = (1, 3, 261)  # ggml-vulkan uses VK_EXT_layer_settings
#: cuBLAS for CUDA 13.0 (nvcc 13.0): the pinned wheel, used when neither the toolkit nor an
#: installed ``nvidia-cublas`` provides it.
CUBLAS_WHEEL = ("nvidia-cublas", "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl",
                "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c")
DEFAULT_CUDA_ARCHITECTURES = "90"  # H100/H200, when no GPU is there to ask (else "native")

_TRUE, _FALSE = {"1", "on", "yes", "true", "y"}, {"0", "off", "no", "false", "n", ""}


def _cmake_bools(args: list[str]) -> dict[str, bool]:
    """``-DGGML_X=ON`` / ``-DGGML_X:BOOL=OFF`` in ``args``: {"GGML_X": True/False} (last one wins)."""
    out = {}
    for a in args:
        m = re.fullmatch(r"-D(GGML_[A-Z0-9_]+)(?::BOOL)?=(.*)", a.strip())
        if m and m.group(2).lower() in _TRUE | _FALSE:
            out[m.group(1)] = m.group(2).lower() in _TRUE
    return out


def _cmake_value(args: list[str], name: str) -> str | None:
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
    flags = _cmake_bools(user_args)
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


def _find_cuda_toolkit() -> tuple[Path, Path]:
    """(nvcc, toolkit root). The root is what nvcc itself reports (``#$ TOP=`` of ``-dryrun``):
    nvcc on PATH may be a wrapper script outside the toolkit."""
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    if not nvcc:
        raise BuildError("CUDA was requested but nvcc was not found: install the CUDA toolkit "
                         "(12.x or 13.x) and put nvcc on PATH, or set CUDACXX")
    try:
        out = subprocess.run([nvcc, "-dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"CUDA was requested but {nvcc} does not run: {e}") from None
    top = re.search(r"^#\$ TOP=(.*)$", out, flags=re.M)
    root = Path(top.group(1)).resolve() if top else Path(nvcc).resolve().parent.parent
    return Path(nvcc), root


def _gpus_present() -> bool:
    """True if ``nvidia-smi -L`` lists a GPU (then CMake can ask for 'native' architectures)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def _find_cublas(toolkit: Path, cache_dir: Path) -> tuple[Path, Path] | None:
    """(include dir, lib dir) of cuBLAS when it is not in the toolkit; None when it is."""
    if any(list((toolkit / d).glob("libcublas.so*")) for d in ("lib64", "lib", "targets/x86_64-linux/lib")):
        return None
    for entry in sys.path:  # an installed nvidia-cublas (pip install nvidia-cublas)
        root = Path(entry or ".") / "nvidia" / "cu13"
        if (root / "include" / "cublas_v2.h").is_file() and list((root / "lib").glob("libcublas.so*")):
            log(f"cuBLAS from the installed nvidia-cublas package: {root}")
            return root / "include", root / "lib"
    project, filename, sha = CUBLAS_WHEEL
    wheel = _fetch_pinned(project, filename, sha, cache_dir)
    root = cache_dir / filename.removesuffix(".whl")
    if not (root / "nvidia" / "cu13" / "include" / "cublas_v2.h").is_file():
        import zipfile
        log(f"unpacking {filename} into {root}")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("nvidia/")])
    root = root / "nvidia" / "cu13"
    return root / "include", root / "lib"


def _cuda_args(cache_dir: Path, user_args: list[str]) -> tuple[list[str], list[str]]:
    """(CMake arguments, extra rpath entries) for ``GGML_CUDA``."""
    nvcc, toolkit = _find_cuda_toolkit()
    log(f"CUDA toolkit: {toolkit} (nvcc: {nvcc})")
    args = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}"]
    rpath = [str(toolkit / d) for d in ("lib64", "targets/x86_64-linux/lib") if (toolkit / d).is_dir()]
    arch = os.environ.get("PYGGML_CUDA_ARCHITECTURES") or _cmake_value(user_args, "CMAKE_CUDA_ARCHITECTURES")
    if not arch and _gpus_present():
        arch = "native"
        log("CUDA architectures: native (the GPUs of this machine); set PYGGML_CUDA_ARCHITECTURES, "
            "e.g. '80;86;89;90', to build for others")
    elif not arch:
        arch = DEFAULT_CUDA_ARCHITECTURES
        log(f"CUDA architectures: {arch} (H100/H200; no GPU here to ask); set "
            f"PYGGML_CUDA_ARCHITECTURES, e.g. 'native' or '80;86;89;90', for other GPUs")
    args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    import ctypes.util
    stub = list(toolkit.glob("**/stubs/libcuda.so"))
    if ctypes.util.find_library("cuda") is None and not stub and "GGML_CUDA_NO_VMM" not in _cmake_bools(user_args):
        log("no libcuda (driver) and no stub to link against: building with GGML_CUDA_NO_VMM=ON "
            "(ggml-cuda then uses the runtime API only, without virtual memory management)")
        args.append("-DGGML_CUDA_NO_VMM=ON")
    cublas = _find_cublas(toolkit, cache_dir)
    if cublas:
        inc, libdir = cublas
        args += [f"-DCUDA_cublas_LIBRARY={next(libdir.glob('libcublas.so*'))}",
                 f"-DCUDA_cublasLt_LIBRARY={next(libdir.glob('libcublasLt.so*'))}",
                 f"-DCMAKE_CUDA_FLAGS=-I{inc}"]
        # at run time: the build's copy, then an installed nvidia-cublas next to pyggml
        rpath += [str(libdir)]
    rpath.append("$ORIGIN/../../nvidia/cu13/lib")
    return args, rpath


def vulkan_header_version(include_dir: Path) -> tuple[int, int, int] | None:
    """``VK_HEADER_VERSION_COMPLETE`` of ``include_dir/vulkan/vulkan_core.h`` as (1, 3, 239)."""
    core = include_dir / "vulkan" / "vulkan_core.h"
    if not core.is_file():
        return None
    text = core.read_text(errors="replace")
    patch = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    complete = re.search(r"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\s*\d+,\s*(\d+),\s*(\d+),", text)
    if not (patch and complete):
        return None
    return int(complete.group(1)), int(complete.group(2)), int(patch.group(1))


def _vulkan_args(cache_dir: Path) -> list[str]:
    """CMake arguments for ``GGML_VULKAN``, after checking every prerequisite (a 10-minute shader
    compile should not be what finds a missing tool). Looks in ``$PYGGML_VULKAN_PREFIX``,
    ``$VULKAN_SDK``, the prefix ``scripts/vulkan_sdk.sh`` fills, then the system."""
    fix = ("On Debian 12, scripts/vulkan_sdk.sh installs all of them (Vulkan headers from "
           "Debian 13 into a private prefix); elsewhere install the LunarG Vulkan SDK and set "
           "VULKAN_SDK.")
    sdk = Path(os.environ["VULKAN_SDK"]) if os.environ.get("VULKAN_SDK") else None
    prefixes = [Path(os.environ[e]) for e in ("PYGGML_VULKAN_PREFIX", "VULKAN_SDK") if os.environ.get(e)]
    candidates = [p / sub for p in prefixes for sub in ("include", "usr/include")]
    candidates += [cache_dir / "vulkan-headers" / "usr" / "include", Path("/usr/include")]
    problems, args = [], ["-DGGML_VULKAN=ON"]

    found = [(c, vulkan_header_version(c)) for c in candidates]
    good = [(c, v) for c, v in found if v and v >= VULKAN_MIN_HEADER]
    if good:
        inc, ver = good[0]
        log(f"Vulkan headers {'.'.join(map(str, ver))} in {inc}")
        args.append(f"-DVulkan_INCLUDE_DIR={inc}")
        if not (inc / "vulkan" / "vulkan.hpp").is_file():
            problems.append(f"{inc} has no vulkan/vulkan.hpp (Vulkan-Hpp)")
    else:
        seen = ", ".join(f"{'.'.join(map(str, v))} in {c}" for c, v in found if v) or "none"
        problems.append(f"Vulkan headers >= {'.'.join(map(str, VULKAN_MIN_HEADER))} (found: {seen})")

    glslc = shutil.which("glslc") or (sdk and shutil.which("glslc", path=str(sdk / "bin")))
    if glslc:
        args.append(f"-DVulkan_GLSLC_EXECUTABLE={glslc}")
    else:
        problems.append("glslc (the GLSL to SPIR-V compiler; Debian package glslc)")

    spirv_dirs = ([sdk / "include"] if sdk else []) + [Path("/usr/include"), Path("/usr/local/include")]
    if not any((d / "spirv" / "unified1" / "spirv.hpp").is_file() for d in spirv_dirs):
        problems.append("SPIRV-Headers (spirv/unified1/spirv.hpp; Debian package spirv-headers)")

    if not (sdk and list((sdk / "lib").glob("libvulkan.so*"))):  # FindVulkan looks in the SDK itself
        loaders = [Path(d) / "libvulkan.so.1" for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")]
        loaders = [p for p in loaders if p.exists()]
        if loaders:
            args.append(f"-DVulkan_LIBRARY={loaders[0]}")
        else:
            problems.append("the Vulkan loader libvulkan.so.1 (Debian package libvulkan1)")
    if problems:
        raise BuildError("Vulkan was requested but these are missing:\n  - " + "\n  - ".join(problems)
                         + "\n" + fix)
    return args


def backend_args(config: Config, cache_dir: Path) -> tuple[list[str], list[str]]:
    """(CMake arguments, extra rpath entries) selecting ``config``'s backends. Every backend
    pyggml knows is switched ON or OFF explicitly, so a reused build folder cannot keep one."""
    args, rpath = [f"-DGGML_BACKEND_DL={'ON' if config.dl else 'OFF'}",
                   f"-DGGML_NATIVE={'ON' if config.cpu == 'native' else 'OFF'}",
                   f"-DGGML_CPU_ALL_VARIANTS={'ON' if config.cpu == 'all-variants' else 'OFF'}"], []
    for name in list(BACKEND_HEADERS)[1:]:
        if name not in config.backends:
            args.append(f"-DGGML_{name.upper()}=OFF")
    for name in config.backends:
        if name == "cuda":
            a, r = _cuda_args(cache_dir, config.user_args)
            args += a
            rpath += r
        elif name == "vulkan":
            args += _vulkan_args(cache_dir)
        elif name != "cpu":
            args.append(f"-DGGML_{name.upper()}=ON")
    return args, rpath


# --------------------------------------------------------------------------------------------
# 3. CMake
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
    _run([_cmake(), "-S", str(src), "-B", str(build_dir)] + args)
    _run([_cmake(), "--build", str(build_dir), "--config", "Release", "-j", str(jobs)])
    if stage.exists():
        shutil.rmtree(stage)
    _run([_cmake(), "--install", str(build_dir), "--prefix", str(stage)])
    log(f"ggml built in {time.monotonic() - t0:.0f} s")
    return stage


def modules(build_dir: Path) -> list[Path]:
    """The backend modules of a ``GGML_BACKEND_DL`` build (``bin/libggml-*.so``; CMake does not
    install them)."""
    return sorted(p for p in (build_dir / "bin").glob("libggml-*.so") if not p.is_symlink())


def write_build_info(pkg_dir: Path, src: Path, config: Config, args: list[str], libs: list[Path],
                     seconds: float) -> Path:
    """Record what was built (read by ``python -m pyggml info`` and by pyggml's loader)."""
    info = {
        "ggml_version": source_version(src),
        "source": str(src),
        **config.as_dict(),
        "cmake_args": args,
        "libraries": sorted(p.name for p in libs if p.suffix == ".so"),
        "build_seconds": round(seconds),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = pkg_dir / "_build_info.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


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
    headers = HEADERS + [BACKEND_HEADERS[b] for b in config.backends
                         if b in BACKEND_HEADERS and BACKEND_HEADERS[b] not in HEADERS]
    for h in headers:
        out.append(Path(shutil.copy2(src / h, inc_dir / Path(h).name)))
    for f in out:
        log(f"  {f.relative_to(pkg_dir.parent)}")
    return out


# --------------------------------------------------------------------------------------------
# 4. cffi extension
# --------------------------------------------------------------------------------------------

def load_ffi_build():
    """Import ``pyggml/_ffi_build.py`` by path (importing ``pyggml`` needs the built extension)."""
    path = ROOT / "pyggml" / "_ffi_build.py"
    spec = importlib.util.spec_from_file_location("pyggml_ffi_build", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def build_extension(pkg_dir: Path, tmp_dir: Path, config: Config) -> Path:
    t0 = time.monotonic()
    ffi_build = load_ffi_build()
    so = ffi_build.compile_extension(pkg_dir, tmp_dir, backends=config.backends, dl=config.dl)
    log(f"cffi extension {so.name} built in {time.monotonic() - t0:.0f} s")
    return so


# --------------------------------------------------------------------------------------------

def build(pkg_dir: Path = ROOT / "pyggml", *, ggml_src: str | None = None,
          build_dir: Path = ROOT / "build", jobs: int | None = None,
          cmake_extra: list[str] | None = None, config: Config | None = None) -> list[Path]:
    """Run every step; ``pkg_dir`` is the ``pyggml`` package folder that receives the outputs.
    ``config`` defaults to :func:`resolve_config` of the environment."""
    t0 = time.monotonic()
    config = config or resolve_config()
    log(f"backends: {', '.join(config.backends)}; CPU: {config.cpu}; "
        f"{'each backend a loadable module (GGML_BACKEND_DL)' if config.dl else 'linked into libggml'}")
    cache = Path(os.environ.get("PYGGML_CACHE_DIR", Path.home() / ".cache" / "pyggml"))
    backend, rpath = backend_args(config, cache)  # checks prerequisites before anything long
    src = resolve_source(ggml_src, cache)
    ggml_build = build_dir / f"ggml{config.tag}"
    args = cmake_args(config, backend, rpath, cmake_extra or [])
    stage = build_libraries(src, ggml_build, args, jobs or os.cpu_count() or 2)
    out = copy_outputs(src, stage, ggml_build, config, pkg_dir)
    out.append(write_build_info(pkg_dir, src, config, args, out, time.monotonic() - t0))
    out.append(build_extension(pkg_dir, build_dir / f"ffi{config.tag}", config))
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
