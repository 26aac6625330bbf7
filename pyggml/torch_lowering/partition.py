"""Which nodes of an FX graph go to ggml: torch's ``CapabilityBasedPartitioner`` over
:func:`~pyggml.torch_lowering.table.why_not`. Nodes ggml cannot take stay in torch; each partition becomes one
submodule of the graph (``fused_<i>``), which :mod:`~pyggml.torch_lowering.backend` replaces by a
:class:`~pyggml.torch_lowering.graph.LoweredGraph`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .layout import val
from .table import args_of, kw_of, why_not

__all__ = ["Support", "partition", "Explanation", "explain_graph", "linear_products", "repeated_heads"]

#: nodes that compute nothing: a partition made of them only is left to torch
_TRIVIAL = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.alias.default",
            "aten.detach.default", "aten.t.default", "aten.permute.default", "aten.transpose.int",
            "aten.unsqueeze.default", "aten.squeeze.dim", "aten.expand.default", "aten.clone.default",
            "aten._to_copy.default", "aten.slice.Tensor", "aten.select.int", "<built-in function getitem>"}


class Support(OperatorSupportBase):  # type: ignore[misc,unused-ignore]  # Any without torch
    """ggml takes a node when :func:`why_not` has nothing against it."""

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        return why_not(node) is None


def partition(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each group of ggml-supported nodes moved into a submodule ``fused_<i>``
    (worth one ggml graph: a group of views only stays in torch)."""
    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    parts = [p for p in partitioner.propose_partitions()
             if any(str(n.target) not in _TRIVIAL for n in p.nodes)]
    return partitioner.fuse_partitions(parts)


@dataclass
class Explanation:
    """Where each node of a graph goes: ``ggml`` (the ATen overloads lowered, with counts) and
    ``torch`` (overload -> why not)."""
    ggml: dict[str, int] = field(default_factory=dict)
    torch: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"ggml: {sum(self.ggml.values())} nodes"]
        lines += [f"  {k} x{v}" for k, v in sorted(self.ggml.items())]
        lines.append(f"torch: {len(self.torch)} overloads")
        lines += [f"  {k}: {v}" for k, v in sorted(self.torch.items())]
        return "\n".join(lines)


def explain_graph(gm: fx.GraphModule, into: Explanation | None = None) -> Explanation:
    """Count the call_function nodes of ``gm`` that ggml takes, and why it takes the others not."""
    e = into or Explanation()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        why = why_not(n)
        name = str(n.target)
        if why is None:
            e.ggml[name] = e.ggml.get(name, 0) + 1
        else:
            e.torch.setdefault(name, why)
    return e


def linear_products(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each product by a transposed 2-dim tensor, ``mm(x, t(w))`` or
    ``addmm(b, x, t(w))`` (``nn.Linear`` after ATen's decomposition), written as
    ``linear(x, w[, b])``: the weight is then read by products only, as stored, and can be kept
    in a quantized type (:class:`~pyggml.torch_lowering.graph.LoweredGraph`'s ``weight_type``)."""
    aten = torch.ops.aten
    transposes = {aten.t.default, aten.permute.default, aten.transpose.int}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        args = args_of(node)
        if node.target == aten.addmm.default and (kw_of(node).get("beta", 1) != 1 or kw_of(node).get("alpha", 1) != 1):
            continue
        y = args[1] if node.target == aten.mm.default else args[2]
        if not (isinstance(y, fx.Node) and y.op == "call_function" and y.target in transposes):
            continue
        yargs = args_of(y)
        w = yargs[0]
        wv, xv = val(w), val(args[0] if node.target == aten.mm.default else args[1])
        if not isinstance(wv, torch.Tensor) or wv.dim() != 2 or xv is None or xv.dim() != 2:
            continue
        if y.target == aten.permute.default and list(yargs[1]) not in ([1, 0], [-1, -2]):
            continue
        if y.target == aten.transpose.int and sorted(d % 2 for d in yargs[1:3]) != [0, 1]:
            continue
        bias = None if node.target == aten.mm.default else args[0]
        if bias is not None and (val(bias) is None or val(bias).dim() != 1):
            continue
        x = args[0] if node.target == aten.mm.default else args[1]
        with gm.graph.inserting_before(node):
            lin = gm.graph.call_function(aten.linear.default, (x, w) if bias is None else (x, w, bias))
        lin.meta = dict(node.meta)
        node.replace_all_uses_with(lin)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def repeated_heads(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with each ``view(clone(expand(unsqueeze(x, d))))`` that repeats every slice of
    ``x``'s dim ``d - 1`` n times in a row (grouped-query attention's ``repeat_kv``) written as
    ``repeat_interleave(x, n, d - 1)``: its 5-dim intermediates, which ggml cannot hold, are gone."""
    aten = torch.ops.aten
    views = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in views:
            continue
        src = args_of(node)[0]
        if isinstance(src, fx.Node) and src.target == aten.clone.default:
            src = args_of(src)[0]
        if not (isinstance(src, fx.Node) and src.target == aten.expand.default):
            continue
        uns = args_of(src)[0]
        if not (isinstance(uns, fx.Node) and uns.target == aten.unsqueeze.default):
            continue
        x = args_of(uns)[0]
        xv, ev, ov = val(x), val(src), val(node)
        if not all(isinstance(v, torch.Tensor) for v in (xv, ev, ov)):
            continue
        d = args_of(uns)[1] % (xv.dim() + 1)
        xs, es = tuple(xv.shape), tuple(ev.shape)
        if d == 0 or es[:d] + es[d + 1:] != xs:
            continue
        n = int(es[d])
        want = list(xs)
        want[d - 1] *= n
        if tuple(ov.shape) != tuple(want):
            continue
        with gm.graph.inserting_before(node):
            rep = gm.graph.call_function(aten.repeat_interleave.self_int, (x, n, d - 1))
        rep.meta = dict(node.meta)
        node.replace_all_uses_with(rep)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm
