"""Device memory for the torch backend: buffers that are torch tensors, and tensors seen as
torch views of them.

A ``TorchBuffer`` is one ``uint8`` torch tensor on the backend's torch device; its base
address (what ggml computes ``tensor->data`` from) is that tensor's ``data_ptr()``. A ggml tensor
placed in it is seen, without a copy, as ``torch.as_strided`` of the buffer reinterpreted as the
tensor's dtype: shape ``ne`` reversed, strides ``nb`` reversed divided by the element size,
storage offset ``(data - base) / element size`` (``Views.tensor``). Quantized tensors are
seen as rows of bytes (``Views.rows``).

On the torch device ``cpu`` the buffers are host memory (``is_host``: ggml's CPU backend reads
and writes them in place, they are real host pointers) and any other host buffer (ggml's CPU
buffer type, a NumPy buffer) is seen too, through ``torch.frombuffer`` over its address range.
On other devices (``cuda:N``, ``mps``...) only this backend's own buffers are seen; the
scheduler copies inputs into them.

Weights are converted once: a kernel reading a quantized, F16 or BF16 tensor as float32 (MUL_MAT,
OUT_PROD) keeps the float32 tensor in its buffer's ``weights_cache`` when the buffer is a
``TorchBuffer`` whose usage is ``WEIGHTS`` (``ggml_backend_buffer_get_usage`` when the graph's
plan is built), and reuses it on later computes. Every write into the buffer that this backend
sees drops the cache: ``set_tensor``, ``memset_tensor``, ``cpy_tensor``, ``clear``, and a node of
one of its own graphs whose destination is in the buffer. A write it cannot see, another
backend computing in place into a weight of a ``TorchBuffer`` on ``cpu`` (host memory), is not
noticed: weights buffers are meant to be written only by loading them. The cost is memory: a
float32 copy of each weight read this way (4 bytes per value). The cache counts the times it
was emptied (``WeightsCache.epoch``): a CUDA graph reading its tensors is dropped when it changes.

On a CUDA device the synchronous slots follow :mod:`pyggml.impl.torch.stream`'s rule: they run
after the work queued on the device's backend streams and are complete when they return.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch

from ...core.tensor import Tensor
from ...raw import ffi, lib
from .. import PyBuffer, PyBufferType
from .._vtable import LIVE, addr
from .stream import synchronous

__all__ = ["DTYPES", "TorchBuffer", "TorchBufferType", "Views", "WeightsCache", "generation",
           "torch_buffer", "weights_buffer"]

_F32, _F16, _BF16, _F64 = lib.GGML_TYPE_F32, lib.GGML_TYPE_F16, lib.GGML_TYPE_BF16, lib.GGML_TYPE_F64
_I8, _I16, _I32, _I64 = lib.GGML_TYPE_I8, lib.GGML_TYPE_I16, lib.GGML_TYPE_I32, lib.GGML_TYPE_I64

#: ggml type -> torch dtype of its elements (the plain types)
DTYPES: dict[int, torch.dtype] = {
    _F32: torch.float32, _F16: torch.float16, _BF16: torch.bfloat16, _F64: torch.float64,
    _I8: torch.int8, _I16: torch.int16, _I32: torch.int32, _I64: torch.int64}

_WEIGHTS = lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS

#: counts freed buffers: when it changes, a backend drops the plans whose views (which hold
#: storage) see a freed buffer, so freed device memory is not kept alive by a cached plan
_freed = [0]


def generation() -> int:
    """How many ``TorchBuffer`` have been freed in this process so far."""
    return _freed[0]


#: a weight as float32: (values, per-block minima of Q4_1/Q5_1 or None)
Weight = tuple[torch.Tensor, "torch.Tensor | None"]


class WeightsCache(dict[tuple[Any, ...], Weight]):
    """A buffer's float32 conversions of its weights; ``epoch`` counts the times it was
    emptied (``clear``).

    On CUDA the backends that read a cache have streams of their own (:mod:`.stream`): a
    conversion is queued on the stream of the step that made it, and ``fetch`` records an event
    there after it. Another stream that reads it first waits for that event (on the GPU, once per
    stream) and marks its tensors as used by that stream (``record_stream``), so that when the
    cache drops them the allocator reuses the memory only after that stream's work queued so far."""

    epoch = 0

    def __init__(self) -> None:
        super().__init__()
        #: key -> (the event after its conversion, the streams ordered after that event)
        self.made: dict[tuple[Any, ...], tuple[Any, set[Any]]] = {}

    def fetch(self, key: tuple[Any, ...],
              convert: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
              stream: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The conversion under ``key`` (a weight as float32: its values, and the per-block minima
        of Q4_1/Q5_1 or None), made by ``convert()`` if there is none, for a step on ``stream``
        (a ``torch.cuda.Stream``; None on ``cpu``)."""
        w = self.get(key)
        if w is None:
            w = self[key] = convert()
            if stream is not None:
                self.made[key] = (stream.record_event(), {stream})
            return w
        made = self.made.get(key)
        if stream is not None and made is not None and stream not in made[1]:
            stream.wait_event(made[0])
            for t in w:
                if t is not None and t.is_cuda:
                    t.record_stream(stream)
            made[1].add(stream)
        return w

    def clear(self) -> None:
        """Empty the cache, counting it in ``epoch``."""
        self.epoch += 1
        self.made.clear()
        super().clear()


class TorchBuffer(PyBuffer):
    """A buffer of ``size`` bytes: one ``uint8`` torch tensor on ``device``, its start aligned
    to ``alignment`` bytes. ``data``: the 1-D ``uint8`` tensor of exactly ``size`` bytes.
    ``weights_cache``: float32 conversions of its tensors, (values, Q4_1/Q5_1 minima or None)
    (key: data address, type, ne, nb, split; a ``WeightsCache``),
    emptied by every write this backend sees."""

    def __init__(self, device: torch.device, size: int, alignment: int):
        self.device = device
        self.host = device.type == "cpu"
        self.freed = False      # ggml freed it (its plans' views still hold the storage)
        self.weights_cache = WeightsCache()
        with synchronous(device):   # zeroed before any backend stream uses it
            raw = torch.zeros(max(size, 1) + alignment, dtype=torch.uint8, device=device)
        pad = (-raw.data_ptr()) % alignment
        self.data = raw[pad:pad + max(size, 1)]
        self._addr = self.data.data_ptr()

    def get_base(self) -> int:
        return self._addr

    def _start(self, tensor: Tensor, offset: int, size: int) -> int:
        start = addr(tensor.ptr.data) - self._addr + offset
        if start < 0 or start + size > self.data.numel():
            raise ValueError("access outside the buffer")
        return start

    def span(self, tensor: Tensor, offset: int, size: int) -> torch.Tensor:
        """The ``size`` bytes of ``tensor`` (in this buffer) from byte ``offset``, as a ``uint8``
        view of ``data``. Raises ValueError for bytes outside the buffer."""
        start = self._start(tensor, offset, size)
        return self.data[start:start + size]

    # On cpu the buffer is host memory: bytes move with memmove/memset (a torch copy_ between
    # uint8 tensors costs milliseconds per MiB on a small machine, memmove microseconds).

    def set_tensor(self, tensor: Tensor, data: memoryview, offset: int) -> None:
        self.weights_cache.clear()
        n = data.nbytes
        if not n:
            return
        if self.host:
            ffi.memmove(ffi.cast("char *", self._addr + self._start(tensor, offset, n)), data, n)
        else:
            with synchronous(self.device):
                self.span(tensor, offset, n).copy_(torch.frombuffer(data, dtype=torch.uint8))

    def get_tensor(self, tensor: Tensor, out: memoryview, offset: int) -> None:
        n = out.nbytes
        if not n:
            return
        if self.host:
            ffi.memmove(out, ffi.cast("char *", self._addr + self._start(tensor, offset, n)), n)
        else:
            with synchronous(self.device):
                torch.frombuffer(out, dtype=torch.uint8).copy_(self.span(tensor, offset, n))

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.weights_cache.clear()
        if not size:
            return
        if self.host:
            ctypes.memset(self._addr + self._start(tensor, offset, size), value, size)
        else:
            with synchronous(self.device):
                self.span(tensor, offset, size).fill_(value)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """A copy from another buffer of this backend (any torch device) or a host buffer."""
        n = src.nbytes
        if n != dst.nbytes:
            return False
        sp = src.ptr
        other = LIVE.get(addr(sp.buffer)) if sp.buffer != ffi.NULL else None
        if isinstance(other, TorchBuffer):
            self.weights_cache.clear()
            if n and self.host and other.host:
                ffi.memmove(ffi.cast("char *", self._addr + self._start(dst, 0, n)), sp.data, n)
            elif n:
                with synchronous(self.device, other.device):
                    self.span(dst, 0, n).copy_(other.data[addr(sp.data) - other._addr:][:n])
            return True
        if sp.buffer != ffi.NULL and lib.ggml_backend_buffer_is_host(sp.buffer):
            self.weights_cache.clear()
            if n and self.host:
                ffi.memmove(ffi.cast("char *", self._addr + self._start(dst, 0, n)), sp.data, n)
            elif n:
                with synchronous(self.device):
                    self.span(dst, 0, n).copy_(torch.frombuffer(ffi.buffer(sp.data, n), dtype=torch.uint8))
            return True
        return False

    def clear(self, value: int) -> None:
        self.weights_cache.clear()
        if self.host:
            ctypes.memset(self._addr, value, self.data.numel())
        else:
            with synchronous(self.device):
                self.data.fill_(value)

    def free_buffer(self) -> None:
        self.freed = True
        _freed[0] += 1
        self.weights_cache.clear()
        with synchronous(self.device):      # no queued work still reads or writes the memory
            self.data = torch.empty(0, dtype=torch.uint8)


class TorchBufferType(PyBufferType):
    """Buffers of torch tensors on one torch device; host memory (``is_host``) for ``cpu``."""

    ALIGNMENT = 128

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        super().__init__()

    def get_name(self) -> str:
        return self.name

    def get_alignment(self) -> int:
        return self.ALIGNMENT

    def is_host(self) -> bool:
        return self.device.type == "cpu"

    def alloc_buffer(self, size: int) -> TorchBuffer:
        return TorchBuffer(self.device, size, self.ALIGNMENT)


def _name(p: Any) -> str:
    return ffi.string(p.name).decode("utf-8", "replace") or "(unnamed)"


def torch_buffer(p: Any) -> "TorchBuffer | None":
    """The ``TorchBuffer`` holding tensor ``p`` (a raw ``struct ggml_tensor *``), else None."""
    buf = p.buffer
    if buf == ffi.NULL:
        return None
    own = LIVE.get(addr(buf))
    return own if isinstance(own, TorchBuffer) else None


def weights_buffer(p: Any) -> "TorchBuffer | None":
    """The ``TorchBuffer`` holding tensor ``p`` if its usage is ``WEIGHTS``, else None."""
    own = torch_buffer(p)
    if own is not None and lib.ggml_backend_buffer_get_usage(p.buffer) == _WEIGHTS:
        return own
    return None


class Views:
    """Torch views of the tensors of a graph on ``device`` (a cache per memory range, kept by
    one plan). ``host``: whether host memory that is not a ``TorchBuffer`` may be seen
    (torch ``cpu`` only). ``checks``: the backend's ``checks.DeviceChecks`` where steps check
    row indices on the device (CUDA), None where they check them on the host."""

    def __init__(self, device: torch.device, checks: Any = None):
        self.device = device
        self.checks = checks
        self.host = device.type == "cpu"
        #: the ``TorchBuffer`` whose memory the views see (by id)
        self.buffers: dict[int, TorchBuffer] = {}
        self._typed: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._foreign: dict[tuple[int, int], torch.Tensor] = {}
        self._seen: dict[Any, torch.Tensor] = {}

    def _bytes(self, p: Any) -> tuple[torch.Tensor, int]:
        """(1-D uint8 tensor, byte offset of ``p``'s data in it)."""
        if p.data == ffi.NULL:
            raise ValueError(f"tensor {_name(p)} has no data: allocate the graph before computing it")
        data = addr(p.data)
        buf = p.buffer
        own = LIVE.get(addr(buf)) if buf != ffi.NULL else None
        if isinstance(own, TorchBuffer):
            if own.device != self.device:
                raise ValueError(f"tensor {_name(p)} is in a buffer on torch device {own.device}, "
                                 f"not {self.device}")
            self.buffers[id(own)] = own
            return own.data, data - own._addr
        if not self.host:
            raise ValueError(f"tensor {_name(p)} is not in a buffer of this torch backend")
        if buf != ffi.NULL and lib.ggml_backend_buffer_is_host(buf):
            base = addr(lib.ggml_backend_buffer_get_base(buf))
            size = int(lib.ggml_backend_buffer_get_size(buf))
        elif buf == ffi.NULL:   # memory of a ggml context (no_alloc=False)
            base, size = data, int(lib.ggml_nbytes(p))
        else:
            raise ValueError(f"tensor {_name(p)} is in a device buffer that torch cannot read")
        key = (base, size)
        t = self._foreign.get(key)
        if t is None:
            t = self._foreign[key] = torch.frombuffer(ffi.buffer(ffi.cast("void *", base), size),
                                                      dtype=torch.uint8)
        return t, data - base

    def _typed_of(self, u8: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        key = (u8.data_ptr(), dtype)
        t = self._typed.get(key)
        if t is None:
            k = dtype.itemsize
            t = self._typed[key] = u8[: u8.numel() - u8.numel() % k].view(dtype)
        return t

    def strided(self, p: Any, dtype: torch.dtype, ne: Any, nb: Any, offset: int = 0) -> torch.Tensor:
        """A view of ``p``'s memory as ``dtype`` with ggml ``ne``/``nb`` (torch shape ``ne``
        reversed), starting ``offset`` bytes after ``p``'s data. Raises ValueError when the
        data, the offset or a stride is not a multiple of the element size."""
        ne = [int(x) for x in ne]
        nb = [int(x) for x in nb]
        if 0 in ne:
            return torch.empty(ne[::-1], dtype=dtype, device=self.device)
        u8, start = self._bytes(p)
        start += offset
        k = dtype.itemsize
        if start % k or nb[0] % k or nb[1] % k or nb[2] % k or nb[3] % k:
            raise ValueError(f"tensor {_name(p)}: data or strides are not multiples of its element size")
        typed = self._typed_of(u8, dtype)
        return torch.as_strided(typed, ne[::-1], [b // k for b in nb[::-1]],
                                typed.storage_offset() + start // k)

    def tensor(self, p: Any) -> torch.Tensor:
        """``p`` (a plain type) as a typed view of its memory, torch shape ``ne`` reversed (one
        view per tensor struct: the structs do not change while a plan is built)."""
        t = self._seen.get(p)
        if t is None:
            t = self._seen[p] = self.strided(p, DTYPES[p.type], p.ne, p.nb)
        return t

    def rows(self, p: Any) -> torch.Tensor:
        """``p``'s rows as bytes, shape (ne3, ne2, ne1, row size) (rows of packed blocks)."""
        rs = int(lib.ggml_row_size(p.type, p.ne[0]))
        return self.strided(p, torch.uint8, (rs, p.ne[1], p.ne[2], p.ne[3]), (1, p.nb[1], p.nb[2], p.nb[3]))
