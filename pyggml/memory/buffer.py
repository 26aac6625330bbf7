"""Backend buffers (``ggml_backend_buffer_t``): one block of memory of a buffer type, and the
record of which buffers are alive.

A :class:`Buffer` from ``alloc_buffer``/``alloc_tensors`` is owned (``ggml_backend_buffer_free``
on close). Graph allocators and schedulers own buffers ggml allocates for them, and free or
replace them when they grow.

**Live buffers.** Tensors point into buffers (``tensor->buffer``, ``tensor->data``); a freed
buffer leaves them pointing at freed memory. pyggml therefore keeps one record per buffer it
made or that an allocator of its made (:func:`track`), retired when the buffer is freed
(:func:`retire`). Data access (``Tensor.numpy``, ``Tensor.set``) and computing a graph check
that every tensor's buffer has a live record and that its data lies inside it; a tensor in a
freed or replaced buffer raises :class:`~pyggml.errors.ClosedError` instead of reading freed
memory. A record is looked up by the buffer's address, and ``malloc`` hands a freed buffer's
addresses (its struct and its memory) to the next buffer of that size at once: so retiring a
buffer also points the tensors of every open context that were in it at a stand-in
(:data:`FREED`, :func:`forget`), which no record will ever match.
"""
from __future__ import annotations

import re
import threading

import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from .. import _cobject
from ..enums import BufferUsage, member
from ..errors import ClosedError
from ..raw import ffi, lib
from ..raw.boundary import calling


__all__ = ["Buffer", "LiveBuffer", "check_layout", "track", "retire", "forget", "FREED", "lookup", "live_table", "graph_buffers",
           "retired_by_placer", "check_graph_memory", "check_placements", "IndexCheck", "host_array_owner"]


def _str(p: Any) -> str:
    return "" if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


class LiveBuffer:
    """The record of one live buffer: its address range and the object that owns it (a
    :class:`Buffer`, a graph allocator or a scheduler; held weakly, so that the record does
    not keep it alive). ``alive`` turns False when it is freed. ``meta``: a buffer of a meta
    device (:mod:`pyggml.backends.meta`), whose tensors' ``data`` are tokens, not addresses (each
    device's slice is in a buffer of that device): no address range to check them against."""

    __slots__ = ("ptr", "base", "size", "_owner", "alive", "meta")

    def __init__(self, ptr: Any, owner: Any):
        self.ptr = ptr
        self.size = int(lib.ggml_backend_buffer_get_size(ptr))
        self.base = int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(ptr))) if self.size else 0
        self._owner = weakref.ref(owner)
        self.alive = True
        self.meta = bool(lib.ggml_backend_buffer_is_meta(ptr))

    @property
    def owner(self) -> Any:
        """The owning object (None if it was collected, which frees the buffer)."""
        return self._owner()

    @owner.setter
    def owner(self, value: Any) -> None:
        self._owner = weakref.ref(value)

    def holds(self, data: Any, nbytes: int) -> bool:
        """Whether ``nbytes`` at address ``data`` (cdata) lie inside this buffer."""
        if self.meta:
            return True
        addr = int(ffi.cast("uintptr_t", data))
        return self.base <= addr and addr + nbytes <= self.base + self.size


