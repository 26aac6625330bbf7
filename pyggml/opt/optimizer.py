"""What ggml-opt minimizes and how it steps: the losses (:class:`Loss`), the graphs an
:class:`~pyggml.opt.OptContext` builds (:class:`BuildType`), and the optimizer parameters
(:class:`AdamW`, :class:`SGD`, a per-epoch :data:`Schedule`), checked before ggml asserts on them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Union

from ..raw import ffi, lib

__all__ = ["Loss", "BuildType", "AdamW", "SGD", "OptimizerParams", "Schedule", "default_optimizer_params"]


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


def _read_params(c: Any, cls: type) -> OptimizerParams:
    if cls is AdamW:
        return AdamW(c.adamw.alpha, c.adamw.beta1, c.adamw.beta2, c.adamw.eps, c.adamw.wd)
    return SGD(c.sgd.alpha, c.sgd.wd)
