"""Read and write GGUF files through ggml's own GGUF code (``gguf.h``).

Reading: :class:`GGUFFile` parses the header with ``gguf_init_from_file`` (which validates the
whole layout: keys, types, tensor infos, alignment, offsets) and maps the file read-only with
``numpy.memmap`` for the tensor data (``gguf_get_data_offset`` + ``gguf_get_tensor_offset``)::

    with GGUFFile("model.gguf") as f:
        f.metadata["general.architecture"]          # -> "llama"
        f.metadata.value_type("llama.block_count")   # -> GGUFValueType.UINT32
        info = f.tensor_info("token_embd.weight")    # type, ne (ggml order), shape (NumPy order)
        w = f.array("token_embd.weight")             # float32, dequantized by ggml
        raw = f.raw("token_embd.weight")             # the bytes as stored, uint8

Writing: :class:`GGUFWriter` fills a ``gguf_init_empty`` context (``gguf_set_*``,
``gguf_add_tensor``, ``gguf_set_tensor_data``) and saves it with ``gguf_write_to_file``;
:func:`write_gguf` does it in one call.

Shapes: a tensor's ``ne`` is in ggml order (``ne[0]`` = row length, fastest varying); its NumPy
``shape`` is ``ne`` reversed. GGUF stores ``n_dims`` but ``gguf.h`` exposes only ``ne`` padded
with 1s to 4 dims, so ``ne`` here drops trailing 1s (``ggml_n_dims``; at least 1 dim); ggml's
writer stores ``n_dims`` the same way. A gguf-py tensor of NumPy shape (1, 8) thus reads back as
shape (8,).

Every call checks what ggml would ``abort()`` on first (typed getters on the wrong type,
duplicate tensor names, ``general.alignment`` with another type...) and raises a Python error.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .. import _cobject
from .context import Context
from ..enums import BufferUsage, GGUFValueType
from ..errors import ClosedError
from ..memory.buffer import check_layout
from ..raw import ffi, lib
from ..raw.boundary import calling
from .tensor import Tensor, lookup_name_bytes
from ..types import GGMLType, TypeLike, _as_u8, _check_ne, block_size, ggml_type, nbytes, numpy_dtype, \
    to_numpy, type_size

__all__ = ["GGUFValueType", "TensorInfo", "GGUFMetadata", "GGUFFile", "GGUFWriter", "write_gguf",
           "GGUF_DEFAULT_ALIGNMENT"]

#: The data alignment of files ggml writes (``GGUF_DEFAULT_ALIGNMENT``); see :class:`GGUFWriter`.
GGUF_DEFAULT_ALIGNMENT = 32
_MAX_NAME = lib.GGML_MAX_NAME  # tensor names hold at most GGML_MAX_NAME - 1 bytes

_VT = GGUFValueType
_DTYPES = {_VT.UINT8: np.uint8, _VT.INT8: np.int8, _VT.UINT16: np.uint16, _VT.INT16: np.int16,
           _VT.UINT32: np.uint32, _VT.INT32: np.int32, _VT.UINT64: np.uint64, _VT.INT64: np.int64,
           _VT.FLOAT32: np.float32, _VT.FLOAT64: np.float64, _VT.BOOL: np.bool_}
_VT_OF_DTYPE = {np.dtype(d): vt for vt, d in _DTYPES.items()}
_SUFFIX = {_VT.UINT8: "u8", _VT.INT8: "i8", _VT.UINT16: "u16", _VT.INT16: "i16", _VT.UINT32: "u32",
           _VT.INT32: "i32", _VT.UINT64: "u64", _VT.INT64: "i64", _VT.FLOAT32: "f32",
           _VT.FLOAT64: "f64", _VT.BOOL: "bool", _VT.STRING: "str"}
_GET = {vt: getattr(lib, f"gguf_get_val_{s}") for vt, s in _SUFFIX.items()}
_SET = {vt: getattr(lib, f"gguf_set_val_{s}") for vt, s in _SUFFIX.items()}
_PLAIN_OF_DTYPE = {np.dtype(d): GGMLType[n] for n, d in [
    ("F32", np.float32), ("F16", np.float16), ("F64", np.float64), ("I8", np.int8),
    ("I16", np.int16), ("I32", np.int32), ("I64", np.int64)]}


def _encode(s: str, what: str) -> bytes:
    """UTF-8 bytes of a key/name/string value for C (``surrogateescape``, so strings read from a
    file with invalid UTF-8 write back unchanged). NUL cannot pass through a C string."""
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, not {type(s).__name__}")
    if "\0" in s:
        raise ValueError(f"{what} must not contain NUL characters: {s!r}")
    return s.encode("utf-8", "surrogateescape")


def _decode(p: Any) -> str:
    return ffi.string(p).decode("utf-8", "surrogateescape")


def _trim(ne: Sequence[int]) -> tuple[int, ...]:
    """ggml_n_dims: drop trailing 1s, keep at least one dimension."""
    ne = [int(n) for n in ne]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    ``ne``: dimensions in ggml order, trailing 1s dropped; ``offset``: byte offset of its data from
    the start of the data section (add ``GGUFFile.data_offset`` for the file position); ``size``:
    bytes of data (``gguf_get_tensor_size``)."""
    name: str
    type: GGMLType
    ne: tuple[int, ...]
    offset: int
    size: int

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy shape: ``ne`` reversed."""
        return self.ne[::-1]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))


class GGUFMetadata(Mapping[str, Any]):
    """Read-only, live view of a :class:`GGUFFile`'s key-value pairs, in file order.

    Values: numbers as ``int``/``float``, BOOL as ``bool``, STRING as ``str`` (UTF-8,
    ``surrogateescape`` for invalid bytes; ggml returns C strings, so a value with an embedded NUL
    is cut there), arrays of numbers/bools as a new 1-D NumPy array of the matching dtype
    (uint8...float64, bool), arrays of strings as ``list[str]``; empty arrays keep their element
    type. Every access after the file is closed raises ValueError; a missing key raises KeyError.
    Wraps ``gguf_get_n_kv``, ``gguf_find_key``, ``gguf_get_key``, ``gguf_get_kv_type``,
    ``gguf_get_arr_type``/``_n``/``_data``/``_str`` and ``gguf_get_val_*``.
    """

    def __init__(self, owner: GGUFFile) -> None:
        self._owner = owner

    def _id(self, key: str) -> int:
        ctx = self._owner._check()
        if not isinstance(key, str) or "\0" in key:
            raise KeyError(key)
        kid = lib.gguf_find_key(ctx, key.encode("utf-8", "surrogateescape"))
        if kid < 0:
            raise KeyError(key)
        return int(kid)

    def __len__(self) -> int:
        return int(lib.gguf_get_n_kv(self._owner._check()))

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield _decode(lib.gguf_get_key(self._owner._check(), i))

    def __contains__(self, key: object) -> bool:
        try:
            self._id(key)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def value_type(self, key: str) -> GGUFValueType:
        """The GGUF type of ``key``'s value (ARRAY for arrays); KeyError if missing."""
        return GGUFValueType(lib.gguf_get_kv_type(self._owner._check(), self._id(key)))

    def element_type(self, key: str) -> GGUFValueType | None:
        """The element type of an ARRAY value, None for a scalar; KeyError if missing."""
        kid = self._id(key)
        ctx = self._owner._check()
        if lib.gguf_get_kv_type(ctx, kid) != _VT.ARRAY:
            return None
        return GGUFValueType(lib.gguf_get_arr_type(ctx, kid))

    def get_typed(self, key: str, value_type: GGUFValueType,
                  element_type: GGUFValueType | None = None) -> Any:
        """``self[key]``, but only if its value has type ``value_type`` (and, for ARRAY, element
        type ``element_type`` when given) -- the Python form of ggml's typed getters, which
        abort on a mismatch. Raises KeyError if missing, TypeError on a type mismatch."""
        kid = self._id(key)
        actual, elem = self.value_type(key), self.element_type(key)
        if actual != value_type or (element_type is not None and elem != element_type):
            got = actual.name + (f" of {elem.name}" if elem is not None else "")
            raise TypeError(f"GGUF key {key!r} holds {got}, not {GGUFValueType(value_type).name}"
                            + (f" of {GGUFValueType(element_type).name}" if element_type is not None else ""))
        return self._value(kid)

    def __getitem__(self, key: str) -> Any:
        return self._value(self._id(key))

    def _value(self, kid: int) -> Any:
        ctx = self._owner._check()
        vt = GGUFValueType(lib.gguf_get_kv_type(ctx, kid))
        if vt == _VT.STRING:
            return _decode(lib.gguf_get_val_str(ctx, kid))
        if vt != _VT.ARRAY:
            return _GET[vt](ctx, kid)
        et, n = GGUFValueType(lib.gguf_get_arr_type(ctx, kid)), int(lib.gguf_get_arr_n(ctx, kid))
        if et == _VT.STRING:
            return [_decode(lib.gguf_get_arr_str(ctx, kid, i)) for i in range(n)]
        if et == _VT.BOOL:  # stored as int8; read the bytes rather than trust them to be 0/1
            return self._numbers(ctx, kid, n, np.dtype(np.int8)) != 0
        return self._numbers(ctx, kid, n, np.dtype(_DTYPES[et]))

    @staticmethod
    def _numbers(ctx: Any, kid: int, n: int, dt: np.dtype) -> np.ndarray:
        if n == 0:
            return np.empty(0, dtype=dt)
        return np.frombuffer(ffi.buffer(lib.gguf_get_arr_data(ctx, kid), n * dt.itemsize), dtype=dt).copy()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<GGUFMetadata of {self._owner!r}>"


