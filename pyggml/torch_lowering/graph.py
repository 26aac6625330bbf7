"""One FX graph of ATen ops (every node lowerable) as ggml graphs: :class:`Builder` lowers the
nodes into a context, :class:`LoweredGraph` runs them, one ggml graph per input shape (a
:class:`~pyggml.GraphCache`), the weights read in torch's own memory (CPU) or copied once into
a backend buffer.

Data flow: torch CPU tensors -> NumPy views -> the graph's input tensors -> compute -> NumPy
copies of the outputs -> torch tensors. Index inputs (int64 token ids) are given to ggml as I32.
Weights (parameters, buffers, tensors marked static such as a KV cache) are not copied on the
CPU backend: ggml reads, and writes in place (``index_copy_``), torch's memory, imported through
DLPack (:func:`~pyggml.backends.utils.from_dlpack`).
"""
from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Collection, Sequence, cast

import numpy as np
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ..backends.backend import Backend
from ..backends.cpu import CPUBackend
from ..backends.utils import from_dlpack
from ..backends.graph_cache import GraphCache, GraphParts
from ..backends.weights import Weights, load_tensors
from ..core.context import Context
from ..core.tensor import Tensor
from .. import types
from ..enums import GGMLType
from .layout import DTYPES, INDEX_DTYPES, is_static, ne_of, shape_of, val
from .rewrites import IN_PLACE
from .table import SMALL_INT, TABLE, LoweringError, Val, int_bound, why_not

__all__ = ["Builder", "LoweredGraph"]

#: nodes per ggml graph (a lowered ATen node makes up to ~10 ggml nodes)
GRAPH_SIZE = 8192


class Builder:
    """Lowers FX nodes into the graph ``g`` is building (``g.ctx``): ``env`` maps each node to
    its :class:`~pyggml.torch_lowering.table.Val` (or a tuple of them); constants made on the
    way are ``g``'s (written once after the build, owned by the cached graph)."""

    def __init__(self, g: GraphParts, flash_attn: bool = False, on_cpu: bool = False):
        self.g = g
        self.ctx = g.ctx
        #: scaled-dot-product attention as ggml_flash_attn_ext (else mul_mat, soft_max, mul_mat)
        self.flash_attn = flash_attn
        #: the graph runs on the CPU backend alone (its attention kernel wants blocks of
        #: FLASH_ATTN_TILE_ROWS query rows: short sequences share one)
        self.on_cpu = on_cpu
        self.env: dict[fx.Node, Any] = {}
        #: a tensor made by swapping the last two dims of a contiguous one -> that one (mm reads it)
        self.transposed_of: dict[int, Tensor] = {}

    # ------------------------------------------------------------------ helpers for lowerings
    def constant(self, array: Any, dtype: Any = np.float32) -> Tensor:
        """A tensor holding ``array`` (NumPy order), written once after the build."""
        a = np.asarray(array, dtype=dtype)
        return self.g.constant(a, GGMLType.F32 if a.dtype == np.float32 else GGMLType.I32)

    def op(self, name: str) -> Callable[..., Tensor]:
        """The context's op method ``name`` (``"add"``...)."""
        return cast(Callable[..., Tensor], getattr(self.ctx, name))

    def contig(self, t: Tensor) -> Tensor:
        return t if t.is_contiguous() else self.ctx.cont(t)

    def as_f32(self, v: Any) -> Any:
        """``v`` to compute on in float32: a Val of I32 (integers) cast (``ggml_cast``); a Val
        of F32 (floats, bools as 0/1) and a Python number as they are."""
        if isinstance(v, Val) and v.t.type == GGMLType.I32:
            return Val(self.ctx.cast(self.contig(v.t), "f32"), v.shape)
        return v

    def as_i32(self, t: Tensor) -> Tensor:
        """Integers computed in float32 (exact) back to I32 (``ggml_cast``)."""
        return self.ctx.cast(self.contig(t), "i32")

    def reshape(self, t: Tensor, shape: Sequence[int]) -> Tensor:
        """``t`` as torch ``shape`` (same number of elements)."""
        ne = ne_of(shape)
        if list(t.ne[:len(ne)]) == ne and all(n == 1 for n in t.ne[len(ne):]):
            return t
        return self.ctx.reshape(self.contig(t), *ne)

    def expand(self, v: Val, shape: Sequence[int]) -> Tensor:
        """``v`` broadcast (NumPy's rule) to torch ``shape``: ggml's repeat tiles it."""
        if tuple(v.shape) == tuple(shape):
            return v.t
        padded = (1,) * (len(shape) - v.ndim) + tuple(v.shape)
        t = self.reshape(v.t, padded)
        like = self.ctx.new_tensor(t.type, ne_of(shape))
        return self.ctx.repeat(t, like)

    # ------------------------------------------------------------------ the graph
    def lower(self, node: fx.Node) -> Any:
        """Lower ``node`` (a call_function node whose inputs are in ``env``)."""
        why = why_not(node)
        if why is not None:
            raise LoweringError(f"{node.format_node()}: {why}")
        lowering = TABLE[node.target]

        def arg(x: Any) -> Any:
            if isinstance(x, fx.Node):
                return self.env[x]
            if isinstance(x, (list, tuple)):
                return type(x)(arg(y) for y in x)
            return x

        out = lowering.lower(self, node, *arg(node.args), **{k: arg(x) for k, x in node.kwargs.items()})
        fake = val(node)
        if isinstance(fake, (tuple, list)):
            return tuple(None if o is None else self._checked(node, o, tuple(f.shape))
                         for o, f in zip(out, fake))
        return self._checked(node, out, tuple(fake.shape))

    def _checked(self, node: fx.Node, t: Tensor, shape: tuple[int, ...]) -> Val:
        ne = ne_of(shape)
        if list(t.ne[:len(ne)]) != ne or any(n != 1 for n in t.ne[len(ne):]):
            raise LoweringError(f"{node.format_node()}: lowered to ne {list(t.ne)}, torch says {list(shape)} "
                                "(a bug in pyggml's lowering)")
        return Val(t, tuple(int(d) for d in shape))


