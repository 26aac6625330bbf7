"""``torch.compile(model, backend="pyggml")``: the graphs dynamo captures, decomposed to core
ATen by AOT autograd, partitioned between ggml and torch, the ggml partitions computed by
:class:`~pyggml.torch_lowering.graph.LoweredGraph`.

Options (``torch.compile(..., options={...})``): ``device`` (``"cpu"``, the default, or a ggml
device name such as ``"CUDA0"``, ``"Vulkan0"``, ``"RPC0"``: that device holds the weights and
runs what it supports, the CPU the rest), ``threads`` (CPU threads; torch's
``torch.get_num_threads()`` by default), ``weights`` (the type of the weight matrices that only
``nn.Linear``-style products and embeddings read: ``"auto"``, the default: ``"bf16"`` on the
CPU where ggml's CPU code has AVX512-BF16 (BF16 products run about twice as fast as float32
ones there: all-MiniLM-L6-v2 through transformers at 1.6-1.7x eager torch, its token states at
cosine >= 0.99997 to float32's, its embeddings >= 0.9999), except in a graph that writes into
its inputs (a generation step updating a KV cache: an LLM's logits would move by some 0.05,
and a near tie would change the text), else ``"f32"``; ``"f32"`` to keep float32 products;
or ``"f16"``, ``"bf16"``, ``"q8_0"``, ``"q4_0"``... converted by ggml when copied in; ggml's
quantized products also quantize the activations), ``attention`` (``"flash"``, the default:
scaled-dot-product attention as one ``ggml_flash_attn_ext`` node, whose CPU kernel for more
than a few queries computes in F16 tiles, a relative error of about 2e-4; ``"exact"``:
``mul_mat``, ``soft_max``, ``mul_mat`` in float32). Tensors in and out are CPU
torch tensors; on the CPU, float32 weights are read, and a KV cache updated with
``index_copy_`` written, in torch's own memory. ggml graphs are built once per input shape and
cached; a dynamo graph of symbolic sizes (``torch.compile``'s default ``dynamic=None`` from the
second shape on, ``dynamic=True``, ``mark_dynamic``) is partitioned once and lowered at each
call's sizes. Only the forward pass is lowered: under autograd the backward pass runs in
torch.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
from torch import fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._guards import TracingContext
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from .. import types
from ..backends.backend import Backend
from ..backends.cpu import CPUBackend
from ..enums import GGMLType
from ..runtime import bf16_products_fast, open_backend
from .graph import LoweredGraph
from .partition import Explanation, explain_graph, partition
from .rewrites import mark_in_place, rewrite

__all__ = ["Options", "compile_fx", "compile_exported", "lower_module", "explain"]


@dataclass(frozen=True)
class Options:
    """The backend's options; ValueError for a bad one."""
    device: str = "cpu"
    threads: int | None = None
    weights: str = "auto"
    attention: str = "flash"

    def __post_init__(self) -> None:
        try:
            t = types.ggml_type(self.weight_type())
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"weights must be a ggml type name such as 'q8_0', not {self.weights!r}") from None
        if t != GGMLType.F32 and not types.can_quantize(t):
            raise ValueError(f"ggml cannot convert weights to {t.name}")
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a ggml device name, not {self.device!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads must be an int >= 1, not {self.threads!r}")
        if self.attention not in ("flash", "exact"):
            raise ValueError(f"attention must be 'flash' or 'exact', not {self.attention!r}")

    def weight_type(self, writes_inputs: bool = False) -> str:
        """``weights``, ``"auto"`` resolved: BF16 on the CPU where ggml has AVX512-BF16 kernels,
        unless the graph ``writes_inputs`` (a KV cache), else F32."""
        if self.weights != "auto":
            return self.weights
        return "bf16" if isinstance(self.device, str) and not writes_inputs and bf16_products_fast(self.device) \
            else "f32"


class _Devices:
    """The backends of one compiled model: the CPU's and, for another device, that one's."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.flash_attn = opts.attention == "flash"
        self.cpu = CPUBackend(n_threads=opts.threads or torch.get_num_threads())
        self.other: Backend | None = None
        if opts.device.lower() != "cpu":
            self.other = open_backend(opts.device, self.cpu.n_threads)

    def graph(self, gm: fx.GraphModule, weights: set[int], writes_inputs: bool = False) -> LoweredGraph:
        """A partition's LoweredGraph; ``writes_inputs``: its module writes into its inputs."""
        weight_type = types.ggml_type(self.opts.weight_type(writes_inputs))
        if self.other is None:
            return LoweredGraph(gm, weights, backend=self.cpu, weight_type=weight_type, flash_attn=self.flash_attn)
        return LoweredGraph(gm, weights, backends=[self.other, self.cpu], weight_type=weight_type,
                            flash_attn=self.flash_attn)


_log = logging.getLogger("pyggml.torch_lowering")
_reported: set[tuple[str, str]] = set()


def _report(gm: fx.GraphModule) -> None:
    """Say (logger ``pyggml.torch_lowering``, INFO) how many of ``gm``'s nodes ggml takes, and
    each reason a node stays in torch the first time it is met in this process."""
    e = explain_graph(gm)
    fresh = [(op, why) for op, why in sorted(e.torch.items()) if (op, why) not in _reported]
    _reported.update(fresh)
    _log.info("pyggml lowers %d of %d ATen nodes to ggml%s", sum(e.ggml.values()),
              sum(e.ggml.values()) + sum(e.torch_nodes.values()),
              "".join(f"; {op} stays in torch: {why}" for op, why in fresh))


def lower_module(gm: fx.GraphModule, weights: set[int], devices: Any,
                 mutated: dict[int, int] | None = None) -> fx.GraphModule:
    """``gm`` (core ATen) with its ggml partitions replaced by :class:`LoweredGraph` modules.
    ``weights``: the placeholder indices that receive parameters and buffers (and tensors
    marked static); ``mutated``: output position -> the placeholder position whose new value it
    is (see :func:`~pyggml.torch_lowering.rewrites.mark_in_place`)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weight_names = {placeholders[i].name for i in weights}   # partitioning may copy the nodes
    gm = rewrite(gm)
    mark_in_place(gm, mutated or {})
    _report(gm)
    fused = partition(gm)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("fused_"):
            continue
        sub = getattr(fused, str(node.target))
        sub_weights = {i for i, a in enumerate(node.args)
                       if isinstance(a, fx.Node) and a.op == "placeholder" and a.name in weight_names}
        setattr(fused, str(node.target), _Module(devices.graph(sub, sub_weights, bool(mutated)), sub))
    fused.recompile()
    return fused


class _Module(torch.nn.Module):  # type: ignore[misc,unused-ignore]  # Any without torch
    """A ggml partition as the submodule FX calls."""

    def __init__(self, lowered: LoweredGraph, original: fx.GraphModule):
        super().__init__()
        self.lowered = lowered
        out = next(n for n in original.graph.nodes if n.op == "output")
        self.single = not isinstance(out.args[0], (list, tuple))

    def forward(self, *args: torch.Tensor) -> Any:
        outs = self.lowered(*args)
        return outs[0] if self.single else tuple(outs)


#: kept whole: their lowering makes one attention of them (torch's decomposition makes a dozen
#: ops, some on bool tensors ggml does not take, which would cut each layer off the next)
_KEEP = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
         torch.ops.aten.scaled_dot_product_attention.default)


def _decompositions() -> Any:
    """torch's core ATen decompositions, less those of :data:`_KEEP`."""
    table: Any = core_aten_decompositions()   # a dict-like table of untyped methods
    for op in _KEEP:
        table.pop(op, None)
    return table


def _is_weight(name: str, x: Any) -> bool:
    return isinstance(x, torch.nn.Parameter) or "_parameters_" in name or "_buffers_" in name


def compile_fx(gm: fx.GraphModule, example_inputs: Sequence[Any],
               options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend ``"pyggml"`` (registered through the
    ``torch_dynamo_backends`` entry point). ``options``: see :class:`Options`. ``mode``
    (``torch.compile``'s: transformers' ``CompileConfig`` gives ``"reduce-overhead"``) changes
    nothing: the graphs are made once per input shape and computed again whatever the mode."""
    opts = Options(**(options or {}))
    devices = _Devices(opts)
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    weights = {i for i, (name, x) in enumerate(zip(names, example_inputs)) if _is_weight(name, x)}

    def forward(aten_gm: fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        # AOT autograd knows the inputs that are parameters and buffers (it may have lifted
        # them in front of the others); dynamo's placeholder names say it where it does not
        # the first outputs are the new values of the inputs the graph mutates, which AOT
        # autograd copies into them afterwards
        tracing = TracingContext.try_get()
        meta = getattr(tracing, "fw_metadata", None)
        static = getattr(meta, "static_input_indices", None)
        found = set(static) if static else weights
        mutated = dict(enumerate(getattr(meta, "mutated_inp_runtime_indices", None) or ()))
        # a graph of symbolic sizes (dynamic shapes) is partitioned once for all of them: what a
        # check reads of a size must not become one of dynamo's guards (a recompilation for
        # every new size); the lowering then runs at each call's sizes
        shape_env = getattr(getattr(tracing, "fake_mode", None), "shape_env", None)
        with shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext():
            return cast(Callable[..., Any], lower_module(aten_gm, found, devices, mutated))

    def backward(aten_gm: fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        return cast(Callable[..., Any], aten_gm)

    compiler = aot_autograd(fw_compiler=forward, inference_compiler=forward, bw_compiler=backward,
                            decompositions=_decompositions())
    compiled: Callable[..., Any] = compiler(gm, list(example_inputs))
    return compiled


def compile_exported(ep: torch.export.ExportedProgram,
                     options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A function computing ``ep`` (a ``torch.export`` program) with ggml: decomposed to core
    ATen as :func:`compile_fx` does, partitioned between ggml and torch. Call it with the
    inputs the model was exported with (the same structure, shapes and dtypes; CPU tensors);
    it returns the model's outputs and writes the buffers the model mutates into
    ``ep.state_dict`` (a buffer written with ``index_copy_`` is written in place on the CPU).
    ``options``: see :class:`Options`. Raises ValueError for inputs of another structure, what
    the graph raises for other shapes (:class:`~pyggml.torch_lowering.table.LoweringError`)."""
    devices = _Devices(Options(**(options or {})))
    ep = ep.run_decompositions(_decompositions())
    sig = ep.graph_signature
    ins, outs = list(sig.input_specs), list(sig.output_specs)
    state = {**ep.state_dict, **ep.constants}
    weights = {i for i, spec in enumerate(ins) if spec.kind != InputKind.USER_INPUT}
    position = {spec.target: i for i, spec in enumerate(ins) if spec.kind == InputKind.BUFFER}
    mutated = {k: position[spec.target] for k, spec in enumerate(outs) if spec.kind == OutputKind.BUFFER_MUTATION}
    fused = lower_module(ep.graph_module, weights, devices, mutated)
    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec

    def run(*args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != in_spec:
            raise ValueError(f"the program was exported for inputs {in_spec}, not {spec}")
        user = iter(flat)
        inputs = [next(user) if spec.kind == InputKind.USER_INPUT else state[str(spec.target)] for spec in ins]
        with torch.no_grad():
            results = fused(*inputs)
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        returned = []
        for value, spec in zip(results, outs):
            if spec.kind == OutputKind.BUFFER_MUTATION:
                buf = state[str(spec.target)]
                if value is not buf:
                    buf.copy_(value)
            else:
                returned.append(value)
        return pytree.tree_unflatten(returned, out_spec)

    return run


def explain(model: torch.nn.Module, *inputs: Any) -> Explanation:
    """Which ATen ops of ``model(*inputs)`` ggml would run and why the others stay in torch:
    the model exported (``torch.export``), decomposed and rewritten as :func:`compile_fx` does."""
    ep = torch.export.export(model, tuple(inputs)).run_decompositions(_decompositions())
    return explain_graph(rewrite(ep.graph_module))