#: ggml_backend_buffer_t -> LiveBuffer, for every live buffer pyggml knows (cdata pointers hash
#: and compare by address)
_LIVE: dict[Any, LiveBuffer] = {}
#: buffers graph allocators and schedulers freed (the latest few thousand): tensors still placed
#: in them may be placed again by an allocator, unlike those of a closed Buffer of the user's
_RETIRED_BY_PLACERS: "OrderedDict[Any, None]" = OrderedDict()
_MAX_RETIRED = 4096
#: what the tensors of a freed buffer are pointed at instead (``pyggml_ctx_forget_buffer``), for
#: a buffer of the user's and one of a graph allocator or scheduler: a new buffer that malloc puts
#: at the freed one's address (struct and data) must not make them look placed in it
FREED = (lib.pyggml_freed_buffer(0), lib.pyggml_freed_buffer(1))
#: called with (buffer, stand-in) when a buffer is freed; pyggml.core.tensor, which knows the open
#: contexts, registers the function that points their tensors in it at the stand-in
forgetters: list[Callable[[Any, Any], None]] = []
#: held around every C call that allocates backend buffers together with pyggml's record of
#: them (track; for placers also retire and forget): ggml's allocators free a buffer inside the
#: call that allocates the next one, and pyggml retires it after; another thread's buffer
#: allocated at the freed address in between would be taken for the freed one (its tensors
#: swept away while it computed: found by tests/fuzz_threads_worker.py). A buffer pyggml frees
#: itself is retired first and needs no lock (finalizers free buffers). Re-entrant; held
#: briefly, around C calls whose only Python callbacks are Python buffer types' own; always taken
#: inside the gate (``with calling(), lifecycle:``), never before it (a close waiting at the gate
#: would wait for a call that waits for it)
lifecycle = threading.RLock()


class _Lifecycle:
    """:data:`lifecycle` as an object :class:`pyggml.raw.threads.using` takes with the others (a
    placement takes it with its contexts' locks, all at once)."""

    _lock = lifecycle


LIFECYCLE = _Lifecycle()
_table: list[Any] = [None, 0, -1]  # [C array of struct pyggml_live_buffer, length, version]
_version = 0
#: counts the times a placer forgot the places of tensors (data NULL again, to place them
#: anew: pyggml.backends.alloc.Placer._unplace): a check of another graph of those tensors, made while
#: they had data, holds no longer (pyggml.backends.backend)
unplaced = 0


def note_unplaced() -> None:
    global unplaced
    unplaced += 1


def track(ptr: Any, owner: Any) -> LiveBuffer:
    """Record ``ptr`` as a live buffer owned by ``owner`` (idempotent for the same owner)."""
    global _version
    rec = _LIVE.get(ptr)
    if rec is None or rec.owner is not owner:
        if rec is not None:
            rec.alive = False
        rec = _LIVE[ptr] = LiveBuffer(ptr, owner)
        _RETIRED_BY_PLACERS.pop(ptr, None)
        _version += 1
    return rec


def retire(ptr: Any, *, by_placer: bool = False, sweep: bool = True) -> None:
    """Forget ``ptr``: it was freed (or is about to be). Tensors in it become unusable (and,
    ``by_placer``: an allocator may place them again); ``sweep``: the tensors of open contexts
    in it are pointed at a stand-in now (:func:`forget`; a placer that reallocated calls it
    itself once it knows its new buffers)."""
    global _version
    if sweep:
        forget(ptr, by_placer=by_placer)
    rec = _LIVE.pop(ptr, None)
    if rec is not None:
        rec.alive = False
        _version += 1
    if by_placer:
        _RETIRED_BY_PLACERS[ptr] = None
        if len(_RETIRED_BY_PLACERS) > _MAX_RETIRED:
            _RETIRED_BY_PLACERS.popitem(last=False)


def forget(ptr: Any, *, by_placer: bool = False) -> None:
    """Point the tensors of every open context that are in buffer ``ptr`` (freed, or about to
    be) at the stand-in of :data:`FREED`: using them raises ClosedError (by_placer: an
    allocator places them again), even once malloc gives a new buffer the same address."""
    for f in forgetters:
        f(ptr, FREED[1 if by_placer else 0])


def retired_by_placer(ptr: Any) -> bool:
    """Whether ``ptr`` is a buffer a graph allocator or scheduler freed (and nothing live now)."""
    return ptr == FREED[1] or (ptr in _RETIRED_BY_PLACERS and ptr not in _LIVE)


def lookup(ptr: Any) -> LiveBuffer | None:
    """The record of buffer ``ptr``, or None if pyggml knows no live buffer there."""
    return _LIVE.get(ptr)


