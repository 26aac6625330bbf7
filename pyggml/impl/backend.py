"""Backends written in Python (``struct ggml_backend``)."""
from __future__ import annotations

import abc
import uuid
from typing import Any

from ..core.graph import Graph
from ..raw import ffi, lib
from ..core.tensor import Tensor, tensor_arg
from ._vtable import LIVE, Impl, addr, lent, make_struct, safe, slot_arity


__all__ = ["PyBackend", "GraphOptimizeParams"]

#: ggml 0.25.3 gave ``graph_optimize`` a third parameter (allocation dependencies)
_OPTIMIZE_HAS_PARAMS = slot_arity("ggml_backend_i", "graph_optimize") >= 3


class GraphOptimizeParams:
    """What ggml's scheduler passes to ``graph_optimize`` (``struct
    ggml_backend_graph_optimize_params``, ggml >= 0.25): :meth:`add_alloc_dep` keeps a tensor
    allocated until a later node, for backends that run parts of a graph out of order."""

    def __init__(self, ptr: Any, cgraph: Any = None):
        self._ptr = ptr
        self._cgraph = cgraph  # the graph being optimized (its nodes are the valid `until`s)

    def add_alloc_dep(self, tensor: Tensor, until: Tensor) -> None:
        """Keep ``tensor`` allocated at least until node ``until`` (of the same graph) is computed.

        Raises ValueError when this call takes no dependencies or ``until`` is not a node of the
        graph being optimized (ggml's scheduler would abort: the dependency is never placed)."""
        p = self._ptr
        if p == ffi.NULL or p.add_alloc_dep == ffi.NULL:
            raise ValueError("this graph_optimize call takes no allocation dependencies")
        pt, pu = tensor_arg(tensor, "tensor")._ptr, tensor_arg(until, "until")._ptr
        g = self._cgraph
        if g is not None and not any(lib.ggml_graph_node(g, i) == pu for i in range(int(lib.ggml_graph_n_nodes(g)))):
            raise ValueError(f"add_alloc_dep: `until` ({until._label()}) is not a node of the graph "
                             "being optimized")
        p.add_alloc_dep(p.user_data, pt, pu)


class PyBackend(Impl):
    """A backend (``struct ggml_backend``), made by :meth:`PyDevice.init_backend`.

    Required: :meth:`graph_compute`. Defaults: ``get_name`` (the device's name), ``free``.
    Optional: ``synchronize()``, ``graph_optimize(graph, params)`` (``params``: a
    :class:`GraphOptimizeParams`, None before ggml 0.25), ``set_tensor_async(tensor, data,
    offset)``, ``get_tensor_async(tensor, out, offset)`` (the memory stays valid until
    ``synchronize``), ``cpy_tensor_async(backend_src, src, dst) -> bool``, and with device events
    ``event_record(event)`` / ``event_wait(event)`` (``event``: what ``PyDevice.event_new``
    returned). Tensors and graphs passed to the methods are valid during the call only.
    """

    _iface = "ggml_backend_i"
    _struct = "ggml_backend"

    def __init__(self, device: Any):
        self.device = device
        c = make_struct(self)
        guid = uuid.uuid5(uuid.NAMESPACE_URL, f"pyggml:{type(self).__qualname__}").bytes
        self._guid = ffi.new("ggml_guid *", list(guid))
        c.guid = self._guid
        c.device = device._c

    @abc.abstractmethod
    def graph_compute(self, graph: Graph) -> None:
        """Compute every node of ``graph`` (a view of the nodes assigned to this backend; skip
        ``is_empty_op()`` nodes and those without ``TensorFlag.COMPUTE``). Raise to fail."""

    def get_name(self) -> str:
        """The backend's name (default: the device's)."""
        return str(self.device.get_name())

    def free(self) -> None:
        """Called when ggml frees the backend (``ggml_backend_free``); release resources here."""

    def _implements(self, member: str) -> bool:
        return member in ("get_name", "free") or callable(getattr(self, member, None))

    def _c_get_name(self, b: Any) -> Any:
        try:
            return self._cstr(self.get_name())
        except Exception as e:  # noqa: BLE001 - ggml prints the name (copies are named after it)
            return safe(self, e, self._cstr("(error)"))

    def _c_free(self, b: Any) -> None:
        try:
            self.free()
        finally:
            LIVE.pop(addr(b), None)

    def _c_graph_compute(self, b: Any, cgraph: Any) -> int:
        with lent("graph_compute") as scope:
            self.graph_compute(Graph(cgraph, scope, int(lib.ggml_graph_n_nodes(cgraph))))
        return int(lib.GGML_STATUS_SUCCESS)

    def _c_graph_optimize(self, b: Any, cgraph: Any, *params: Any) -> None:
        with lent("graph_optimize") as scope:
            graph = Graph(cgraph, scope, int(lib.ggml_graph_n_nodes(cgraph)))
            if _OPTIMIZE_HAS_PARAMS:
                self.graph_optimize(graph, GraphOptimizeParams(params[0], cgraph))  # type: ignore[attr-defined]
            else:
                self.graph_optimize(graph, None)  # type: ignore[attr-defined]

    def _c_synchronize(self, b: Any) -> None:
        self.synchronize()  # type: ignore[attr-defined]

    def _c_set_tensor_async(self, b: Any, t: Any, data: Any, offset: int, size: int) -> None:
        with lent("set_tensor_async") as scope:
            self.set_tensor_async(Tensor(t, scope), memoryview(ffi.buffer(data, size)), offset)  # type: ignore[attr-defined]

    def _c_get_tensor_async(self, b: Any, t: Any, data: Any, offset: int, size: int) -> None:
        with lent("get_tensor_async") as scope:
            self.get_tensor_async(Tensor(t, scope), memoryview(ffi.buffer(data, size)), offset)  # type: ignore[attr-defined]

    def _c_cpy_tensor_async(self, src_b: Any, dst_b: Any, src: Any, dst: Any) -> bool:
        with lent("cpy_tensor_async") as scope:
            return bool(self.cpy_tensor_async(src_b, Tensor(src, scope), Tensor(dst, scope)))  # type: ignore[attr-defined]

    def _c_event_record(self, b: Any, event: Any) -> None:
        self.event_record(ffi.from_handle(event.context))  # type: ignore[attr-defined]

    def _c_event_wait(self, b: Any, event: Any) -> None:
        self.event_wait(ffi.from_handle(event.context))  # type: ignore[attr-defined]