class GGUFFile(_cobject.CObject):
    """An open GGUF file (``gguf_init_from_file``): metadata, tensor infos and tensor data.

    ``ggml_context=True`` also asks ggml for a ``ggml_context`` holding one tensor header per
    tensor (type, ne, name; ``no_alloc``: no data), for allocating them in a backend buffer and
    filling them from :meth:`raw`; see :meth:`ggml_tensor`.

    The file owns the ``gguf_context`` (and that ``ggml_context``); :meth:`close` (or leaving a
    ``with`` block, or garbage collection) frees them. After closing, every method and
    :attr:`metadata` raise :class:`~pyggml.errors.ClosedError` (a ValueError), and so do the
    tensors :meth:`ggml_tensor` gave. Arrays from :meth:`raw`/:meth:`array` stay valid (they keep
    the read-only memory map alive).

    Attributes: ``path``, ``version`` (3), ``alignment`` (``general.alignment`` or 32),
    ``data_offset`` (file position of the data section); :attr:`metadata`, :attr:`tensors`.
    Wraps ``gguf_init_from_file``, ``gguf_get_version``/``_alignment``/``_data_offset``,
    ``gguf_get_n_tensors``, ``gguf_get_tensor_name``/``_type``/``_ne``/``_offset``/``_size``,
    ``gguf_free``, ``ggml_free``.

    Raises FileNotFoundError if ``path`` does not exist, ValueError if ggml rejects the file (the
    reason is in ggml's log on stderr) or the data section is truncated.
    """

    _kind = "GGUF file"

    def __init__(self, path: str | os.PathLike[str], *, ggml_context: bool = False) -> None:
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path!r} is a directory, not a GGUF file")
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no such GGUF file: {self.path!r}")
        pctx = ffi.new("struct ggml_context **") if ggml_context else ffi.NULL
        with calling():
            ctx = lib.gguf_init_from_file(os.fsencode(self.path), {"no_alloc": True, "ctx": pctx})
        if ctx == ffi.NULL:
            raise ValueError(f"ggml could not read {self.path!r} as a GGUF file (see the pyggml.ggml.gguf log)")
        super().__init__(ctx, owned=True)
        self._gen = 0  # tensors of the ggml context are borrowed from the file
        self._ggml_ctx: Any = pctx[0] if ggml_context else ffi.NULL
        self.version: int = int(lib.gguf_get_version(ctx))
        self.alignment: int = int(lib.gguf_get_alignment(ctx))
        self.data_offset: int = int(lib.gguf_get_data_offset(ctx))
        infos = []
        for i in range(lib.gguf_get_n_tensors(ctx)):
            infos.append(TensorInfo(
                name=_decode(lib.gguf_get_tensor_name(ctx, i)),
                type=GGMLType(lib.gguf_get_tensor_type(ctx, i)),
                ne=_trim(lib.gguf_get_tensor_ne(ctx, i)[0:lib.GGML_MAX_DIMS]),
                offset=int(lib.gguf_get_tensor_offset(ctx, i)),
                size=int(lib.gguf_get_tensor_size(ctx, i))))
        self._infos = tuple(infos)
        self._by_name = {t.name: t for t in infos}
        file_size = os.path.getsize(self.path)
        end = max((self.data_offset + t.offset + t.size for t in infos), default=0)
        if end > file_size:
            self.close()
            raise ValueError(f"{self.path!r} is truncated: tensor data ends at byte {end}, "
                             f"the file has {file_size}")
        self._map: np.ndarray | None = np.memmap(self.path, dtype=np.uint8, mode="r") if infos else None

    def _free(self, ptr: Any) -> None:
        self._gen = -1
        lib.gguf_free(ptr)
        if self._ggml_ctx != ffi.NULL:
            lib.ggml_free(self._ggml_ctx)
        self._map = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, ggml_context: bool = False) -> GGUFFile:
        """Same as ``GGUFFile(path, ggml_context=...)``."""
        return cls(path, ggml_context=ggml_context)

    def _check(self) -> Any:
        if self._ptr is None:
            raise ClosedError(f"GGUF file {self.path!r} is closed")
        return self._ptr

    def close(self) -> None:
        """Free the ``gguf_context`` (``gguf_free``) and ``ggml_context`` (``ggml_free``) and drop
        the memory map. Idempotent."""
        self._gen = -1
        super().close()

    def __enter__(self) -> GGUFFile:
        self._check()
        return self

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._infos)} tensors"
        return f"<GGUFFile {self.path!r} ({state})>"

    @property
    def metadata(self) -> GGUFMetadata:
        """The key-value pairs, a read-only :class:`GGUFMetadata` mapping (ValueError if closed)."""
        self._check()
        return GGUFMetadata(self)

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        """Every tensor's :class:`TensorInfo`, in file order."""
        self._check()
        return self._infos

    def tensor_info(self, name: str) -> TensorInfo:
        """The :class:`TensorInfo` of tensor ``name``; KeyError if there is none."""
        self._check()
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise KeyError(name) from None

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name``: a read-only 1-D uint8 view of the file
        (``info.size`` bytes at ``data_offset + info.offset``). KeyError if there is no such
        tensor."""
        info = self.tensor_info(name)
        start = self.data_offset + info.offset
        assert self._map is not None
        return self._map[start:start + info.size].view(np.ndarray)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` in NumPy order (shape ``info.shape``): F32/F16/F64/I8/I16/I32/I64 as a
        read-only view in their own dtype; BF16 and quantized types as a new float32 array
        dequantized by ggml (:func:`pyggml.types.to_numpy`). ValueError for Q8_1/Q8_K, which ggml
        cannot dequantize; KeyError if there is no such tensor."""
        info = self.tensor_info(name)
        return to_numpy(self.raw(name), info.type, info.ne)

    def load(self, where: Any, names: Sequence[str] | None = None) -> tuple[Context, dict[str, Tensor]]:
        """Load tensors straight into one backend buffer: a new ``no_alloc``
        :class:`~pyggml.core.context.Context` with a :class:`~pyggml.core.tensor.Tensor` per tensor (same
        name, type and ne), allocated on ``where`` (a Backend or BufferType:
        ``Context.alloc_tensors``, buffer usage "weights") and filled with the file's bytes
        (``ggml_backend_tensor_set``; no dequantization). ``names`` picks tensors (default: all).
        Returns ``(context, {name: tensor})``; the context owns the buffer. KeyError for an
        unknown name."""
        infos = [self.tensor_info(n) for n in names] if names is not None else list(self.tensors)
        if not infos:
            raise ValueError("no tensors to load")
        ctx = Context.for_tensors(len(infos))
        tensors = {i.name: ctx.new_tensor(i.type, list(i.ne), name=i.name) for i in infos}
        buf = ctx.alloc_tensors(where)
        buf.usage = BufferUsage.WEIGHTS
        with calling():
            for i in infos:
                raw = np.ascontiguousarray(self.raw(i.name))
                check_layout(tensors[i.name]._ptr, read=False)
                lib.ggml_backend_tensor_set(tensors[i.name]._ptr, ffi.from_buffer(raw), 0, raw.nbytes)
        return ctx, tensors

    @property
    def ggml_context(self) -> Any:
        """The raw ``struct ggml_context *`` with the tensor headers (``ggml_context=True``
        only), valid until :meth:`close`; ValueError otherwise, ClosedError when closed."""
        self._check()
        if self._ggml_ctx == ffi.NULL:
            raise ValueError("open the file with ggml_context=True to get its ggml context")
        return self._ggml_ctx

    def ggml_tensor(self, name: str) -> Tensor:
        """The tensor named ``name`` in :attr:`ggml_context` (``ggml_get_tensor``: no data,
        ``ne`` padded to 4 dims), borrowed from this file: ClosedError once it is closed.
        KeyError if none."""
        gctx = self.ggml_context
        raw = lookup_name_bytes(name) if isinstance(name, str) else None
        t = lib.ggml_get_tensor(gctx, raw) if raw is not None else ffi.NULL
        if t == ffi.NULL:
            raise KeyError(name)
        return Tensor(t, self)


