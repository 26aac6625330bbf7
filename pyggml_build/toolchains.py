"""Step 2b, each backend's toolchain: find and check what CUDA and Vulkan need before CMake runs
(a 30-minute CUDA or 10-minute shader build should not be what finds a missing tool), and turn
a :class:`~pyggml_build.config.Config` into CMake arguments.

CUDA: ``nvcc`` (``$CUDACXX``, PATH, /usr/local/cuda), cuBLAS from the toolkit, an installed
``nvidia-cublas`` or the pinned wheel below; architectures ``native`` when a GPU is present, else
``90``. Vulkan: headers >= 1.3.261 with Vulkan-Hpp, ``glslc``, SPIRV-Headers and the loader
(``scripts/vulkan_sdk.sh`` installs them on Debian 12). BLAS: the CBLAS of the pinned
``scipy-openblas32`` wheel below (OpenBLAS, as NumPy and SciPy ship it), unless ``CMAKE_ARGS``
names a ``GGML_BLAS_VENDOR`` (then CMake's FindBLAS looks for that one on the system).
"""
from __future__ import annotations

import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from .common import BuildError, log
from .config import Config, cmake_bools, cmake_value
from .pins import BACKEND_HEADERS
from .source import fetch_pinned

__all__ = ["VULKAN_MIN_HEADER", "CUBLAS_WHEEL", "OPENBLAS_WHEEL", "DEFAULT_CUDA_ARCHITECTURES",
           "vulkan_header_version", "backend_args"]

VULKAN_MIN_HEADER = (1, 3, 261)  # ggml-vulkan uses VK_EXT_layer_settings
#: cuBLAS for CUDA 13.0 (nvcc 13.0): the pinned wheel, used when neither the toolkit nor an
#: installed ``nvidia-cublas`` provides it.
CUBLAS_WHEEL = ("nvidia-cublas", "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl",
                "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c")
DEFAULT_CUDA_ARCHITECTURES = "90"  # H100/H200, when no GPU is there to ask (else "native")
#: OpenBLAS for the BLAS backend, as NumPy and SciPy ship it (32-bit integers, the CBLAS ggml-blas
#: calls; every function named with the prefix ``scipy_``); its library is found at run time in
#: the installed ``scipy-openblas32`` (pyggml's ``blas`` extra), else in the build's cache.
OPENBLAS_WHEEL = ("scipy-openblas32",
                  "scipy_openblas32-0.3.34.481.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
                  "0595f94cd58c1f8a0d90c975621f4587337a003916b1979e834ebdf2cb5d9504")


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
    wheel = fetch_pinned(project, filename, sha, cache_dir)
    root = cache_dir / filename.removesuffix(".whl")
    if not (root / "nvidia" / "cu13" / "include" / "cublas_v2.h").is_file():
        log(f"unpacking {filename} into {root}")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("nvidia/")])
    root = root / "nvidia" / "cu13"
    return root / "include", root / "lib"


def _cuda_args(cache_dir: Path, user_args: list[str]) -> tuple[list[str], list[str]]:
    """(CMake arguments, extra rpath entries) for ``GGML_CUDA``."""
    nvcc, toolkit = _find_cuda_toolkit()
    log(f"CUDA toolkit: {toolkit} (nvcc: {nvcc})")
    # CUDA graphs (captured once, replayed while a graph is unchanged): ggml leaves them off
    # unless the project is llama.cpp, which turns them on (GGML_CUDA_GRAPHS_DEFAULT); without
    # them every decode step launches each kernel again. GGML_CUDA_DISABLE_GRAPHS=1 turns them off
    # at run time.
    args = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}"]
    if "GGML_CUDA_GRAPHS" not in cmake_bools(user_args):
        args.append("-DGGML_CUDA_GRAPHS=ON")
    rpath = [str(toolkit / d) for d in ("lib64", "targets/x86_64-linux/lib") if (toolkit / d).is_dir()]
    arch = os.environ.get("PYGGML_CUDA_ARCHITECTURES") or cmake_value(user_args, "CMAKE_CUDA_ARCHITECTURES")
    if not arch and _gpus_present():
        arch = "native"
        log("CUDA architectures: native (the GPUs of this machine); set PYGGML_CUDA_ARCHITECTURES, "
            "e.g. '80;86;89;90', to build for others")
    elif not arch:
        arch = DEFAULT_CUDA_ARCHITECTURES
        log(f"CUDA architectures: {arch} (H100/H200; no GPU here to ask); set "
            f"PYGGML_CUDA_ARCHITECTURES, e.g. 'native' or '80;86;89;90', for other GPUs")
    args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    stub = list(toolkit.glob("**/stubs/libcuda.so"))
    if ctypes.util.find_library("cuda") is None and not stub and "GGML_CUDA_NO_VMM" not in cmake_bools(user_args):
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


