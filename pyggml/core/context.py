"""ggml contexts (``struct ggml_context``): the memory arena that holds tensor structs, graphs and,
unless ``no_alloc``, tensor data.

A context is fixed-size: ggml asserts (and aborts the process) when it is full. :class:`Context`
checks the free space before every tensor or graph it creates and raises :class:`MemoryError`
instead. Op constructors are methods (:class:`pyggml.core.ops.Ops`), as in C: ``ctx.add(a, b)`` is
``ggml_add(ctx, a, b)``; the result lives in ``ctx``.

The arena is allocated by pyggml (a NumPy array handed to ``ggml_init`` as ``mem_buffer``), so a
size the machine cannot provide raises MemoryError instead of ggml's assert, and NumPy views of
tensor data in the arena keep it alive after the context is closed.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from .. import _cobject, types
from ..memory import buffer
from . import tensor as _tensor_mod
from ..raw import threads
from ..memory.buffer import Buffer, check_tensor_memory
from ..memory.buffer_type import BufferType
from ..errors import ClosedError, GGMLError
from .graph import Graph
from .ops import Ops, _check_nelements
from ..raw import ffi, lib
from ..raw.boundary import calling
from .tensor import Tensor, tensor_arg

__all__ = ["Context", "HasBufferType", "tensor_overhead", "DEFAULT_MEM_SIZE"]


class HasBufferType(Protocol):
    """What has a default buffer type: a :class:`~pyggml.backends.backend.Backend` (built on contexts,
    so this module names it through this)."""

    @property
    def default_buffer_type(self) -> BufferType: ...

DEFAULT_MEM_SIZE = 16 * 1024 * 1024
_OVERHEAD = int(lib.ggml_tensor_overhead())
_NONE = lib.GGML_OP_NONE
_new_object = object.__new__
_ALIGN = int(lib.GGML_MEM_ALIGN)
#: the largest data size pyggml lets a tensor have (ggml computes sizes in size_t/int64)
_MAX_BYTES = 2**62


#: bytes new_graph reserves beyond ggml_graph_overhead_custom (the estimate's margin)
_GRAPH_MARGIN = 64


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _make_stale(ctx: "Context") -> None:
    """``ctx`` was reset or closed (every context's lock held: :class:`pyggml.raw.threads.closing`):
    every context whose nodes read its tensors, directly or through others, is stale. Their op
    constructors take the slow path (``_room`` < 0), where :meth:`Context._reserve` raises
    ClosedError."""
    for d in threads.live_contexts():
        if d is not ctx and d._deps and not d._stale and d._gen >= 0 and d._stale_dep() is not None:
            d._stale = True
            d._room = -1


class Context(_cobject.CObject, Ops):
    """A ggml context (``ggml_init`` / ``ggml_free``); owns its memory.

    ``mem_size`` is in bytes. With ``no_alloc=True`` tensors get no data in the context (allocate
    them in a backend buffer: :meth:`alloc_tensors`, a graph allocator or a scheduler); each
    tensor then needs :func:`tensor_overhead` bytes. Raises MemoryError if the arena cannot be
    allocated, ValueError for a negative size.
    """

    _kind = "context"
    _c_free = lib.ggml_free

    def __init__(self, mem_size: int = DEFAULT_MEM_SIZE, *, no_alloc: bool = False):
        mem_size = int(mem_size)
        if mem_size < 0:
            raise ValueError("mem_size must be >= 0")
        size = _pad(max(mem_size, _ALIGN), _ALIGN)
        try:
            raw = np.empty(size + 64, dtype=np.uint8)
        except (MemoryError, ValueError):
            raise MemoryError(f"could not allocate a ggml context of {mem_size} bytes") from None
        start = -raw.ctypes.data % 64
        self._arena = raw[start:start + size]  # kept alive by the context and by views into it
        ptr = lib.ggml_init({"mem_size": size, "mem_buffer": ffi.cast("void *", self._arena.ctypes.data),
                             "no_alloc": no_alloc})
        super().__init__(ptr, owned=True)
        self._gen = 0                      # changed by reset() and close(): tensors check it
        self._mem_size = int(lib.ggml_get_mem_size(ptr))
        self._room = size                  # free bytes, never more than the real free space
        self._raw = False                  # raw code has the pointer: ask ggml each time (ptr)
        self._no_alloc = bool(no_alloc)
        self._buffers: list[Buffer] = []   # from alloc_tensors, closed with the context
        self._callbacks: list[Any] = []    # Python ops (map_custom) live as long as the context
        self._deps: dict[Any, int] = {}    # other contexts whose tensors ours point at -> their
                                           # generation then
        self._stale = False                # a context in _deps was reset or closed since
        self._trial_ops: set[int] = set()  # ops made by Ops.op without checks of their own
        self._arena_lo = int(self._arena.ctypes.data)  # the tensor structs of this context lie
        self._arena_hi = self._arena_lo + size          # in [lo, hi) (Context._give_data)
        # ``_lock``: taken by whatever makes, walks or places the context's tensors (op
        # constructors without the gate: closes and resets take every context's lock)
        threads.register_context(self)
        _tensor_mod.register_arena(self, self._arena.ctypes.data, size)

    @classmethod
    def of(cls, obj: Tensor | Graph) -> "Context":
        """The context whose memory holds ``obj`` (a tensor or a graph). ValueError for one
        that belongs to no pyggml context (lent to a callback, or ggml's own), TypeError for
        anything else."""
        if not isinstance(obj, (Tensor, Graph)):
            raise TypeError(f"Context.of takes a Tensor or a Graph, not {type(obj).__name__}")
        owner = obj._owner
        if not isinstance(owner, Context):
            raise ValueError(f"this {obj._kind} belongs to no pyggml context ({getattr(owner, 'name', owner)})")
        return owner

    @classmethod
    def for_tensors(cls, n_tensors: int, *, graph_size: int = 0) -> "Context":
        """A ``no_alloc`` context sized for ``n_tensors`` tensor structs plus, if ``graph_size``,
        one graph of that many nodes."""
        size = n_tensors * _OVERHEAD
        if graph_size:  # as much as new_graph(graph_size) reserves
            size += int(lib.ggml_graph_overhead_custom(graph_size, False)) + _GRAPH_MARGIN
        return cls(size, no_alloc=True)

    # ------------------------------------------------------------------ properties
    @property
    def ptr(self) -> Any:
        """The ``struct ggml_context *``, for raw calls; raises ClosedError once closed.

        Raw calls may make tensors, nodes and graphs in the context through it, or switch its
        ``no_alloc``: from the first read of ``ptr`` on, the context asks ggml for its free space
        (``ggml_used_mem``) before each tensor it makes, instead of counting the space in Python,
        so that a full context still raises MemoryError rather than letting ggml abort."""
        p = self._live_ptr()
        self._raw = True
        self._recount()
        return p

    def _recount(self) -> None:
        """A C call made objects in the context (a backward pass, ggml-opt): the next tensor
        asks ggml for the free space instead of trusting the count."""
        self._room = -1

    @property
    def mem_size(self) -> int:
        """Arena size in bytes (``ggml_get_mem_size``)."""
        with calling():  # a call: no close meanwhile
            return int(lib.ggml_get_mem_size(self._live_ptr()))

    @property
    def used_mem(self) -> int:
        """Bytes in use (``ggml_used_mem``)."""
        with calling():  # a call: no close meanwhile
            return int(lib.ggml_used_mem(self._live_ptr()))

    @property
    def no_alloc(self) -> bool:
        """Whether tensors get no data in the context (``ggml_get_no_alloc``)."""
        with calling():  # a call: no close meanwhile
            return bool(lib.ggml_get_no_alloc(self._live_ptr()))

    def reset(self) -> None:
        """``ggml_reset``: forget every tensor and graph. Their Python objects raise ClosedError
        from now on; the memory is reused by what the context makes next. Contexts whose nodes
        read this context's tensors refuse new tensors, nodes and graphs (ClosedError) until
        they are reset themselves, and their graphs are refused."""
        lib.ggml_reset(self._live_ptr())
        self._gen += 1
        self._room = -1 if self._raw else self._mem_size
        self._trial_ops.clear()
        self._deps.clear()
        self._stale = False
        _make_stale(self)

    # ------------------------------------------------------------------ dependencies
    def _add_dep(self, owner: Any) -> None:
        """Record that nodes of this context read tensors of ``owner`` (a context or a borrow
        scope) in its current generation. Raises ClosedError if ``owner``'s own nodes read
        memory that is gone (its tensors may point into it). The caller holds this context's lock."""
        if getattr(owner, "_stale", False):
            owner._check_deps()
        self._deps.setdefault(owner, owner._gen)

    def _drop_dep(self, owner: Any) -> None:
        """Undo :meth:`_add_dep` of ``owner`` (a node that read its tensors was refused)."""
        self._deps.pop(owner, None)

    def _stale_dep(self) -> Any:
        """A context this one depends on (transitively) that was reset or closed since, or None."""
        seen: set[int] = set()
        todo = [self]
        while todo:
            ctx = todo.pop()
            for dep, gen in tuple(getattr(ctx, "_deps", {}).items()):  # (atomic: threads add)
                if dep._gen != gen:
                    return dep
                if id(dep) not in seen:
                    seen.add(id(dep))
                    todo.append(dep)
        return None

    def _recorded_gen(self, ctx: Any) -> int | None:
        """The generation ``ctx`` had when this context (or one it depends on, transitively)
        recorded it as a dependency, or None if none did."""
        seen: set[int] = set()
        todo = [self]
        while todo:
            c = todo.pop()
            for dep, gen in tuple(getattr(c, "_deps", {}).items()):
                if dep is ctx:
                    return int(gen)
                if id(dep) not in seen:
                    seen.add(id(dep))
                    todo.append(dep)
        return None

    def _check_deps(self) -> None:
        """Raise ClosedError if a context whose tensors this one's nodes read was reset or
        closed since (see :meth:`reset`)."""
        if self._stale_dep() is not None:
            raise ClosedError("a context whose tensors this context's nodes read was reset or closed "
                              "since: those nodes point at memory that is gone (reset this context too)")
        self._stale = False

    def tensors(self) -> Iterator[Tensor]:
        """Every tensor of the context, in creation order (``ggml_get_first/next_tensor``).
        ClosedError from the next step once the context is reset or closed."""
        gen = self._gen
        # each wrapped under the lock: its ne and generation are read before a reset can put
        # another tensor there
        with threads.using(self, gate=False):
            t = lib.ggml_get_first_tensor(self._live_ptr())
            out = None if t == ffi.NULL else Tensor(t, self)
        while out is not None:
            yield out
            with threads.using(self, gate=False):
                if self._gen != gen:
                    raise ClosedError("the context was reset or closed while its tensors were listed")
                t = lib.ggml_get_next_tensor(self._live_ptr(), out._ptr)
                out = None if t == ffi.NULL else Tensor(t, self)

    def get_tensor(self, name: str) -> Tensor:
        """``ggml_get_tensor``: the context's tensor named ``name`` (see :attr:`Tensor.name
        <pyggml.core.tensor.Tensor.name>`); KeyError if none has that name, TypeError unless a str."""
        raw = _tensor_mod.lookup_name_bytes(name)
        with threads.using(self, gate=False):
            t = lib.ggml_get_tensor(self._live_ptr(), raw) if raw is not None else ffi.NULL
            out = None if t == ffi.NULL else Tensor(t, self)  # under the lock, as in tensors()
        if out is None:
            raise KeyError(name)
        return out

    # ------------------------------------------------------------------ memory checks
    def _reserve(self, data_bytes: int = 0, n_objects: int = 1, extra: int = 0) -> None:
        """Raise MemoryError unless ``n_objects`` tensors (with ``data_bytes`` of data when the
        context allocates) and ``extra`` bytes fit (ggml would assert instead). The estimate is
        an upper bound; the exact free space is asked from ggml only when it runs low."""
        if self._stale:
            self._check_deps()
        if self._raw:  # raw code may have switched no_alloc
            self._no_alloc = bool(lib.ggml_get_no_alloc(self._live_ptr()))
        need = n_objects * _OVERHEAD + extra
        if data_bytes and not self._no_alloc:
            need += _pad(data_bytes, _ALIGN)
        if need > self._room:
            self._room = self._mem_size - int(lib.ggml_used_mem(self._live_ptr()))
            if need > self._room:
                raise MemoryError(f"ggml context full: {need} bytes needed, {self._room} free of "
                                  f"{self._mem_size} (make a larger Context)")
        # once raw code has the pointer, the next tensor asks ggml again (see ``ptr``)
        self._room = -1 if self._raw else self._room - need

    # ------------------------------------------------------------------ nodes (op constructors)
    def _node(self, fn: Any, inputs: Sequence[Tensor], ne: tuple[int, ...] | None,
                    type: Any, contig: bool | None, args: tuple[Any, ...], need: int = _OVERHEAD) -> Tensor:
        """The new node ``fn(*args)`` (``args[0]`` is ``self._ptr``: a call with one whole tuple costs
        least), its ``ne`` and type as the caller computed them the way ggml.c does
        (``tests/test_ops.py`` compares them with C's for every op that passes them), or read from
        C when ``ne`` is None. ``contig`` True: the result is known to be contiguous (a new
        tensor, or a reshape), so later contiguity checks of it need no C call (``Tensor._contig``).

        The context's free space (``need`` bytes: the tensor structs the call makes) is checked
        first. In a ``no_alloc`` context (the common case) that is all. In an allocating context the
        node is made with allocation switched off, so its data size is known before any data is
        taken from the arena; the context's space is checked again, then data is given with
        ``ggml_new_buffer``. A context that made a node from another context's tensors keeps that
        context alive and records its generation (``Context._deps``: a reset or close of that
        context makes this one refuse new nodes until it is reset itself, since its nodes point at
        memory that is gone). This is the hot path of every op constructor: it reads only Python
        attributes besides the one C call."""
        # threads take turns in a context's arena (ggml's is not thread-safe): its lock, and no
        # close or reset meanwhile (they take every context's lock: pyggml.raw.threads). The fast path:
        # every input is open and lives in this context or in a context it recorded as a
        # dependency, the context has room by the count and makes no data. The inputs were checked
        # before: again under the lock (another thread may have reset their context since)
        p = None
        lock = self._lock
        if lock.acquire(False):  # else held elsewhere, or lent to this callback: the slow path
            try:
                deps = self._deps
                for t in inputs:
                    owner = t._owner
                    if owner._gen != t._gen or (owner is not self and owner not in deps):
                        break
                else:
                    room = self._room - need  # < 0: stale, closed, raw or running low
                    if room >= 0 and self._no_alloc:
                        self._room = room
                        p = fn(*args)  # args[0]: self._ptr, read before the lock (None once closed)
                        gen = self._gen  # the node's (a reset after the lock is let go makes another)
            finally:
                lock.release()
        if p is None:
            p, gen = self._node_slow(fn, inputs, args, need // _OVERHEAD)
        if ne is None:
            t = Tensor(p, self)
            t._gen = gen  # a node of a reset context is closed, whatever its struct says now
            return t
        # the Tensor made here, not by Tensor.__init__ (which reads ne and type from C): every
        # slot of Tensor.__slots__ is set (tests/test_tensor.py checks)
        t = _new_object(Tensor)
        t._ptr = p
        t._owner = self
        t._gen = gen
        t._ne = ne
        t._type = type
        t._contig = contig
        t._nb = None
        return t

    def _node_slow(self, fn: Any, inputs: Sequence[Tensor], args: tuple[Any, ...],
                   n_objects: int) -> tuple[Any, int]:
        """The node ``fn(*args)`` (``args[0]``: the context's pointer) and this context's generation,
        where :meth:`_node`'s fast path does not go: with this context's lock; ClosedError if one of them is closed or reset (or
        a context whose tensors this context's nodes read), MemoryError when this context is full; records the
        dependencies; gives data in an allocating context."""
        held = self._hold_for_node(inputs)
        try:
            room = self._room - _OVERHEAD * n_objects
            if room < 0:
                # asks ggml for the exact free space (MemoryError); ClosedError if a context whose
                # tensors this one's nodes read was reset or closed (context._make_stale sends every
                # op constructor here then)
                self._reserve(0, n_objects)
            else:
                self._room = room
            if self._no_alloc:
                self._record_deps(inputs)
                return fn(self._ptr, *args[1:]), self._gen
            return self._node_allocating(fn, inputs, args[1:]), self._gen
        finally:
            held.__exit__()

    def _hold_for_node(self, inputs: Sequence[Tensor]) -> threads.using:
        """The lock of this context (no reset or close anywhere meanwhile: they take every context's
        lock), then every input checked open (ClosedError, nothing held); the caller lets go
        (``__exit__``)."""
        held = threads.using(self, gate=False)
        held.__enter__()
        try:
            if self._gen < 0:
                raise ClosedError("this context is closed")
            for t in inputs:
                if t._owner._gen != t._gen:
                    tensor_arg(t, "input")  # ClosedError
        except BaseException:
            held.__exit__()
            raise
        return held

    def _record_deps(self, inputs: Sequence[Tensor]) -> list[Any]:
        """Record that this context's new node reads the tensors of the inputs' owners (``Context._add_dep``),
        after checking all of them: ClosedError (nothing recorded) if an owner's own nodes read
        memory that is gone. Returns the owners that were not dependencies before."""
        owners: list[Any] = [t._owner for t in inputs if t._owner is not self]
        for owner in owners:
            if getattr(owner, "_stale", False):
                owner._check_deps()
        deps = self._deps
        new = [o for o in dict.fromkeys(owners) if o not in deps]
        for owner in owners:
            self._add_dep(owner)
        return new

    def _node_allocating(self, fn: Any, inputs: Sequence[Tensor], args: Sequence[Any]) -> Any:
        """:meth:`_node` in an allocating context: the node made with allocation off, then
        given data. If the data does not fit (MemoryError), the nodes this call made stay in the
        arena (ggml cannot take them back) but are made inert leafs (op NONE, no sources, not a
        view), and the dependencies this call recorded are dropped: a refused op leaves nothing
        that reads other contexts' tensors."""
        c = self._ptr
        new_deps = self._record_deps(inputs)
        used = int(lib.ggml_used_mem(c))
        lib.ggml_set_no_alloc(c, True)
        try:
            p = fn(c, *args)
        finally:
            lib.ggml_set_no_alloc(c, False)
        try:
            self._give_data(p)
        except MemoryError:
            self._make_inert(p, self._arena_lo + used)
            for owner in new_deps:
                self._drop_dep(owner)
            raise
        return p

    def _make_inert(self, ptr: Any, lo: int) -> None:
        """Make every tensor struct reachable from ``ptr`` that lies in this context's arena at or past
        address ``lo`` (made by the failed call) a leaf that reads nothing."""
        hi = self._arena_hi
        todo, seen = [ptr], set()
        while todo:
            p = todo.pop()
            if p == ffi.NULL or p in seen:
                continue
            seen.add(p)
            if not lo <= int(ffi.cast("uintptr_t", p)) < hi:
                continue
            todo.extend(p.src)
            todo.append(p.view_src)
            for i in range(len(p.src)):
                p.src[i] = ffi.NULL
            if p.view_src != ffi.NULL:
                p.view_src = ffi.NULL
                p.view_offs = 0
                p.data = ffi.NULL
            p.op = _NONE

    def _node_c(self, fn: Any, inputs: Sequence[Tensor], *args: Any, n_objects: int = 1) -> Tensor:
        """:meth:`_node` with the node's ne and type read from C."""
        return self._node(fn, inputs, None, None, None, (self._ptr, *args), _OVERHEAD * n_objects)

    def _give_data(self, ptr: Any) -> None:
        """Data for the new node of an allocating context and for any intermediate node the C
        function made (conv_2d makes im2col, reshapes, a mul_mat...): all reachable from the result
        without data yet, in creation order (arena addresses grow). Only tensors whose struct is in
        this context's own arena: a source of another context without data (a tensor of a ``no_alloc``
        context not allocated yet) stays without data, it is not given memory of this context."""
        lo, hi = self._arena_lo, self._arena_hi
        todo, seen = [ptr], {}
        while todo:
            p = todo.pop()
            if p == ffi.NULL or p in seen or p.data != ffi.NULL:
                continue
            addr = int(ffi.cast("uintptr_t", p))
            if not lo <= addr < hi:
                continue
            seen[p] = addr
            todo.extend(p.src)
            if p.view_src != ffi.NULL:
                todo.append(p.view_src)
        for p in sorted(seen, key=seen.__getitem__):
            if p.data == ffi.NULL and p.view_src == ffi.NULL:
                nbytes = int(lib.ggml_nbytes(p))
                self._reserve(nbytes, 1)
                p.data = lib.ggml_new_buffer(self._ptr, nbytes)
            elif p.data == ffi.NULL and p.view_src.data != ffi.NULL:
                p.data = ffi.cast("char *", p.view_src.data) + p.view_offs

    # ------------------------------------------------------------------ tensor creation
    def new_tensor(self, type: types.TypeLike, ne: Sequence[int], name: str | None = None) -> Tensor:
        """``ggml_new_tensor``: a tensor of ggml ``type`` with ``ne`` (ggml order, 1 to 4 dims).

        Raises ValueError for an unknown type, 0 or more than 4 dims, negative sizes, a size
        ggml cannot represent, or ``ne[0]`` not a multiple of a quantized type's block size;
        MemoryError if the context is full.
        """
        t = types.ggml_type(type)
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= lib.GGML_MAX_DIMS:
            raise ValueError(f"a ggml tensor has 1 to {lib.GGML_MAX_DIMS} dims, got {len(ne)}")
        if any(n < 0 for n in ne):
            raise ValueError(f"negative size in ne={ne}")
        blck = types.block_size(t)
        if ne[0] % blck:
            raise ValueError(f"ne[0]={ne[0]} is not a multiple of the {types.type_name(t)} block size {blck}")
        nbytes = types.row_size(t, ne[0])
        for n in ne[1:]:
            nbytes *= n
        if nbytes > _MAX_BYTES or any(n > _MAX_BYTES for n in ne):
            raise ValueError(f"a tensor of type {types.type_name(t)} with ne={ne} would take {nbytes} "
                             "bytes: more than ggml can address")
        _check_nelements(ne, "new_tensor")  # quantized types take < 1 byte per element
        if ne[0] == 0 and len(ne) > 1:
            # an empty row: its reductions over ne[0] (mean, sum_rows, argmax...) make ne[0] 1,
            # and ggml_new_tensor_impl, which passed ne[0] == 0 whatever came after, asserts then
            try:
                _check_nelements([1, *ne[1:]], "new_tensor")
            except ValueError:
                raise ValueError(f"new_tensor: ne={ne} is empty, but a reduction of it over ne[0] "
                                 f"(mean, sum_rows...) would make ne={[1, *ne[1:]]}, more elements "
                                 "than int64 holds: ggml would abort") from None
        if ne[0] * types.type_size(t) >= 2**64:
            # ggml_nbytes computes ne[0] * type_size in size_t: it would wrap around
            raise ValueError(f"ne[0]={ne[0]} of type {types.type_name(t)}: ggml_nbytes would overflow")
        c_ne = ffi.new("int64_t[]", ne)
        with threads.using(self, gate=False):
            self._reserve(nbytes)
            p = lib.ggml_new_tensor(self._live_ptr(), t, len(ne), c_ne)
            # wrapped under the lock: after it, another thread's reset and new tensor may lie
            # there, and the wrapper would take that tensor's ne with the new generation
            out = Tensor(p, self)
        out._contig = True  # ggml_new_tensor's strides are packed
        if name is not None:
            out.name = name
        return out

    def new_tensor_1d(self, type: types.TypeLike, ne0: int) -> Tensor:
        """``ggml_new_tensor_1d``."""
        return self.new_tensor(type, [ne0])

    def new_tensor_2d(self, type: types.TypeLike, ne0: int, ne1: int) -> Tensor:
        """``ggml_new_tensor_2d``."""
        return self.new_tensor(type, [ne0, ne1])

    def new_tensor_3d(self, type: types.TypeLike, ne0: int, ne1: int, ne2: int) -> Tensor:
        """``ggml_new_tensor_3d``."""
        return self.new_tensor(type, [ne0, ne1, ne2])

    def new_tensor_4d(self, type: types.TypeLike, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        """``ggml_new_tensor_4d``."""
        return self.new_tensor(type, [ne0, ne1, ne2, ne3])

    def dup_tensor(self, t: Tensor) -> Tensor:
        """``ggml_dup_tensor``: a new tensor with ``t``'s type and ne (no data copied)."""
        return self.new_tensor(t.type, t.ne)

    def from_numpy(self, array: Any, type: types.TypeLike | None = None, name: str | None = None) -> Tensor:
        """A tensor with ``array``'s shape (NumPy order; ne = shape reversed) and type (from the
        dtype unless ``type`` is given: float32 F32, float16 F16, float64 F64, int8..int64 I8..I64,
        either byte order). In an allocating context the data is copied in; in a ``no_alloc``
        context only the tensor is created (set its data once allocated). Raises TypeError for a
        dtype without a ggml type, ValueError for more than 4 dims or, in an allocating context,
        for 0 elements (ggml gives such a tensor no memory there).
        """
        a = np.asarray(array)
        if a.ndim > lib.GGML_MAX_DIMS:
            raise ValueError(f"{a.ndim}-d array: ggml tensors have at most {lib.GGML_MAX_DIMS} dims")
        ggml_type = types.type_of_dtype(a.dtype) if type is None else type
        if a.size == 0 and not self.no_alloc:  # before new_tensor: the context keeps nothing
            raise ValueError(f"array of shape {a.shape} has 0 elements: an allocating context gives "
                             "such a tensor no memory (data NULL); use a no_alloc context and a buffer")
        t = self.new_tensor(ggml_type, a.shape[::-1] or (1,), name=name)
        if not self.no_alloc:
            t.set(a, reshape=True)
        return t

    # ------------------------------------------------------------------ graphs and buffers
    def new_graph(self, size: int = lib.GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> Graph:
        """``ggml_new_graph_custom``: an empty graph of at most ``size`` nodes and ``size`` leafs."""
        if size < 1:
            raise ValueError("graph size must be >= 1")
        extra = int(lib.ggml_graph_overhead_custom(size, grads)) + _GRAPH_MARGIN
        with threads.using(self, gate=False):
            self._reserve(0, n_objects=0, extra=extra)
            p = lib.ggml_new_graph_custom(self._live_ptr(), size, grads)
            return Graph(p, self, size, grads)  # its generation read under the lock

    def alloc_tensors(self, where: HasBufferType | BufferType) -> Buffer:
        """Allocate every tensor of this ``no_alloc`` context in one backend buffer
        (``ggml_backend_alloc_ctx_tensors`` / ``_from_buft``); ``where`` is a backend (its
        default buffer type) or a buffer type. The context keeps the buffer alive and closes it
        when it is closed.

        Views in the context are placed in their source's buffer, so their sources must be this
        context's own tensors or tensors already in a live backend buffer.

        Raises ValueError if the context allocates its own data, holds no unallocated tensor
        or only unallocated tensors of 0 elements (ggml makes no buffer for 0 bytes), or holds a
        view of a tensor in no backend buffer (an allocating context's memory, or another
        context's tensor not allocated yet); MemoryError if the tensors need 2**62 bytes or
        more (ggml's size_t sum would wrap around and abort); ClosedError for a closed ``where``
        (checked first) or a view of a tensor whose buffer was closed; GGMLError if the
        allocation fails.
        """
        with calling():  # no close meanwhile: the checks hold until the C call
            if not self.no_alloc:
                raise ValueError("alloc_tensors needs a no_alloc context")
            # a closed backend or buffer type: ClosedError before anything about the tensors
            buft = where if isinstance(where, BufferType) else where.default_buffer_type
            buft.ptr
            need = False
            total = 0  # bytes asked for, in Python integers: ggml's size_t sum wraps around
            lo, hi = self._arena_lo, self._arena_hi
            for t in self.tensors():
                p = t.ptr
                v = p.view_src
                if v == ffi.NULL:
                    if p.data == ffi.NULL:
                        need = True
                        total += int(lib.ggml_nbytes(p))
                elif p.buffer == ffi.NULL:
                    # ggml_backend_view_init asserts the source has a buffer and data: one of ours
                    # without data gets them first (it was made before the view); others must have them
                    if v.data == ffi.NULL and lo <= int(ffi.cast("uintptr_t", v)) < hi:
                        continue
                    if v.buffer == ffi.NULL or v.data == ffi.NULL:
                        state = ("has no data yet" if v.data == ffi.NULL else
                                 "is in an allocating context's memory, not a backend buffer")
                        raise ValueError(f"tensor {t._label()} is a view of a tensor that {state}: "
                                         "alloc_tensors places views in their source's buffer (allocate "
                                         "the source first, or make the view in the source's context)")
                    check_tensor_memory(v, t._label)  # ClosedError: its buffer was freed
            if not need:
                raise ValueError("no tensor of this context needs allocation")
            if total >= 2**62:
                raise MemoryError(f"alloc_tensors: the tensors of this context need {total} bytes")
            with calling(), buffer.lifecycle:
                ptr = lib.ggml_backend_alloc_ctx_tensors_from_buft(self._live_ptr(), buft.ptr)
                if ptr == ffi.NULL and total == 0:
                    # ggml makes no buffer of 0 bytes (nothing is allocated: it returns NULL)
                    raise ValueError("the tensors of this context that need memory all have 0 "
                                     "elements: ggml allocates no buffer for them")
                if ptr == ffi.NULL:
                    raise GGMLError("ggml_backend_alloc_ctx_tensors failed (out of memory?)")
                buf = Buffer(ptr, owned=True, keep=where)
            self._buffers.append(buf)
            return buf

    def _adopt(self, buf: Buffer) -> None:
        """Keep ``buf`` alive (and close it) with this context: tensors of ours live in it."""
        if not any(b is buf for b in self._buffers):
            self._buffers.append(buf)

    def close(self) -> None:
        """``ggml_free``, then the backend buffers made by :meth:`alloc_tensors`. Tensors of the
        context raise ClosedError from now on."""
        if self._ptr is not None:
            self._gen = -1
            self._room = -1  # op constructors take the slow path (ClosedError)
            _make_stale(self)
        super().close()
        for b in self._buffers:
            b.close()

    def _free(self, ptr: Any) -> None:
        with self._lock:  # after any C call in the arena another thread is making
            lib.ggml_free(ptr)

    # one Python object per ggml context: identity is equality (cheap to hash, and stable
    # when the context is closed)
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        if self.closed:
            return "<Context (closed)>"
        return f"<Context {self.used_mem}/{self.mem_size} bytes{' no_alloc' if self.no_alloc else ''}>"


def tensor_overhead() -> int:
    """Bytes a tensor struct takes in a context (``ggml_tensor_overhead``)."""
    return _OVERHEAD