def live_table() -> tuple[Any, int]:
    """Every live buffer as a C array of ``struct pyggml_live_buffer`` (for the C helpers that
    check a whole graph's memory at once), and its length; rebuilt only when buffers change."""
    if _table[2] != _version:
        recs = list(_LIVE.values())
        arr = ffi.new("struct pyggml_live_buffer[]", max(len(recs), 1))
        for i, r in enumerate(recs):
            arr[i].buffer, arr[i].base, arr[i].size = (r.ptr, 0, 2**64 - 1) if r.meta else (r.ptr, r.base, r.size)
        _table[:] = [arr, len(recs), _version]
    return _table[0], _table[1]


def graph_buffers(g: Any) -> list[Any]:
    """The distinct buffers (``ggml_backend_buffer_t``) graph ``g``'s nodes and sources are in
    (possibly freed ones: compare them, never dereference them)."""
    cap = 64
    while True:
        out = ffi.new("ggml_backend_buffer_t[]", cap)
        n = lib.pyggml_graph_buffers(g, out, cap)
        if n >= 0:
            return [out[i] for i in range(n)]
        cap *= 4


def check_tensor_memory(p: Any, name: Callable[[], str]) -> LiveBuffer | None:
    """For a tensor struct ``p`` whose data is in a backend buffer: its :class:`LiveBuffer`.
    Raises ClosedError if the buffer is not live or the data is not inside it (the buffer was
    freed, or replaced by a reallocation), naming the tensor ``name()`` (called only then).
    Returns None for tensors whose data is not in a backend buffer (context memory)."""
    v = p.view_src
    buf = v.buffer if v != ffi.NULL else p.buffer
    if buf == ffi.NULL:
        return None
    rec = _LIVE.get(buf)
    if rec is None or not rec.holds(p.data, 0):
        raise ClosedError(f"the buffer holding tensor {name()} was freed or replaced (its buffer, "
                          "graph allocator or scheduler was closed, or reallocated for a larger "
                          "graph): allocate it again")
    return rec


def check_layout(p: Any, *, read: bool, offset: int = 0, size: int | None = None) -> None:
    """ValueError if tensor struct ``p`` is in memory that keeps tensors in a layout of its own
    (a buffer without ``get_tensor``: an extra buffer type's, such as ``CPU_REPACK`` or ``AMX``,
    :mod:`pyggml.backends.extra_bufts`) and this access would crash or abort the process: any
    read (``read=True``); a write of a view, of bytes [``offset``, ``offset + size``) short of
    the whole tensor, or of a tensor the buffer type has no layout for (``extra`` NULL)."""
    v = p.view_src
    buf = v.buffer if v != ffi.NULL else p.buffer
    if buf == ffi.NULL or buf.iface.get_tensor != ffi.NULL:
        return
    where = f"tensor {label(p)} is in a {_str(lib.ggml_backend_buffer_name(buf))} buffer, which keeps it in a layout of its own"
    if read:
        raise ValueError(f"{where}: it cannot be read back (keep the values you wrote into it)")
    if v != ffi.NULL:
        raise ValueError(f"{where}: a view of it cannot be written")
    if offset != 0 or (size is not None and size != int(lib.ggml_nbytes(p))):
        raise ValueError(f"{where}: it is written whole or not at all")
    if p.extra == ffi.NULL:
        raise ValueError(f"{where}, and has none for a {_str(lib.ggml_type_name(p.type))} tensor "
                         f"of ne {list(p.ne)}: allocate it in the device's default buffer type")


_AUTO_NAME = re.compile(r"(node|leaf)_\d+")


def label(p: Any) -> str:
    """How messages name tensor struct ``p``: the name it was given, or its op and ne (after
    the name ggml gives unnamed graph tensors, ``node_<i>``/``leaf_<i>``)."""
    name = ffi.string(p.name).decode("utf-8", "surrogateescape")  # as tensor.name_str
    if name and not _AUTO_NAME.fullmatch(name):
        return repr(name)
    what = f"({ffi.string(lib.ggml_op_name(p.op)).decode()} ne={list(p.ne)})"
    return f"{name!r} {what}" if name else what