def _blas_args(cache_dir: Path, user_args: list[str]) -> tuple[list[str], list[str]]:
    """(CMake arguments, extra rpath entries) for ``GGML_BLAS``: the pinned ``scipy-openblas32``
    wheel, unpacked into the cache, handed to ggml's CMake through a FindBLAS module of its own
    (CMake's would look for ``sgemm_``, which this library names ``scipy_sgemm_``) and a
    ``cblas.h`` that includes the wheel's and maps the names ggml-blas calls (``cblas_sgemm``,
    ``openblas_set_num_threads``...) to the prefixed ones, generated from the wheel's header.
    With ``GGML_BLAS_VENDOR`` in ``CMAKE_ARGS``: CMake's own search for that vendor."""
    if cmake_value(user_args, "GGML_BLAS_VENDOR"):
        log("BLAS: GGML_BLAS_VENDOR from CMAKE_ARGS (CMake's FindBLAS searches the system)")
        return ["-DGGML_BLAS=ON"], []
    project, filename, sha = OPENBLAS_WHEEL
    wheel = fetch_pinned(project, filename, sha, cache_dir)
    root = cache_dir / filename.removesuffix(".whl")
    pkg = root / "scipy_openblas32"
    if not (pkg / "include" / "cblas.h").is_file():
        log(f"unpacking {filename} into {root}")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("scipy_openblas32/")])
    header = pkg / "include" / "cblas.h"
    library = pkg / "lib" / "libscipy_openblas.so"
    names = sorted(set(re.findall(r"\bscipy_(\w+)\s*\(", header.read_text())))
    if "cblas_sgemm" not in names or not library.is_file():
        raise BuildError(f"{root} does not hold the CBLAS ggml-blas needs (scipy_cblas_sgemm, "
                         f"{library.name}): delete it and build again")
    shim = root / "pyggml-shim"
    shim.mkdir(exist_ok=True)
    (shim / "cblas.h").write_text(
        "/* generated by pyggml's build: scipy-openblas32 names its CBLAS scipy_cblas_*, ggml-blas\n"
        "   calls cblas_*; map each name the wheel's header declares */\n"
        "#ifndef PYGGML_SCIPY_OPENBLAS_SHIM\n#define PYGGML_SCIPY_OPENBLAS_SHIM\n"
        f'#include "{header}"\n'
        + "".join(f"#define {n} scipy_{n}\n" for n in names) + "#endif\n")
    (shim / "FindBLAS.cmake").write_text(
        "# generated by pyggml's build: the pinned scipy-openblas32 (CMake's FindBLAS would look for\n"
        "# an unprefixed sgemm_)\n"
        "set(BLAS_FOUND TRUE)\n"
        f'set(BLAS_LIBRARIES "{library}")\n'
        f'set(BLAS_INCLUDE_DIRS "{shim};{header.parent}")\n'
        "set(BLAS_LINKER_FLAGS \"\")\n")
    log(f"BLAS: OpenBLAS of {filename}")
    return (["-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS", f"-DCMAKE_MODULE_PATH={shim}"],
            # at run time: an installed scipy-openblas32 next to pyggml, then the build's copy
            ["$ORIGIN/../../scipy_openblas32/lib", str(library.parent)])


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
        elif name == "blas":
            a, r = _blas_args(cache_dir, config.user_args)
            args += a
            rpath += r
        elif name != "cpu":
            args.append(f"-DGGML_{name.upper()}=ON")
    return args, rpath
