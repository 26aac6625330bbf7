"""A model's weights in backend buffers: :func:`load_tensors` reads them from a model file
(:class:`~pyggml.core.gguf.GGUFFile`, a whisper.cpp file, anything with the same three
members) or from arrays (safetensors, torch), converted where asked, into buffers of a
backend, each matrix that only products read in the CPU's fastest layout where asked (as
llama.cpp places them), and returns them as :class:`Weights`.

Every byte goes through :meth:`Tensor.set <pyggml.core.tensor.Tensor.set>` or
:meth:`Tensor.set_bytes <pyggml.core.tensor.Tensor.set_bytes>`: checked layouts, and an
exception a Python backend's ``set_tensor`` raises reaches the caller.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from .. import types
from .backend import Backend
from .cpu import CPUBackend
from .device import Device
from ..core.context import Context
from ..core.tensor import Tensor
from ..enums import BufferUsage, GGMLType
from ..memory.buffer_type import BufferType

__all__ = ["TensorSource", "Weights", "load_tensors"]


class TensorSource(Protocol):
    """A model file's tensors: ``tensors`` (infos with ``name``, ``type``, ``ne`` in ggml
    order), ``tensor_info(name)`` (KeyError if none) and ``raw(name)`` (the bytes as stored,
    uint8). :class:`~pyggml.core.gguf.GGUFFile` is one."""

    @property
    def tensors(self) -> Iterable[Any]: ...

    def tensor_info(self, name: str) -> Any: ...

    def raw(self, name: str) -> np.ndarray: ...


class Weights(Mapping[str, Tensor]):
    """``{name: Tensor}`` of loaded weights; ``buffers``: buffer type name -> (tensors, bytes)
    in it. Owns its contexts and buffers: :meth:`close` (or ``with``) frees them, and the
    tensors raise ClosedError after."""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}
        self.buffers: dict[str, tuple[int, int]] = {}
        self._stack = contextlib.ExitStack()

    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer."""
        return sum(b for _, b in self.buffers.values())

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "Weights":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Arrays:
    """A ``{name: array}`` mapping seen as a :class:`TensorSource` (its dtypes' ggml types)."""

    class Info:
        def __init__(self, name: str, a: np.ndarray):
            self.name, self.type, self.ne = name, types.type_of_dtype(a.dtype), tuple(a.shape[::-1]) or (1,)

    def __init__(self, arrays: Mapping[str, Any]):
        self._arrays = arrays

    @property
    def tensors(self) -> list["_Arrays.Info"]:
        return [self.tensor_info(n) for n in self._arrays]

    def tensor_info(self, name: str) -> "_Arrays.Info":
        return _Arrays.Info(name, np.asarray(self._arrays[name]))

    def raw(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self._arrays[name]).reshape(-1).view(np.uint8)


def load_tensors(source: TensorSource | Mapping[str, Any], where: Backend | BufferType,
                 names: Sequence[str] | None = None, *,
                 type_of: Callable[[str, GGMLType], types.TypeLike] | None = None,
                 repack: Callable[[str], bool] | None = None) -> Weights:
    """Load ``names`` (default: all) of ``source`` into buffers of ``where`` (a backend: its
    default buffer type; or a buffer type), buffer usage "weights".

    ``source``: a :class:`TensorSource` (a model file) or ``{name: array}`` (NumPy arrays or
    anything ``np.asarray`` takes; a NumPy shape is ``ne`` reversed). ``type_of(name,
    stored_type)``: the ggml type to keep a tensor in (default: as stored); another than the
    stored one is converted by ggml's own routines (dequantized by its ``to_float``, then
    converted or quantized). ``repack(name)``: true for a tensor that only matrix products read
    (as their first source): on a CPU backend such a tensor goes in the buffer type
    :meth:`Device.weight_buffer_type <pyggml.backends.device.Device.weight_buffer_type>` picks
    (an extra buffer type of the CPU whose products take it, e.g. ``CPU_REPACK``, as llama.cpp
    places weights); other backends ignore it.

    Raises KeyError for an unknown name, ValueError for no tensors or a type ggml cannot
    convert to, what :meth:`Context.new_tensor <pyggml.core.context.Context.new_tensor>` and
    :meth:`Tensor.set <pyggml.core.tensor.Tensor.set>` raise (a Python backend's exception
    included), MemoryError/GGMLError if a buffer cannot be allocated. Nothing stays allocated
    after an error."""
    src: TensorSource = source if not isinstance(source, Mapping) else _Arrays(source)
    infos = [src.tensor_info(n) for n in names] if names is not None else list(src.tensors)
    if not infos:
        raise ValueError("no tensors to load")
    default = where if isinstance(where, BufferType) else where.default_buffer_type
    device = Device.of(where) if isinstance(where, CPUBackend) else None
    groups: dict[BufferType, list[tuple[Any, GGMLType]]] = {}
    for info in infos:
        t = types.ggml_type(type_of(info.name, info.type)) if type_of is not None else info.type
        products = repack is not None and device is not None and repack(info.name)
        buft = device.weight_buffer_type(t, info.ne) if products and device is not None else default
        groups.setdefault(buft, []).append((info, t))
    w = Weights()
    try:
        for buft, group in groups.items():
            ctx = w._stack.enter_context(Context.for_tensors(len(group)))
            made = [(ctx.new_tensor(t, list(info.ne), name=info.name), info) for info, t in group]
            buf = ctx.alloc_tensors(buft)
            buf.usage = BufferUsage.WEIGHTS
            for tensor, info in made:
                raw = src.raw(info.name)
                if tensor.type == info.type:
                    tensor.set_bytes(raw)
                else:   # ggml's conversions: dequantized to float32, then stored as tensor.type
                    tensor.set(types.to_numpy(raw, info.type, info.ne))
                w._tensors[info.name] = tensor
            n, size = w.buffers.get(buft.name, (0, 0))
            w.buffers[buft.name] = (n + len(made), size + buf.size)
    except BaseException:
        w.close()
        raise
    return w