def check_graph_memory(g: Any, *, need_data: bool) -> None:
    """Check every node and source of graph ``g`` in one C call (``pyggml_graph_check_memory``):
    a tensor in a backend buffer must be in a live one, its data inside it; with
    ``need_data``, every tensor must have data. Raises ValueError (no data) or ClosedError."""
    table, n = live_table()
    bad, node = ffi.new("struct ggml_tensor **"), ffi.new("struct ggml_tensor **")
    code = lib.pyggml_graph_check_memory(g, table, n, need_data, bad, node)
    if code == 1:
        what = (f"node {label(node[0])}" if bad[0] == node[0]
                else f"tensor {label(bad[0])} (a source of node {label(node[0])})")
        raise ValueError(f"{what} has no data: allocate the graph first (GraphAllocator, "
                         "Scheduler, Context.alloc_tensors)")
    if code:
        raise ClosedError(f"tensor {label(bad[0])} of this graph is in a buffer that was freed or "
                          "replaced (its buffer, graph allocator or scheduler was closed, or "
                          "reallocated for a larger graph): allocate the graph again")


def check_placements(graph: Any, records: list[LiveBuffer], placer: Any) -> list[tuple[Any, Any]]:
    """ClosedError for a tensor of ``graph`` (a pyggml Graph) in the memory of a graph
    allocator or scheduler other than ``placer`` that no longer holds it there (it placed
    another graph since, or was reset): a compute would read or write another graph's memory.
    Such memory is live, so :func:`check_graph_memory` passes it; its owner says what it holds
    (``still_holds``). Costs nothing when no tensor of the graph is in such memory. Returns
    those placers with what they hold now (``holding()``): the check holds while that does not
    change."""
    foreign = {r.ptr: o for r in records
               if (o := r.owner) is not None and o is not placer and hasattr(o, "still_holds")}
    if not foreign:
        return []
    for p in graph.node_set():
        v = p.view_src
        root = v if v != ffi.NULL else p
        owner = foreign.get(root.buffer)
        if owner is not None and root.data != ffi.NULL and not owner.still_holds(root):
            raise ClosedError(f"tensor {label(root)} of this graph was placed by a graph allocator or "
                              "scheduler that has since placed another graph or was reset (its memory "
                              "holds other values now): allocate this graph again")
    return [(o, o.holding()) for o in {id(o): o for o in foreign.values()}.values()]


# ops whose CPU kernels read row indices from data: (index source, the node's tensor and
# dimension that bounds them, ggml-cpu/ops.cpp)
_INDEX_OPS = {
    lib.GGML_OP_GET_ROWS: (1, 0, 1),       # src1 in [0, src0->ne[1]): GGML_ASSERT (abort)
    lib.GGML_OP_SET_ROWS: (1, -1, 1),      # src1 in [0, dst->ne[1]): GGML_ASSERT (abort)
    lib.GGML_OP_GET_ROWS_BACK: (1, -1, 1),  # src1 in [0, dst->ne[1]): unchecked write
    lib.GGML_OP_MUL_MAT_ID: (2, 0, 2),     # ids in [0, src0->ne[2]): unchecked read
    lib.GGML_OP_ADD_ID: (2, 1, 1),         # ids in [0, src1->ne[1]): GGML_ASSERT (abort)
}
_INDEX_TYPES = (lib.GGML_TYPE_I32, lib.GGML_TYPE_I64)
_MAX_SRC = int(lib.GGML_MAX_SRC)


def _in_meta(t: Any) -> bool:
    """Whether tensor struct ``t`` (or the tensor it views) is in a meta device's buffer."""
    root = t.view_src if t.view_src != ffi.NULL else t
    return root.buffer != ffi.NULL and bool(lib.ggml_backend_buffer_is_meta(root.buffer))


