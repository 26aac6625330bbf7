"""Which nodes of an FX graph go to ggml: torch's ``CapabilityBasedPartitioner`` over
:func:`~pyggml.torch_lowering.table.why_not`. Nodes ggml cannot take stay in torch; each partition becomes one
submodule of the graph (``fused_<i>``), which :mod:`~pyggml.torch_lowering.backend` replaces by a
:class:`~pyggml.torch_lowering.graph.LoweredGraph`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .table import why_not

__all__ = ["Support", "partition", "Explanation", "explain_graph"]

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
    (worth one ggml graph: a group of views only, or of constants only, reading no tensor,
    stays in torch)."""
    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    parts = [p for p in partitioner.propose_partitions()
             if any(str(n.target) not in _TRIVIAL for n in p.nodes) and _reads_a_tensor(p.nodes)]
    return partitioner.fuse_partitions(parts)


def _reads_a_tensor(nodes: Collection[fx.Node]) -> bool:
    return any(a not in nodes for n in nodes for a in n.all_input_nodes)


@dataclass
class Explanation:
    """Where each node of a graph goes: ``ggml`` (the ATen overloads lowered, with counts),
    ``torch`` (overload -> why not, the first reason found) and ``torch_nodes`` (overload ->
    the number of its nodes left in torch: an overload may have nodes on both sides)."""
    ggml: dict[str, int] = field(default_factory=dict)
    torch: dict[str, str] = field(default_factory=dict)
    torch_nodes: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"ggml: {sum(self.ggml.values())} nodes"]
        lines += [f"  {k} x{v}" for k, v in sorted(self.ggml.items())]
        lines.append(f"torch: {sum(self.torch_nodes.values())} nodes")
        lines += [f"  {k} x{self.torch_nodes.get(k, 0)}: {v}" for k, v in sorted(self.torch.items())]
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
            e.torch_nodes[name] = e.torch_nodes.get(name, 0) + 1
    return e
