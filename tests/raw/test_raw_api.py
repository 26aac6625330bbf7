"""The raw layer: C examples translate line by line; results checked against NumPy."""
from __future__ import annotations

import numpy as np

import pyggml
from pyggml import ffi, lib


def test_simple_ctx_translation():
    """upstream examples/simple/simple-ctx.cpp, line by line."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 2), dtype=np.float32)   # NumPy (rows, cols) = ggml ne [2, 4]
    B = rng.standard_normal((3, 2), dtype=np.float32)
    ctx = lib.ggml_init({"mem_size": 16 * 1024 * 1024, "mem_buffer": ffi.NULL, "no_alloc": False})
    try:
        a = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 2, 4)
        b = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 2, 3)
        ffi.memmove(a.data, ffi.from_buffer(A), A.nbytes)
        ffi.memmove(b.data, ffi.from_buffer(B), B.nbytes)
        result = lib.ggml_mul_mat(ctx, a, b)
        assert list(result.ne) == [4, 3, 1, 1]
        gf = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(gf, result)
        assert lib.ggml_graph_compute_with_ctx(ctx, gf, 1) == lib.GGML_STATUS_SUCCESS
        got = np.frombuffer(ffi.buffer(result.data, 48), np.float32).reshape(3, 4)
        np.testing.assert_allclose(got, B @ A.T, rtol=1e-6)
    finally:
        lib.ggml_free(ctx)


def test_backend_tensors_round_trip_through_a_cpu_buffer():
    """ggml_backend_alloc_ctx_tensors + tensor_set/get, as in simple-backend.cpp."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)   # ggml ne [4, 3, 2]
    backend = lib.ggml_backend_cpu_init()
    ctx = lib.ggml_init({"mem_size": 8 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead(),
                         "mem_buffer": ffi.NULL, "no_alloc": True})
    try:
        t = lib.ggml_new_tensor_3d(ctx, lib.GGML_TYPE_F32, 4, 3, 2)
        assert list(t.nb) == [4, 16, 48, 96]
        y = lib.ggml_scale(ctx, lib.ggml_sum_rows(ctx, t), 0.5)
        buf = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
        assert buf != ffi.NULL
        lib.ggml_backend_tensor_set(t, ffi.from_buffer(x), 0, x.nbytes)
        gf = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(gf, y)
        # y is not in the buffer yet: allocate the graph with a gallocr
        galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(backend))
        assert lib.ggml_gallocr_alloc_graph(galloc, gf)
        assert lib.ggml_backend_graph_compute(backend, gf) == lib.GGML_STATUS_SUCCESS
        out = np.empty((2, 3, 1), dtype=np.float32)
        lib.ggml_backend_tensor_get(y, ffi.from_buffer(out), 0, out.nbytes)
        np.testing.assert_array_equal(out, 0.5 * x.sum(axis=2, keepdims=True))
        lib.ggml_gallocr_free(galloc)
        lib.ggml_backend_buffer_free(buf)
    finally:
        lib.ggml_free(ctx)
        lib.ggml_backend_free(backend)


def test_constants_and_enums_have_their_c_names():
    assert lib.GGML_MAX_DIMS == 4 and lib.GGML_MAX_SRC == 10
    assert ffi.string(lib.GGUF_MAGIC) == b"GGUF"
    assert lib.GGML_TENSOR_SIZE == ffi.sizeof("struct ggml_tensor")
    # the vtables' version: 3 since ggml 0.26 (buffer types gained alloc_buffer_n, get_alloc_size_n)
    impl_h = (pyggml.INCLUDE_DIR / "ggml-backend-impl.h").read_text()
    assert f"#define GGML_BACKEND_API_VERSION {lib.GGML_BACKEND_API_VERSION}" in impl_h
    assert lib.GGML_BACKEND_API_VERSION == (3 if hasattr(lib, "ggml_backend_buft_alloc_buffer_n") else 2)
    assert lib.GGML_TYPE_COUNT == 43 and lib.GGML_OP_COUNT == 101
    assert len(ffi.typeof("struct ggml_tensor").fields) > 10
