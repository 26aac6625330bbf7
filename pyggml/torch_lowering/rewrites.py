"""Rewrites of an ATen graph before it is partitioned, so that more of it reaches ggml, and
better: ``nn.Linear``'s products read their weight as stored (:func:`linear_products`), and
grouped-query attention's 5-dim repeat of heads becomes one op (:func:`repeated_heads`), and
so does RMS normalisation written out (:func:`rms_norms`). :func:`rewrite` applies them, after
torch's common subexpression elimination. :func:`mark_in_place` says which ``index_put`` nodes may write
into their input's own memory (a static KV cache updated with ``index_copy_``)."""
from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx.passes.dialect.common.cse_pass import CSEPass

from .layout import val
from .table import args_of, kw_of

__all__ = ["rewrite", "linear_products", "repeated_heads", "rms_norms", "mark_in_place", "IN_PLACE"]

#: ``node.meta`` key set by :func:`mark_in_place`
IN_PLACE = "pyggml_in_place"


def rewrite(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with its common subexpressions computed once (torch's ``CSEPass``: e.g. the same
    attention mask made for every layer, which would be as many inputs of a ggml graph) and
    every rewrite of this module made, recompiled."""
    result = CSEPass()(gm)
    gm = result.graph_module if result is not None else gm
    repeated_heads(gm)
    rms_norms(gm)
    linear_products(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _replace(gm: fx.GraphModule, node: fx.Node, target: Any, args: tuple[Any, ...]) -> None:
    """``node`` replaced by a call of ``target`` with ``args``, which computes the same tensor
    (its fake tensor is kept)."""
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(target, args)
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)


def linear_products(gm: fx.GraphModule) -> None:
    """In ``gm``, each product by a transposed 2-dim tensor, ``mm(x, t(w))`` or
    ``addmm(b, x, t(w))`` (``nn.Linear`` after ATen's decomposition), written as
    ``linear(x, w[, b])``: the weight is then read by products only, as stored, and can be kept
    in a quantized type (:class:`~pyggml.torch_lowering.graph.LoweredGraph`'s ``weight_type``)."""
    aten = torch.ops.aten
    transposes = {aten.t.default, aten.permute.default, aten.transpose.int}
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
        _replace(gm, node, aten.linear.default, (x, w) if bias is None else (x, w, bias))


def repeated_heads(gm: fx.GraphModule) -> None:
    """In ``gm``, each ``view(clone(expand(unsqueeze(x, d))))`` that repeats every slice of
    ``x``'s dim ``d - 1`` n times in a row (grouped-query attention's ``repeat_kv``) written as
    ``repeat_interleave(x, n, d - 1)``: its 5-dim intermediates, which ggml cannot hold, are gone."""
    aten = torch.ops.aten
    views = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
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
        _replace(gm, node, aten.repeat_interleave.self_int, (x, n, d - 1))


def rms_norms(gm: fx.GraphModule) -> None:
    """In ``gm``, each ``x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps)`` (an RMS norm as
    transformers' ``LlamaRMSNorm`` writes it, without its weight) written as
    ``rms_norm(x, [x.shape[-1]], None, eps)``: one ggml_rms_norm instead of seven ggml ops."""
    aten = torch.ops.aten

    def call(n: Any, target: Any) -> list[Any] | None:
        return args_of(n) if isinstance(n, fx.Node) and n.op == "call_function" and n.target == target else None

    for node in list(gm.graph.nodes):
        a = call(node, aten.mul.Tensor)
        if a is None or len(a) != 2:
            continue
        for x, r in ((a[0], a[1]), (a[1], a[0])):
            rs = call(r, aten.rsqrt.default)
            add = call(rs[0], aten.add.Tensor) if rs else None
            if rs is None or add is None or len(add) != 2 or not isinstance(add[1], float) \
                    or kw_of(rs[0]).get("alpha", 1) != 1:
                continue
            mean = call(add[0], aten.mean.dim)
            if mean is None or list(mean[1]) not in ([-1], [val(x).dim() - 1]) or not (len(mean) > 2 and mean[2]):
                continue
            sq = call(mean[0], aten.pow.Tensor_Scalar)
            if sq is None or sq[0] is not x or sq[1] != 2 or val(x).dtype != torch.float32:
                continue
            _replace(gm, node, aten.rms_norm.default, (x, [int(val(x).shape[-1])], None, add[1]))
            break


def mark_in_place(gm: fx.GraphModule, mutated: dict[int, int]) -> None:
    """Mark (``node.meta[IN_PLACE]``) each ``index_put`` node of ``gm`` that may write into
    its ``self`` input's own memory: ``mutated`` maps the graph's output positions to the
    placeholder positions whose new value they are (AOT autograd's input mutations, copied
    back into those inputs after the graph), and ``self`` is that placeholder, read by this node
    only. The partitions keep the mark (FX copies ``meta``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for k, i in mutated.items():
        node = outs[k] if k < len(outs) else None
        if (isinstance(node, fx.Node) and node.target == torch.ops.aten.index_put.default
                and node.args[0] is placeholders[i] and len(placeholders[i].users) == 1):
            node.meta[IN_PLACE] = True