class LoweredGraph:
    """``gm`` (an FX graph of ATen ops, all lowerable) computed by ggml on ``backend`` (or by a
    :class:`~pyggml.Scheduler` over ``backends``, the CPU last). ``weights``: the indices of the
    placeholders that receive parameters, buffers and other static tensors: on the CPU backend
    ggml reads a float32 weight in its own memory (no copy); the others are copied into a
    backend buffer at the first call and again only when torch has changed them (another
    tensor, or written in place), not at every call; integer and bool ones are inputs as the
    others, read at every call. An ``index_put`` marked by
    :func:`~pyggml.torch_lowering.rewrites.mark_in_place` writes into its input's memory. Call
    it with the graph's inputs (CPU tensors, and Python ints for the sizes a graph with dynamic
    shapes takes); it returns the outputs as a list of torch tensors.

    ``flash_attn``: scaled-dot-product attention as one ``ggml_flash_attn_ext`` node (see
    :class:`~pyggml.torch_lowering.backend.Options`' ``attention``), else in float32 products.

    A graph traced with symbolic sizes (``torch.compile``'s dynamic shapes) is lowered for each
    concrete set of input shapes and sizes it is called with (its fake tensors propagated for
    them, one ggml graph each, cached); where those shapes cannot be lowered (a lowering's
    condition on a size), that call runs the graph in torch, with a warning once per shape.
    Raises :class:`~pyggml.torch_lowering.table.LoweringError` for a node it cannot lower at
    the traced shapes."""

    def __init__(self, gm: fx.GraphModule, weights: Collection[int], backend: Backend | None = None,
                 backends: Sequence[Backend] | None = None, max_graphs: int = 64,
                 weight_type: GGMLType = GGMLType.F32, flash_attn: bool = False):
        self.gm = gm
        if backend is None and not backends:
            raise ValueError("give a backend or backends")
        home = backend if backend is not None else list(backends or [])[0]
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        self.outputs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        for n in gm.graph.nodes:
            if n.op == "call_function":
                why = why_not(n)
                if why is not None:
                    raise LoweringError(f"{n.format_node()}: {why}")
        # integer and bool buffers (a static cache's position counters, written at every step)
        # are inputs like the others: a weight's copy into ggml memory is checked and made
        # again whenever torch writes it, a cost that pays for large float tensors only
        self._weights = sorted(i for i in weights if isinstance(val(self.placeholders[i]), torch.Tensor)
                               and val(self.placeholders[i]).dtype in DTYPES)
        self._weight_type = weight_type
        self._flash_attn = flash_attn
        self._on_cpu = isinstance(backend, CPUBackend)
        self._weight_seen: dict[int, tuple[int, int]] = {}
        self._w: dict[int, Tensor] = {}
        #: weights whose ggml tensor is the torch tensor's own memory (on the CPU backend)
        self._aliased: set[int] = set()
        self._copied: list[int] = []
        self._copied_versions: tuple[int, ...] = ()   # their torch versions when last copied
        self._aliased_ctx: Context | None = None
        self._copied_w: Weights | None = None
        self._placed: tuple[int, ...] | None = None   # the weights' data pointers they were placed for
        self._alias_ok = isinstance(backend, CPUBackend)
        self._home = home
        #: the torch dtype of each output: an integer one is I32 in ggml, returned as traced
        self._out_dtypes = [val(o).dtype if isinstance(o, fx.Node) and isinstance(val(o), torch.Tensor) else None
                            for o in self.outputs]
        #: placeholder positions that take a Python int (a symbolic size of a dynamic graph)
        self._ints = {i for i, n in enumerate(self.placeholders) if not isinstance(val(n), torch.Tensor)}
        # what a call reads of its arguments, worked out once: (position, is a size) of each
        # argument of the key, and (position, input name) of each tensor argument fed as input
        weight_set = set(self._weights)
        self._key_args = [(i, i in self._ints) for i in range(len(self.placeholders)) if i not in weight_set]
        self._feed_args = [(i, f"in{i}") for i, _ in self._key_args if i not in self._ints]
        #: (position, is a size) of the inputs whose integers ggml computes on in float32
        #: (sums, products, comparisons): a call where one holds more than SMALL_INT in
        #: magnitude runs in torch
        self._small = sorted({(self.placeholders.index(p), self.placeholders.index(p) in self._ints)
                              for n in gm.graph.nodes if n.op == "call_function" and _computes_ints(n)
                              for x in n.all_input_nodes for p in int_bound(x)[0]})
        #: of those, the sizes (checked in the key) and the tensors (checked as they are fed)
        self._small_sizes = [i for i, size in self._small if size]
        self._small_inputs = {i for i, size in self._small if not size}
        #: keys (input shapes and sizes) whose lowering failed -> why: those calls run in torch
        self._in_torch: dict[Any, str] = {}
        self._warned_small = False
        #: output position -> the placeholder position whose memory that output was written in
        self._in_place = {j: self.placeholders.index(o.args[0]) for j, o in enumerate(self.outputs)
                          if isinstance(o, fx.Node) and o.meta.get(IN_PLACE) and o.args[0] in self.placeholders}
        #: the key (input shapes and sizes) the nodes' fake tensors are for; None: symbolic
        self._traced: Any = None
        if not self._ints and all(is_static(val(n).shape) for n in self.placeholders):
            self._traced = tuple(shape_of(n) for i, n in enumerate(self.placeholders) if i not in self._weights)
        self._static_key = self._traced
        #: a graph traced with symbolic sizes: each node's traced value (see _specialize)
        self._symbolic: dict[fx.Node, Any] | None = None
        self.cache = GraphCache(self._build, backend=backend, backends=None if backend is not None else backends,
                                graph_size=GRAPH_SIZE, max_graphs=max_graphs)
        self.graphs_built = 0

    @staticmethod
    def _type_of(node: fx.Node) -> GGMLType:
        v = val(node)
        if v.dtype == torch.bool:   # a mask: 0/1
            return GGMLType.F32
        return GGMLType.I32 if v.dtype in INDEX_DTYPES else DTYPES[v.dtype]

    def close(self) -> None:
        self.cache.close()
        for c in [self._aliased_ctx, self._copied_w]:
            if c is not None:
                c.close()

    def _aliasable(self, i: int, src: torch.Tensor) -> bool:
        """Whether weight ``i`` can be ``src``'s own memory in ggml: on the CPU backend, float32
        and kept so, contiguous, 64-byte aligned (ggml asserts 32; at 32 but not 64, a product's
        row loads straddle cache lines: SmolLM2's decode step took 15% longer than on copies)."""
        return (self._alias_ok and src.dtype == torch.float32 and src.dim() > 0 and src.is_contiguous()
                and src.data_ptr() % 64 == 0 and self._type(i) == GGMLType.F32)

    def _type(self, i: int) -> GGMLType:
        node = self.placeholders[i]
        return self._weight_type if _products_only(node, self._weight_type) else self._type_of(node)

    def _place_weights(self, args: Sequence[torch.Tensor]) -> None:
        """The weights' ggml tensors for ``args``: on the CPU backend a float32 weight in
        contiguous, 64-byte aligned memory is that memory (no copy; torch's writes are seen);
        the others are copied into a backend buffer, again whenever torch changes them. When
        such a weight is another tensor than before (a new KV cache), the graphs are made again
        (the copied weights are kept)."""
        ptrs = tuple(map(_DATA_PTR, _pick(args, self._weights)))
        if ptrs == self._placed and tuple(map(_VERSION, _pick(args, self._copied))) == self._copied_versions:
            return   # the common case: the same tensors, unchanged
        if ptrs != self._placed:
            aliasable = {i for i in self._weights if self._aliasable(i, args[i])}
            if self._placed is not None:
                self.cache.clear()   # the graphs read the weights' old tensors
                if self._aliased_ctx is not None:
                    self._aliased_ctx.close()
            if self._placed is None or aliasable != self._aliased:   # a weight that changed kind
                if self._copied_w is not None:
                    self._copied_w.close()
                    self._copied_w = None
                self._aliased, self._weight_seen = aliasable, {}
                copied = [i for i in self._weights if i not in aliasable]
                if copied:   # their values now, converted to the weight type by ggml
                    self._copied_w = load_tensors({str(i): _array(args[i]) for i in copied}, self._home,
                                                  type_of=lambda name, t: self._type(int(name)))
                    for i in copied:
                        self._w[i] = self._copied_w[str(i)]
                        self._weight_seen[i] = (args[i].data_ptr(), args[i]._version)
            self._aliased_ctx = Context.for_tensors(max(1, len(aliasable)))
            for i in aliasable:
                self._w[i] = from_dlpack(args[i].detach(), self._aliased_ctx)
            self._copied = [i for i in self._weights if i not in aliasable]
            self._placed = ptrs
        for i in self._copied:
            src = args[i]
            stamp = (src.data_ptr(), src._version)
            if self._weight_seen.get(i) != stamp:
                self._w[i].set(_array(src))
                self._weight_seen[i] = stamp
        self._copied_versions = tuple(map(_VERSION, _pick(args, self._copied)))

    def _propagate(self, key: tuple[Any, ...]) -> None:
        """The nodes' fake tensors (and sizes) for the inputs of ``key``: each non-weight
        input's shape, or its value for a size (the graph was traced for others)."""
        mode = FakeTensorMode()
        fakes: list[Any] = []
        k = 0
        for i, node in enumerate(self.placeholders):
            if i in self._weights:
                fakes.append(mode.from_tensor(torch.empty(shape_of(node), dtype=val(node).dtype)))
                continue
            fakes.append(key[k] if i in self._ints else mode.from_tensor(torch.empty(key[k], dtype=val(node).dtype)))
            k += 1
        try:
            FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*fakes)
        except Exception as e:  # noqa: BLE001 - torch says the graph does not take these shapes
            self._traced = None
            raise LoweringError(f"the graph does not take inputs of shapes {list(key)}: {e}") from None
        self._traced = key

    def _specialize(self, key: tuple[Any, ...]) -> bool:
        """For a graph traced with symbolic sizes: each node's value for the inputs of ``key``
        (a meta tensor, or an int), its sizes and strides the traced ones' expressions of the
        symbols, evaluated at the sizes ``key`` binds them to (a few microseconds a node, where
        propagating fake tensors takes half a millisecond). False where a size is not bound (a
        data-dependent one): :meth:`_propagate` then."""
        if self._symbolic is None:
            self._symbolic = {n: val(n) for n in self.gm.graph.nodes if n.op != "output"}
        binds: dict[Any, int] = {}
        k = 0
        for i, node in enumerate(self.placeholders):
            if i in self._weights:
                continue
            v = self._symbolic[node]
            for sym, n in ([(v, key[k])] if i in self._ints else zip(v.shape, key[k])):
                if isinstance(sym, torch.SymInt):
                    expr = sym.node.expr
                    if not expr.is_Symbol:
                        return False
                    binds[expr] = int(n)
            k += 1
        known: dict[Any, int] = {}

        def size(d: Any) -> int:
            if not isinstance(d, torch.SymInt):
                return int(d)
            expr = d.node.expr
            got = known.get(expr)
            if got is None:
                value = expr.xreplace(binds) if hasattr(expr, "xreplace") else expr
                if not getattr(value, "is_number", True):
                    raise LookupError(expr)
                got = known[expr] = int(value)
            return got

        def concrete(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return torch.empty_strided([size(d) for d in v.shape], [size(s) for s in v.stride()],
                                           dtype=v.dtype, device="meta")
            if isinstance(v, (tuple, list)):
                return type(v)(concrete(x) for x in v)
            return size(v) if isinstance(v, torch.SymInt) else v

        try:
            metas = {n: concrete(v) for n, v in self._symbolic.items()}
        except LookupError:
            return False
        for n, v in metas.items():
            n.meta["val"] = v
        return True

    def _build(self, g: GraphParts, *key: Any) -> dict[str, Tensor]:
        if key != self._traced:
            if self._static_key is not None or not self._specialize(key):
                self._propagate(key)
            self._traced = key
        b = Builder(g, self._flash_attn, self._on_cpu)
        k = 0
        for i, node in enumerate(self.placeholders):
            if i in self._w:
                b.env[node] = Val(self._w[i], shape_of(node))
                continue
            if i in self._ints:
                b.env[node] = key[k]
            else:
                t = g.input(self._type_of(node), ne_of(key[k]), f"in{i}")
                b.env[node] = Val(t, tuple(key[k]))
            k += 1
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                b.env[node] = b.lower(node)
        outputs = {}
        for j, o in enumerate(self.outputs):
            t = b.contig(b.env[o].t)   # NumPy reads contiguous outputs
            # small ones (a decode step's logits and counters) copied out in the graph and read
            # without a call into C; large ones read where computed (no memory per graph); a
            # weight's own memory when aliased (read only when not)
            if j not in self._in_place and t.nbytes <= _HOST_OUTPUT_BYTES:
                g.output(t, f"out{j}")
            else:
                outputs[f"out{j}"] = t
        g.extra["run"] = _Run(self, g, [b.env[o].shape for o in self.outputs])
        self.graphs_built += 1
        return outputs

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        key = tuple(int(args[i]) if size else tuple(args[i].shape) for i, size in self._key_args)
        if key in self._in_torch:
            return self._in_torch_run(args)
        for i in self._small_sizes:
            if abs(int(args[i])) > SMALL_INT:
                return self._too_large(int(args[i]), args)
        with self.cache.lock:   # threads sharing this graph take turns from feeding to reading
            self._place_weights(args)
            try:
                entry = self.cache.get(key)
            except LoweringError as e:
                if key == self._static_key:   # the shapes its nodes were checked for: a bug, not a size
                    raise
                self._in_torch[key] = str(e)
                warnings.warn(f"pyggml: a graph of {len(self.gm.graph.nodes)} nodes runs in torch for inputs of "
                              f"shapes {list(key)}: {e}", stacklevel=2)
                return self._in_torch_run(args)
            run: _Run = entry.extra["run"]
            entry.arrays   # noqa: B018 - its inputs are written in place (by run.feed)
            try:
                run.feed(args)
            except _TooLarge as e:
                return self._too_large(e.args[0], args)
            return run.results(args, self.cache.compute(key, run.read))

    def _too_large(self, value: int, args: Sequence[Any]) -> list[torch.Tensor]:
        """An integer input holds ``value``, beyond SMALL_INT: a warning (once), and the call
        computed by torch."""
        if not self._warned_small:
            self._warned_small = True
            warnings.warn(f"pyggml: an integer input holds {value}, beyond the {SMALL_INT} up to which "
                          "ggml's float32 integer arithmetic is exact: the graph runs in torch for such "
                          "inputs", stacklevel=3)
        return self._in_torch_run(args)

    def _in_torch_run(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """The graph computed by torch (its FX module), for inputs whose shapes ggml does not take."""
        out = self.gm(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]


class _TooLarge(Exception):
    """An input of integers ggml computes on in float32 holds ``args[0]``, beyond SMALL_INT."""


class _Run:
    """How a call feeds one cached graph of a :class:`LoweredGraph` and reads its outputs,
    worked out once when the graph is built (kept in its ``CachedGraph.extra``, dropped with it):
    each input written straight into the graph's NumPy view of it, each output made a torch
    tensor of the traced dtype, shape and strides."""

    __slots__ = ("feeds", "read", "outs")

    def __init__(self, lowered: LoweredGraph, g: GraphParts, shapes: list[tuple[int, ...]]):
        #: (argument position, host view, kind, the least and the largest integer it may hold):
        #: kind "f" floats, "b" bools (0/1), "i" integers, "s" one integer
        self.feeds: list[tuple[int, np.ndarray, str, int, int]] = []
        for i, name in lowered._feed_args:
            arr = g.arrays.get(name)
            if arr is None:   # inputs are placed in host memory (the CPU's, also under a scheduler)
                raise LoweringError(f"input {name} of the graph has no host memory to write it in")
            dtype = val(lowered.placeholders[i]).dtype
            kind = "b" if dtype == torch.bool else ("s" if arr.size == 1 else "i") if dtype in INDEX_DTYPES else "f"
            lo, hi = (-SMALL_INT, SMALL_INT) if i in lowered._small_inputs else (_I32.min, _I32.max)
            self.feeds.append((i, arr, kind, lo, hi))
        #: the outputs read through GraphCache.compute (not in host memory of their own)
        self.read: list[str] = []
        #: per output: (argument position of the weight it was written in, or -1; its host view
        #: or None; traced shape, dtype, strides; whether those strides differ from contiguous)
        self.outs: list[tuple[int, np.ndarray | None, tuple[int, ...], Any, tuple[int, ...], bool]] = []
        for j, (o, shape) in enumerate(zip(lowered.outputs, shapes)):
            i = lowered._in_place.get(j, -1)
            if i >= 0 and i not in lowered._aliased:
                i = -1
            arr = g.arrays.get(f"out{j}")
            if i < 0 and arr is None:
                self.read.append(f"out{j}")
            stride = tuple(int(x) for x in val(o).stride()) if isinstance(val(o), torch.Tensor) else ()
            dense = torch.empty(shape, device="meta").stride()
            strided = any(a != b for a, b, n in zip(dense, stride, shape) if n > 1)
            self.outs.append((i, arr, tuple(shape), lowered._out_dtypes[j], stride, strided))

    def feed(self, args: Sequence[Any]) -> None:
        """Write the call's tensors into the graph's inputs. Raises ValueError for an int64
        value outside int32's range, _TooLarge for one beyond SMALL_INT in an input ggml
        computes on."""
        for i, arr, kind, least, largest in self.feeds:
            x = args[i]
            if kind == "s":
                v = x.item()
                if not least <= v <= largest:
                    _out_of_range(x, v, largest)
                arr.flat[0] = v
                continue
            a = (x.detach() if x.requires_grad else x).numpy()
            if kind == "i" and a.size:
                lo, hi = int(a.min()), int(a.max())
                if lo < least or hi > largest:
                    _out_of_range(x, lo if lo < least else hi, largest)
            np.copyto(arr, a.reshape(arr.shape), casting="unsafe")

    def results(self, args: Sequence[Any], got: dict[str, np.ndarray]) -> list[torch.Tensor]:
        """The outputs as torch tensors (new ones, or the weight written in place)."""
        out = []
        for j, (i, arr, shape, dtype, stride, strided) in enumerate(self.outs):
            if i >= 0:
                out.append(args[i])
                continue
            if arr is None:
                t = torch.from_numpy(got[f"out{j}"])   # a new array
                if dtype is not None and t.dtype != dtype:
                    t = t.to(dtype)
            elif not shape and dtype in INDEX_DTYPES:
                out.append(torch.scalar_tensor(arr.item(), dtype=dtype))   # a counter
                continue
            else:
                t = torch.from_numpy(arr)
                t = t.to(dtype) if dtype is not None and t.dtype != dtype else t.clone()
            if t.shape != shape:
                t = t.reshape(shape)
            out.append(_strided(t, stride) if strided else t)
        return out


def _out_of_range(x: torch.Tensor, value: int, largest: int) -> None:
    if largest == SMALL_INT:
        raise _TooLarge(value)
    raise ValueError(f"an int64 input of shape {list(x.shape)} holds {value}, outside the int32 "
                     "range of ggml's indices: as an index it is out of range")


#: outputs up to this size get memory of their own in each cached graph (read without a call into C)
_HOST_OUTPUT_BYTES = 1 << 20


def _computes_ints(node: fx.Node) -> bool:
    """Whether ``node`` is lowered arithmetic on integers (a sum, a comparison: float32 in ggml)."""
    lowering = TABLE.get(node.target)
    return bool(lowering is not None and lowering.makes_values
                and any(isinstance(val(x), torch.Tensor) and val(x).dtype in INDEX_DTYPES for x in node.all_input_nodes))


def _strided(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``t`` (contiguous) laid out with the strides torch traced for it, where they differ (a
    transposed result, which a view torch takes of it next reads as laid out so)."""
    if all(a == b for a, b, n in zip(t.stride(), stride, t.shape) if n > 1):
        return t
    if 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, stride)) != t.numel():
        return t   # not a dense layout (an expand's 0 strides): only a permuted dense one is kept
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype)
    out.copy_(t)
    return out


def _products_only(node: fx.Node, t: GGMLType) -> bool:
    """Whether weight placeholder ``node`` may be kept in type ``t``: a float32 matrix whose rows
    are whole blocks of ``t``, read only as the weight of ``aten.linear`` or the table of
    ``aten.embedding`` (ggml's quantized products and get_rows take it as stored;
    :func:`~pyggml.torch_lowering.rewrites.linear_products` writes ``nn.Linear``'s products
    that way)."""
    v = val(node)
    if t == GGMLType.F32 or v.dtype != torch.float32 or v.dim() != 2 or v.shape[-1] % types.block_size(t):
        return False
    return bool(node.users) and all(_reads_as_stored(u, node) for u in node.users)


def _reads_as_stored(user: fx.Node, node: fx.Node) -> bool:
    """Whether ``user`` reads weight ``node`` only as ``linear``'s weight or ``embedding``'s
    table (ggml's products and get_rows take quantized types)."""
    a = user.args
    if user.op != "call_function" or not a:
        return False
    if user.target == torch.ops.aten.linear.default:
        return len(a) > 1 and a[1] is node and a[0] is not node
    return bool(user.target == torch.ops.aten.embedding.default and a[0] is node and a[1] is not node)


_I32 = torch.iinfo(torch.int32)
_DATA_PTR = torch.Tensor.data_ptr
_VERSION = operator.attrgetter("_version")


def _pick(args: Sequence[Any], positions: Sequence[int]) -> Sequence[Any]:
    """``[args[i] for i in positions]``, in one C call where there are several."""
    if len(positions) > 1:
        return cast(Sequence[Any], operator.itemgetter(*positions)(args))
    return [args[i] for i in positions]


def _array(t: torch.Tensor) -> np.ndarray:
    """A float32 weight as NumPy (a view where torch allows: contiguous), for ggml to copy."""
    return np.asarray(t.detach().contiguous().numpy())
