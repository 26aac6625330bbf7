"""extern "Python" callbacks: error values for every callback type, and real use by ggml."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import callbacks, ffi, lib
from pyggml.raw import log


class Boom(Exception):
    pass


class Owner:
    """Any vtable owner: every slot raises."""

    def __getattr__(self, name):
        def slot(*args):
            raise Boom(name)
        return slot


def _dummy_args(spec, owner_handle, payload):
    """C arguments for calling the trampoline of ``spec`` directly: zeros and NULLs, plus the
    payload/owner that routes the call to Python."""
    args = []
    keep = []
    for i, t in enumerate(ffi.typeof(getattr(lib, spec.name)).args):
        if spec.kind == "slot" and i == spec.index:
            obj = ffi.new(t.cname.replace(" *", "[1]", 1) if t.kind == "pointer" else t)
            obj[0].context = owner_handle
            keep.append(obj)
            args.append(ffi.cast(t, obj))
        elif spec.kind == "userdata" and i == spec.index:
            args.append(payload)
        elif t.kind in ("pointer", "function"):
            args.append(ffi.NULL)
        else:
            args.append(0)
    return args, keep


def test_error_value_kinds():
    assert callbacks.SPECS["struct ggml_backend_i.graph_compute"].error == lib.GGML_STATUS_FAILED
    assert callbacks.SPECS["ggml_abort_callback"].error is True
    assert callbacks.SPECS["ggml_backend_sched_eval_callback"].error is False


@pytest.mark.parametrize("ctype", sorted(callbacks.SPECS))
def test_exception_becomes_the_error_value(ctype):
    spec = callbacks.SPECS[ctype]
    owner = Owner()
    owner_handle = ffi.new_handle(owner)
    cb = None
    if spec.kind == "userdata":
        cb = callbacks.Callback(ctype, lambda *a: (_ for _ in ()).throw(Boom(ctype)))
    elif spec.kind == "global":
        callbacks.set_global(ctype, lambda *a: (_ for _ in ()).throw(Boom(ctype)))
    args, _keep = _dummy_args(spec, owner_handle, cb.user_data if cb else None)
    result = "not called"
    try:
        with pytest.raises(Boom), callbacks.calling():  # the call boundary re-raises it
            result = getattr(lib, spec.name)(*args)
    finally:
        if spec.kind == "global":
            callbacks.set_global(ctype, None)
    rtype = ffi.typeof(getattr(lib, spec.name)).result
    if rtype.cname == "enum ggml_status":
        assert result == lib.GGML_STATUS_FAILED
    elif rtype.cname == "_Bool":
        assert result is (ctype == "ggml_abort_callback")
    elif rtype.kind == "pointer":
        assert result == ffi.NULL
    elif rtype.kind in ("primitive", "enum"):
        assert result == 0
    elif rtype.kind == "struct":
        assert bytes(ffi.buffer(ffi.new(rtype.cname + "*", result))) == bytes(ffi.sizeof(rtype))
    else:
        assert rtype.kind == "void" and result is None


def test_null_payload_is_an_error_not_a_crash():
    with pytest.raises(ValueError, match="NULL owner") as e, callbacks.calling():
        assert lib.pyggml_cb_ggml_backend_i__graph_compute(ffi.NULL, ffi.NULL) == lib.GGML_STATUS_FAILED
        assert lib.pyggml_cb_ggml_abort_callback(ffi.NULL) is True
    assert "1 more exception" in "".join(getattr(e.value, "__notes__", []))


def test_wrong_dispatch_kind_is_refused():
    with pytest.raises(TypeError):
        callbacks.Callback("ggml_abort_callback_t", print)
    with pytest.raises(TypeError):
        callbacks.set_global("ggml_log_callback", print)
    with pytest.raises(KeyError):
        callbacks.Callback("no_such_callback", print)


# --------------------------------------------------------------------------------------------
# real calls from ggml

@pytest.fixture
def cpu():
    backend = lib.ggml_backend_cpu_init()
    yield backend
    lib.ggml_backend_free(backend)


def _ctx(size=64 * 1024 * 1024):
    return lib.ggml_init({"mem_size": size, "mem_buffer": ffi.NULL, "no_alloc": False})


def _f32(ctx, arr):
    t = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, arr.size)
    ffi.memmove(t.data, ffi.from_buffer(arr.astype(np.float32)), arr.size * 4)
    return t


def _numpy(t, n):
    return np.frombuffer(ffi.buffer(t.data, n * 4), dtype=np.float32).copy()


def test_log_callback_receives_ggml_messages(tmp_path):
    seen = []
    cb = callbacks.Callback("ggml_log_callback",
                            lambda level, text, ud: seen.append((level, ffi.string(text).decode())))
    lib.ggml_log_set(cb.fn, cb.user_data)
    try:
        missing = str(tmp_path / "missing.gguf").encode()
        assert lib.gguf_init_from_file(missing, {"no_alloc": True, "ctx": ffi.NULL}) == ffi.NULL
    finally:
        log.install()  # give the log back to pyggml's logging bridge
    assert any(level == lib.GGML_LOG_LEVEL_ERROR and "missing.gguf" in text for level, text in seen)


def test_custom_op_runs_python_on_ggml_worker_threads():
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    calls = []

    def square(dst, a, ith, nth, userdata):
        calls.append((ith, nth))
        n = dst.ne[0]
        lo, hi = n * ith // nth, n * (ith + 1) // nth
        src = np.frombuffer(ffi.buffer(a.data, n * 4), dtype=np.float32)
        out = np.frombuffer(ffi.buffer(dst.data, n * 4), dtype=np.float32)
        out[lo:hi] = src[lo:hi] ** 2

    cb = callbacks.Callback("ggml_custom1_op_t", square)
    ctx = _ctx()
    try:
        a = _f32(ctx, x)
        y = lib.ggml_map_custom1(ctx, a, cb.fn, 4, cb.user_data)
        gf = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(gf, y)
        assert lib.ggml_graph_compute_with_ctx(ctx, gf, 2) == lib.GGML_STATUS_SUCCESS
        np.testing.assert_array_equal(_numpy(y, x.size), x ** 2)
    finally:
        lib.ggml_free(ctx)
    assert sorted(calls) == [(i, 2) for i in range(2)]


def test_abort_callback_stops_compute(cpu):
    cb = callbacks.Callback("ggml_abort_callback", lambda data: True)
    lib.ggml_backend_cpu_set_abort_callback(cpu, cb.fn, cb.user_data)
    ctx = _ctx()
    try:
        a = _f32(ctx, np.ones(16))
        gf = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(gf, lib.ggml_sqr(ctx, lib.ggml_add(ctx, a, a)))
        assert lib.ggml_backend_graph_compute(cpu, gf) == lib.GGML_STATUS_ABORTED
        # an abort callback that raises also stops the computation (error value: true)
        cb.func = lambda data: 1 / 0
        with pytest.raises(ZeroDivisionError), callbacks.calling():
            assert lib.ggml_backend_graph_compute(cpu, gf) == lib.GGML_STATUS_ABORTED
    finally:
        lib.ggml_backend_cpu_set_abort_callback(cpu, ffi.NULL, ffi.NULL)
        lib.ggml_free(ctx)


def test_sched_eval_callback_sees_every_node(cpu):
    seen = []

    def observe(t, ask, user_data):
        if not ask:
            seen.append(ffi.string(lib.ggml_op_name(t.op)).decode())
        return True

    cb = callbacks.Callback("ggml_backend_sched_eval_callback", observe)
    backends = ffi.new("ggml_backend_t[1]", [cpu])
    sched = lib.ggml_backend_sched_new(backends, ffi.NULL, 1, 64, False, False)
    ctx = lib.ggml_init({"mem_size": 1024 * 1024, "mem_buffer": ffi.NULL, "no_alloc": True})
    try:
        lib.ggml_backend_sched_set_eval_callback(sched, cb.fn, cb.user_data)
        a = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 8)
        lib.ggml_set_input(a)
        out = lib.ggml_sqr(ctx, lib.ggml_add(ctx, a, a))
        gf = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(gf, out)
        assert lib.ggml_backend_sched_alloc_graph(sched, gf)
        x = np.arange(8, dtype=np.float32)
        lib.ggml_backend_tensor_set(a, ffi.from_buffer(x), 0, x.nbytes)
        assert lib.ggml_backend_sched_graph_compute(sched, gf) == lib.GGML_STATUS_SUCCESS
        y = np.empty(8, dtype=np.float32)
        lib.ggml_backend_tensor_get(out, ffi.from_buffer(y), 0, y.nbytes)
        np.testing.assert_array_equal(y, (2 * x) ** 2)
        assert seen == ["ADD", "SQR"]
    finally:
        lib.ggml_free(ctx)
        lib.ggml_backend_sched_free(sched)
