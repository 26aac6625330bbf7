"""Dispatch once, replay after: a graph's kernels bound once (a ``Plan``), run again while
the graph is unchanged.

The first compute of a graph builds its plan: for each node that computes something (not an
empty op, ``TensorFlag.COMPUTE`` set) the kernel table binds a step on fixed torch views of the
node and its sources (``table.build``); the steps run in graph order. A later compute of
the same graph runs the same steps, with no op lookup, no view made and no parameter decoded:
the Python cost per node is one call into torch.

"The same graph" is decided as ggml-cuda decides whether to replay a captured CUDA graph
(``ggml_cuda_graph_update_required``): plans are kept per first node; a graph whose ``uid`` is
set (the scheduler gives each split a new one whenever it splits a graph) and equals the plan's
is the same; otherwise the bytes of every node's ``struct ggml_tensor`` (op, type, ne, nb,
op_params, flags, data, src and view pointers) and of every source that is not a node (its data
pointer, ne, nb) must equal those recorded when the plan was built.

A plan computes through its ``GraphReplay`` (:mod:`pyggml.impl.torch.capture`): with a
``Capturer`` (the backend's on a CUDA device), a plan with steps, none of them eager, is captured
into a CUDA graph after its warm-up and replayed as one.

The first compute runs each step that is not eager under :class:`~pyggml.impl.torch.host_work.HostWork`:
a step that copies host data to the device, reads device data on the host or makes a
data-dependent shape would stall or break a CUDA graph, which the kernel table must not let
happen (a defect of pyggml's). Such a plan is refused a capture (it runs eagerly, correct but
slower), ``host_work`` names the calls, and a warning (logger ``pyggml.torch``) is written once
per op and call.
"""
from __future__ import annotations

from typing import Any

from ...enums import TensorFlag
from ...core.tensor import EMPTY_OPS
from ...raw import ffi, lib
from .capture import Capturer, GraphReplay, logger
from .host_work import HostWork
from .memory import weights_buffer
from .table import Step, build, eager, is_eager

__all__ = ["Plan"]

_COMPUTE = int(TensorFlag.COMPUTE)
_SIZE = ffi.sizeof("struct ggml_tensor")
#: (op, call) pairs already reported by a warning
_reported: set[tuple[str, str]] = set()


def _signature(tensors: list[Any]) -> bytes:
    return b"".join([ffi.buffer(p, _SIZE) for p in tensors])


def _dropping(step: Step, cache: dict[Any, Any]) -> Step:
    def run() -> None:
        step()
        cache.clear()
    return run


class Plan:
    """The steps of one graph (``nodes``: its raw nodes in order) on ``views``
    (``memory.Views``), with what identifies the graph: ``uid`` and the bytes of the
    nodes and of their sources that are not nodes. ``capturable``: it has steps and none is
    eager (nor, after the first compute, does host work); ``graph``: its ``capture.GraphReplay``
    (with ``capture`` if capturable); ``host_work``: (op, call) of the host work its replayed
    steps did at the first compute (None before it)."""

    def __init__(self, nodes: list[Any], uid: int, views: Any, capture: Capturer | None = None):
        steps: list[Step] = []
        ops: list[str] = []
        node_set = set(nodes)
        leafs: dict[Any, None] = {}
        caches: dict[int, Any] = {}     # the weights caches a step may read
        for p in nodes:
            for s in p.src:  # (a source may be NULL before a later one: FLASH_ATTN_EXT's mask, sinks)
                if s == ffi.NULL:
                    continue
                if s not in node_set:
                    leafs[s] = None
                ws = weights_buffer(s)
                if ws is not None:
                    caches[id(ws.weights_cache)] = ws.weights_cache
            if p.op in EMPTY_OPS or not p.flags & _COMPUTE:
                continue
            step = build(p, views)
            if step is not None:
                wb = weights_buffer(p)
                if wb is not None:       # a write into weights: their float32 copies are stale
                    step = eager(_dropping(step, wb.weights_cache))
                steps.append(step)
                ops.append(ffi.string(lib.ggml_op_desc(p)).decode())
        self.steps = steps
        self.ops = ops
        self.host_work: list[tuple[str, str]] | None = None
        self.capturable = bool(steps) and not any(is_eager(s) for s in steps)
        self.graph = GraphReplay(capture if self.capturable else None, list(caches.values()))
        self.uid = uid
        self.n_nodes = len(nodes)
        self.leafs = list(leafs)
        self.node_bytes = _signature(nodes)
        self.leaf_bytes = _signature(self.leafs)
        self.views = views          # keeps the memory the steps see alive

    def matches(self, uid: int, nodes: list[Any]) -> bool:
        """Whether ``nodes`` (with graph ``uid``) are the graph this plan was built for."""
        if len(nodes) != self.n_nodes:
            return False
        if uid != 0 and uid == self.uid:
            return True
        # the nodes first: equal nodes have the same sources, so the recorded leafs are alive
        if _signature(nodes) != self.node_bytes or _signature(self.leafs) != self.leaf_bytes:
            return False
        self.uid = uid
        return True

    def run(self) -> None:
        """Run the steps in order (an exception from torch propagates); the first time, look
        for host work in the steps that are not eager (see the module)."""
        if self.host_work is None:
            self._first_run()
            return
        for step in self.steps:
            step()

    def _first_run(self) -> None:
        found: dict[tuple[str, str], None] = {}
        with HostWork() as hw:          # one mode for the run; each replayed step's calls kept
            for step, op in zip(self.steps, self.ops):
                hw.found.clear()
                step()
                if hw.found and not is_eager(step):
                    found.update(((op, call), None) for call in hw.found)
        self.host_work = list(found)
        if found:
            self.capturable = False
            self.graph.capture = None
            for key in self.host_work:
                if key not in _reported:
                    _reported.add(key)
                    logger.warning("the torch backend's %s step calls %s, which waits for the GPU and "
                                   "cannot be captured into a CUDA graph: its plans run without one "
                                   "(a defect of pyggml's kernel table)", *key)

    def compute(self) -> str:
        """Compute the graph once: replay its CUDA graph, or run the steps (and capture them
        when due). Returns what it did (``capture.EAGER``, ``CAPTURED``, ``GRAPH``, ``FAILED``)."""
        return self.graph.run(self.run)