def _int_type(lo: int, hi: int) -> GGUFValueType:
    for vt in (_VT.INT32, _VT.INT64, _VT.UINT64):
        info = np.iinfo(_DTYPES[vt])
        if info.min <= lo and hi <= info.max:
            return vt
    raise ValueError(f"integer {hi if hi > 0 else lo} does not fit any GGUF integer type")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _infer(values: Sequence[Any]) -> GGUFValueType:
    """Element type for Python values: all bool -> BOOL, all str -> STRING, all int -> the first of
    INT32/INT64/UINT64 holding them, ints and floats -> FLOAT32; numpy scalars keep their dtype."""
    if all(isinstance(v, np.generic) and v.dtype in _VT_OF_DTYPE for v in values) and \
            len({v.dtype for v in values}) == 1:
        return _VT_OF_DTYPE[values[0].dtype]
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return _VT.BOOL
    if all(isinstance(v, str) for v in values):
        return _VT.STRING
    if all(_is_int(v) for v in values):
        return _int_type(min(int(v) for v in values), max(int(v) for v in values))
    if all(_is_int(v) or isinstance(v, (float, np.floating)) for v in values):
        return _VT.FLOAT32
    kinds = sorted({type(v).__name__ for v in values})
    raise TypeError(f"no GGUF type for values of type {', '.join(kinds)}")


