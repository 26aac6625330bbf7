"""Training with ggml-opt (``ggml-opt.h``): datasets, AdamW/SGD, losses, epochs and fits.

ggml trains models itself: a ``ggml_opt_context`` builds the backward graph of a model and the
optimizer step (``ggml_opt_step_adamw`` / ``ggml_opt_step_sgd``), a ``ggml_opt_dataset`` holds
the data in host memory and copies shuffled batches to the model's inputs, and a
``ggml_opt_result`` accumulates loss and accuracy with their uncertainties. This module puts
those objects behind Python ones named as in ggml::

    import numpy as np
    from pyggml import opt

    class MLP(opt.Model):                         # ggml's MNIST "mnist-fc" architecture
        def __init__(self, rng, **kw):
            super().__init__(**kw)
            self.fc1_w = self.param("fc1.weight", rng.normal(0, 1e-2, (500, 784)))  # ne [784, 500]
            self.fc1_b = self.param("fc1.bias", rng.normal(0, 1e-2, 500))
            self.fc2_w = self.param("fc2.weight", rng.normal(0, 1e-2, (10, 500)))
            self.fc2_b = self.param("fc2.bias", rng.normal(0, 1e-2, 10))

        def forward(self, ctx, images):           # images: ne [784, batch]
            h = ctx.relu(ctx.add(ctx.mul_mat(self.fc1_w, images), self.fc1_b))
            return ctx.add(ctx.mul_mat(self.fc2_w, h), self.fc2_b)   # logits: ne [10, batch]

    model = MLP(np.random.default_rng(0))
    train = opt.Dataset(x_train, opt.one_hot(y_train, 10), shard_size=10)  # NumPy (n, 784), (n, 10)
    history = opt.fit(model, train, loss="cross_entropy", optimizer=opt.AdamW(alpha=1e-3),
                      epochs=30, batch_size=500, nbatch_logical=1000, val_split=0.05)
    print(opt.evaluate(model, opt.Dataset(x_test, opt.one_hot(y_test, 10))).accuracy)
    model.save("mnist-fc-f32.gguf", arch="mnist-fc")   # ggml's examples/mnist/mnist-eval reads it

**Shapes.** A dataset of ``ndata`` datapoints is given as NumPy arrays of shape
``(ndata, *datapoint_shape)`` and ``(ndata, *label_shape)``; ggml stores them flattened, as
tensors of ``ne [ne_datapoint, ndata]`` and ``ne [ne_label, ndata]`` (NumPy's last axis is
ggml's ``ne[0]``). A model's inputs tensor is ``ne [ne_datapoint, batch]`` and its outputs must
be ``ne [ne_label, batch]`` F32 (ggml-opt reads ``ne[1]`` as the number of datapoints).

**Errors.** Everything ggml-opt would ``GGML_ASSERT`` on (which kills the interpreter) is
checked first and raised as ValueError/TypeError: mismatched data/label counts, dtypes without
a ggml type, batch sizes that do not divide the dataset or are not a multiple of the shard size,
losses that need labels given a dataset without them (and the reverse), invalid optimizer
parameters, ops without a backward pass, graphs larger than ggml-opt's 2048-node graphs. An
exception raised by a Python callback (per-batch callback, optimizer schedule, a Python
backend's compute) is re-raised by the call that ran ggml.

**Ctrl-C** during :func:`fit` / :func:`epoch` (main thread) stops training cleanly after the
batch being computed: the model keeps every completed optimizer step and can be evaluated and
saved; :attr:`History.stopped` says ``"interrupt"``. A second Ctrl-C raises KeyboardInterrupt
at once (the interrupted optimizer step may then be partly applied).

**Progress.** On a terminal (stderr a TTY) a bar per epoch and phase shows loss and accuracy
with ggml's uncertainties after each batch: tqdm's if it is installed (``pip install tqdm``),
else ggml's own ``ggml_opt_epoch_callback_progress_bar``. ``progress=False`` (and a stderr
that is not a TTY) keeps it quiet; per-epoch summaries go to the ``pyggml.opt`` logger (INFO).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Iterator, Mapping, Union

import numpy as np

from . import _cobject, types
from ._cobject import CObject
from .backend import Backend
from .context import Context
from .cpu import CPUBackend
from .device import device_by_name
from .enums import GGMLType
from .errors import BackendNotAvailableError
from .gguf import GGUFFile, GGUFWriter
from .graph import Graph
from .raw import callbacks, ffi, lib
from .raw.boundary import calling
from .sched import Scheduler
from .tensor import BorrowScope, Tensor

__all__ = ["Loss", "BuildType", "AdamW", "SGD", "OptimizerParams", "Schedule", "default_optimizer_params",
           "Dataset", "Result", "Metrics", "Model", "ModelGraph", "OptContext", "BatchInfo",
           "EpochResult", "History", "epoch", "fit", "evaluate", "one_hot", "GRAPH_SIZE"]

logger = logging.getLogger("pyggml.opt")

#: nodes (and leafs) of the graphs ``ggml_opt_init`` makes (GGML_DEFAULT_GRAPH_SIZE): a model
#: whose forward + backward + optimizer graph has more cannot be trained with ggml-opt
GRAPH_SIZE = lib.GGML_DEFAULT_GRAPH_SIZE


# =============================================================================================
# tensors of ggml-opt's own contexts
# =============================================================================================

class _Lender(BorrowScope):
    """What the tensors of a ggml-opt object (a dataset's data and labels, an opt context's
    labels, loss, pred, ncorrect, gradient accumulators) are borrowed from: their structs live in
    contexts private to ggml-opt, so no pyggml :class:`Context` holds them. The scope closes
    with the object (the tensors then raise ClosedError); it keeps the object alive while a
    tensor lives."""

    __slots__ = ("obj",)

    def __init__(self, name: str, obj: CObject):
        super().__init__(name)
        self.obj = obj


def _borrowed_tensor(ptr: Any, scope: BorrowScope) -> Tensor:
    """A :class:`Tensor` for a tensor whose struct ggml-opt owns, borrowed from ``scope``."""
    return Tensor(ptr, scope)


# =============================================================================================
# enums and optimizer parameters
# =============================================================================================

class Loss(IntEnum):
    """``enum ggml_opt_loss_type``: the quantity the optimizer minimizes.

    * ``MEAN``: mean of the outputs (a custom loss computed by the model); no labels.
    * ``SUM``: sum of the outputs; no labels.
    * ``CROSS_ENTROPY``: ``ggml_cross_entropy_loss(outputs, labels)``, the mean over datapoints
      of ``-sum(labels * log_softmax(outputs))``; labels are probabilities (one-hot for
      classes, see :func:`one_hot`). Also gives predictions (argmax) and accuracy.
    * ``MEAN_SQUARED_ERROR``: mean of ``(outputs - labels)**2``.
    """
    MEAN = lib.GGML_OPT_LOSS_TYPE_MEAN
    SUM = lib.GGML_OPT_LOSS_TYPE_SUM
    CROSS_ENTROPY = lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY
    MEAN_SQUARED_ERROR = lib.GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR

    @property
    def needs_labels(self) -> bool:
        return self in (Loss.CROSS_ENTROPY, Loss.MEAN_SQUARED_ERROR)

    @classmethod
    def of(cls, loss: "Loss | str | int") -> "Loss":
        """``Loss.CROSS_ENTROPY``, ``"cross_entropy"``, ``"mse"``... -> Loss; ValueError otherwise."""
        if isinstance(loss, str):
            key = {"mse": "MEAN_SQUARED_ERROR", "ce": "CROSS_ENTROPY"}.get(loss.lower(), loss.upper())
            if key in cls.__members__:
                return cls[key]
            raise ValueError(f"unknown loss {loss!r}; one of {[m.lower() for m in cls.__members__]}")
        try:
            return cls(loss)
        except ValueError:
            raise ValueError(f"unknown loss {loss!r}") from None


class BuildType(IntEnum):
    """``enum ggml_opt_build_type``: which graphs an :class:`OptContext` builds."""
    FORWARD = lib.GGML_OPT_BUILD_TYPE_FORWARD  #: forward pass and loss only (evaluation)
    GRAD = lib.GGML_OPT_BUILD_TYPE_GRAD        #: + backward pass (gradients, no optimizer step)
    OPT = lib.GGML_OPT_BUILD_TYPE_OPT          #: + optimizer step (training)


def _check_range(name: str, value: float, lo: float, hi: float | None, lo_open: bool = False) -> float:
    v = float(value)
    bad = math.isnan(v) or (v <= lo if lo_open else v < lo) or (hi is not None and v > hi)
    if bad:
        span = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}{']' if hi is not None else ')'}"
        raise ValueError(f"{name} must be in {span}, got {value!r} (ggml-opt asserts it)")
    return v


@dataclass(frozen=True)
class AdamW:
    """AdamW parameters (``ggml_opt_optimizer_params.adamw``; defaults are
    ``ggml_opt_get_default_optimizer_params``). Raises ValueError for values ggml asserts on.

    ``alpha`` is the learning rate; ``wd`` the decoupled weight decay (each step multiplies the
    weights by ``1 - alpha * wd``, as PyTorch's AdamW with ``weight_decay=wd``); ``eps`` is added
    to the square root of the second moment. Bias correction uses the step count of the
    :class:`OptContext` (``ggml_opt_reset(..., optimizer=True)`` restarts it).
    """
    alpha: float = 1e-3  #: learning rate, > 0
    beta1: float = 0.9   #: first-moment decay, [0, 1]
    beta2: float = 0.999  #: second-moment decay, [0, 1]
    eps: float = 1e-8    #: >= 0
    wd: float = 0.0      #: weight decay, [0, 1]

    def __post_init__(self) -> None:
        _check_range("AdamW alpha", self.alpha, 0.0, None, lo_open=True)
        _check_range("AdamW beta1", self.beta1, 0.0, 1.0)
        _check_range("AdamW beta2", self.beta2, 0.0, 1.0)
        _check_range("AdamW eps", self.eps, 0.0, None)
        _check_range("AdamW wd", self.wd, 0.0, 1.0)

    optimizer_type = lib.GGML_OPT_OPTIMIZER_TYPE_ADAMW


@dataclass(frozen=True)
class SGD:
    """SGD parameters (``ggml_opt_optimizer_params.sgd``; defaults as ggml's). ``alpha`` is the
    learning rate (> 0), ``wd`` the weight decay in [0, 1] (``x -= alpha * (grad + wd * x)``).
    Raises ValueError for values ggml asserts on."""
    alpha: float = 1e-3
    wd: float = 0.0

    def __post_init__(self) -> None:
        _check_range("SGD alpha", self.alpha, 0.0, None, lo_open=True)
        _check_range("SGD wd", self.wd, 0.0, 1.0)

    optimizer_type = lib.GGML_OPT_OPTIMIZER_TYPE_SGD


OptimizerParams = Union[AdamW, SGD]
#: per-epoch optimizer parameters: ``schedule(epoch) -> AdamW | SGD``, ``epoch`` counted from 1
#: as ``ggml_opt_fit`` counts it (e.g. a learning-rate schedule)
Schedule = Callable[[int], OptimizerParams]


def default_optimizer_params() -> AdamW:
    """ggml's defaults (``ggml_opt_get_default_optimizer_params``) as :class:`AdamW`."""
    p = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
    return AdamW(p.adamw.alpha, p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd)


def _fill_params(c: Any, p: OptimizerParams) -> None:
    """Write ``p`` into a ``struct ggml_opt_optimizer_params`` (the other optimizer's half keeps
    ggml's defaults)."""
    d = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
    c.adamw.alpha, c.adamw.beta1, c.adamw.beta2 = d.adamw.alpha, d.adamw.beta1, d.adamw.beta2
    c.adamw.eps, c.adamw.wd, c.sgd.alpha, c.sgd.wd = d.adamw.eps, d.adamw.wd, d.sgd.alpha, d.sgd.wd
    if isinstance(p, AdamW):
        c.adamw.alpha, c.adamw.beta1, c.adamw.beta2, c.adamw.eps, c.adamw.wd = p.alpha, p.beta1, p.beta2, p.eps, p.wd
    else:
        c.sgd.alpha, c.sgd.wd = p.alpha, p.wd


def _check_params(p: Any, what: str) -> OptimizerParams:
    if not isinstance(p, (AdamW, SGD)):
        raise TypeError(f"{what} must be opt.AdamW or opt.SGD, got {type(p).__name__}")
    # float32 rounding can push a value ggml checks out of range (alpha 1e-50 -> 0)
    c = ffi.new("struct ggml_opt_optimizer_params *")
    _fill_params(c, p)
    if isinstance(p, AdamW) and not c.adamw.alpha > 0 or isinstance(p, SGD) and not c.sgd.alpha > 0:
        raise ValueError(f"{what}: alpha {p.alpha!r} is 0 as a float32 (ggml asserts alpha > 0)")
    return p


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


# =============================================================================================
# Dataset
# =============================================================================================

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

    def shuffle(self, opt_ctx: "OptContext", idata: int = -1) -> None:
        """``ggml_opt_dataset_shuffle``: shuffle the shards of the first ``idata`` datapoints
        (all for -1) with ``opt_ctx``'s random generator. Raises ValueError if ``idata`` exceeds
        ``ndata`` or is not a multiple of the shard size."""
        if not isinstance(opt_ctx, OptContext):
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

    @_cobject.guarded
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


# =============================================================================================
# Result
# =============================================================================================

@dataclass(frozen=True)
class Metrics:
    """Loss and accuracy of a :class:`Result` at one moment, with ggml's uncertainties (one
    standard error: of the mean batch loss, and ``sqrt(acc * (1 - acc) / (ndata - 1))``). NaN
    where ggml has no value (accuracy of losses without predictions, uncertainties of < 2
    batches)."""
    ndata: int
    loss: float
    loss_unc: float
    accuracy: float
    accuracy_unc: float

    def __str__(self) -> str:
        acc = "" if math.isnan(self.accuracy) else \
            f", accuracy {100 * self.accuracy:.2f} ± {100 * self.accuracy_unc:.2f} %"
        return f"loss {self.loss:.5f} ± {self.loss_unc:.5f}{acc} ({self.ndata} datapoints)"


class Result(CObject):
    """``ggml_opt_result``: what evaluations add up (``ggml_opt_result_init`` / ``_free``), owned.

    ggml accumulates, per physical batch, the loss and (for CROSS_ENTROPY) the predictions and
    the count of correct ones. A result may only be incremented by :class:`OptContext` s with
    the same batch size, loss reduction and ``opt_period`` until :meth:`reset` (ggml asserts
    it; here: ValueError).
    """

    _kind = "result"
    _c_free = lib.ggml_opt_result_free

    def __init__(self) -> None:
        super().__init__(lib.ggml_opt_result_init(), owned=True)
        self._signature: tuple[Any, ...] | None = None
        self._has_pred = False

    @_cobject.guarded
    def reset(self) -> None:
        """``ggml_opt_result_reset``: forget everything."""
        lib.ggml_opt_result_reset(self.ptr)
        self._signature = None
        self._has_pred = False

    def _accept(self, opt_ctx: "OptContext") -> None:
        sig = (opt_ctx.batch_size, opt_ctx.loss_type in (Loss.MEAN, Loss.CROSS_ENTROPY, Loss.MEAN_SQUARED_ERROR),
               opt_ctx.opt_period)
        if self.ndata and self._signature is not None and sig != self._signature:
            raise ValueError("this Result holds evaluations of another batch size, loss reduction or "
                             "opt_period (ggml asserts they agree): reset() it or use a new Result")
        self._signature = sig
        # ggml keeps predictions only while every evaluation made them
        self._has_pred = (self._has_pred or not self.ndata) and opt_ctx.loss_type == Loss.CROSS_ENTROPY

    @property
    def ndata(self) -> int:
        """Datapoints evaluated (``ggml_opt_result_ndata``)."""
        n = ffi.new("int64_t *")
        lib.ggml_opt_result_ndata(self.ptr, n)
        return int(n[0])

    @property
    def loss(self) -> float:
        """Mean loss per datapoint (sum for SUM) (``ggml_opt_result_loss``); 0.0 before any batch."""
        return self._loss()[0]

    @property
    def loss_unc(self) -> float:
        """Its uncertainty (standard error over the batches); NaN with < 2 batches."""
        return self._loss()[1]

    def _loss(self) -> tuple[float, float]:
        v, u = ffi.new("double *"), ffi.new("double *")
        lib.ggml_opt_result_loss(self.ptr, v, u)
        return float(v[0]), float(u[0])

    def _accuracy(self) -> tuple[float, float]:
        v, u = ffi.new("double *"), ffi.new("double *")
        lib.ggml_opt_result_accuracy(self.ptr, v, u)
        return float(v[0]), float(u[0])

    @property
    def accuracy(self) -> float:
        """Fraction of datapoints whose argmax output equals the argmax label
        (``ggml_opt_result_accuracy``); NaN for losses other than CROSS_ENTROPY."""
        return self._accuracy()[0]

    @property
    def accuracy_unc(self) -> float:
        """``sqrt(acc * (1 - acc) / (ndata - 1))``; NaN for < 2 datapoints."""
        return self._accuracy()[1]

    def pred(self) -> np.ndarray:
        """The predicted class (argmax of the outputs) of every datapoint evaluated, in
        evaluation order (the dataset's shuffled order): int32 ``(ndata,)``
        (``ggml_opt_result_pred``). ValueError for losses without predictions."""
        if not self._has_pred:
            raise ValueError("no predictions: only Loss.CROSS_ENTROPY evaluations predict classes")
        out = np.empty(self.ndata, dtype=np.int32)
        if out.size:
            lib.ggml_opt_result_pred(self.ptr, ffi.from_buffer("int32_t[]", out))
        return out

    def metrics(self) -> Metrics:
        """A snapshot of :attr:`loss`, :attr:`accuracy` and their uncertainties."""
        loss, lu = self._loss()
        acc, au = self._accuracy()
        return Metrics(self.ndata, loss, lu, acc, au)

    def __repr__(self) -> str:
        return "<Result (closed)>" if self.closed else f"<Result {self.metrics()}>"


# =============================================================================================
# Model
# =============================================================================================

def _default_threads() -> int:
    """ggml's MNIST example: ``min(ncores, (ncores + 4) / 2)`` CPU threads."""
    n = os.cpu_count() or 1
    return max(1, min(n, (n + 4) // 2))


def _resolve_backends(backend: Any, n_threads: int | None) -> tuple[list[Backend], list[Backend]]:
    """([primary, ..., CPU], the backends made here): a device name (``"CPU"``, ``"CUDA0"``,
    ``"Vulkan0"``, ``"NUMPY"``...) or a Backend, then a CPU backend as the fallback ggml's
    scheduler requires last; or a list of backends as given."""
    nt = _default_threads() if n_threads is None else n_threads
    if backend is None:
        cpu = CPUBackend(n_threads=nt)
        return [cpu], [cpu]
    if isinstance(backend, (list, tuple)):
        out = list(backend)
        if not out or not all(isinstance(b, Backend) for b in out):
            raise TypeError("backend list must hold pyggml Backend objects")
        return out, []
    made = []
    if isinstance(backend, str):
        try:
            dev = device_by_name(backend)
        except BackendNotAvailableError as e:
            if backend.upper() != "NUMPY":
                raise
            # a backend of pyggml.impl (the layer above this one): the user registers it
            raise BackendNotAvailableError(f"{e.args[0]} (register pyggml's NumPy backend first: "
                                           "pyggml.impl.numpy.register())") from None
        backend = dev.init()
        made.append(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a device name, a Backend or a list of them, not {type(backend).__name__}")
    if isinstance(backend, CPUBackend):
        if n_threads is not None or made:
            backend.n_threads = nt
        return [backend], made
    if made:  # e.g. BLAS: as many threads as the CPU backend (a GPU backend has no such setting)
        backend.set_n_threads(nt)
    cpu = CPUBackend(n_threads=nt)
    return [backend, cpu], made + [cpu]


class Model:
    """Trainable parameters, the backends they live on, and the graph that computes outputs
    from inputs.

    Define a model PyTorch-style: subclass and create parameters with :meth:`param` in
    ``__init__``, and implement :meth:`forward` with ggml ops (or pass ``forward=``). The
    parameters live in one ``no_alloc`` context (``ggml_set_param``) and are allocated together
    on the first backend (the first use of the model, or :meth:`allocate`); ggml-opt trains
    them in place. Each graph the model is used in (:class:`ModelGraph`: one per batch size and
    per :class:`OptContext`) calls :meth:`forward` again, on its own inputs tensor.

    ``backend``: None (the CPU), a device name (``"CPU"``, ``"CUDA0"``, ``"Vulkan0"``,
    ``"NUMPY"`` for pyggml's NumPy backend once ``pyggml.impl.numpy.register()`` has registered
    it...), a :class:`Backend`, or a list of backends for the
    scheduler (the last one a CPU backend). A single non-CPU backend gets a CPU backend added
    after it, for the ops it does not support. ``n_threads``: CPU threads (default: as ggml's
    MNIST example, ``min(ncores, (ncores + 4) // 2)``). ``max_params``: capacity of the
    parameter context, in tensors.

    Raises :class:`~pyggml.errors.BackendNotAvailableError` for an unknown device name.
    """

    def __init__(self, backend: Any = None, *, n_threads: int | None = None,
                 forward: Callable[[Context, Tensor], Tensor] | None = None, max_params: int = 4096,
                 arch: str | None = None):
        self.backends, self._made = _resolve_backends(backend, n_threads)
        self.params_ctx = Context.for_tensors(max_params)
        self.params: dict[str, Tensor] = {}
        self._init: dict[str, np.ndarray] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._buffer: Any = None
        self._forward = forward
        self._predict: ModelGraph | None = None
        self.arch = arch

    # ------------------------------------------------------------------ parameters
    def param(self, name: str, init: Any, *, trainable: bool = True) -> Tensor:
        """A new F32 parameter named ``name`` with initial values ``init`` (NumPy order: shape
        ``(rows, cols)`` is ggml ``ne [cols, rows]``; PyTorch's ``nn.Linear(784, 500).weight``
        layout (500, 784) gives the ``ne [784, 500]`` that ``ggml_mul_mat(w, x)`` takes).
        ``trainable=False`` makes a constant (no ``ggml_set_param``).

        Raises ValueError for a duplicate or too long name, more than 4 dims, or a model
        already allocated; TypeError for non-numeric ``init``.
        """
        if self._buffer is not None:
            raise ValueError("the model's parameters are already allocated: create every param() first")
        if not isinstance(name, str) or not name:
            raise ValueError("a parameter needs a non-empty name")
        if name in self.params:
            raise ValueError(f"duplicate parameter name {name!r}")
        a = np.asarray(init)
        if a.dtype.kind not in "fiub":
            raise TypeError(f"parameter {name!r}: initial values of dtype {a.dtype}")
        if not 0 <= a.ndim <= lib.GGML_MAX_DIMS:
            raise ValueError(f"parameter {name!r}: {a.ndim} dims, ggml has at most {lib.GGML_MAX_DIMS}")
        t = self.params_ctx.new_tensor(GGMLType.F32, a.shape[::-1] or (1,), name=name)
        if trainable:
            t.set_param()
        self.params[name] = t
        self._init[name] = np.array(a, dtype=np.float32)
        self._shapes[name] = a.shape
        return t

    @property
    def allocated(self) -> bool:
        return self._buffer is not None

    def allocate(self) -> None:
        """Allocate every parameter in one buffer of the first backend
        (``ggml_backend_alloc_ctx_tensors``) and copy the initial values in. Done on first use;
        idempotent. ValueError if the model has no parameters."""
        if self._buffer is not None:
            return
        if not self.params:
            raise ValueError("the model has no parameters: create them with param()")
        self._buffer = self.params_ctx.alloc_tensors(self.backends[0])
        self._buffer.usage = "weights"
        for name, t in self.params.items():
            t.set(self._init.pop(name))

    # ------------------------------------------------------------------ graph
    def forward(self, ctx: Context, inputs: Tensor) -> Tensor:
        """The outputs for ``inputs`` (``ne [ne_datapoint, batch]``), built with ops of ``ctx``
        (a ``no_alloc`` compute context): ``ne [n_outputs, batch]``, F32. Override it, or pass
        ``forward=`` to the constructor; with neither, NotImplementedError (as
        ``torch.nn.Module.forward``: the model has no computation to build)."""
        if self._forward is None:
            raise NotImplementedError("define Model.forward(ctx, inputs) or pass forward=")
        return self._forward(ctx, inputs)

    def graph(self, batch_size: int, ne_datapoint: int, type: Any = GGMLType.F32) -> "ModelGraph":
        """A new :class:`ModelGraph` of this model for batches of ``batch_size`` datapoints of
        ``ne_datapoint`` elements of ggml ``type``."""
        return ModelGraph(self, batch_size, ne_datapoint, type)

    # ------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter's values, float32 copies in the NumPy shape it was created with."""
        self.allocate()
        return {name: t.numpy().reshape(self._shapes[name]) for name, t in self.params.items()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Set parameters from ``{name: array}`` (NumPy order). ``strict``: every parameter
        must be given and no other name. KeyError/ValueError on a mismatch."""
        self.allocate()
        missing = [n for n in self.params if n not in state]
        extra = [n for n in state if n not in self.params]
        if strict and (missing or extra):
            raise KeyError(f"state does not match the model: missing {missing}, unexpected {extra}")
        for name, value in state.items():
            if name not in self.params:
                continue
            t, a = self.params[name], np.asarray(value)
            if tuple(a.shape) not in (t.shape, self._shapes[name]):
                raise ValueError(f"parameter {name!r} has shape {t.shape} (ne {list(t.ne)}), given {a.shape}")
            t.set(a)

    def save(self, path: "str | os.PathLike[str]", metadata: Mapping[str, Any] | None = None,
             arch: str | None = None) -> None:
        """Write the parameters to a GGUF file (``pyggml.gguf.GGUFWriter``): one F32 tensor per
        parameter, same name and ``ne``; ``general.architecture`` = ``arch`` (default
        the ``arch`` given to the constructor) if set, plus ``metadata``. ggml's ``examples/mnist/mnist-eval`` reads the
        file of a model with its architecture and tensor names."""
        self.allocate()
        with GGUFWriter() as w:
            arch = arch or self.arch
            if arch:
                w.add_value("general.architecture", arch)
            for k, v in (metadata or {}).items():
                w.add_value(k, v)
            for name, t in self.params.items():
                w.add_tensor(name, t.numpy(), ne=list(t.ne[:t.n_dims]))
            w.write(path)

    def load(self, path: "str | os.PathLike[str]", strict: bool = True) -> dict[str, Any]:
        """Read the parameters from a GGUF file written by :meth:`save` (or ggml's MNIST
        example): tensors matched by name; each must have the parameter's ``ne`` (trailing 1s
        aside); any type ggml can dequantize. ``strict``: the file must hold every parameter
        and nothing else. Returns the file's metadata as a dict. Raises KeyError/ValueError on
        a mismatch, as :class:`~pyggml.gguf.GGUFFile` for unreadable files."""
        self.allocate()
        with GGUFFile(path) as f:
            names = {t.name for t in f.tensors}
            missing = [n for n in self.params if n not in names]
            extra = sorted(names - set(self.params))
            if missing or (strict and extra):
                raise KeyError(f"{os.fspath(path)!r} does not match the model: missing {missing}"
                               + (f", unexpected {extra}" if strict and extra else ""))
            for name, t in self.params.items():
                info = f.tensor_info(name)
                ne_file = tuple(info.ne) + (1,) * (4 - len(info.ne))
                if ne_file != t.ne:
                    raise ValueError(f"tensor {name!r} has ne {list(ne_file)} in the file, the model's is {list(t.ne)}")
                t.set(f.array(name))
            return dict(f.metadata)

    # ------------------------------------------------------------------ inference
    def predict(self, x: Any, batch_size: int | None = None, type: Any = None) -> np.ndarray:
        """The outputs for NumPy inputs ``x`` ``(n, *datapoint_shape)``: float32
        ``(n, n_outputs)``, computed batch by batch (``batch_size``, default ``min(n, 1000)``;
        the last batch is padded with zeros) on the model's backends through a
        :class:`~pyggml.sched.Scheduler`. ``type``: the inputs' ggml type (default as
        :class:`Dataset`)."""
        a = np.asarray(x)
        n = a.shape[0] if a.ndim else 0
        if n == 0:
            raise ValueError("predict needs at least one datapoint (shape (n, ...))")
        a, ne = _as_rows(a, n, "x")
        t = _resolve_type(a, type, ne, "x")
        bs = min(n, 1000) if batch_size is None else int(batch_size)
        if bs < 1:
            raise ValueError("batch_size must be >= 1")
        g = self._predict
        if g is None or (g.batch_size, g.ne_datapoint, g.type) != (bs, ne, t):
            if g is not None:
                g.close()
            g = self._predict = ModelGraph(self, bs, ne, t)
            g.graph = g.ctx.new_graph(2 * GRAPH_SIZE).build_forward(g.outputs)
            g.sched.alloc_graph(g.graph)
        assert g.graph is not None
        out = np.empty((n, g.outputs.ne[0]), dtype=np.float32)
        batch = np.zeros((bs, ne), dtype=a.dtype)
        for start in range(0, n, bs):
            m = min(bs, n - start)
            batch[:m] = a[start:start + m]
            batch[m:] = 0
            g.inputs.set(batch)
            g.sched.compute(g.graph)
            out[start:start + m] = g.outputs.numpy().reshape(bs, -1)[:m]
        return out

    def close(self) -> None:
        """Free the parameters, the inference graph and the backends this model made."""
        if self._predict is not None:
            self._predict.close()
            self._predict = None
        self.params_ctx.close()
        for b in self._made:
            b.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        n = sum(t.nelements for t in self.params.values()) if not self.params_ctx.closed else 0
        return (f"<{type(self).__name__} {len(self.params)} params ({n} values) on "
                f"{[b.name for b in self.backends]}>")


def _compute_mem(n_graphs: int) -> int:
    """Bytes of a ``no_alloc`` compute context for a model graph and ``n_graphs`` graphs of
    ggml-opt's size with gradients, holding up to 6 tensors per graph node."""
    return (6 * GRAPH_SIZE * lib.ggml_tensor_overhead()
            + n_graphs * lib.ggml_graph_overhead_custom(2 * GRAPH_SIZE, True) + (1 << 16))


class ModelGraph:
    """A model's graph for one batch size: a statically allocated inputs tensor
    ``ne [ne_datapoint, batch_size]`` (on the model's first backend, as ggml-opt requires), a
    ``no_alloc`` compute context, the outputs :meth:`Model.forward` built in it, and a
    :class:`~pyggml.sched.Scheduler` over the model's backends.

    Raises ValueError/TypeError if the outputs are not ``ne [n, batch_size]`` F32 or the graph
    does not depend on the inputs.
    """

    def __init__(self, model: Model, batch_size: int, ne_datapoint: int, type: Any = GGMLType.F32,
                 n_graphs: int = 4):
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        self.model = model
        self.batch_size = int(batch_size)
        self.ne_datapoint = int(ne_datapoint)
        self.type = types.ggml_type(type)
        self.graph: Graph | None = None
        model.allocate()
        self.inputs_ctx = Context.for_tensors(1)
        try:
            self.inputs = self.inputs_ctx.new_tensor(self.type, [self.ne_datapoint, self.batch_size], name="inputs")
            self.inputs.set_input()
            self.inputs_ctx.alloc_tensors(model.backends[0])
            self.ctx = Context(_compute_mem(n_graphs), no_alloc=True)
            out = model.forward(self.ctx, self.inputs)
            if not isinstance(out, Tensor):
                raise TypeError(f"Model.forward must return a pyggml Tensor, not {out.__class__.__name__}")
            if out.type != GGMLType.F32:
                raise TypeError(f"the outputs must be F32 (ggml-opt's losses are F32), got {out.type_name}")
            if out.ne[1] != self.batch_size or out.ne[2] != 1 or out.ne[3] != 1:
                raise ValueError(f"the outputs must be ne [n_outputs, batch_size={self.batch_size}] "
                                 f"(ggml-opt reads ne[1] as the datapoints), got ne {list(out.ne)}")
            if out.ptr == self.inputs.ptr:
                raise ValueError("the outputs are the inputs: the model computes nothing")
            if not out.name:
                out.name = "outputs"
            out.set_output()
            self.outputs = out
            self.sched = Scheduler(model.backends, graph_size=2 * GRAPH_SIZE)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the scheduler, the compute context and the inputs."""
        for name in ("sched", "ctx", "inputs_ctx"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()


# =============================================================================================
# OptContext
# =============================================================================================

def _check_graph(g: ModelGraph, loss_type: Loss, build_type: BuildType, opt_period: int = 1) -> None:
    """Build, in a scratch context, what ``ggml_opt_init`` will build (loss, and for training
    the backward graph) with pyggml's checked ops and :meth:`Graph.build_backward`, so that
    anything ggml would abort on raises here; and check the node counts against ggml-opt's
    graph size. Without gradient accumulation (``opt_period`` 1) ggml's optimizer steps read
    each parameter's gradient as built, at the parameter's strides: a gradient that is a
    transposed or permuted view is refused."""
    outputs = g.outputs
    params = [t for t in g.model.params.values() if t.flags & lib.GGML_TENSOR_FLAG_PARAM]
    scratch = Context(_compute_mem(2) + 16 * GRAPH_SIZE * lib.ggml_tensor_overhead(), no_alloc=True)
    try:
        fwd = scratch.new_graph(4 * GRAPH_SIZE, grads=True).build_forward(outputs)
        for t in fwd.nodes:
            if t.flags & lib.GGML_TENSOR_FLAG_LOSS:
                raise ValueError(f"node {t.name!r} is marked as a loss (set_loss): ggml-opt adds the "
                                 "loss itself (extra loss terms are not supported)")
        if fwd.n_nodes + 8 >= GRAPH_SIZE or len(fwd.leafs) + 8 >= GRAPH_SIZE:
            raise ValueError(f"the model graph has {fwd.n_nodes} nodes and {len(fwd.leafs)} leafs: "
                             f"ggml-opt's graphs hold fewer than {GRAPH_SIZE}")
        if not any(s.ptr == g.inputs.ptr for s in fwd.leafs):
            raise ValueError("the outputs do not depend on the inputs tensor")
        if loss_type in (Loss.CROSS_ENTROPY, Loss.MEAN_SQUARED_ERROR):
            labels = scratch.new_tensor(outputs.type, list(outputs.ne), name="labels")
        if loss_type == Loss.CROSS_ENTROPY:
            loss = scratch.cross_entropy_loss(outputs, labels)
            scratch.argmax(outputs)  # ggml-opt's predictions: asserts a matrix
        elif loss_type == Loss.MEAN_SQUARED_ERROR:
            loss = scratch.scale(scratch.sum(scratch.sqr(scratch.sub(outputs, labels))), 1.0)
        else:
            loss = scratch.sum(outputs)
        loss.set_loss()  # F32 scalar, as ggml_set_loss asserts
        g_train = scratch.new_graph(4 * GRAPH_SIZE, grads=True).build_forward(loss)
        if build_type != BuildType.FORWARD:
            if not params:
                raise ValueError("the model has no trainable parameter in this graph (Model.param)")
            g_train.build_backward(scratch)  # raises for ops without a backward pass, in-place ops...
        # the scheduler aborts on a node no backend supports (the optimizer steps are F32 ops
        # every CPU backend has, and the CPU backend comes last)
        for t in g_train.nodes:
            if not t.is_empty_op() and not any(b.supports_op(t) for b in g.model.backends):
                srcs = ", ".join(s.type_name for s in t.src)
                why = "; ".join(f"{b.name}: {b._why_not(t._ptr)}" for b in g.model.backends)
                raise ValueError(f"no backend of the model ({', '.join(b.name for b in g.model.backends)}) "
                                 f"can compute {t.op_name} of {srcs} -> {t.type_name} ({t.name!r}): {why}")
        if build_type == BuildType.FORWARD:
            return
        n_steps = sum(1 for t in g_train.nodes if t.flags & lib.GGML_TENSOR_FLAG_PARAM)
        if g_train.n_nodes + n_steps + 8 >= GRAPH_SIZE or len(g_train.leafs) + 2 * n_steps + 8 >= GRAPH_SIZE:
            raise ValueError(f"the training graph has {g_train.n_nodes + n_steps} nodes and "
                             f"{len(g_train.leafs) + 2 * n_steps} leafs: ggml-opt's graphs hold fewer "
                             f"than {GRAPH_SIZE}")
        for t in g_train.nodes:
            if t.flags & lib.GGML_TENSOR_FLAG_PARAM and t.type != GGMLType.F32:
                raise TypeError(f"parameter {t.name!r} is {t.type_name}: ggml's optimizer steps are F32 only")
        if opt_period == 1:  # else ggml-opt accumulates into a contiguous tensor and steps from that
            for t in params:
                grad = g_train.grad(t)
                if grad is not None and not lib.ggml_is_contiguous(grad.ptr):
                    raise ValueError(
                        f"parameter {t.name!r} reaches the loss only through a transpose or permute, so "
                        "ggml's gradient of it is a transposed or permuted view, and ggml's optimizer step "
                        "(OPT_STEP_ADAMW / OPT_STEP_SGD) reads it at the parameter's strides (a scrambled "
                        "update, no error): store the parameter in the layout the model uses it in, or "
                        "accumulate gradients (opt_period > 1, nbatch_logical > batch_size)")
    finally:
        scratch.close()


class OptContext(CObject):
    """``ggml_opt_context``: a model's graph with the loss, the backward pass and the optimizer
    step, built once for a fixed batch size (``ggml_opt_init`` with static graphs), owned.

    Made by :func:`fit` and :func:`evaluate`; make one yourself to write your own loop with
    :func:`epoch`. Each OptContext has its own :class:`ModelGraph` (inputs, compute context,
    scheduler), so that several can share the model's parameters (ggml-opt keeps a scheduler's
    allocation between batches).

    ``batch_size``: datapoints per physical batch (``inputs ne[1]``); ``ne_datapoint`` and
    ``type``: the inputs, as in the :class:`Dataset` (or pass ``dataset=`` to take them from it).
    ``loss``: a :class:`Loss`. ``optimizer``: :class:`AdamW` or :class:`SGD` parameters, or a
    :data:`Schedule` ``epoch -> params`` evaluated at the start of each epoch (ggml's
    ``ggml_opt_get_optimizer_params`` callback returns them to ``ggml_opt_eval``).
    ``opt_period``: physical batches per optimizer step (gradient accumulation).
    ``build_type``: :class:`BuildType` OPT, or FORWARD for evaluation only (GRAD is refused:
    ``ggml_opt_init`` aborts on it with static graphs, in ggml 0.20.2 and 0.25.3 alike).

    Raises ValueError/TypeError (see :func:`_check_graph`) for anything ``ggml_opt_init`` would
    abort on.
    """

    _kind = "opt context"
    _c_free = lib.ggml_opt_free

    def _free(self, ptr: Any) -> None:
        with calling():  # frees the buffers of the model's backends (Python buffers call back)
            lib.ggml_opt_free(ptr)

    def __init__(self, model: Model, *, batch_size: int, ne_datapoint: int | None = None,
                 type: Any = None, dataset: Dataset | None = None,
                 loss: "Loss | str" = Loss.CROSS_ENTROPY,
                 optimizer: "OptimizerParams | Schedule | None" = None, opt_period: int = 1,
                 build_type: "BuildType | str" = BuildType.OPT):
        if dataset is not None:
            ne_datapoint = dataset.ne_datapoint if ne_datapoint is None else ne_datapoint
            type = dataset.type if type is None else type
            dataset.check_batch_size(batch_size)
        if ne_datapoint is None:
            raise ValueError("OptContext needs ne_datapoint (or dataset=)")
        self.loss_type = Loss.of(loss)
        try:
            self.build_type = BuildType[build_type.upper()] if isinstance(build_type, str) else BuildType(build_type)
        except (KeyError, ValueError):
            raise ValueError(f"unknown build_type {build_type!r}: forward, grad or opt") from None
        if self.build_type == BuildType.GRAD:
            # ggml-opt.cpp (0.20.2 and 0.25.3: same file) ggml_opt_build: with static graphs, the GRAD branch
            # allocates and then falls through to GGML_ASSERT(build_type_alloc == OPT): abort
            raise ValueError("ggml cannot build an OptContext of build_type GRAD (ggml_opt_init "
                             "would abort: ggml-opt.cpp:501); use OPT, or FORWARD to evaluate")
        if not isinstance(opt_period, (int, np.integer)) or opt_period < 1:
            raise ValueError(f"opt_period must be an integer >= 1, got {opt_period!r}")
        self.opt_period = int(opt_period)
        optimizer = AdamW() if optimizer is None else optimizer
        if isinstance(optimizer, (AdamW, SGD)):
            self._schedule: Schedule | None = None
            first = _check_params(optimizer, "optimizer")
        elif callable(optimizer):
            self._schedule = optimizer
            first = _check_params(optimizer(1), "the optimizer schedule's result for epoch 1")
        else:
            raise TypeError("optimizer must be opt.AdamW(...), opt.SGD(...) or a callable epoch -> params")
        self._params_cls = first.__class__
        self.current_epoch = 1  #: the epoch number the optimizer schedule is asked for next
        self._c_params = ffi.new("struct ggml_opt_optimizer_params *")
        _fill_params(self._c_params, first)
        self.graph = ModelGraph(model, batch_size, ne_datapoint, GGMLType.F32 if type is None else type)
        try:
            _check_graph(self.graph, self.loss_type, self.build_type, self.opt_period)
            self._get_params_cb = callbacks.Callback("ggml_opt_get_optimizer_params", self._get_params)
            p = lib.ggml_opt_default_params(self.graph.sched.ptr, self.loss_type)
            p.ctx_compute = self.graph.ctx._live_ptr()
            p.inputs = self.graph.inputs.ptr
            p.outputs = self.graph.outputs.ptr
            p.build_type = self.build_type
            p.opt_period = self.opt_period
            p.get_opt_pars = self._get_params_cb.fn
            p.get_opt_pars_ud = self._get_params_cb.user_data
            p.optimizer = first.optimizer_type
            with calling(self.graph.ctx):  # allocates on the model's backends' buffer types
                ptr = lib.ggml_opt_init(p)
            self.graph.ctx._recount()  # ggml-opt made its graphs and gradient nodes there
        except BaseException:
            self.graph.close()
            raise
        super().__init__(ptr, owned=True)
        self._scope = _Lender("a ggml-opt context", self)
        self.model = model
        self._eval_ready = False

    # ------------------------------------------------------------------ optimizer parameters
    def _get_params(self, userdata: Any) -> Any:
        # called by ggml_opt_eval before each optimizer step. Never raise here: the error value
        # of this callback type is an all-zero struct, and ggml asserts alpha > 0 on it (abort).
        return self._c_params[0]

    def params_for_epoch(self, epoch: int) -> OptimizerParams:
        """Evaluate the schedule for ``epoch`` (checked) and hand the result to ggml for the
        following optimizer steps. Without a schedule: the constant parameters."""
        if self._schedule is None:
            return _read_params(self._c_params, self._params_cls)
        p = _check_params(self._schedule(epoch), f"the optimizer schedule's result for epoch {epoch}")
        if not isinstance(p, self._params_cls):
            raise TypeError(f"the optimizer schedule returned {type(p).__name__} for epoch {epoch}, "
                            f"but {self._params_cls.__name__} for epoch 1 (an OptContext has one optimizer)")
        _fill_params(self._c_params, p)
        return p

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    @property
    def optimizer_name(self) -> str:
        """``"adamw"`` or ``"sgd"`` (``ggml_opt_optimizer_name(ggml_opt_context_optimizer_type)``)."""
        return ffi.string(lib.ggml_opt_optimizer_name(lib.ggml_opt_context_optimizer_type(self.ptr))).decode()

    @property
    def static_graphs(self) -> bool:
        """``ggml_opt_static_graphs`` (always True here)."""
        return bool(lib.ggml_opt_static_graphs(self.ptr))

    @property
    def inputs(self) -> Tensor:
        """``ggml_opt_inputs``: ``ne [ne_datapoint, batch_size]``."""
        return self.graph.inputs

    @property
    def outputs(self) -> Tensor:
        """``ggml_opt_outputs``: ``ne [n_outputs, batch_size]`` (no data outside ggml-opt's
        evaluation: ggml computes a copy of the graph; use :meth:`Model.predict`)."""
        return self.graph.outputs

    def _own(self, p: Any) -> Tensor | None:
        return None if p == ffi.NULL else _borrowed_tensor(p, self._scope)

    @property
    def labels(self) -> Tensor | None:
        """``ggml_opt_labels``: the labels the loss compares with (None for MEAN/SUM)."""
        return self._own(lib.ggml_opt_labels(self.ptr))

    @property
    def loss(self) -> Tensor:
        """``ggml_opt_loss``: the scalar F32 loss of the last batch."""
        return self._own(lib.ggml_opt_loss(self.ptr))  # type: ignore[return-value]

    @property
    def pred(self) -> Tensor | None:
        """``ggml_opt_pred``: I32 ``ne [batch_size]`` argmax of the outputs (CROSS_ENTROPY)."""
        return self._own(lib.ggml_opt_pred(self.ptr))

    @property
    def ncorrect(self) -> Tensor | None:
        """``ggml_opt_ncorrect``: I64 scalar, correct predictions in the last batch."""
        return self._own(lib.ggml_opt_ncorrect(self.ptr))

    def grad_acc(self, node: Tensor) -> Tensor | None:
        """``ggml_opt_grad_acc``: the gradient accumulator of a forward-graph node (a
        parameter) in the optimizer graph, or None. ValueError for a context without an
        optimizer graph."""
        if self.build_type != BuildType.OPT:
            raise ValueError("grad_acc needs an OptContext with build_type OPT")
        return self._own(lib.ggml_opt_grad_acc(self.ptr, node.ptr))

    # ------------------------------------------------------------------ low level
    @_cobject.guarded
    def reset(self, optimizer: bool) -> None:
        """``ggml_opt_reset``: zero the gradients and, with ``optimizer``, the AdamW moments and
        the step count."""
        with calling(self.graph.ctx, self):  # tensor memsets: Python buffers call back
            lib.ggml_opt_reset(self.ptr, bool(optimizer))

    def alloc(self, backward: bool) -> None:
        """``ggml_opt_alloc``: allocate the graph of the next :meth:`eval` (forward, or forward
        + backward (+ optimizer step every ``opt_period``-th time)). ValueError if called twice
        without :meth:`eval`, or ``backward`` on a FORWARD context."""
        if self._eval_ready:
            raise ValueError("alloc() was already called: eval() comes next")
        if backward and self.build_type == BuildType.FORWARD:
            raise ValueError("this OptContext was built for the forward pass only (build_type FORWARD)")
        with calling(self.graph.ctx, self):  # the scheduler: Python backends' supports_op, buffers
            lib.ggml_opt_alloc(self.ptr, bool(backward))
        self._eval_ready = True

    def eval(self, result: Result | None = None) -> None:
        """``ggml_opt_eval``: compute the allocated graph (the forward pass, the loss, and if
        allocated the backward pass and the optimizer step) and add the batch to ``result``.
        ValueError without :meth:`alloc` first; re-raises an exception of a Python callback
        or backend."""
        if not self._eval_ready:
            raise ValueError("call alloc() before eval()")
        if result is not None:
            result._accept(self)
        self._eval_ready = False
        with calling(self.graph.ctx, self):  # the scheduler's compute, get_opt_pars
            lib.ggml_opt_eval(self.ptr, result.ptr if result is not None else ffi.NULL)

    def get_batch(self, dataset: Dataset, ibatch: int) -> None:
        """``ggml_opt_dataset_get_batch``: copy batch ``ibatch`` of ``dataset`` (in its current
        order) to the inputs and, if the loss has them, the labels."""
        self.check_dataset(dataset)
        if ibatch < 0 or (ibatch + 1) * self.batch_size > dataset.ndata:
            raise ValueError(f"batch {ibatch} of {self.batch_size} is beyond the {dataset.ndata} datapoints")
        self._get_batch(dataset, int(ibatch))

    def _get_batch(self, dataset: Dataset, ibatch: int) -> None:
        with calling(self.graph.ctx, self):  # ggml_backend_tensor_set: Python buffers call back
            lib.ggml_opt_dataset_get_batch(dataset.ptr, self.graph.inputs.ptr, lib.ggml_opt_labels(self.ptr), ibatch)

    def check_dataset(self, dataset: Dataset) -> None:
        """ValueError/TypeError unless ``dataset`` fits this context: ne_datapoint and type of
        the inputs, labels iff the loss needs them (same ne and type as the outputs), a batch
        size that is a multiple of the shard size and divides ``ndata`` (what
        ``ggml_opt_epoch`` and ``ggml_opt_dataset_get_batch`` assert)."""
        if not isinstance(dataset, Dataset):
            raise TypeError(f"expected an opt.Dataset, got {type(dataset).__name__}")
        g = self.graph
        if dataset.ne_datapoint != g.ne_datapoint:
            raise ValueError(f"the dataset's datapoints have {dataset.ne_datapoint} elements, the model's "
                             f"inputs {g.ne_datapoint}")
        if dataset.type != g.type:
            raise TypeError(f"the dataset holds {dataset.type.name} data, the model's inputs are {g.type.name}")
        if self.loss_type.needs_labels:
            if dataset.labels is None:
                raise ValueError(f"loss {self.loss_type.name} needs labels: the dataset has none")
            if dataset.ne_label != g.outputs.ne[0]:
                raise ValueError(f"the dataset's labels have {dataset.ne_label} elements, the model's outputs "
                                 f"{g.outputs.ne[0]} (loss {self.loss_type.name} compares them"
                                 + ("; one-hot encode class indices with opt.one_hot" if dataset.ne_label == 1 else "")
                                 + ")")
            if dataset.label_type != g.outputs.type:
                raise TypeError(f"the dataset's labels are {dataset.label_type.name}, the outputs "  # type: ignore[union-attr]
                                f"{g.outputs.type_name} (loss {self.loss_type.name} compares them)")
        elif dataset.labels is not None:
            raise ValueError(f"loss {self.loss_type.name} takes no labels, but the dataset has labels "
                             "(ggml asserts that they agree): make the Dataset without labels")
        dataset.check_batch_size(self.batch_size)
        if dataset.ndata % self.batch_size:
            raise ValueError(f"batch size {self.batch_size} does not divide the dataset's {dataset.ndata} "
                             "datapoints (ggml-opt has no partial batches): trim the data or pick a divisor")

    @_cobject.guarded
    def close(self) -> None:
        """``ggml_opt_free``, then the model graph (scheduler, compute context, inputs). Its
        tensors (labels, loss, ...) raise ClosedError afterwards."""
        scope = getattr(self, "_scope", None)
        if scope is not None:
            scope.close()
        super().close()
        g = getattr(self, "graph", None)
        if g is not None:
            g.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<OptContext (closed)>"
        return (f"<OptContext {self.build_type.name} loss={self.loss_type.name} {self.optimizer_name} "
                f"batch_size={self.batch_size} opt_period={self.opt_period}>")


def _read_params(c: Any, cls: type) -> OptimizerParams:
    if cls is AdamW:
        return AdamW(c.adamw.alpha, c.adamw.beta1, c.adamw.beta2, c.adamw.eps, c.adamw.wd)
    return SGD(c.sgd.alpha, c.sgd.wd)


# =============================================================================================
# progress, Ctrl-C, loops
# =============================================================================================

@dataclass
class BatchInfo:
    """What a per-batch callback gets: ``train`` (False during validation/evaluation), the
    ``epoch`` (from 1), ``ibatch`` batches evaluated so far in this phase (from 1) of
    ``nbatches``, the phase's :class:`Result` so far, and ``seconds`` since the phase began."""
    train: bool
    epoch: int
    ibatch: int
    nbatches: int
    result: Result
    seconds: float

    @property
    def loss(self) -> float:
        return self.result.loss

    @property
    def accuracy(self) -> float:
        return self.result.accuracy


#: a per-batch callback; returning False stops training after this batch
BatchCallback = Callable[[BatchInfo], Union[bool, None]]


class _Progress:
    """One bar per phase: tqdm if available, else ggml's ``ggml_opt_epoch_callback_progress_bar``."""

    def __init__(self, enabled: bool | None):
        if enabled is None:
            enabled = sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.enabled = bool(enabled)
        self.bar: Any = None
        self.tqdm: Any = None
        if self.enabled:
            try:
                from tqdm import tqdm
                self.tqdm = tqdm
            except ImportError:
                self.tqdm = None

    def start(self, desc: str, total: int) -> None:
        self.close()
        if self.enabled and self.tqdm is not None:
            self.bar = self.tqdm(total=total, desc=desc, unit="batch", leave=True, file=sys.stderr,
                                 dynamic_ncols=True)

    def update(self, info: BatchInfo, octx: OptContext, dataset: Dataset, t_start_us: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            m = info.result.metrics()
            acc = "" if math.isnan(m.accuracy) else f" acc={100 * m.accuracy:.2f}±{100 * m.accuracy_unc:.2f}%"
            unc = "" if math.isnan(m.loss_unc) else f"±{m.loss_unc:.4f}"
            self.bar.set_postfix_str(f"loss={m.loss:.4f}{unc}{acc}", refresh=False)
            self.bar.update(1)
        else:  # ggml's own bar, on the C stderr
            sys.stderr.flush()
            lib.ggml_opt_epoch_callback_progress_bar(info.train, octx.ptr, dataset.ptr, info.result.ptr,
                                                     info.ibatch, info.nbatches, t_start_us)

    def write(self, text: str) -> None:
        if self.enabled:
            (self.tqdm.write if self.tqdm is not None else print)(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _Interrupt:
    """Ctrl-C while training: the first one asks to stop after the current batch, a second one
    raises KeyboardInterrupt. Only in the main thread (where Python handles signals)."""

    def __init__(self) -> None:
        self.requested = False
        self._prev: Any = None
        self._installed = False
        self.progress: _Progress | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False
            raise KeyboardInterrupt
        self.requested = True
        msg = "Ctrl-C: training stops after this batch (Ctrl-C again to stop at once)"
        if self.progress is not None and self.progress.enabled:
            self.progress.write(msg)
        else:
            logger.warning(msg)

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if prev is not signal.SIG_IGN and prev is not None:
                self._prev = prev
                signal.signal(signal.SIGINT, self._handler)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False


_NATIVE_LOCK = threading.Lock()


def epoch(opt_ctx: OptContext, dataset: Dataset, result_train: Result | None = None,
          result_eval: Result | None = None, idata_split: int = -1,
          callback: BatchCallback | None = None, *, progress: bool | None = None,
          native: bool = False, _interrupt: _Interrupt | None = None,
          _progress: _Progress | None = None) -> str | None:
    """One pass over ``dataset``, as ``ggml_opt_epoch``: train on the datapoints before
    ``idata_split`` (forward, backward, optimizer step every ``opt_period`` batches), then
    evaluate the rest (forward only); ``idata_split=-1`` trains on everything, 0 only
    evaluates. The dataset's current order is used (shuffle first: :meth:`Dataset.shuffle`).

    Loss and accuracy are added to ``result_train`` / ``result_eval``. ``callback(info)`` is
    called after every batch with a :class:`BatchInfo`; returning False stops after that batch.
    The optimizer schedule (if any) is evaluated for ``opt_ctx.current_epoch`` first, which is
    incremented afterwards if anything was trained.

    The loop is ggml_opt_epoch's, over the same public functions (``ggml_opt_alloc``,
    ``ggml_opt_dataset_get_batch``, ``ggml_opt_eval``), run from Python so that it can stop
    between batches. ``native=True`` calls ``ggml_opt_epoch`` itself, with the callback behind
    ggml's ``ggml_opt_epoch_callback`` (process-wide: one native epoch at a time); it stops
    only at the end of the epoch.

    Ctrl-C (main thread) while it trains stops it after the current batch; while it only
    evaluates, KeyboardInterrupt is raised as usual.

    Returns None, or why it stopped early: ``"callback"`` or ``"interrupt"`` (Ctrl-C).
    Raises ValueError/TypeError for a dataset that does not fit (:meth:`OptContext.check_dataset`)
    or an ``idata_split`` that is not a multiple of the batch size; re-raises what a callback
    raised.
    """
    opt_ctx.check_dataset(dataset)
    bs = opt_ctx.batch_size
    ndata = dataset.ndata
    nbatches = ndata // bs
    idata_split = ndata if idata_split < 0 else int(idata_split)
    if idata_split > ndata or idata_split % bs:
        raise ValueError(f"idata_split {idata_split} must be a multiple of the batch size {bs} and <= ndata {ndata}")
    ibatch_split = idata_split // bs
    if ibatch_split and opt_ctx.build_type == BuildType.FORWARD:
        raise ValueError("this OptContext evaluates only (build_type FORWARD): use idata_split=0")
    if opt_ctx._eval_ready:
        raise ValueError("alloc() was called without eval(): finish that batch first")
    results = {True: Result() if result_train is None else result_train,
               False: Result() if result_eval is None else result_eval}
    for r in results.values():
        r._accept(opt_ctx)
    ep = opt_ctx.current_epoch
    if ibatch_split:
        opt_ctx.params_for_epoch(ep)
    prog = _progress if _progress is not None else _Progress(progress)
    # Ctrl-C stops training cleanly; an evaluation alone has nothing to keep: KeyboardInterrupt
    own_interrupt = _interrupt is None and ibatch_split > 0
    intr: _Interrupt = _Interrupt() if _interrupt is None else _interrupt
    stopped: str | None = None
    try:
        if own_interrupt:
            intr.__enter__()
        intr.progress = prog
        if native:
            stopped = _native_epoch(opt_ctx, dataset, results, idata_split, ibatch_split, nbatches,
                                    ep, callback, prog, intr)
        else:
            for train, first, last in ((True, 0, ibatch_split), (False, ibatch_split, nbatches)):
                if last == first:
                    continue
                res = results[train]
                t0_us, t0 = lib.ggml_time_us(), time.perf_counter()
                prog.start(f"epoch {ep} {'train' if train else 'val'}", last - first)
                for ib in range(first, last):
                    opt_ctx.alloc(backward=train)
                    opt_ctx._get_batch(dataset, ib)
                    opt_ctx.eval(res)
                    info = BatchInfo(train, ep, ib + 1 - first, last - first, res, time.perf_counter() - t0)
                    prog.update(info, opt_ctx, dataset, t0_us)
                    if callback is not None and callback(info) is False:
                        stopped = "callback"
                    elif intr.requested:
                        stopped = "interrupt"
                    if stopped:
                        break
                prog.close()
                if stopped:
                    break
    finally:
        prog.close()
        if own_interrupt:
            intr.__exit__()
        if ibatch_split:
            opt_ctx.current_epoch = ep + 1
    return stopped


def _native_epoch(opt_ctx: OptContext, dataset: Dataset, results: dict[bool, Result], idata_split: int,
                  ibatch_split: int, nbatches: int, ep: int, callback: BatchCallback | None,
                  prog: _Progress, intr: _Interrupt) -> str | None:
    state: dict[str, Any] = {"stopped": None, "phase": None, "t0": 0.0}

    def on_batch(train: bool, octx_p: Any, ds_p: Any, result_p: Any, ibatch: int, ibatch_max: int,
                 t_start_us: int) -> None:
        train = bool(train)
        if state["phase"] != train:
            state["phase"], state["t0"] = train, time.perf_counter()
            prog.start(f"epoch {ep} {'train' if train else 'val'}", int(ibatch_max))
        info = BatchInfo(train, ep, int(ibatch), int(ibatch_max), results[train], time.perf_counter() - state["t0"])
        prog.update(info, opt_ctx, dataset, int(t_start_us))
        if int(ibatch) == int(ibatch_max):
            prog.close()
        if state["stopped"] is None:
            if callback is not None and callback(info) is False:
                state["stopped"] = "callback"
            elif intr.requested:
                state["stopped"] = "interrupt"

    with _NATIVE_LOCK:
        fn = callbacks.set_global("ggml_opt_epoch_callback", on_batch)
        try:
            with calling(opt_ctx.graph.ctx, opt_ctx):  # the scheduler, the epoch callback
                lib.ggml_opt_epoch(opt_ctx.ptr, dataset.ptr, results[True].ptr, results[False].ptr,
                                   idata_split, fn, fn)
        finally:
            callbacks.set_global("ggml_opt_epoch_callback", None)
    stopped: str | None = state["stopped"]
    return stopped


@dataclass
class EpochResult:
    """One epoch of :func:`fit`: training and validation :class:`Metrics` (``val`` None without
    a validation split) and wall-clock seconds."""
    epoch: int
    train: Metrics
    val: Metrics | None
    seconds: float


@dataclass
class History:
    """What :func:`fit` returns: the :class:`EpochResult` of each epoch trained (the last one
    possibly partial), and ``stopped``: None, ``"callback"`` or ``"interrupt"`` (Ctrl-C)."""
    epochs: list[EpochResult] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.epochs)

    def __iter__(self) -> Iterator[EpochResult]:
        return iter(self.epochs)

    def __getitem__(self, i: int) -> EpochResult:
        return self.epochs[i]


def _split(ndata: int, nbatch_logical: int, opt_period: int, nbatch_physical: int, val_split: float) -> int:
    """``idata_split`` exactly as ``ggml_opt_fit`` computes it (float32 arithmetic)."""
    nbatches_logical = ndata // nbatch_logical
    frac = np.float32(1.0) - np.float32(val_split)
    ibatch_split = int(np.float32(frac * np.float32(nbatches_logical))) * opt_period
    return ibatch_split * nbatch_physical


def fit(model: Model, dataset: Dataset, *, batch_size: int, loss: "Loss | str" = Loss.CROSS_ENTROPY,
        optimizer: "OptimizerParams | Schedule | None" = None, epochs: int = 1,
        nbatch_logical: int | None = None, val_split: float = 0.0,
        callback: BatchCallback | None = None,
        epoch_callback: "Callable[[EpochResult], bool | None] | None" = None,
        progress: bool | None = None, native: bool = False) -> History:
    """Train ``model`` on ``dataset`` for ``epochs`` epochs, as ``ggml_opt_fit`` does.

    ``batch_size`` datapoints per physical batch (the graph's ``inputs ne[1]``);
    ``nbatch_logical`` (default ``batch_size``, a multiple of it) per optimizer step: the
    gradients of ``nbatch_logical / batch_size`` batches are accumulated (``opt_period``).
    ``val_split`` in [0, 1): the last fraction of the (shuffled) dataset, in whole logical
    batches, is evaluated after each epoch instead of trained on. ``loss``: a :class:`Loss`
    (or its name). ``optimizer``: :class:`AdamW` (default: ggml's defaults) or :class:`SGD`
    parameters, or a :data:`Schedule` ``epoch -> params`` (epochs from 1).

    The sequence is ggml_opt_fit's: a new :class:`OptContext`, one shuffle of all the data (if
    a logical batch is smaller than the dataset), then per epoch a shuffle of the training part
    and :func:`epoch`; with ggml's default AdamW the weights are bit for bit those of
    ``ggml_opt_fit``. Unlike ``ggml_opt_fit`` it shows a progress bar on a terminal
    (``progress``), calls ``callback`` after every batch (return False to stop), stops cleanly
    on Ctrl-C, and takes a Python optimizer schedule. ``epoch_callback(epoch_result)`` is called
    after every epoch with its :class:`EpochResult` (return False to stop). ``native=True`` runs
    each epoch with ``ggml_opt_epoch`` itself (see :func:`epoch`). The optimizer state (AdamW
    moments) is freed at the end, as in ggml.

    Returns a :class:`History`. Raises ValueError/TypeError for inputs ggml would abort on
    (sizes that do not divide, a ``val_split`` outside [0, 1), labels that do not fit the loss,
    ...: see :meth:`OptContext.check_dataset`); re-raises what a callback raised.
    """
    if not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be an opt.Dataset, got {type(dataset).__name__}")
    dataset.check_batch_size(batch_size)
    nbatch_logical = batch_size if nbatch_logical is None else nbatch_logical
    if not isinstance(nbatch_logical, (int, np.integer)) or nbatch_logical < 1 or nbatch_logical % batch_size:
        raise ValueError(f"nbatch_logical {nbatch_logical} must be a multiple of batch_size {batch_size}")
    ndata = dataset.ndata
    if ndata % nbatch_logical:
        raise ValueError(f"nbatch_logical {nbatch_logical} does not divide the dataset's {ndata} datapoints "
                         "(ggml-opt has no partial batches): trim the data or pick a divisor")
    vs = float(val_split)
    if not 0.0 <= vs < 1.0:
        raise ValueError(f"val_split must be in [0, 1), got {val_split!r}")
    opt_period = nbatch_logical // batch_size
    idata_split = _split(ndata, nbatch_logical, opt_period, batch_size, vs)
    if idata_split == 0 and epochs:
        raise ValueError(f"val_split {val_split} leaves no logical batch of {nbatch_logical} to train on")
    history = History()
    t_fit = time.perf_counter()
    with OptContext(model, batch_size=batch_size, dataset=dataset, loss=loss, optimizer=optimizer,
                    opt_period=opt_period) as octx:
        octx.check_dataset(dataset)
        if nbatch_logical < ndata:
            dataset.shuffle(octx, -1)  # all data, train + validation
        prog = _Progress(progress)
        rt, rv = Result(), Result()
        with _Interrupt() as intr:
            for ep in range(1, epochs + 1):
                if nbatch_logical < idata_split:
                    dataset.shuffle(octx, idata_split)
                rt.reset()
                rv.reset()
                t0 = time.perf_counter()
                octx.current_epoch = ep
                stopped = epoch(octx, dataset, rt, rv, idata_split, callback, native=native,
                                _interrupt=intr, _progress=prog)
                er = EpochResult(ep, rt.metrics(), rv.metrics() if rv.ndata else None, time.perf_counter() - t0)
                history.epochs.append(er)
                logger.info("epoch %d/%d: train %s%s (%.2f s)", ep, epochs, er.train,
                            f"; val {er.val}" if er.val else "", er.seconds)
                if not stopped and epoch_callback is not None and epoch_callback(er) is False:
                    stopped = "callback"
                if stopped:
                    history.stopped = stopped
                    break
    history.seconds = time.perf_counter() - t_fit
    return history


def _eval_batch_size(ndata: int, shard: int, cap: int = 1000) -> int:
    """The largest multiple of ``shard`` dividing ``ndata`` that is <= ``cap`` (at least ``shard``)."""
    best = shard
    for b in range(shard, min(ndata, cap) + 1, shard):
        if ndata % b == 0:
            best = b
    return best


def evaluate(model: Model, dataset: Dataset, *, loss: "Loss | str" = Loss.CROSS_ENTROPY,
             batch_size: int | None = None, progress: bool | None = False) -> Result:
    """The loss (and for CROSS_ENTROPY the accuracy and predictions) of ``model`` on every
    datapoint of ``dataset`` in its current order, as ggml's MNIST example evaluates: a
    forward-only :class:`OptContext` and ``ggml_opt_epoch`` with ``idata_split = 0``.

    ``batch_size`` must divide ``ndata`` (default: the largest divisor <= 1000 that is a
    multiple of the shard size). Returns the :class:`Result`. Raises as :func:`epoch`.
    """
    bs = _eval_batch_size(dataset.ndata, dataset.shard_size) if batch_size is None else batch_size
    result = Result()
    with OptContext(model, batch_size=bs, dataset=dataset, loss=loss, build_type=BuildType.FORWARD) as octx:
        epoch(octx, dataset, None, result, 0, progress=progress)
    return result