class IndexCheck:
    """The row indices a graph's nodes read from tensor data (get_rows, set_rows,
    get_rows_back, mul_mat_id, add_id), checked before each compute in one C call
    (``pyggml_check_indices``; a compute makes it inside its own call into C,
    ``pyggml_compute``: :func:`pyggml.backends.graph_run.compute`): an index out of range would
    abort in ggml's CPU kernel, or read or write outside a tensor. Each index tensor is checked
    once per bound. Only index tensors that no node of the graph computes (leafs, such as
    inputs, and views of them) are checked, and only in host memory; indices a node computes
    (argsort, top_k) are ggml's own. Index tensors in a meta device's buffer (their ``data`` are
    not addresses, whatever the buffer type says) are read with ``ggml_backend_tensor_get``.
    :meth:`of` returns None for a graph without any."""

    __slots__ = ("tensors", "bounds", "nodes", "n", "meta", "bad")

    def __init__(self, tensors: list[Any], bounds: list[int], nodes: list[Any]):
        meta = [k for k, t in enumerate(tensors) if _in_meta(t)]
        for k in meta:
            if not lib.ggml_is_contiguous(tensors[k]):
                raise ValueError(f"node {label(nodes[k])} reads row indices from a strided view "
                                 f"{label(tensors[k])} of a meta device's memory, which pyggml cannot "
                                 "check: make the indices a tensor of their own")
        #: (tensor, bound, node) of the index tensors in meta memory
        self.meta = [(tensors[k], bounds[k], nodes[k]) for k in meta]
        keep = [k for k in range(len(tensors)) if k not in meta]
        self.tensors = ffi.new("struct ggml_tensor *[]", [tensors[k] for k in keep])
        self.bounds = ffi.new("int64_t[]", [bounds[k] for k in keep])
        self.nodes = [nodes[k] for k in keep]
        self.n = len(keep)
        #: what ``pyggml_check_indices`` found: the k of the tensor out of range (-1: none), its value
        self.bad = ffi.new("int64_t[2]", [-1, 0])

    @classmethod
    def of(cls, nodes: list[Any], saved: Any = None) -> "IndexCheck | None":
        """The check for node structs ``nodes`` (in graph order), or None. ``saved``: the
        sources as they were before a scheduler's split rewrote them to its copies (a
        :class:`pyggml.core.graph.Graph`'s saved sources, ``GGML_MAX_SRC`` per node): the
        indices are read in the tensors the user set, which the compute copies."""
        tensors, bounds, readers = [], [], []
        seen = set()   # (tensor, bound): a KV cache's row indices are read by every layer's set_rows
        for k, p in enumerate(nodes):
            rule = _INDEX_OPS.get(p.op)
            if rule is None:
                continue
            i, by, dim = rule
            t = p.src[i] if saved is None else saved[k * _MAX_SRC + i]
            if t == ffi.NULL or t.type not in _INDEX_TYPES:
                continue
            root = t.view_src if t.view_src != ffi.NULL else t
            if root.op != lib.GGML_OP_NONE:
                continue
            bound = int((p if by < 0 else p.src[by]).ne[dim])
            if (t, bound) in seen:
                continue
            seen.add((t, bound))
            tensors.append(t)
            bounds.append(bound)
            readers.append(p)
        return cls(tensors, bounds, readers) if tensors else None

    def run(self) -> None:
        """Raises ValueError naming the node, the index tensor and the value out of range."""
        bad = self.bad
        with calling():  # ggml_backend_buffer_is_host of a Python buffer type
            bad[0] = lib.pyggml_check_indices(self.tensors, self.bounds, self.n, bad + 1)
        self.raise_bad()
        self.run_meta()

    def raise_bad(self) -> None:
        """ValueError if the last check in C (:meth:`run`, ``pyggml_compute``) found an index
        out of range."""
        k = int(self.bad[0])
        if k >= 0:
            self._raise(self.nodes[k], self.tensors[k], int(self.bad[1]), int(self.bounds[k]))

    def run_meta(self) -> None:
        """The check of the index tensors in a meta device's memory (read with
        ``ggml_backend_tensor_get``), which the one in C skips."""
        for t, bound, node in self.meta:
            raw = np.empty(int(lib.ggml_nbytes(t)), dtype=np.uint8)
            with calling():
                lib.ggml_backend_tensor_get(t, ffi.from_buffer(raw), 0, raw.nbytes)
            values = raw.view(np.int32 if t.type == lib.GGML_TYPE_I32 else np.int64)
            bad = np.flatnonzero((values < 0) | (values >= bound))
            if bad.size:
                self._raise(node, t, int(values[bad[0]]), bound)

    @staticmethod
    def _raise(node: Any, t: Any, value: int, bound: int) -> None:
        raise ValueError(
                f"node {label(node)} reads row index {value} from tensor "
                f"{label(t)}, outside [0, {bound}): ggml would "
                f"{'abort' if node.op in (lib.GGML_OP_GET_ROWS, lib.GGML_OP_SET_ROWS) else 'read or write out of bounds'}. "
                "(An input's memory is reused by later nodes during a compute: set every input "
                "again before each compute.)")


