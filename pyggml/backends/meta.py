"""ggml's meta device: one device made of several, each tensor split over them by a policy
(``ggml_backend_meta_device``, ggml-backend-meta.cpp), for tensor parallelism.

A meta device is used like any device: :meth:`Device.init` gives a backend that runs a graph on
every device at once (one sub-graph per device, the devices' partial results summed by an
all-reduce where a graph needs it), its buffer type places each tensor's slices on the devices::

    from pyggml.backends.meta import SplitState, meta_device

    def policy(t):                                   # weights and caches, by name
        if t.name.endswith("attn_q.weight"):
            return SplitState.even(1, t.ne[1], n=2)  # rows (ne[1]) split over the devices
        return SplitState.mirrored()                 # a whole copy on each device

    dev = meta_device([rpc0, rpc1], policy)
    backend = dev.init()
    weights_buffer = ctx.alloc_tensors(backend)      # set/get scatter and gather

**The policy** is called by ggml for every tensor of a meta buffer that is not a compute tensor
(weights, caches: what :meth:`Context.alloc_tensors` places), with a :class:`Tensor` lent for the
call; it returns a :class:`SplitState`. ggml derives the split of every computed tensor from its
sources by rules of its own (ggml-backend-meta.cpp); graphs whose ops those rules do not cover
abort in ggml (see below). pyggml checks each state before ggml sees it: an axis the tensor lacks,
sizes that do not add up to ``ne[axis]``, a split of ``ne[0]`` inside a quantization block, no or
too many segments. A policy that raises or returns a bad state makes ggml use a mirrored state
for that tensor instead (no abort), and the pyggml call that made ggml ask (``alloc_tensors``, a
compute) raises the error.

**What ggml's meta backend can drive** (0.26): devices whose buffer type is not host memory
(GPUs, RPC devices). A meta device made of host devices (the CPU twice) works as a plain backend,
but its buffer type claims host memory while its tensors' ``data`` are not addresses, so ggml's
CPU backend beside it in a scheduler would read them: :class:`~pyggml.Scheduler` refuses that
pairing, and :meth:`Tensor.numpy` (``copy=False``), DLPack and :meth:`Buffer.numpy` refuse meta
buffers. Sub-graphs run one device after another on the calling thread; devices without ggml's
communication hooks (``ggml_backend_comm_*``: CPU and RPC have none, CUDA has them) all-reduce
through host memory. ggml keeps every meta device until the process ends, so the policy lives as
long. Graph shapes whose split ggml cannot derive (e.g. a view of a permuted split tensor, a
``mul_mat`` of two tensors split on different axes) abort in ggml: pyggml derives every
tensor's split first and raises ValueError instead (:mod:`pyggml.backends.meta_check`, before a
graph is placed or computed). Build graphs as llama.cpp's tensor-split mode does
(``examples/llama_ggml``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core.tensor import BorrowScope, Tensor
from ..raw import boundary, callbacks, ffi, lib
from ..raw.boundary import calling
from ..types import block_size
from ..enums import DeviceType
from .device import Device
from . import meta_check

__all__ = ["MAX_DEVICES", "MIRRORED", "PARTIAL", "SplitState", "Policy", "meta_device", "is_meta"]

#: ``GGML_BACKEND_META_MAX_DEVICES``: the most devices (and segments) of a meta device
MAX_DEVICES = int(lib.GGML_BACKEND_META_MAX_DEVICES)
#: all values on every device (``GGML_BACKEND_SPLIT_AXIS_MIRRORED``)
MIRRORED = int(lib.GGML_BACKEND_SPLIT_AXIS_MIRRORED)
#: each device holds a partial sum (``GGML_BACKEND_SPLIT_AXIS_PARTIAL``)
PARTIAL = int(lib.GGML_BACKEND_SPLIT_AXIS_PARTIAL)
_MAX_DIMS = 4


@dataclass(frozen=True)
class SplitState:
    """How one tensor is split over a meta device's devices (``struct
    ggml_backend_meta_split_state``).

    ``axis``: 0..3, a dimension in ggml ``ne`` order (``ne[axis]`` is split), or :data:`MIRRORED`
    or :data:`PARTIAL`. ``segments``: for a split axis, one ``(sizes, repeats)`` pair per segment:
    ``sizes`` has one count per device (elements of ``ne[axis]`` that device holds of the
    segment), and the segment repeats ``repeats`` times; the sizes times repeats add up to
    ``ne[axis]``. Most tensors have one segment (:meth:`split`); fused tensors (Q, K and V in one
    matrix) have one per part, each split on its own.
    """

    axis: int
    segments: tuple[tuple[tuple[int, ...], int], ...] = ()

    @classmethod
    def mirrored(cls) -> "SplitState":
        """A whole copy on every device."""
        return cls(MIRRORED)

    @classmethod
    def split(cls, axis: int, sizes: Sequence[int]) -> "SplitState":
        """``ne[axis]`` split into ``sizes`` (one per device, in the meta device's order)."""
        return cls(int(axis), ((tuple(int(s) for s in sizes), 1),))

    @classmethod
    def even(cls, axis: int, ne: int, n: int, granularity: int = 1,
             weights: Sequence[float] | None = None) -> "SplitState":
        """``ne`` elements of ``ne[axis]`` over ``n`` devices in proportion to ``weights``
        (default: equal), each boundary rounded down to a multiple of ``granularity`` (a head's
        size, a quantization block); the last device takes the rest. Raises ValueError for
        ``n`` or ``granularity`` below 1, or weights that are not ``n`` non-negative numbers with
        a positive sum."""
        if n < 1 or granularity < 1:
            raise ValueError("n and granularity must be >= 1")
        w = [1.0] * n if weights is None else [float(x) for x in weights]
        if len(w) != n or any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"weights must be {n} non-negative numbers with a positive sum")
        total, acc, low, sizes = sum(w), 0.0, 0, []
        for x in w[:-1]:
            acc += x
            high = int(ne * acc / total)
            high -= high % granularity
            high = max(high, low)
            sizes.append(high - low)
            low = high
        sizes.append(ne - low)
        return cls.split(axis, sizes)

    def check(self, tensor: Tensor, n_devices: int) -> None:
        """Raise ValueError if ggml would abort on this state for ``tensor``."""
        name = tensor.name or "(unnamed)"
        if self.axis in (MIRRORED, PARTIAL):
            return
        if not 0 <= self.axis < _MAX_DIMS:
            raise ValueError(f"split state of {name}: axis {self.axis} is neither 0..3 nor MIRRORED/PARTIAL")
        ne = tensor.ne
        if self.axis >= max(tensor.n_dims, 1):
            raise ValueError(f"split state of {name}: the tensor (ne {list(ne)}) has no axis {self.axis}")
        if not 1 <= len(self.segments) <= MAX_DEVICES:
            raise ValueError(f"split state of {name}: 1 to {MAX_DEVICES} segments, got {len(self.segments)}")
        gran = block_size(tensor.type) if self.axis == 0 else 1
        total = 0
        for sizes, nr in self.segments:
            if len(sizes) != n_devices:
                raise ValueError(f"split state of {name}: a segment needs {n_devices} sizes "
                                 f"(one per device), got {len(sizes)}")
            if nr < 1 or any(s < 0 for s in sizes):
                raise ValueError(f"split state of {name}: sizes must be >= 0 and repeats >= 1")
            if any(s % gran for s in sizes):
                raise ValueError(f"split state of {name}: ne[0] of a {tensor.type_name} tensor splits "
                                 f"only at multiples of its block size {gran}, got {list(sizes)}")
            total += sum(sizes) * nr
        if total != ne[self.axis]:
            raise ValueError(f"split state of {name}: sizes x repeats add up to {total}, "
                             f"not ne[{self.axis}] = {ne[self.axis]}")

    def _fill(self, out: Any, n_devices: int) -> None:
        out.axis = self.axis
        if self.axis in (MIRRORED, PARTIAL):
            out.nr[0], out.n_segments = 1, 1
            return
        for s, (sizes, nr) in enumerate(self.segments):
            for j, size in enumerate(sizes):
                out.ne[s * n_devices + j] = size
            out.nr[s] = nr
        out.n_segments = len(self.segments)


