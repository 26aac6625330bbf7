"""Before ggml's meta backend places or computes a graph: how it would split every tensor, and
ValueError wherever it would abort instead.

ggml's meta backend (ggml-backend-meta.cpp, 0.26) derives the split state of each tensor it
places or computes from its sources' (``ggml_backend_meta_get_split_state``: one handler per op,
then the per-device sizes taken over from the first split source) and aborts on a graph its
rules do not cover: a ``mul_mat`` of a weight split by columns with an unsplit activation,
sources split in different sizes, a view of a permuted split tensor, an op it has no rule for.
It does so while placing the graph (each tensor's ``init_tensor``, by the graph allocator or the
scheduler) and while computing it. This module is a port of that derivation, run before either:

- :func:`check_alloc` before a :class:`~pyggml.GraphAllocator` of a meta buffer type places a
  graph, :func:`check_sched` before a :class:`~pyggml.Scheduler` with a meta backend does (on
  ggml's split of the graph: the nodes it gives the meta backend), :func:`check_compute` before
  a meta backend computes a graph (cached with the backend's check of the graph).
- Static tensors (in a meta buffer not made by an allocator for a graph: weights, caches) get
  the state the meta device's Python policy gives them (:mod:`pyggml.backends.meta`).
- Computed tensors follow ggml's rules for the ops below; a graph with an op outside them is
  refused ("pyggml cannot check ..."), even where ggml might split it, as is a partial sum
  (``PARTIAL``: a ``mul_mat`` of two tensors split along ``ne[0]``) that is a graph output or
  that no node reads (ggml neither sums it up nor can read it back: an abort), or that another
  backend of a scheduler reads.

The ops checked: every op of ggml's rules except the model-specific ones listed in
:data:`UNCHECKED` (``NONE`` and its full views, ``DUP``, ``ADD``, ``ADD_ID``, ``ADD1``, ``ACC``,
``SUB``, ``MUL``, ``DIV``, ``SQR``, ``SQRT``, ``LOG``, ``SIN``, ``COS``, ``SUM``, ``SUM_ROWS``,
``CUMSUM``, ``MEAN``, ``ARGMAX``, ``COUNT_EQUAL``, ``REPEAT``, ``REPEAT_BACK``, ``CONCAT``,
``SILU_BACK``, the norms, ``MUL_MAT``, ``MUL_MAT_ID``, ``OUT_PROD``, ``SCALE``, ``SET``, ``CPY``,
``CONT``, ``RESHAPE``, ``VIEW``, ``PERMUTE``, ``TRANSPOSE``, ``GET_ROWS``, ``GET_ROWS_BACK``,
``SET_ROWS``, the ``DIAG`` ops, ``SOFT_MAX``, ``SOFT_MAX_BACK``, ``ROPE``, ``ROPE_BACK``,
``CLAMP``, the convolutions and pools, ``UPSCALE``, ``PAD``, ``PAD_REFLECT_1D``, ``ROLL``,
``ARANGE``, ``TIMESTEP_EMBEDDING``, ``ARGSORT``, ``TOP_K``, ``LEAKY_RELU``, ``TRI``, ``FILL``,
``FLASH_ATTN_EXT``, ``FLASH_ATTN_BACK``, ``UNARY``, ``GLU``, the custom ops, the cross-entropy
losses and the optimizer steps).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from ..raw import ffi, lib

__all__ = ["check_alloc", "check_sched", "check_compute", "register", "UNCHECKED"]

MAX_DEVICES = int(lib.GGML_BACKEND_META_MAX_DEVICES)
MIRRORED = int(lib.GGML_BACKEND_SPLIT_AXIS_MIRRORED)
PARTIAL = int(lib.GGML_BACKEND_SPLIT_AXIS_PARTIAL)

_NONE = int(lib.GGML_BACKEND_SPLIT_AXIS_NONE)
_UNKNOWN = int(lib.GGML_BACKEND_SPLIT_AXIS_UNKNOWN)
_MAX_DIMS = 4
_MAX_SRC = int(lib.GGML_MAX_SRC)
_COMPUTE = int(lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE)
_OUTPUT = int(lib.GGML_TENSOR_FLAG_OUTPUT)
_NULL = ffi.NULL


class _SS:
    """``struct ggml_backend_meta_split_state``, by value (copy before changing one)."""

    __slots__ = ("axis", "ne", "nr", "n_segments")

    def __init__(self, axis: int, nr0: int = 1) -> None:
        self.axis = axis
        self.ne = [0] * (16 * MAX_DEVICES)
        self.nr = [0] * 16
        self.nr[0] = nr0
        self.n_segments = 1

    def copy(self) -> "_SS":
        c = _SS.__new__(_SS)
        c.axis, c.ne, c.nr, c.n_segments = self.axis, list(self.ne), list(self.nr), self.n_segments
        return c

    def describe(self, n_bufs: int) -> str:
        if self.axis == MIRRORED:
            return "MIRRORED"
        if self.axis == PARTIAL:
            return "PARTIAL"
        if self.axis == _NONE:
            return "not split (host memory)"
        if self.axis == _UNKNOWN:
            return "UNKNOWN"
        segs = [f"{[self.ne[s * n_bufs + j] for j in range(n_bufs)]}"
                + (f"x{self.nr[s]}" if self.nr[s] != 1 else "") for s in range(self.n_segments)]
        return f"axis {self.axis} sizes {' + '.join(segs)}"


class _State(Protocol):  # pyggml.backends.meta.SplitState
    @property
    def axis(self) -> int: ...

    @property
    def segments(self) -> tuple[tuple[tuple[int, ...], int], ...]: ...


class _Policy(Protocol):  # pyggml.backends.meta._PolicyCallback
    n_devices: int

    def state_of(self, tensor: Any) -> _State: ...


_by_device: dict[int, _Policy] = {}


def register(device: Any, policy: _Policy) -> None:
    """The meta device at ``device`` (``ggml_backend_dev_t``) splits its static tensors by
    ``policy`` (:func:`pyggml.backends.meta.meta_device` registers each device it makes)."""
    _by_device[int(ffi.cast("uintptr_t", device))] = policy


def policy_of(device: Any) -> _Policy | None:
    """The policy registered for the meta device at ``device``, or None."""
    return _by_device.get(int(ffi.cast("uintptr_t", device)))


def _name(p: Any) -> str:
    return repr(ffi.string(p.name).decode("utf-8", "surrogateescape") or "(unnamed)")


def _split(axis: int) -> bool:
    return 0 <= axis < _MAX_DIMS


def _from_policy(state: _State, n_bufs: int) -> _SS:
    ss = _SS(state.axis)
    if _split(state.axis):
        for s, (sizes, nr) in enumerate(state.segments):
            for j, size in enumerate(sizes):
                ss.ne[s * n_bufs + j] = size
            ss.nr[s] = nr
        ss.n_segments = len(state.segments)
    return ss


class _Abort(Exception):
    """Where ggml would abort deriving a state: the reason (made a ValueError naming the node)."""


class _Place:
    """Where a tensor is or will be: in a meta buffer (its device's policy and device count),
    static (a meta buffer not for compute, not a view), in host memory."""

    __slots__ = ("meta", "static", "host", "n_bufs", "dev")

    def __init__(self, meta: bool, static: bool, host: bool, n_bufs: int, dev: Any) -> None:
        self.meta, self.static, self.host, self.n_bufs, self.dev = meta, static, host, n_bufs, dev


def _n_bufs(dev: Any) -> int:
    pc = policy_of(dev)
    if pc is None:
        raise _Abort("its meta device was not made by pyggml.backends.meta.meta_device: pyggml "
                     "cannot check how ggml splits it")
    return pc.n_devices


class _Deriver:
    """``ggml_backend_meta_get_split_state`` over one graph; ``home(p)``: the buffer type a
    tensor without a buffer will be placed in (None: unknown, not a meta one)."""

    def __init__(self, home: Callable[[Any], Any]) -> None:
        self.home = home
        self.cache: dict[tuple[Any, bool], _SS] = {}
        self.places: dict[Any, _Place] = {}

    # ------------------------------------------------------------------ placement
    def place(self, p: Any) -> _Place:
        pl = self.places.get(p)
        if pl is not None:
            return pl
        buf = p.buffer
        if buf != _NULL:
            if lib.ggml_backend_buffer_is_meta(buf):
                dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buf))
                static = lib.ggml_backend_buffer_get_usage(buf) != _COMPUTE and p.view_src == _NULL
                pl = _Place(True, static, bool(lib.ggml_backend_buffer_is_host(buf)), _n_bufs(dev), dev)
            else:
                pl = _Place(False, False, bool(lib.ggml_backend_buffer_is_host(buf)), 0, None)
        elif p.view_src != _NULL:  # a view is placed in its source's buffer (ggml_backend_view_init)
            v = self.place(p.view_src)
            pl = _Place(v.meta, False, v.host, v.n_bufs, v.dev)
        else:
            buft = self.home(p)
            if buft is not None and lib.ggml_backend_buft_is_meta(buft):
                dev = lib.ggml_backend_buft_get_device(buft)
                pl = _Place(True, False, bool(lib.ggml_backend_buft_is_host(buft)), _n_bufs(dev), dev)
            else:
                host = buft is not None and bool(lib.ggml_backend_buft_is_host(buft))
                pl = _Place(False, False, host, 0, None)
        self.places[p] = pl
        return pl

    # ------------------------------------------------------------------ derivation
    def state(self, p: Any, assume_sync: bool) -> _SS:
        """``ggml_backend_meta_get_split_state(tensor, assume_sync)``; raises _Abort (with the
        failing tensor set on it) where ggml aborts."""
        key = (p, assume_sync)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        pl = self.place(p)
        if not pl.meta:
            # [TAG_META_HOST_VIEWS]: only a view of host memory may be outside the meta buffers
            if p.view_src == _NULL or not self.place(p.view_src).host:
                raise _Failure(p, "it is not in the meta device's memory (nor a view of host memory), "
                               "and the meta backend reads it")
            return _SS(_NONE)
        try:
            ss = self._calculate(p, assume_sync, pl)
            if ss.axis == _NONE:
                raise _Abort("its split state would be NONE (derived from host memory only)")
        except _Abort as e:
            raise _Failure(p, str(e), self._sources(p)) from None
        self.cache[key] = ss
        return ss

    def _sources(self, p: Any) -> str:
        out = []
        for i in range(_MAX_SRC):
            s = p.src[i]
            if s == _NULL or s == p:
                continue
            pl = self.place(s)
            ss = self.cache.get((s, True))
            what = ss.describe(pl.n_bufs) if ss is not None else "?"
            out.append(f"src[{i}] {_name(s)} {list(s.ne)}: {what}")
        return "; ".join(out) if out else "no sources"

    def _policy(self, p: Any, pl: _Place) -> _SS:
        pc = policy_of(pl.dev)
        assert pc is not None  # _n_bufs raised otherwise
        state = pc.state_of(p)  # the policy's exception, or ValueError for a bad state, as ggml asks
        return _from_policy(state, pl.n_bufs)

    def _calculate(self, p: Any, assume_sync: bool, pl: _Place) -> _SS:
        if lib.ggml_nelements(p) == 0:
            return _SS(_UNKNOWN)
        if pl.static:
            return self._policy(p, pl)
        srcs = [p.src[i] for i in range(_MAX_SRC)]
        src_ss: list[_SS] = []
        for s in srcs:
            if s == _NULL or s == p:
                src_ss.append(_SS(_UNKNOWN))
                continue
            ss = self.state(s, True)
            if ss.axis == _UNKNOWN:
                raise _Abort(f"its source {_name(s)} has no elements (GGML_ASSERT(src_ss[i].axis != UNKNOWN))")
            src_ss.append(ss)

        op = int(p.op)
        if op == lib.GGML_OP_NONE:
            if p.view_src != _NULL:  # a full view (ggml_view_tensor): its source's state
                return self.state(p.view_src, assume_sync)
            return _SS(MIRRORED)
        kind = _RULES.get(op)
        if kind is None:
            raise _Abort(f"pyggml cannot check that ggml's meta backend splits op "
                         f"{ffi.string(lib.ggml_op_name(op)).decode()}: compute it on another backend")
        r = _Rules(self, p, srcs, src_ss, pl.n_bufs, assume_sync)
        ss = kind(r)
        if _split(ss.axis):
            ss = r.take_over_ratio(ss.copy())
        return ss


class _Failure(Exception):
    """ggml would abort on tensor ``p``: the message names it, its op and its sources' states."""

    def __init__(self, p: Any, reason: str, sources: str | None = None) -> None:
        op = ffi.string(lib.ggml_op_name(p.op)).decode()
        msg = f"ggml's meta backend cannot split tensor {_name(p)} ({op}, ne {list(p.ne)}): {reason}"
        if sources is not None:
            msg += f" [sources: {sources}]"
        super().__init__(msg)


class _Rules:
    """The handlers of ``calculate_split_state`` for one tensor (names as in ggml)."""

    def __init__(self, d: _Deriver, p: Any, srcs: list[Any], src_ss: list[_SS], n_bufs: int,
                 assume_sync: bool) -> None:
        self.p, self.srcs, self.ss, self.n, self.assume_sync = p, srcs, src_ss, n_bufs, assume_sync

    def equal(self, a: _SS, b: _SS) -> bool:  # split_states_equal
        if a.axis != b.axis:
            return False
        n = self.n
        for j in range(n):
            sa = sum(a.ne[s * n + j] * a.nr[s] for s in range(a.n_segments))
            sb = sum(b.ne[s * n + j] * b.nr[s] for s in range(b.n_segments))
            if sa != sb:
                return False
        return True

    def generic(self, scalar_only: bool) -> _SS:
        ret = _SS(_NONE)
        unequal = False
        for i in range(_MAX_SRC):
            s = self.srcs[i]
            if s == _NULL or s == self.p:
                continue
            if ret.axis == _NONE:
                ret = self.ss[i]
            elif not self.equal(self.ss[i], ret):
                ret, unequal = _SS(_UNKNOWN), True
                break
        if unequal:
            raise _Abort("its sources are split differently (GGML_ASSERT(split_states_equal(...))): "
                         "split them alike, or mirror them")
        if ret.axis == _NONE:
            raise _Abort("it has no source in the meta device's memory")
        if scalar_only and _split(ret.axis):
            raise _Abort("ggml splits this op only when its sources are mirrored or partial sums, "
                         "and they are split")
        return ret

    def per_row(self) -> _SS:
        if self.ss[0].axis == 0:
            raise _Abort("it works on whole rows (ne[0]) and its source is split along ne[0]")
        return self.ss[0]

    def bin_bcast(self) -> _SS:
        s0, s1, s2 = self.ss[0], self.ss[1], self.ss[2]
        if _split(s0.axis) and self.srcs[1].ne[s0.axis] == 1 and s1.axis == MIRRORED:
            return s0
        if s2.axis == MIRRORED and (s0.axis == s1.axis or (s0.axis == MIRRORED and s1.axis == PARTIAL)):
            return s0  # GGML_OP_ADD_ID
        if self.srcs[2] != _NULL and s2.axis != MIRRORED:
            raise _Abort("its src[2] is not mirrored")
        return self.generic(False)

    def concat(self) -> _SS:
        dim = int(self.p.op_params[0])
        s0, s1 = self.ss[0], self.ss[1]
        if s0.axis == MIRRORED and _split(s1.axis):
            if dim == s1.axis:
                raise _Abort("it concatenates along the axis its source is split on")
            return s1
        if s1.axis == MIRRORED and _split(s0.axis):
            if dim == s0.axis:
                raise _Abort("it concatenates along the axis its source is split on")
            return s0
        if s0.axis == s1.axis and s0.axis != dim:
            return s0
        return self.generic(True)

    def mul_mat(self) -> _SS:
        s0, s1 = self.ss[0], self.ss[1]
        if s0.axis == MIRRORED and s1.axis == MIRRORED:
            return _SS(MIRRORED)
        if s0.axis == 1 and s1.axis == MIRRORED:
            ret = s0.copy()
            ret.axis, ret.nr[0], ret.n_segments = 0, 1, 1
            return ret
        if s1.axis == 1 and s0.axis == MIRRORED:
            return s1
        if s0.axis == 0 and s1.axis == 0:
            if not self.equal(s0, s1):
                raise _Abort("its sources are split along ne[0] in different sizes")
            return _SS(MIRRORED if self.assume_sync else PARTIAL)
        if s0.axis == s1.axis and 2 <= s0.axis < _MAX_DIMS:
            if not self.equal(s0, s1):
                raise _Abort("its sources are split along the batch axis in different sizes")
            return s0
        if 2 <= s0.axis < _MAX_DIMS and s1.axis == MIRRORED:
            return s0
        raise _Abort("unsupported mul_mat split states (ggml supports: both mirrored; src0 split "
                     "along ne[1] or a batch axis with src1 mirrored; src0 mirrored with src1 split "
                     "along ne[1]; both split alike along ne[0] (a partial sum) or a batch axis)")

    def reshape(self) -> _SS:
        s0 = self.ss[0]
        p, src = self.p, self.srcs[0]
        if _split(s0.axis):
            base_in = 1
            for dim in range(s0.axis + 1):
                base_in *= int(src.ne[dim])
            if s0.n_segments == 1:
                if s0.nr[0] == 0:
                    raise _Abort("its source's state repeats 0 times (a division by zero in ggml)")
                base_in //= s0.nr[0]
                if s0.axis == lib.ggml_n_dims(src) - 1 and s0.nr[0] == 1:
                    return _SS(lib.ggml_n_dims(p) - 1)
                if s0.axis == 0 and p.ne[0] == src.ne[0] and p.ne[1] == 1 and s0.nr[0] == 1:
                    if all(s0.ne[j] in (0, src.ne[0]) for j in range(self.n)):
                        return _SS(1)
            base_out = 1
            for dim in range(_MAX_DIMS):
                base_out *= int(p.ne[dim])
                if base_in != 0 and base_out % base_in == 0:
                    return _SS(dim, (base_out // base_in) & 0xFFFFFFFF)
                if base_out > base_in:
                    if s0.n_segments != 1 or s0.nr[0] != 1:
                        raise _Abort("it reshapes a source of several split segments across its split axis")
                    return _SS(dim)
            raise _Abort(f"shape mismatch for {ffi.string(lib.ggml_op_name(p.op)).decode()}")
        if s0.axis in (MIRRORED, PARTIAL):
            return s0
        raise _Abort("its source is not split, mirrored or partial (GGML_ABORT)")

    def cpy(self) -> _SS:
        if _split(self.ss[0].axis):
            return self.reshape()
        return self.generic(False)

    def view(self) -> _SS:
        p, src, s0 = self.p, self.srcs[0], self.ss[0]
        if lib.ggml_is_contiguous(p) and lib.ggml_is_contiguous(src):
            return self.reshape()
        axis = s0.axis
        same = True
        for dim in range(_MAX_DIMS):
            if p.ne[dim] == 1 and src.ne[dim] == 1:
                continue
            if p.nb[dim] != src.nb[dim]:
                same = False
                break
        if same:
            return s0
        if not lib.ggml_is_permuted(p) and not lib.ggml_is_permuted(src) and 0 <= axis < _MAX_DIMS - 1:
            for dim in range(_MAX_DIMS - 1):
                if p.nb[dim + 1] == src.nb[axis + 1]:
                    return _SS(dim)
            raise _Abort(f"no stride of the view matches its source's split axis {axis} (GGML_ABORT)")
        if s0.axis in (MIRRORED, PARTIAL):
            return s0
        raise _Abort("view of permuted tensor not implemented (a strided view of a permuted or "
                     "split-on-ne[3] tensor: make the view before permuting, or cont() first)")

    def permute(self) -> _SS:
        s0 = self.ss[0]
        if _split(s0.axis):
            if not (s0.n_segments == 1 or s0.nr[0] == 1):
                raise _Abort("it permutes a source of several repeated split segments")
            return _SS(int(self.p.op_params[s0.axis]), s0.nr[0])
        if s0.axis in (MIRRORED, PARTIAL):
            return s0
        raise _Abort("its source is not split, mirrored or partial (GGML_ABORT)")

    def transpose(self) -> _SS:
        s0 = self.ss[0]
        if s0.axis in (0, 1):
            if not (s0.n_segments == 1 or s0.nr[0] == 1):
                raise _Abort("it transposes a source of several repeated split segments")
            return _SS(s0.axis ^ 1, s0.nr[0])
        if s0.axis in (2, 3, MIRRORED, PARTIAL):
            return s0
        raise _Abort("its source is not split, mirrored or partial (GGML_ABORT)")

    def get_rows(self) -> _SS:
        if self.ss[0].axis == 0 and self.ss[1].axis == MIRRORED:
            return self.ss[0]
        return self.generic(True)

    def set_rows(self) -> _SS:  # src[0]: the rows written, src[1]: their indices, src[2]: the destination
        s0, s1, s2 = self.ss[0], self.ss[1], self.ss[2]
        if s0.axis == 1:
            raise _Abort("the rows it writes (src[0]) are split along ne[1] (between rows)")
        if s1.axis != MIRRORED:
            raise _Abort("its row indices (src[1]) are not mirrored")
        if not self.equal(s0, s2):
            raise _Abort("the rows it writes (src[0]) are not split like its destination (src[2])")
        return s0

    def rope(self) -> _SS:
        if self.ss[1].axis != MIRRORED:
            raise _Abort("its positions (src[1]) are not mirrored")
        return self.ss[0]

    def pad(self) -> _SS:
        s0 = self.ss[0]
        if _split(s0.axis) and (self.p.op_params[2 * s0.axis] != 0 or self.p.op_params[2 * s0.axis + 1] != 0):
            raise _Abort("it pads along its source's split axis")
        return s0

    def flash_attn_ext(self) -> _SS:
        ss, srcs = self.ss, self.srcs
        if srcs[3] != _NULL and ss[3].axis != MIRRORED:
            raise _Abort("its mask (src[3]) is not mirrored")
        if ss[0].axis == MIRRORED:
            if ss[1].axis != MIRRORED or ss[2].axis != MIRRORED or (srcs[4] != _NULL and ss[4].axis != MIRRORED):
                raise _Abort("Q is mirrored but K, V or the sinks are not")
            return _SS(MIRRORED)
        if ss[0].axis != 2:
            raise _Abort("Q is neither mirrored nor split by heads (ne[2])")
        kv_split = ss[1].axis == 2 and ss[2].axis == 2
        kv_mirrored = ss[1].axis == MIRRORED and ss[2].axis == MIRRORED
        if not (kv_split or kv_mirrored):
            raise _Abort("K and V are neither both split by heads (ne[2]) nor both mirrored")
        if srcs[4] != _NULL and ss[4].axis != 0:
            raise _Abort("its sinks (src[4]) are not split along ne[0]")
        return _SS(1)

    # the ratio take-over after ggml's switch
    def take_over_ratio(self, ss: _SS) -> _SS:
        p, n = self.p, self.n
        first = True
        for i in range(_MAX_SRC):
            s, si = self.srcs[i], self.ss[i]
            if s == _NULL or not _split(si.axis):
                continue
            src_ne = int(s.ne[si.axis])
            if first:
                for j in range(n):
                    for seg in range(si.n_segments):
                        ss.ne[seg * n + j] = 0
                    for seg in range(si.n_segments):
                        ss.ne[j] += si.ne[seg * n + j] * si.nr[seg]
                    ss.ne[j] *= int(p.ne[ss.axis])
                    if ss.ne[j] != 0 or src_ne != 0:
                        div = src_ne * ss.nr[0]
                        if div == 0:
                            raise _Abort("its state repeats 0 times (a division by zero in ggml)")
                        if ss.ne[j] % div != 0:
                            raise _Abort(f"device {j}'s share of src[{i}] along its axis {si.axis} does not "
                                         f"scale to a whole number of elements along this tensor's axis "
                                         f"{ss.axis} (ne {int(p.ne[ss.axis])})")
                        ss.ne[j] //= div
            else:
                if ss.n_segments != 1:
                    raise _Abort("two of its sources are split, one of them in several segments")
                for j in range(n):
                    total = sum(si.ne[seg * n + j] * si.nr[seg] for seg in range(si.n_segments))
                    if ss.ne[j] * ss.nr[0] * src_ne != total * int(p.ne[ss.axis]):
                        raise _Abort(f"its sources are split in different proportions over the devices "
                                     f"(src[{i}] differs from the first split source)")
            first = False
        if first:
            raise _Abort("its state is split but none of its sources is")
        return ss


def _g(scalar_only: bool) -> Callable[[_Rules], _SS]:
    return lambda r: r.generic(scalar_only)


_BY_NAME: dict[str, Callable[[_Rules], _SS]] = {}
for _names, _rule in (
    ("DUP ADD1 ACC SUM OUT_PROD SET GET_ROWS_BACK DIAG DIAG_MASK_INF DIAG_MASK_ZERO CONV_TRANSPOSE_1D "
     "IM2COL IM2COL_BACK IM2COL_3D CONV_2D CONV_3D CONV_2D_DW CONV_TRANSPOSE_2D POOL_1D POOL_2D "
     "POOL_2D_BACK UPSCALE PAD_REFLECT_1D ROLL ARANGE TIMESTEP_EMBEDDING TRI FLASH_ATTN_BACK "
     "MAP_CUSTOM1 MAP_CUSTOM2 MAP_CUSTOM3 CUSTOM", _g(True)),
    ("SQR SQRT LOG SIN COS REPEAT REPEAT_BACK SILU_BACK SCALE SOFT_MAX SOFT_MAX_BACK CLAMP LEAKY_RELU "
     "FILL UNARY OPT_STEP_ADAMW OPT_STEP_SGD GLU", _g(False)),
    ("ADD ADD_ID SUB MUL DIV", _Rules.bin_bcast),
    ("SUM_ROWS CUMSUM MEAN ARGMAX COUNT_EQUAL NORM RMS_NORM RMS_NORM_BACK GROUP_NORM L2_NORM ARGSORT "
     "TOP_K CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK", _Rules.per_row),
    ("CONCAT", _Rules.concat),
    ("MUL_MAT MUL_MAT_ID", _Rules.mul_mat),
    ("CPY", _Rules.cpy),
    ("CONT RESHAPE", _Rules.reshape),
    ("VIEW", _Rules.view),
    ("PERMUTE", _Rules.permute),
    ("TRANSPOSE", _Rules.transpose),
    ("GET_ROWS", _Rules.get_rows),
    ("SET_ROWS", _Rules.set_rows),
    ("ROPE ROPE_BACK", _Rules.rope),
    ("PAD", _Rules.pad),
    ("FLASH_ATTN_EXT", _Rules.flash_attn_ext),
):
    for _n in _names.split():
        _BY_NAME[_n] = _rule

#: ops ggml's meta backend has rules for that pyggml does not check (their graphs are refused)
UNCHECKED = ("SSM_CONV", "SSM_SCAN", "WIN_PART", "WIN_UNPART", "GET_REL_POS", "ADD_REL_POS",
             "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "SOLVE_TRI", "GATED_DELTA_NET",
             "LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST")

_RULES: dict[int, Callable[[_Rules], _SS]] = {
    int(getattr(lib, "GGML_OP_" + n)): rule for n, rule in _BY_NAME.items() if hasattr(lib, "GGML_OP_" + n)
}


# ---------------------------------------------------------------------- graph checks
def _run(nodes: Sequence[Any], home: Callable[[Any], Any], on_meta: Callable[[Any], bool] | None,
         readers: dict[Any, list[Any]] | None = None, strict: bool = True) -> None:
    """Derive the state of every node (``on_meta``: of those the meta backend computes; None:
    all) in a meta buffer as placing it (assume_sync) and computing it do; ValueError where
    ggml would abort. ``strict``: the meta backend computes the nodes, so one outside its
    buffers must be a view of host memory. ``readers``: node -> the nodes that read it in the
    graph as built (None: from ``nodes``)."""
    d = _Deriver(home)
    mine = [p for p in nodes if on_meta is None or on_meta(p)]
    try:
        for p in mine:  # in graph order: each node's sources are cached before it
            if d.place(p).meta or strict:
                d.state(p, True)  # outside the meta buffers: a view of host memory, or refused
        if readers is None:
            readers = {}
            for p in nodes:
                for i in range(_MAX_SRC):
                    s = p.src[i]
                    if s != _NULL:
                        readers.setdefault(s, []).append(p)
        if on_meta is None and nodes:
            last = nodes[-1]
            v = last.view_src
            if v != _NULL and v.op == lib.GGML_OP_NONE and d.place(v).host:
                # ggml_backend_meta_graph_compute skips such a node when it cuts the graph into
                # sub-graphs, so none ends at the last node: GGML_ASSERT(i_start == n_nodes)
                raise _Failure(last, "it is the graph's last node and a view of a tensor in memory "
                               "that says it is host memory (cpy, set_rows and views write into "
                               "their destination): ggml's meta backend skips such nodes when it "
                               "cuts the graph and aborts when the last one is one; end the graph "
                               "with another op", d._sources(last))
        for p in mine:
            if not d.place(p).meta:
                continue
            ss = d.state(p, False)
            if ss.axis != PARTIAL:
                continue
            if int(p.flags) & _OUTPUT or not readers.get(p):
                raise _Failure(p, "it is a partial sum (PARTIAL: each device holds a part) that is a "
                               "graph output or that no node reads: ggml can neither sum it up nor "
                               "read it back (an abort); add an op after it (e.g. + 0, or the "
                               "residual add) or split its sources otherwise", d._sources(p))
            if on_meta is not None and any(not on_meta(r) for r in readers[p]):
                raise _Failure(p, "it is a partial sum (PARTIAL) that a node on another backend of "
                               "the scheduler reads: ggml cannot copy it out of the meta backend "
                               "(an abort); add an op after it on the meta backend", d._sources(p))
            if not lib.ggml_is_contiguous(p):
                raise _Failure(p, "it is a partial sum (PARTIAL) that is not contiguous: ggml's "
                               "all-reduce asserts contiguous memory", d._sources(p))
    except _Failure as e:
        raise ValueError(str(e)) from None


def check_alloc(graph_ptr: Any, nodes: Sequence[Any], buft: Any) -> None:
    """Before a graph allocator of buffer type ``buft`` (a meta one) places ``graph_ptr``'s
    ``nodes``: ValueError where ggml's meta backend would abort on a tensor it places there.
    The policy's exception (or ValueError for a bad state) when it fails for a static tensor."""
    _run(nodes, lambda p: buft, None, strict=False)


def check_compute(nodes: Sequence[Any], grads: bool) -> None:
    """Before a meta backend computes a placed graph of ``nodes`` (``grads``: made with room for
    gradients): ValueError where ggml would abort (a graph with gradients; a node whose split
    it cannot derive; a partial sum it cannot read back). The policy's exception when it fails
    for a static tensor."""
    if grads:
        raise ValueError("ggml's meta backend cannot compute a graph with gradients "
                         "(GGML_ASSERT(cgraph->grads == nullptr)): compute it on another backend")
    _run(nodes, lambda p: None, None)


def check_sched(nodes: Sequence[Any], srcs_before: list[list[Any]], backend_of: Callable[[Any], Any],
                bufts: dict[Any, Any], meta_backends: set[Any]) -> None:
    """After ggml's scheduler split a graph (``nodes``: its nodes, their sources now the split's
    copies; ``srcs_before``: each node's sources as built) and before it places it:
    ValueError where ggml's meta backend would abort on the nodes it was given.
    ``backend_of(p)``: the backend pointer the split gave tensor ``p`` (NULL: none);
    ``bufts``: backend pointer -> its buffer type; ``meta_backends``: the meta ones."""
    home_of: dict[Any, Any] = {}
    for p, before in zip(nodes, srcs_before):
        b = backend_of(p)
        for i, s in enumerate(before):
            now = p.src[i]
            if s != _NULL and now != s and b != _NULL:
                home_of[now] = bufts.get(b)  # the split's copy: in the reading node's backend

    def home(p: Any) -> Any:
        h = home_of.get(p)
        if h is not None:
            return h
        b = backend_of(p)
        return bufts.get(b) if b != _NULL else None

    on: dict[Any, bool] = {}

    def on_meta(p: Any) -> bool:
        r = on.get(p)
        if r is None:
            r = on[p] = backend_of(p) in meta_backends
        return r

    readers: dict[Any, list[Any]] = {}
    for p, before in zip(nodes, srcs_before):
        for s in before:
            if s != _NULL:
                readers.setdefault(s, []).append(p)
    _run(nodes, home, on_meta, readers)

