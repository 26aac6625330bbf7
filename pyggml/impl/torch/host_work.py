"""Host work inside a step: what a step that is replayed (and captured into a CUDA graph) must not
do.

A step not marked :func:`~pyggml.impl.torch.table.eager` runs on the device alone: on CUDA a copy
of host memory to the device (``torch.tensor``, ``x.to(device)`` of a host tensor), a read of
device data on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(x)``...) or a result whose
shape depends on data (``nonzero``, a boolean-mask index) waits for the GPU, and inside
``torch.cuda.graph`` it raises ("operation not permitted when stream is capturing"), so the plan is
never captured. :class:`HostWork` is a ``TorchFunctionMode`` that records such calls; a plan runs
each of its replayed steps under it once, at its first compute (:class:`~pyggml.impl.torch.plan.Plan`).

The rule is about the call, not about where the data is: on ``cpu`` (no GPU) ``x.to(device)``
moves nothing, but the same step on CUDA would, so it is recorded there too. That makes the
check a CPU proxy for the GPU's rule.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name

__all__ = ["HostWork"]

_T = torch.Tensor

#: calls that read device data on the host, or whose result's shape depends on data
_TO_HOST = frozenset({
    _T.item, _T.tolist, _T.cpu, _T.numpy, _T.__bool__, _T.__int__, _T.__float__, _T.__index__,
    _T.__complex__, _T.nonzero, torch.nonzero, _T.masked_select, torch.masked_select,
    _T.unique, torch.unique, torch.unique_consecutive, torch.argwhere, _T.argwhere})
#: calls that make a tensor of host data (copied to the device when one is named)
_FROM_HOST = frozenset({torch.tensor, torch.as_tensor})
#: indexing calls, host work when an index is a boolean mask
_INDEXING = frozenset({_T.__getitem__, _T.__setitem__, _T.index_put_, _T.index_put})


def _names_a_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to``/``.cuda`` arguments (after the tensor) name a device."""
    if "device" in kwargs:
        return True
    return any(isinstance(a, (torch.device, str, int, torch.Tensor)) and not isinstance(a, bool)
               for a in args[1:])


def _has_mask(index: Any) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostWork(TorchFunctionMode):  # type: ignore[misc,unused-ignore]  # Any without torch
    """Records (in ``found``, as torch's names: ``"torch.Tensor.item"``) the calls made inside
    it that would make a step wait for the GPU or fail in a CUDA graph capture. Calls run as
    usual."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if (func in _TO_HOST or func in _FROM_HOST
                or func is _T.cuda or (func is _T.to and _names_a_device(args, kwargs))
                or (func in _INDEXING and len(args) > 1 and _has_mask(args[1]))
                or (func is torch.where and len(args) + len(kwargs) == 1)):
            self.found.append(resolve_name(func) or repr(func))
        return func(*args, **kwargs)