def _numbers(values: Sequence[Any] | np.ndarray, vt: GGUFValueType) -> np.ndarray:
    """Numbers/bools as a 1-D array of ``vt``'s dtype: TypeError for the wrong kind (floats or
    bools as integers, numbers as BOOL), ValueError for integers out of range."""
    dt: np.dtype[Any] = np.dtype(_DTYPES[vt])
    if isinstance(values, np.ndarray):
        k = values.dtype.kind
        ok = k == "b" if vt == _VT.BOOL else (k in "iu" if dt.kind in "iu" else k in "iuf")
        ints = [int(values.min()), int(values.max())] if dt.kind in "iu" and values.size and ok else []
    else:
        vals = list(values)
        if vt == _VT.BOOL:
            ok = all(isinstance(v, (bool, np.bool_)) for v in vals)
        elif dt.kind in "iu":
            ok = all(_is_int(v) for v in vals)
        else:
            ok = all(_is_int(v) or isinstance(v, (float, np.floating)) for v in vals)
        ints = [int(v) for v in vals] if ok and dt.kind in "iu" else []
    if not ok:
        raise TypeError(f"values of kind {getattr(values, 'dtype', 'list')} cannot be stored as {vt.name}")
    if ints and (min(ints) < np.iinfo(dt).min or max(ints) > np.iinfo(dt).max):
        raise ValueError(f"integer out of range for {vt.name}: {min(ints)}..{max(ints)}")
    if isinstance(values, np.ndarray):
        return np.ascontiguousarray(values, dtype=dt).reshape(-1)
    return np.array(ints or vals, dtype=dt)  # Python ints straight to dt: [2**64 - 1, 0] is no float64


