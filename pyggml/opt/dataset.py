"""Data for ggml-opt: :class:`Dataset` (``ggml_opt_dataset``, filled from NumPy), :func:`one_hot`
labels, and the borrow scope of the tensors whose structs ggml-opt's own objects own.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import types
from .._cobject import CObject
from ..enums import GGMLType
from ..raw import ffi, lib
from ..core.tensor import BorrowScope, Tensor


__all__ = ["one_hot", "Dataset"]


# =============================================================================================
# tensors of ggml-opt's own contexts
# =============================================================================================

#: the C type of an OptContext's pointer (``ggml_opt_context_t``)
_OPT_CONTEXT_T = ffi.typeof("ggml_opt_context_t")


class _Lender(BorrowScope):
    """What the tensors of a ggml-opt object (a dataset's data and labels, an opt context's
    labels, loss, pred, ncorrect, gradient accumulators) are borrowed from: their structs live in
    contexts private to ggml-opt, so no pyggml :class:`~pyggml.core.context.Context` holds them. The
    scope closes with the object (the tensors then raise ClosedError); it keeps the object alive
    while a tensor lives."""

    __slots__ = ("obj",)

    def __init__(self, name: str, obj: CObject):
        super().__init__(name)
        self.obj = obj


def _borrowed_tensor(ptr: Any, scope: BorrowScope) -> Tensor:
    """A :class:`Tensor` for a tensor whose struct ggml-opt owns, borrowed from ``scope``."""
    return Tensor(ptr, scope)


# =============================================================================================
# Dataset
# =============================================================================================

def one_hot(labels: Any, n_classes: int, dtype: Any = np.float32) -> np.ndarray:
    """Class indices (NumPy ``(ndata,)`` integers in ``[0, n_classes)``) as one-hot rows
    ``(ndata, n_classes)`` of ``dtype``: the labels :attr:`Loss.CROSS_ENTROPY` compares the
    outputs with. Raises ValueError/TypeError for other input."""
    y = np.asarray(labels)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise TypeError(f"one_hot takes a 1-D integer array of class indices, got {y.dtype} {y.shape}")
    if n_classes < 1 or (y.size and (y.min() < 0 or y.max() >= n_classes)):
        raise ValueError(f"class indices must be in [0, {n_classes})")
    out = np.zeros((y.size, n_classes), dtype=dtype)
    out[np.arange(y.size), y] = 1
    return out


def _default_type(dtype: np.dtype, what: str) -> GGMLType:
    """The ggml type a NumPy dtype is stored as by default: float16 F16, other floats F32
    (ggml-opt trains in F32; float64 is converted), int32 I32; TypeError otherwise."""
    if dtype == np.float16:
        return GGMLType.F16
    if dtype.kind == "f":
        return GGMLType.F32
    if dtype == np.int32:
        return GGMLType.I32
    if dtype.kind in "iub":
        hint = (" (class indices: one-hot encode them with opt.one_hot(y, n_classes) for "
                "Loss.CROSS_ENTROPY)" if what == "labels" else " (e.g. pixels: scale them to float32)")
        raise TypeError(f"{what} of dtype {dtype} have no default ggml type{hint}; or pass the ggml "
                        f"type explicitly ({'label_type' if what == 'labels' else 'type'}=...)")
    raise TypeError(f"{what} of dtype {dtype} cannot be stored in a ggml tensor")


def _as_rows(a: np.ndarray, n: int, what: str) -> tuple[np.ndarray, int]:
    """``a`` (ndata, ...) as (ndata, ne) with ne = prod(...) (1 for 1-D)."""
    if a.ndim == 0:
        raise ValueError(f"{what} must have a first axis of datapoints, got a scalar")
    if a.shape[0] != n:
        raise ValueError(f"{what} has {a.shape[0]} datapoints, data has {n}")
    ne = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
    return a.reshape(n, ne), ne


def _resolve_type(arr: np.ndarray, type_: Any, ne: int, what: str) -> GGMLType:
    t: GGMLType = _default_type(arr.dtype, what) if type_ is None else types.ggml_type(type_)
    if ne % types.block_size(t):
        raise ValueError(f"{what}: {ne} elements per datapoint is not a multiple of the "
                         f"{t.name} block size {types.block_size(t)}")
    if types.is_quantized(t) and not types.can_quantize(t):
        raise TypeError(f"{what}: ggml cannot quantize to {t.name}")
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{what} of dtype {arr.dtype} cannot be stored in a ggml tensor")
    dt = types.numpy_dtype(t)
    if arr.dtype.kind == "f" and dt is not None and dt.kind in "iu":
        raise TypeError(f"{what}: float {arr.dtype} values cannot be stored as {t.name} (an integer type)")
    return t


class Dataset(CObject):
    """A ggml-opt dataset (``ggml_opt_dataset_init`` / ``ggml_opt_dataset_free``), owned, filled
    from NumPy.

    ``data``: NumPy ``(ndata, *datapoint_shape)``; each datapoint is flattened in C order to
    ``ne_datapoint`` elements, so ggml's data tensor is ``ne [ne_datapoint, ndata]``.
    ``labels``: ``(ndata, *label_shape)`` -> ``ne [ne_label, ndata]``, or None for losses
    without labels (MEAN, SUM). Default types: float16 F16, other floats F32 (float64 is
    converted: ggml trains in F32), int32 I32; ``type``/``label_type`` pick any ggml type
    (BF16 and quantized types are quantized with ggml's own routines).

    ``shard_size``: datapoints per shard, the unit ggml shuffles and copies (``ndata_shard``);
    it must divide ``ndata`` and every batch size used with the dataset. ggml's MNIST example
    uses 10 (fewer, larger copies).

    ``seed``: if given, the datapoints are permuted (shard-wise) with
    ``numpy.random.default_rng(seed)`` before they are stored. ggml's own shuffles
    (:meth:`shuffle`, done by :func:`fit` every epoch) draw from the ``std::mt19937`` of an
    :class:`OptContext`, which ggml seeds with its fixed default: they are reproducible, and the
    seed is how to vary them.

    Raises ValueError for empty data, mismatched data/label counts or a shard size that does
    not divide ``ndata``; TypeError for dtypes without a ggml type; MemoryError if the CPU
    buffer cannot be allocated.
    """

    _kind = "dataset"
    _c_free = lib.ggml_opt_dataset_free

    def __init__(self, data: Any, labels: Any = None, *, shard_size: int = 1, type: Any = None,
                 label_type: Any = None, seed: int | None = None):
        x = np.asarray(data)
        n = int(x.shape[0]) if x.ndim else 0
        if n == 0:
            raise ValueError("a dataset needs at least one datapoint (data of shape (ndata, ...))")
        x, ne_data = _as_rows(x, n, "data")
        if ne_data < 1:
            raise ValueError("datapoints must have at least one element")
        y, ne_label = None, 0
        if labels is not None:
            y, ne_label = _as_rows(np.asarray(labels), n, "labels")
            if ne_label < 1:
                raise ValueError("labels must have at least one element per datapoint")
        if not isinstance(shard_size, (int, np.integer)) or shard_size < 1:
            raise ValueError(f"shard_size must be an integer >= 1, got {shard_size!r}")
        if n % shard_size:
            raise ValueError(f"shard_size {shard_size} does not divide ndata {n}")
        t_data = _resolve_type(x, type, ne_data, "data")
        t_label = _resolve_type(y, label_type, ne_label, "labels") if y is not None else GGMLType.F32
        ptr = lib.ggml_opt_dataset_init(t_data, t_label, ne_data, ne_label, n, int(shard_size))
        super().__init__(ptr, owned=True)
        self._scope = _Lender("a ggml-opt dataset", self)
        self.shard_size = int(shard_size)
        if lib.ggml_opt_dataset_data(ptr).data == ffi.NULL:  # CPU buffer allocation failed
            self.close()
            raise MemoryError(f"ggml could not allocate the dataset ({n} datapoints)")
        if seed is not None:
            order = np.random.default_rng(seed).permutation(n // shard_size)
            idx = (order[:, None] * shard_size + np.arange(shard_size)).reshape(-1)
            x = x[idx]
            y = y[idx] if y is not None else None
        self.data.set(x)
        if y is not None:
            self.labels.set(y)  # type: ignore[union-attr]

    @property
    def ndata(self) -> int:
        """Number of datapoints (``ggml_opt_dataset_ndata``)."""
        return int(lib.ggml_opt_dataset_ndata(self.ptr))

    @property
    def data(self) -> Tensor:
        """The data tensor, ``ne [ne_datapoint, ndata]``, in a CPU buffer (``ggml_opt_dataset_data``)."""
        return _borrowed_tensor(lib.ggml_opt_dataset_data(self.ptr), self._scope)

    @property
    def labels(self) -> Tensor | None:
        """The labels tensor, ``ne [ne_label, ndata]``, or None (``ggml_opt_dataset_labels``)."""
        p = lib.ggml_opt_dataset_labels(self.ptr)
        return None if p == ffi.NULL else _borrowed_tensor(p, self._scope)

    @property
    def ne_datapoint(self) -> int:
        return int(lib.ggml_opt_dataset_data(self.ptr).ne[0])

    @property
    def ne_label(self) -> int:
        """Elements per label; 0 without labels."""
        p = lib.ggml_opt_dataset_labels(self.ptr)
        return 0 if p == ffi.NULL else int(p.ne[0])

    @property
    def type(self) -> GGMLType:
        return GGMLType(lib.ggml_opt_dataset_data(self.ptr).type)

    @property
    def label_type(self) -> GGMLType | None:
        p = lib.ggml_opt_dataset_labels(self.ptr)
        return None if p == ffi.NULL else GGMLType(p.type)

    def _nbs(self) -> tuple[int, int]:
        """Bytes per shard of data and labels (ggml's ``nbs_data``, ``nbs_labels``)."""
        d = lib.ggml_opt_dataset_data(self.ptr)
        lb = lib.ggml_opt_dataset_labels(self.ptr)
        nbs_l = 0 if lb == ffi.NULL else types.row_size(lb.type, lb.ne[0]) * self.shard_size
        return types.row_size(d.type, d.ne[0]) * self.shard_size, nbs_l

    def check_batch_size(self, batch_size: int) -> None:
        """ValueError unless ``batch_size`` is >= 1 and a multiple of the shard size (ggml
        copies whole shards into a batch and asserts it)."""
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        if batch_size % self.shard_size:
            raise ValueError(f"batch size {batch_size} is not a multiple of the dataset's shard size "
                             f"{self.shard_size} (ggml copies whole shards into a batch)")

    def shuffle(self, opt_ctx: CObject, idata: int = -1) -> None:
        """``ggml_opt_dataset_shuffle``: shuffle the shards of the first ``idata`` datapoints
        (all for -1) with ``opt_ctx``'s random generator. Raises ValueError if ``idata`` exceeds
        ``ndata`` or is not a multiple of the shard size."""
        # OptContext's module imports this one: the context is recognized by its C type
        if not (isinstance(opt_ctx, CObject) and ffi.typeof(opt_ctx.ptr) is _OPT_CONTEXT_T):
            raise TypeError("shuffle takes the OptContext whose random generator to use")
        idata = int(idata)
        if idata > self.ndata:
            raise ValueError(f"idata {idata} > ndata {self.ndata}")
        if idata >= 0 and idata % self.shard_size:
            raise ValueError(f"idata {idata} is not a multiple of the shard size {self.shard_size}")
        lib.ggml_opt_dataset_shuffle(opt_ctx.ptr, self.ptr, idata)

    def get_batch(self, ibatch: int, batch_size: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Batch ``ibatch`` of ``batch_size`` datapoints in the current shuffled order
        (``ggml_opt_dataset_get_batch_host``), as NumPy ``(batch_size, ne_datapoint)`` and
        ``(batch_size, ne_label)`` (or None): plain types in their dtype, BF16 and quantized
        types dequantized to float32. ValueError for a batch beyond the end or a batch size that
        is not a multiple of the shard size."""
        self.check_batch_size(batch_size)
        nbs_data, nbs_labels = self._nbs()
        shards = batch_size // self.shard_size
        if ibatch < 0 or (ibatch + 1) * shards > self.ndata // self.shard_size:
            raise ValueError(f"batch {ibatch} of {batch_size} datapoints is beyond the {self.ndata} datapoints")
        raw_x = np.empty(shards * nbs_data, dtype=np.uint8)
        raw_y = np.empty(shards * nbs_labels, dtype=np.uint8) if nbs_labels else None
        lib.ggml_opt_dataset_get_batch_host(self.ptr, ffi.from_buffer(raw_x), raw_x.nbytes,
                                            ffi.from_buffer(raw_y) if raw_y is not None else ffi.NULL, int(ibatch))
        x = types.to_numpy(raw_x, self.type, [self.ne_datapoint, batch_size])
        lt = self.label_type
        y = types.to_numpy(raw_y, lt, [self.ne_label, batch_size]) if raw_y is not None and lt is not None else None
        return x, y

    def close(self) -> None:
        """``ggml_opt_dataset_free``: its data and labels tensors raise ClosedError afterwards."""
        scope = getattr(self, "_scope", None)
        if scope is not None:
            scope.close()
        super().close()

    def __repr__(self) -> str:
        if self.closed:
            return "<Dataset (closed)>"
        lt = self.label_type
        lab = f", labels {lt.name} ne_label={self.ne_label}" if lt is not None else ", no labels"
        return (f"<Dataset {self.ndata} x {self.type.name} ne_datapoint={self.ne_datapoint}{lab}, "
                f"shard_size={self.shard_size}>")