#: a split policy: a tensor (a weight or cache placed in a meta buffer) -> its SplitState
Policy = Callable[[Tensor], SplitState]

_STATE = "struct ggml_backend_meta_split_state"
_kept: list[Any] = []   # ggml keeps every meta device, with its callback, until exit


class _PolicyCallback:
    def __init__(self, policy: Policy, n_devices: int):
        self.policy, self.n_devices = policy, n_devices
        self.cb = callbacks.Callback("ggml_backend_meta_get_split_state_t", self._call)

    def state_of(self, tensor: Any) -> SplitState:
        """The policy's state for tensor struct ``tensor``, checked: the policy's exception,
        TypeError for something else than a SplitState, ValueError for a state ggml aborts on."""
        scope = BorrowScope("a split policy")
        try:
            t = Tensor(tensor, scope)
            state = self.policy(t)
            if not isinstance(state, SplitState):
                raise TypeError(f"a split policy returns a SplitState, not {type(state).__name__}")
            state.check(t, self.n_devices)
        finally:
            scope.close()
        return state

    def _call(self, tensor: Any, _ud: Any) -> Any:
        out = ffi.new(_STATE + " *")
        try:
            self.state_of(tensor)._fill(out, self.n_devices)
        except BaseException as e:  # cffi would return a zeroed state, on which ggml aborts
            boundary.record(e)
            ffi.buffer(out)[:] = bytes(ffi.sizeof(_STATE))
            SplitState.mirrored()._fill(out, self.n_devices)
        return out[0]


def meta_device(devices: Sequence[Device], policy: Policy) -> Device:
    """A meta device over ``devices`` (1 to :data:`MAX_DEVICES`, none itself a meta device; the
    same device twice gives it two shares) that splits tensors by ``policy``
    (``ggml_backend_meta_device``). The device, and ``policy``, live until the process ends
    (ggml keeps them).

    Raises ValueError for no or too many devices, or a meta device among them;
    TypeError for something that is not a :class:`Device` or a policy that is not callable."""
    devices = list(devices)
    if not 1 <= len(devices) <= MAX_DEVICES:
        raise ValueError(f"a meta device is made of 1 to {MAX_DEVICES} devices, got {len(devices)}")
    for d in devices:
        if not isinstance(d, Device):
            raise TypeError(f"meta_device takes pyggml Devices, not {type(d).__name__}")
    if any(is_meta(d) for d in devices):
        raise ValueError("a meta device cannot be made of meta devices")
    if not callable(policy):
        raise TypeError("policy must be callable: Tensor -> SplitState")
    cb = _PolicyCallback(policy, len(devices))
    arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in devices])
    with calling():
        p = lib.ggml_backend_meta_device(arr, len(devices), cb.cb.fn, cb.cb.user_data)
    _kept.append(cb)
    meta_check.register(p, cb)  # its policy, for the check of graphs before ggml splits them
    return Device(p)


def is_meta(device: Device) -> bool:
    """Whether ``device`` is a meta device (its ``ggml_backend_dev_type`` is
    ``GGML_BACKEND_DEVICE_TYPE_META``)."""
    return device.type == DeviceType.META