class GGUFWriter(_cobject.CObject):
    """Build a GGUF file in memory (``gguf_init_empty``) and save it with :meth:`write`.

    Keys must be unique: adding an existing key raises ValueError unless ``replace=True`` (ggml
    then removes the old pair and appends the new one at the end). Tensor names must be unique,
    non-empty, < 64 UTF-8 bytes and without NUL (ggml aborts on duplicates and truncates long
    names). Tensor data is copied when added. ``general.alignment`` may only be set to the default
    32 as UINT32: ggml v0.20.2 ignores the key when writing, so any other value would produce a
    file that declares one alignment and is padded to another (unreadable).

    Use as a context manager or call :meth:`close` to free the ``gguf_context`` early (it is
    freed on garbage collection too); afterwards every method raises
    :class:`~pyggml.errors.ClosedError` (a ValueError).
    """

    _kind = "GGUF writer"
    _c_free = lib.gguf_free

    def __init__(self) -> None:
        super().__init__(lib.gguf_init_empty(), owned=True)
        self._data: dict[str, np.ndarray] = {}

    def _check(self) -> Any:
        if self._ptr is None:
            raise ClosedError("GGUFWriter is closed")
        return self._ptr

    def close(self) -> None:
        """Free the ``gguf_context`` (``gguf_free``) and the copied tensor data. Idempotent."""
        super().close()
        self._data.clear()

    def __enter__(self) -> GGUFWriter:
        self._check()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_value(self, key: str, value: Any, type: GGUFValueType | None = None,
                  element_type: GGUFValueType | None = None, *, replace: bool = False) -> None:
        """Set the KV pair ``key`` (``gguf_set_val_*``, ``gguf_set_arr_data``, ``gguf_set_arr_str``).

        Default types: ``bool`` -> BOOL, ``int`` -> INT32 (like gguf-py; INT64 or UINT64 when it
        does not fit), ``float`` -> FLOAT32 (like gguf-py), ``str`` -> STRING, a NumPy scalar ->
        its dtype. ``list``/``tuple``/1-D ``ndarray`` -> ARRAY: element type from the dtype
        (``U``/``str`` -> STRING) or the elements as for scalars (all ints -> INT32/INT64/UINT64,
        ints and floats -> FLOAT32); an empty list needs ``element_type``.

        ``type`` picks the value type (ARRAY for arrays, which is also implied by
        ``element_type``); ``element_type`` the array element type. Numbers are converted to the
        chosen type: integers are range-checked, floats rounded to FLOAT32 if asked.

        Raises ValueError for an empty key, a key containing NUL, an existing key without
        ``replace``, nested arrays (ggml cannot read them), an out-of-range integer, an empty list
        without ``element_type``, or ``general.alignment`` other than UINT32 32; TypeError for
        values that do not fit the requested or any type.
        """
        ctx = self._check()
        kb = _encode(key, "GGUF key")
        if not kb:
            raise ValueError("GGUF keys must not be empty")
        if lib.gguf_find_key(ctx, kb) >= 0 and not replace:
            raise ValueError(f"GGUF key {key!r} is already set (pass replace=True to overwrite it)")
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        is_array = isinstance(value, (list, tuple, np.ndarray))
        if element_type is not None:
            element_type = GGUFValueType(element_type)
            if type not in (None, _VT.ARRAY):
                raise ValueError(f"element_type is for ARRAY values, not {GGUFValueType(type).name}")
            type = _VT.ARRAY
        vt = GGUFValueType(type) if type is not None else (_VT.ARRAY if is_array else _infer([value]))
        if (vt == _VT.ARRAY) != is_array:
            raise TypeError(f"{'a list/array' if is_array else 'a scalar'} cannot be stored as {vt.name}")
        default_alignment = vt == _VT.UINT32 and _is_int(value) and int(value) == GGUF_DEFAULT_ALIGNMENT
        if key == "general.alignment" and not default_alignment:
            raise ValueError(
                f"general.alignment must be UINT32 {GGUF_DEFAULT_ALIGNMENT}: ggml v0.20.2 pads the files it "
                "writes to 32 bytes whatever the key says, so another alignment would give a broken file")
        if vt == _VT.STRING:
            if not isinstance(value, str):
                raise TypeError(f"a STRING value must be a str, not {value.__class__.__name__}")
            lib.gguf_set_val_str(ctx, kb, _encode(value, "GGUF string value"))
        elif vt != _VT.ARRAY:
            _SET[vt](ctx, kb, _numbers([value], vt)[0].item())
        else:
            self._set_array(ctx, kb, key, value, element_type)

    @staticmethod
    def _set_array(ctx: Any, kb: bytes, key: str, value: Any, et: GGUFValueType | None) -> None:
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                raise ValueError(f"{key!r}: nested arrays (ndim {value.ndim}) are not supported by ggml")
            if et is None:
                et = _VT.STRING if value.dtype.kind == "U" else _VT_OF_DTYPE.get(value.dtype)
                if et is None:
                    raise TypeError(f"{key!r}: no GGUF type for dtype {value.dtype}; pass element_type")
            elems: Sequence[Any] | np.ndarray = value.tolist() if et == _VT.STRING else value
        else:
            if any(isinstance(v, (list, tuple, np.ndarray, dict, set)) for v in value):
                raise ValueError(f"{key!r}: nested arrays are not supported by ggml")
            if et is None:
                if not value:
                    raise ValueError(f"{key!r}: cannot infer the element type of an empty list; pass element_type")
                et = _infer(value)
            elems = value
        if et == _VT.ARRAY:
            raise ValueError(f"{key!r}: nested arrays are not supported by ggml")
        if et == _VT.STRING:
            if not all(isinstance(s, str) for s in elems):
                raise TypeError(f"{key!r}: a STRING array must hold only str")
            keep = [ffi.new("char[]", _encode(s, "GGUF string value")) for s in elems]
            lib.gguf_set_arr_str(ctx, kb, ffi.new("const char *[]", keep), len(keep))
        else:
            arr = _numbers(elems, et)
            lib.gguf_set_arr_data(ctx, kb, et, ffi.from_buffer(arr), arr.size)

    def remove_value(self, key: str) -> bool:
        """Remove ``key`` (``gguf_remove_key``); True if it was there."""
        return bool(lib.gguf_remove_key(self._check(), _encode(key, "GGUF key")) >= 0)

    def add_tensor(self, name: str, data: Any, type: TypeLike | None = None,
                   ne: Sequence[int] | None = None) -> TensorInfo:
        """Add tensor ``name`` (``ggml_new_tensor`` header, ``gguf_add_tensor``,
        ``gguf_set_tensor_data``); its data is copied.

        ``data`` and ``type``:

        - ``type=None``: a NumPy array of float32/float16/float64/int8/int16/int32/int64 ->
          F32/F16/F64/I8/I16/I32/I64; ``ne`` defaults to ``data.shape`` reversed.
        - a plain ``type`` (F32, F16, F64, I8, I16, I32, I64): an array of exactly that dtype,
          ``ne`` from its shape; BF16: its raw bits as a uint16 array, ``ne`` from its shape.
        - any ``type``: raw bytes as a uint8 array (or bytes-like) in ggml's layout, e.g. from
          :func:`pyggml.types.quantize`, ``gguf.quants.quantize`` or :meth:`GGUFFile.raw`. Without
          ``ne`` the array's last axis is the bytes of one row, as gguf-py lays it out: ``ne[0] =
          shape[-1] // type_size * block_size``, the other dims from the leading axes.

        ``ne`` (ggml order, 1-4 dims, ``ne[0]`` a multiple of the block size) overrides the shape;
        the data must hold exactly ``nbytes(type, ne)`` bytes. Returns the tensor's
        :class:`TensorInfo` (trailing 1s of ``ne`` dropped, as the file stores it).

        Raises ValueError for a duplicate, empty or too long (>= 64 bytes) name, more than 4
        dims, a row length that is not a multiple of the block size, or a size mismatch; TypeError
        for a dtype that does not match ``type``.
        """
        ctx = self._check()
        nb = _encode(name, "tensor name")
        if not 0 < len(nb) < _MAX_NAME:
            raise ValueError(f"tensor names must have 1..{_MAX_NAME - 1} UTF-8 bytes, {name!r} has {len(nb)}")
        if lib.gguf_find_tensor(ctx, nb) >= 0:
            raise ValueError(f"duplicate tensor name {name!r}")
        t, raw, shape_ne = self._tensor_bytes(data, type, ne is None)
        ne_t = _check_ne(shape_ne if ne is None else ne)
        if ne_t[0] % block_size(t):
            raise ValueError(f"{t.name}: ne[0] = {ne_t[0]} is not a multiple of the block size {block_size(t)}")
        if raw.size != nbytes(t, ne_t):
            raise ValueError(f"{t.name} tensor with ne={list(ne_t)} takes {nbytes(t, ne_t)} bytes, data has {raw.size}")
        raw = np.array(raw, dtype=np.uint8, copy=True)  # numpy never hands out a NULL data pointer
        gctx = lib.ggml_init({"mem_size": lib.ggml_tensor_overhead(), "mem_buffer": ffi.NULL, "no_alloc": True})
        if gctx == ffi.NULL:
            raise MemoryError("ggml_init failed")
        try:
            header = lib.ggml_new_tensor(gctx, t, len(ne_t), ffi.new("int64_t[]", ne_t))
            lib.ggml_set_name(header, nb)
            lib.gguf_add_tensor(ctx, header)  # copies the header
        finally:
            lib.ggml_free(gctx)
        self._data[name] = raw
        lib.gguf_set_tensor_data(ctx, nb, ffi.from_buffer(raw))
        tid = lib.gguf_find_tensor(ctx, nb)
        return TensorInfo(name, t, _trim(ne_t), int(lib.gguf_get_tensor_offset(ctx, tid)),
                          int(lib.gguf_get_tensor_size(ctx, tid)))

    @staticmethod
    def _tensor_bytes(data: Any, type: TypeLike | None, need_ne: bool) -> tuple[GGMLType, np.ndarray, Any]:
        """(type, flat uint8 bytes, default ne if need_ne) for add_tensor."""
        arr = data if isinstance(data, np.ndarray) else None
        if type is None:
            if arr is None or arr.dtype not in _PLAIN_OF_DTYPE:
                got = arr.dtype if arr is not None else data.__class__.__name__
                raise TypeError(f"no default ggml type for {got}; pass type=")
            t = _PLAIN_OF_DTYPE[arr.dtype]
        else:
            t = ggml_type(type)
        dt = numpy_dtype(t)
        if arr is not None and dt is not None and arr.dtype == dt:  # values (BF16: the uint16 bits)
            return t, _as_u8(arr), arr.shape[::-1] or (1,)
        if arr is not None and arr.dtype != np.uint8:
            want = f"a NumPy array of {dt} or raw bytes (uint8)" if dt is not None else \
                "raw bytes (uint8); quantize values with pyggml.types.quantize first"
            raise TypeError(f"{t.name} data must be {want}, got {arr.dtype}")
        u8 = arr if arr is not None else _as_u8(data)
        if not need_ne:
            return t, _as_u8(u8), None
        if u8.ndim == 0 or u8.shape[-1] % type_size(t):
            raise ValueError(f"{t.name}: the last axis ({u8.shape[-1] if u8.ndim else 0} bytes) is not a "
                             f"whole number of {type_size(t)}-byte blocks; pass ne=")
        rows = (*u8.shape[:-1], u8.shape[-1] // type_size(t) * block_size(t))
        return t, _as_u8(u8), rows[::-1]

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the whole file (``gguf_write_to_file``); OSError if ggml cannot write it."""
        ctx = self._check()
        p = os.fspath(path)
        if not lib.gguf_write_to_file(ctx, os.fsencode(p), False):
            raise OSError(f"ggml could not write the GGUF file {p!r} (see ggml's log)")


TensorData = Union[np.ndarray, tuple[Any, ...]]


def write_gguf(path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None,
               tensors: Mapping[str, TensorData] | None = None) -> None:
    """Write a GGUF file in one call: ``metadata`` values with :meth:`GGUFWriter.add_value`'s
    default types, ``tensors`` as ``name -> array`` or ``name -> (data, type[, ne])`` for
    :meth:`GGUFWriter.add_tensor`. Raises as those do."""
    with GGUFWriter() as w:
        for key, value in (metadata or {}).items():
            w.add_value(key, value)
        for name, t in (tensors or {}).items():
            w.add_tensor(name, *t) if isinstance(t, tuple) else w.add_tensor(name, t)
        w.write(path)
