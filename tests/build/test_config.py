"""pyggml_build.config and cmake: which backends, and the CMake arguments that build them."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyggml_build import BuildError, cmake
from pyggml_build.config import resolve_config
from pyggml_build.toolchains import backend_args


def test_cmake_args_from_the_environment_come_last(monkeypatch):
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    config = resolve_config("")
    backend, rpath = backend_args(config, Path("/nonexistent"))
    args = cmake.cmake_args(config, backend, rpath, ["-DX=1"])
    assert args.index("-DGGML_NATIVE=ON") < args.index("-DGGML_NATIVE=OFF")
    assert args[-3:] == ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DX=1"]


@pytest.mark.parametrize("backends, cmake_args, expected, dl, cpu", [
    ("", "", ["cpu"], False, "native"),
    ("cpu", "-DGGML_AVX512=OFF", ["cpu"], False, "native"),
    ("cpu,vulkan,rpc", "", ["cpu", "rpc", "vulkan"], True, "x86-64-v3"),
    ("", "-DGGML_CUDA=on", ["cpu", "cuda"], True, "x86-64-v3"),      # llama-cpp-python style
    ("rpc", "-DGGML_CUDA:BOOL=ON", ["cpu", "cuda", "rpc"], True, "x86-64-v3"),
    ("cpu-all-variants", "", ["cpu"], True, "all-variants"),
    ("", "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON", ["cpu"], True, "all-variants"),
    (" Vulkan , ", "", ["cpu", "vulkan"], True, "x86-64-v3"),
])
def test_backend_selection(backends, cmake_args, expected, dl, cpu):
    config = resolve_config(backends, cmake_args)
    assert (config.backends, config.dl, config.cpu) == (expected, dl, cpu)


@pytest.mark.parametrize("backends, cmake_args, message", [
    ("cuda", "-DGGML_NATIVE=ON", "GGML_NATIVE=ON, which ggml refuses together with GGML_BACKEND_DL"),
    ("vulkan", "-DGGML_VULKAN=OFF", "asks for vulkan but CMAKE_ARGS has -DGGML_VULKAN=OFF"),
    ("cpu,tpu", "", "unknown backend 'tpu'"),
    ("rpc", "-DGGML_BACKEND_DL=OFF", "need it"),
    ("", "-DGGML_CPU=OFF", "GGML_CPU=OFF is not supported"),
])
def test_contradictory_requests_are_refused_before_cmake(backends, cmake_args, message):
    with pytest.raises(BuildError, match=message):
        resolve_config(backends, cmake_args)


def test_build_folders_differ_per_backend_set():
    tags = {resolve_config(b, "").tag for b in ("", "cpu,rpc", "rpc", "cpu-all-variants", "cuda,rpc")}
    assert tags == {"", "-cpu-rpc", "-cpu-all-variants", "-cpu-cuda-rpc"}


def test_headers_are_the_pinned_list_plus_each_backends():
    assert cmake.headers_for(["cpu"])[-1] == "src/ggml-backend-impl.h"
    assert cmake.headers_for(["cpu", "rpc", "vulkan"])[-2:] == ["include/ggml-rpc.h", "include/ggml-vulkan.h"]
