"""What evaluations add up: :class:`Result` (``ggml_opt_result``: loss, accuracy, predictions)
and its snapshots, :class:`Metrics`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


from .._cobject import CObject
from ..raw import ffi, lib
from .optimizer import Loss


__all__ = ["Metrics", "Result"]


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

    def reset(self) -> None:
        """``ggml_opt_result_reset``: forget everything."""
        lib.ggml_opt_result_reset(self.ptr)
        self._signature = None
        self._has_pred = False

    def _accept(self, opt_ctx: Any) -> None:
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