class Buffer(_cobject.CObject):
    """A backend buffer (``ggml_backend_buffer_t``).

    Owned buffers are freed with ``ggml_backend_buffer_free`` on :meth:`close`; tensors placed
    in them then raise :class:`~pyggml.errors.ClosedError` when used. ``keep`` is kept alive with
    the buffer (e.g. the NumPy array a host-pointer buffer wraps).
    """

    _kind = "buffer"
    _c_free = lib.ggml_backend_buffer_free
    _parts: tuple[Any, ...] = ()  # a multi-buffer's parts (their pointers)

    def __init__(self, ptr: Any, *, owned: bool, keep: Any = None, owner: Any = None):
        super().__init__(ptr, owned=owned, owner=owner, keep=keep)
        if owned:
            track(ptr, self)

    def _free(self, ptr: Any) -> None:
        # forgotten before it is freed: no lifecycle lock needed (a finalizer may run this)
        retire(ptr)
        for part in self._parts:  # a multi-buffer frees its parts
            retire(part)
        with calling():  # a Python buffer's free_buffer
            lib.ggml_backend_buffer_free(ptr)

    def close(self) -> None:
        """``ggml_backend_buffer_free`` if owned (idempotent). Tensors in the buffer become
        unusable at once (even while a NumPy view keeps the memory itself alive)."""
        if self._ptr is not None and self._owned:
            rec = _LIVE.get(self._ptr)
            if rec is not None and rec.owner is self:
                retire(self._ptr)
        super().close()

    @property
    def name(self) -> str:
        """``ggml_backend_buffer_name``."""
        with calling():  # the name of its buffer type
            return _str(lib.ggml_backend_buffer_name(self.ptr))

    @property
    def size(self) -> int:
        """Bytes (``ggml_backend_buffer_get_size``)."""
        return int(lib.ggml_backend_buffer_get_size(self.ptr))

    @property
    def base(self) -> int:
        """Address of the first byte (``ggml_backend_buffer_get_base``; 0 for empty buffers)."""
        if self.size == 0:
            return 0
        return int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(self.ptr)))

    @property
    def alignment(self) -> int:
        """Byte alignment of tensor data (``ggml_backend_buffer_get_alignment``)."""
        with calling():
            return int(lib.ggml_backend_buffer_get_alignment(self.ptr))

    @property
    def max_size(self) -> int:
        """``ggml_backend_buffer_get_max_size``, bytes."""
        with calling():
            return int(lib.ggml_backend_buffer_get_max_size(self.ptr))

    @property
    def is_host(self) -> bool:
        """Whether the memory is host memory (``ggml_backend_buffer_is_host``; a meta device's
        buffer says so when all its devices' do, see :attr:`is_meta`)."""
        with calling():
            return bool(lib.ggml_backend_buffer_is_host(self.ptr))

    @property
    def is_meta(self) -> bool:
        """Whether this is a meta device's buffer (``ggml_backend_buffer_is_meta``): each
        tensor's slices are in buffers of the meta device's devices, and its ``data`` is no
        address."""
        with calling():
            return bool(lib.ggml_backend_buffer_is_meta(self.ptr))

    @property
    def usage(self) -> BufferUsage:
        """:class:`~pyggml.enums.BufferUsage` (``ggml_backend_buffer_get/set_usage``); set it with
        a member or a name (``"weights"``)."""
        with calling():  # a call: no close meanwhile
            return BufferUsage(lib.ggml_backend_buffer_get_usage(self.ptr))

    @usage.setter
    def usage(self, value: BufferUsage | str | int) -> None:
        with calling():  # a call: no close meanwhile
            lib.ggml_backend_buffer_set_usage(self.ptr, member(BufferUsage, value))

    def alloc_size(self, tensor: _cobject.HasPtr) -> int:
        """Bytes ``tensor`` (a :class:`~pyggml.core.tensor.Tensor`) takes in this buffer
        (``ggml_backend_buffer_get_alloc_size``)."""
        with calling():
            return int(lib.ggml_backend_buffer_get_alloc_size(self.ptr, tensor.ptr))

    def clear(self, value: int = 0) -> None:
        """Set every byte to ``value`` (0..255; ``ggml_backend_buffer_clear``). Raises what a
        Python buffer's ``clear`` raised."""
        if not 0 <= value <= 255:
            raise ValueError("clear value is a byte: 0..255")
        if self.size:
            with calling():
                lib.ggml_backend_buffer_clear(self.ptr, value)

    def reset(self) -> None:
        """``ggml_backend_buffer_reset`` (backend-specific tensor state)."""
        with calling():
            lib.ggml_backend_buffer_reset(self.ptr)

    @property
    def is_multi_buffer(self) -> bool:
        """``ggml_backend_buffer_is_multi_buffer``."""
        return bool(lib.ggml_backend_buffer_is_multi_buffer(self.ptr))

    @staticmethod
    def multi(buffers: list["Buffer"]) -> "Buffer":
        """``ggml_backend_multi_buffer_alloc_buffer``: one buffer made of ``buffers``, which it
        takes over: they are freed with it, and closing one of them alone raises ValueError."""
        if not buffers:
            raise ValueError("a multi-buffer needs at least one buffer")
        for b in buffers:
            if not b.owned or b.closed:
                raise ValueError("a multi-buffer takes over open buffers pyggml owns")
        arr = ffi.new("ggml_backend_buffer_t[]", [b.ptr for b in buffers])
        with calling(), lifecycle:  # the gate first, as every call
            ptr = lib.ggml_backend_multi_buffer_alloc_buffer(arr, len(buffers))
            multi = Buffer(ptr, owned=True, keep=buffers)
        for b in buffers:
            b._owned = False
            b._owner = multi  # borrowed from the multi-buffer now: closed with it
            rec = _LIVE.get(b._ptr)
            if rec is not None:
                rec.owner = multi
        multi._parts = tuple(b._ptr for b in buffers)
        return multi

    def numpy(self) -> np.ndarray:
        """Zero-copy ``uint8`` view of a host buffer's bytes (NumPy shape ``(size,)``); keeps the
        buffer's memory alive. Raises ValueError for a device (non-host) buffer, or a meta
        device's (its bytes are in its devices' buffers)."""
        if not self.is_host or self.is_meta:
            raise ValueError(f"buffer {self.name} is not in host memory")
        holder = host_array_owner(self.base, (self.size,), (1,), np.dtype(np.uint8), self)
        self._export(holder)
        return np.asarray(holder)

    def __repr__(self) -> str:
        return "<Buffer (closed)>" if self.closed else f"<Buffer {self.name} {self.size} bytes {self.usage.name.lower()}>"


class _ArrayOwner:
    """Exposes host memory to NumPy through ``__array_interface__`` while holding its owner."""

    def __init__(self, address: int, shape: Any, strides: Any, dtype: np.dtype, owner: Any):
        self.owner = owner
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                    "strides": tuple(strides), "typestr": dtype.str, "version": 3}


def host_array_owner(address: int, shape: Any, strides: Any, dtype: np.dtype, owner: Any) -> Any:
    """An object NumPy makes a view of (``np.asarray``) for host memory at ``address``, keeping
    ``owner`` alive as long as the view. No checks: callers make sure the memory is host memory
    and large enough."""
    return _ArrayOwner(address, shape, strides, dtype, owner)
