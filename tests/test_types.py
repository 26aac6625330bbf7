"""pyggml.types against independent references: NumPy casts and gguf-py 0.19.0's quants module
(``pip install gguf==0.19.0``), a pure-NumPy reimplementation of ggml's formats."""
from __future__ import annotations

import numpy as np
import pytest

from pyggml import lib
from pyggml import types as T
from pyggml.types import GGMLType

PLAIN = ["F32", "F16", "F64", "I8", "I16", "I32", "I64"]
QUANTIZED = [t.name for t in GGMLType if T.is_quantized(t)]


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf", reason="pip install gguf==0.19.0")


def _data(kind: str, rows: int, n: int, seed: int = 0) -> np.ndarray:
    """float32 test rows: varied block scales, rounding ties, all-zero and constant blocks."""
    rng = np.random.default_rng(seed)
    if kind == "randn":
        return (rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    if kind == "ties":  # integers and halves: every rounding rule is exercised
        return (rng.integers(-16, 17, (rows, n)) / 2).astype(np.float32)
    if kind == "zeros":
        return np.zeros((rows, n), np.float32)
    if kind == "const":
        return np.full((rows, n), -3.25, np.float32)
    raise ValueError(kind)


def _gguf_qtype(gguf, name: str):
    qt = getattr(gguf.GGMLQuantizationType, name, None)
    if qt is None:
        pytest.skip(f"gguf-py 0.19.0 has no {name}")
    return qt


# --- the enum and per-type facts ---------------------------------------------------------------

def test_enum_holds_every_live_ggml_type():
    names = [n for n in dir(lib) if n.startswith("GGML_TYPE_") and n != "GGML_TYPE_COUNT"]
    for n in names:
        v = getattr(lib, n)
        live = lib.ggml_get_type_traits(v).blck_size > 0
        assert (n[len("GGML_TYPE_"):] in GGMLType.__members__) == live, n
        if live:
            assert GGMLType[n[len("GGML_TYPE_"):]] == v
            assert T.type_name(v).lower() == n[len("GGML_TYPE_"):].lower()
    # the removed Q4_2/Q4_3 and repacked types are placeholders in ggml's table
    for v in (4, 5, 31, 32, 33, 36, 37, 38):
        with pytest.raises(ValueError):
            T.ggml_type(v)
    assert len(GGMLType) == lib.GGML_TYPE_COUNT - 8


def test_enum_and_block_sizes_match_gguf_py(gguf):
    sizes = gguf.constants.GGML_QUANT_SIZES
    differ = []
    for qt in gguf.GGMLQuantizationType:
        t = GGMLType[qt.name]
        assert int(t) == int(qt)
        if (T.block_size(t), T.type_size(t)) != sizes[qt]:
            differ.append((qt.name, T.type_size(t), sizes[qt][1]))
    # Q8_1 (activations only, never in files): ggml's block is fp16 d + fp16 s + 32 int8 = 36
    # bytes; gguf-py still has the old 2 x float32 layout, 40 bytes
    assert differ == [("Q8_1", 36, 40)]
    # ggml v0.20.2 is one type ahead of gguf-py 0.19.0
    assert {t.name for t in GGMLType} - {q.name for q in gguf.GGMLQuantizationType} == {"Q2_0"}


def test_type_facts():
    assert T.ggml_type("q4_k") is GGMLType.Q4_K is T.ggml_type(lib.GGML_TYPE_Q4_K)
    assert T.ggml_type(np.int32(8)) is GGMLType.Q8_0
    assert (T.block_size("Q4_0"), T.type_size("Q4_0"), T.row_size("Q4_0", 64)) == (32, 18, 36)
    assert T.row_size("Q4_K", 512) == lib.ggml_row_size(lib.GGML_TYPE_Q4_K, 512) == 288
    assert T.nbytes("F16", (3, 4, 5)) == 120
    assert T.is_quantized("Q8_0") and not T.is_quantized("BF16") and not T.is_quantized("F32")
    assert {n: T.numpy_dtype(n) for n in PLAIN + ["BF16"]} == {
        "F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
        "I32": np.int32, "I64": np.int64, "BF16": np.uint16}
    assert all(T.numpy_dtype(n) is None for n in QUANTIZED)
    assert [n for n in QUANTIZED if not T.can_dequantize(n)] == ["Q8_1", "Q8_K"]
    assert not any(T.can_quantize(n) for n in ["Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"])
    assert [t.name for t in GGMLType if T.requires_imatrix(t)] == ["IQ2_XXS", "IQ2_XS", "IQ1_S"]


@pytest.mark.parametrize("bad, exc", [(4, ValueError), (99, ValueError), (-1, ValueError),
                                      ("q4_2", ValueError), ("", ValueError), (1.0, TypeError),
                                      (True, TypeError), (None, TypeError)])
def test_unknown_types_raise(bad, exc):
    with pytest.raises(exc):
        T.ggml_type(bad)
    with pytest.raises(exc):
        T.to_float32(b"\0" * 4, bad)


def test_row_size_checks_before_ggml_asserts():
    with pytest.raises(ValueError, match="multiple of the block size"):
        T.row_size("Q4_0", 33)
    with pytest.raises(ValueError):
        T.row_size("F32", -1)
    with pytest.raises(ValueError, match="dimensions"):
        T.nbytes("F32", (1, 1, 1, 1, 1))


# --- plain types --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PLAIN)
def test_plain_round_trip(name):
    rng = np.random.default_rng(1)
    dt = T.numpy_dtype(name)
    if dt.kind == "f":
        arr = rng.standard_normal((2, 3, 8)).astype(dt)
    else:
        info = np.iinfo(dt)
        arr = rng.integers(info.min, info.max, (2, 3, 8), dtype=dt, endpoint=True)
    raw = T.from_numpy_bytes(arr, name)
    assert raw.dtype == np.uint8 and raw.tobytes() == arr.tobytes()
    back = T.to_numpy(raw, name, arr.shape[::-1])      # ne = NumPy shape reversed
    assert back.dtype == dt and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    np.testing.assert_array_equal(T.to_float32(raw, name), arr.reshape(-1).astype(np.float32))
    assert T.to_float32(bytes(raw), name, arr.size).shape == (arr.size,)


def test_from_numpy_bytes_refuses_lossy_kind_changes():
    np.testing.assert_array_equal(T.from_numpy_bytes(np.arange(4), "F32").view(np.float32), [0, 1, 2, 3])
    with pytest.raises(TypeError):
        T.from_numpy_bytes(np.ones(4, np.float32), "I32")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_f16_conversion_matches_numpy():
    edge = np.array([65504, 65519.99, 65520, 1e6, -1e6, 6e-8, 2.9e-8, 3e-8, 1e-45, -0.0, 0.1, 1 / 3,
                     np.inf, -np.inf, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11], np.float32)
    x = np.concatenate([edge, np.random.default_rng(2).standard_normal(4000).astype(np.float32)])
    raw = T.quantize(x, "F16")
    assert raw.tobytes() == x.astype(np.float16).tobytes()
    np.testing.assert_array_equal(T.to_float32(raw, "F16"), x.astype(np.float16).astype(np.float32))


def test_f32_quantize_is_a_copy():
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    assert T.quantize(x, "F32").tobytes() == x.tobytes()


def test_bf16_matches_gguf_py(gguf):
    qt = gguf.GGMLQuantizationType.BF16
    x = np.concatenate([np.array([np.inf, -np.inf, np.nan, 3.4e38, 1e-40, -0.0, 1 + 2.0 ** -8], np.float32),
                        _data("randn", 4, 256).reshape(-1)])
    raw = T.quantize(x, "BF16")
    assert raw.tobytes() == gguf.quants.quantize(x, qt).tobytes()
    np.testing.assert_array_equal(T.to_float32(raw, "BF16"), gguf.quants.dequantize(raw, qt), strict=False)
    assert T.numpy_dtype("BF16") == np.uint16
    assert T.to_numpy(raw, "BF16", (x.size,)).dtype == np.float32
    assert T.from_numpy_bytes(x, "BF16").tobytes() == raw.tobytes()


# --- quantized types against gguf-py ------------------------------------------------------------

#: the quantizers gguf-py 0.19.0 implements (gguf.quants.quantize)
GGUF_PY_QUANTIZERS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"]


@pytest.mark.parametrize("name", GGUF_PY_QUANTIZERS)
@pytest.mark.parametrize("kind", ["randn", "ties", "zeros", "const"])
def test_quantize_is_byte_identical_to_gguf_py(gguf, name, kind):
    qt = _gguf_qtype(gguf, name)
    x = _data(kind, 8, 512, seed=4)
    ref = gguf.quants.quantize(x, qt)
    mine = T.quantize(x, name)
    assert mine.shape == ref.shape == (8, T.row_size(name, 512))
    np.testing.assert_array_equal(mine, ref)
    # and gguf-py's bytes decode identically with ggml's to_float
    np.testing.assert_array_equal(T.to_float32(ref, name), gguf.quants.dequantize(ref, qt).reshape(-1))


@pytest.mark.parametrize("name", QUANTIZED)
def test_dequantize_ggml_quantized_data_like_gguf_py(gguf, name):
    qt = _gguf_qtype(gguf, name)
    if not T.can_quantize(name):
        pytest.skip(f"ggml cannot quantize to {name}")
    x = _data("randn", 4, 512, seed=5)
    imatrix = np.random.default_rng(6).uniform(0.1, 2, 512).astype(np.float32)
    raw = T.quantize(x, name, imatrix=imatrix if T.requires_imatrix(name) else None)
    try:
        ref = gguf.quants.dequantize(raw, qt)
    except NotImplementedError:
        pytest.skip(f"gguf-py 0.19.0 cannot dequantize {name}")
    mine = T.to_numpy(raw.reshape(-1), name, (512, 4))
    np.testing.assert_array_equal(mine, ref)
    # a quantization at all: closer to x than all zeros (ternary TQ*_0 get ~0.8)
    assert np.linalg.norm(mine - x) / np.linalg.norm(x) < 0.9


@pytest.mark.parametrize("name", [n for n in QUANTIZED + ["F16", "BF16"] if T.can_dequantize(n)])
def test_dequantize_random_bytes_like_gguf_py(gguf, name):
    """Random bytes reach every code, grid index and (NaN/inf) scale."""
    qt = _gguf_qtype(gguf, name)
    raw = np.random.default_rng(7).integers(0, 256, (16, T.row_size(name, 8 * T.block_size(name))), dtype=np.uint8)
    with np.errstate(all="ignore"):
        try:
            ref = gguf.quants.dequantize(raw, qt).reshape(-1)
        except NotImplementedError:
            pytest.skip(f"gguf-py 0.19.0 cannot dequantize {name}")
    np.testing.assert_array_equal(T.to_float32(raw, name), ref)


def test_quantize_rows_are_independent():
    x = _data("randn", 6, 256, seed=8)
    whole = T.quantize(x.reshape(2, 3, 256), "Q4_K")
    assert whole.shape == (2, 3, T.row_size("Q4_K", 256))
    rows = np.stack([T.quantize(r, "Q4_K") for r in x])
    np.testing.assert_array_equal(whole.reshape(6, -1), rows)


def test_imatrix_types():
    x = _data("randn", 2, 256, seed=9)
    with pytest.raises(ValueError, match="importance matrix"):
        T.quantize(x, "IQ2_XXS")
    with pytest.raises(ValueError, match="shape"):
        T.quantize(x, "IQ2_XXS", imatrix=np.ones(128, np.float32))
    with pytest.raises(ValueError, match=">= 0"):
        T.quantize(x, "Q4_K", imatrix=-np.ones(256, np.float32))
    with pytest.raises(ValueError, match="finite"):
        T.quantize(x, "Q4_K", imatrix=np.full(256, np.nan, np.float32))
    # an imatrix changes the result of types that use it
    w = np.linspace(0.01, 10, 256, dtype=np.float32)
    assert not np.array_equal(T.quantize(x, "Q4_K", imatrix=w), T.quantize(x, "Q4_K"))


# --- bad input raises instead of reaching a GGML_ASSERT ------------------------------------------

def test_bad_input_raises():
    x = _data("randn", 2, 64)
    with pytest.raises(ValueError, match="multiple of the block size"):
        T.quantize(x[:, :48], "Q4_K")
    with pytest.raises(ValueError, match="cannot produce"):
        T.quantize(x, "Q8_1")        # ggml_quantize_chunk would abort
    with pytest.raises(ValueError, match="cannot produce"):
        T.quantize(x, "I32")
    with pytest.raises(ValueError, match="non-finite"):
        T.quantize(np.full(32, np.nan, np.float32), "Q8_0")
    with pytest.raises(TypeError):
        T.quantize(np.array(["a"] * 32), "Q8_0")
    raw = T.quantize(x, "Q8_0")
    with pytest.raises(ValueError, match="bytes"):
        T.to_float32(raw.reshape(-1)[:-1], "Q8_0")
    with pytest.raises(ValueError, match="bytes"):
        T.to_float32(raw, "Q8_0", 64)
    with pytest.raises(ValueError, match="multiple of the block size"):
        T.to_float32(raw, "Q8_0", 100)
    with pytest.raises(ValueError, match="no to_float"):
        T.to_float32(b"\0" * 36, "Q8_1")
    with pytest.raises(ValueError, match="takes"):
        T.to_numpy(raw, "Q8_0", (64, 3))
    with pytest.raises(TypeError):
        T.to_float32(12345, "F32")
    assert T.quantize(np.zeros((0, 32), np.float32), "Q4_0").shape == (0, 18)
    assert T.to_float32(b"", "Q4_0").shape == (0,)


def test_grid_quantizers_refuse_magnitudes_that_abort_ggml():
    """IQ*_S/XXS quantizers abort ("point not on grid") from |x| ~ 1e13 on; 1e10 works."""
    x = np.random.default_rng(10).standard_normal((1, 256)).astype(np.float32)
    T.quantize(x / np.abs(x).max() * 1e10, "IQ3_S")   # at the limit: no abort (fp16 scales overflow)
    small = T.to_float32(T.quantize(x, "IQ3_S"), "IQ3_S")
    assert np.linalg.norm(small - x) / np.linalg.norm(x) < 0.5
    with pytest.raises(ValueError, match="too large"):
        T.quantize(x * 1e12, "IQ3_S")
    with pytest.raises(ValueError, match="too large"):
        T.quantize(x, "IQ2_XXS", imatrix=np.full(256, 1e31, np.float32))
    # the same magnitudes are fine for non-grid quantizers (inf scales, but no abort)
    T.quantize(x * 1e30, "Q4_K")


def test_row_size_does_not_wrap_around_for_rows_beyond_size_t():
    """ggml_row_size's size_t product wraps (I32 x 2**62 = 2**64 -> 0): a huge tensor looked
    empty and got no data (found by tests/fuzz_state_worker.py)."""
    assert T.row_size(lib.GGML_TYPE_I32, 2**62) == 2**64
    assert T.nbytes(lib.GGML_TYPE_F32, [2**31, 2**31, 2**31, 2]) == 2**96
    assert T.row_size(lib.GGML_TYPE_Q4_0, 64) == int(lib.ggml_row_size(lib.GGML_TYPE_Q4_0, 64))
