"""The model being trained: :class:`Model` (parameters, backends, ``forward``), and
:class:`ModelGraph`, its graph for one batch size; :data:`GRAPH_SIZE`, the size of ggml-opt's
graphs.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

from .. import types
from ..backends.backend import Backend
from ..core.context import Context
from ..backends.cpu import CPUBackend
from ..enums import GGMLType
from ..core.gguf import GGUFFile, GGUFWriter
from ..core.graph import Graph
from ..raw import lib
from ..backends.sched import Scheduler
from ..runtime import default_threads, open_backend
from ..core.tensor import Tensor
from .dataset import _as_rows, _resolve_type

__all__ = ["GRAPH_SIZE", "Model", "ModelGraph"]

#: nodes (and leafs) of the graphs ``ggml_opt_init`` makes (GGML_DEFAULT_GRAPH_SIZE): a model
#: whose forward + backward + optimizer graph has more cannot be trained with ggml-opt
GRAPH_SIZE = lib.GGML_DEFAULT_GRAPH_SIZE


def _resolve_backends(backend: Any, n_threads: int | None) -> tuple[list[Backend], list[Backend]]:
    """([primary, ..., CPU], the backends made here): a device name (``"CPU"``, ``"CUDA0"``,
    ``"Vulkan0"``, ``"NUMPY"``...: :func:`pyggml.runtime.open_backend`) or a Backend, then a CPU
    backend as the fallback ggml's scheduler requires last; or a list of backends as given."""
    nt = default_threads() if n_threads is None else n_threads
    if backend is None:
        cpu = CPUBackend(n_threads=nt)
        return [cpu], [cpu]
    if isinstance(backend, (list, tuple)):
        out = list(backend)
        if not out or not all(isinstance(b, Backend) for b in out):
            raise TypeError("backend list must hold pyggml Backend objects")
        return out, []
    made = []
    if isinstance(backend, str):
        backend = open_backend(backend, nt)
        made.append(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a device name, a Backend or a list of them, not {type(backend).__name__}")
    if isinstance(backend, CPUBackend):
        if n_threads is not None or made:
            backend.n_threads = nt
        return [backend], made
    if made:  # e.g. BLAS: as many threads as the CPU backend (a GPU backend has no such setting)
        backend.set_n_threads(nt)
    cpu = CPUBackend(n_threads=nt)
    return [backend, cpu], made + [cpu]


class Model:
    """Trainable parameters, the backends they live on, and the graph that computes outputs
    from inputs.

    Define a model PyTorch-style: subclass and create parameters with :meth:`param` in
    ``__init__``, and implement :meth:`forward` with ggml ops (or pass ``forward=``). The
    parameters live in one ``no_alloc`` context (``ggml_set_param``) and are allocated together
    on the first backend (the first use of the model, or :meth:`allocate`); ggml-opt trains
    them in place. Each graph the model is used in (:class:`ModelGraph`: one per batch size and
    per :class:`OptContext`) calls :meth:`forward` again, on its own inputs tensor.

    ``backend``: None (the CPU), a device name (``"CPU"``, ``"CUDA0"``, ``"Vulkan0"``,
    ``"NUMPY"`` and ``"TORCH0"`` for pyggml's Python backends, registered on first use...), a
    :class:`Backend`, or a list of backends for the
    scheduler (the last one a CPU backend). A single non-CPU backend gets a CPU backend added
    after it, for the ops it does not support. ``n_threads``: CPU threads (default: the cores
    this process may use, :func:`pyggml.runtime.default_threads`). ``max_params``: capacity of the
    parameter context, in tensors.

    Raises :class:`~pyggml.errors.BackendNotAvailableError` for an unknown device name.
    """

    def __init__(self, backend: Any = None, *, n_threads: int | None = None,
                 forward: Callable[[Context, Tensor], Tensor] | None = None, max_params: int = 4096,
                 arch: str | None = None):
        self.backends, self._made = _resolve_backends(backend, n_threads)
        self.params_ctx = Context.for_tensors(max_params)
        self.params: dict[str, Tensor] = {}
        self._init: dict[str, np.ndarray] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._buffer: Any = None
        self._forward = forward
        self._predict: ModelGraph | None = None
        self.arch = arch

    # ------------------------------------------------------------------ parameters
    def param(self, name: str, init: Any, *, trainable: bool = True) -> Tensor:
        """A new F32 parameter named ``name`` with initial values ``init`` (NumPy order: shape
        ``(rows, cols)`` is ggml ``ne [cols, rows]``; PyTorch's ``nn.Linear(784, 500).weight``
        layout (500, 784) gives the ``ne [784, 500]`` that ``ggml_mul_mat(w, x)`` takes).
        ``trainable=False`` makes a constant (no ``ggml_set_param``).

        Raises ValueError for a duplicate or too long name, more than 4 dims, or a model
        already allocated; TypeError for non-numeric ``init``.
        """
        if self._buffer is not None:
            raise ValueError("the model's parameters are already allocated: create every param() first")
        if not isinstance(name, str) or not name:
            raise ValueError("a parameter needs a non-empty name")
        if name in self.params:
            raise ValueError(f"duplicate parameter name {name!r}")
        a = np.asarray(init)
        if a.dtype.kind not in "fiub":
            raise TypeError(f"parameter {name!r}: initial values of dtype {a.dtype}")
        if not 0 <= a.ndim <= lib.GGML_MAX_DIMS:
            raise ValueError(f"parameter {name!r}: {a.ndim} dims, ggml has at most {lib.GGML_MAX_DIMS}")
        t = self.params_ctx.new_tensor(GGMLType.F32, a.shape[::-1] or (1,), name=name)
        if trainable:
            t.set_param()
        self.params[name] = t
        self._init[name] = np.array(a, dtype=np.float32)
        self._shapes[name] = a.shape
        return t

    @property
    def allocated(self) -> bool:
        return self._buffer is not None

    def allocate(self) -> None:
        """Allocate every parameter in one buffer of the first backend
        (``ggml_backend_alloc_ctx_tensors``) and copy the initial values in. Done on first use;
        idempotent. ValueError if the model has no parameters."""
        if self._buffer is not None:
            return
        if not self.params:
            raise ValueError("the model has no parameters: create them with param()")
        self._buffer = self.params_ctx.alloc_tensors(self.backends[0])
        self._buffer.usage = "weights"
        for name, t in self.params.items():
            t.set(self._init.pop(name))

    # ------------------------------------------------------------------ graph
    def forward(self, ctx: Context, inputs: Tensor) -> Tensor:
        """The outputs for ``inputs`` (``ne [ne_datapoint, batch]``), built with ops of ``ctx``
        (a ``no_alloc`` compute context): ``ne [n_outputs, batch]``, F32. Override it, or pass
        ``forward=`` to the constructor; with neither, NotImplementedError (as
        ``torch.nn.Module.forward``: the model has no computation to build)."""
        if self._forward is None:
            raise NotImplementedError("define Model.forward(ctx, inputs) or pass forward=")
        return self._forward(ctx, inputs)

    def graph(self, batch_size: int, ne_datapoint: int, type: Any = GGMLType.F32) -> "ModelGraph":
        """A new :class:`ModelGraph` of this model for batches of ``batch_size`` datapoints of
        ``ne_datapoint`` elements of ggml ``type``."""
        return ModelGraph(self, batch_size, ne_datapoint, type)

    # ------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter's values, float32 copies in the NumPy shape it was created with."""
        self.allocate()
        return {name: t.numpy().reshape(self._shapes[name]) for name, t in self.params.items()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Set parameters from ``{name: array}`` (NumPy order). ``strict``: every parameter
        must be given and no other name. KeyError/ValueError on a mismatch."""
        self.allocate()
        missing = [n for n in self.params if n not in state]
        extra = [n for n in state if n not in self.params]
        if strict and (missing or extra):
            raise KeyError(f"state does not match the model: missing {missing}, unexpected {extra}")
        for name, value in state.items():
            if name not in self.params:
                continue
            t, a = self.params[name], np.asarray(value)
            if tuple(a.shape) not in (t.shape, self._shapes[name]):
                raise ValueError(f"parameter {name!r} has shape {t.shape} (ne {list(t.ne)}), given {a.shape}")
            t.set(a)

    def save(self, path: "str | os.PathLike[str]", metadata: Mapping[str, Any] | None = None,
             arch: str | None = None) -> None:
        """Write the parameters to a GGUF file (``pyggml.core.gguf.GGUFWriter``): one F32 tensor per
        parameter, same name and ``ne``; ``general.architecture`` = ``arch`` (default
        the ``arch`` given to the constructor) if set, plus ``metadata``. ggml's ``examples/mnist/mnist-eval`` reads the
        file of a model with its architecture and tensor names."""
        self.allocate()
        with GGUFWriter() as w:
            arch = arch or self.arch
            if arch:
                w.add_value("general.architecture", arch)
            for k, v in (metadata or {}).items():
                w.add_value(k, v)
            for name, t in self.params.items():
                w.add_tensor(name, t.numpy(), ne=list(t.ne[:t.n_dims]))
            w.write(path)

    def load(self, path: "str | os.PathLike[str]", strict: bool = True) -> dict[str, Any]:
        """Read the parameters from a GGUF file written by :meth:`save` (or ggml's MNIST
        example): tensors matched by name; each must have the parameter's ``ne`` (trailing 1s
        aside); any type ggml can dequantize. ``strict``: the file must hold every parameter
        and nothing else. Returns the file's metadata as a dict. Raises KeyError/ValueError on
        a mismatch, as :class:`~pyggml.core.gguf.GGUFFile` for unreadable files."""
        self.allocate()
        with GGUFFile(path) as f:
            names = {t.name for t in f.tensors}
            missing = [n for n in self.params if n not in names]
            extra = sorted(names - set(self.params))
            if missing or (strict and extra):
                raise KeyError(f"{os.fspath(path)!r} does not match the model: missing {missing}"
                               + (f", unexpected {extra}" if strict and extra else ""))
            for name, t in self.params.items():
                info = f.tensor_info(name)
                ne_file = tuple(info.ne) + (1,) * (4 - len(info.ne))
                if ne_file != t.ne:
                    raise ValueError(f"tensor {name!r} has ne {list(ne_file)} in the file, the model's is {list(t.ne)}")
                t.set(f.array(name))
            return dict(f.metadata)

    # ------------------------------------------------------------------ inference
    def predict(self, x: Any, batch_size: int | None = None, type: Any = None) -> np.ndarray:
        """The outputs for NumPy inputs ``x`` ``(n, *datapoint_shape)``: float32
        ``(n, n_outputs)``, computed batch by batch (``batch_size``, default ``min(n, 1000)``;
        the last batch is padded with zeros) on the model's backends through a
        :class:`~pyggml.backends.sched.Scheduler`. ``type``: the inputs' ggml type (default as
        :class:`Dataset`)."""
        a = np.asarray(x)
        n = a.shape[0] if a.ndim else 0
        if n == 0:
            raise ValueError("predict needs at least one datapoint (shape (n, ...))")
        a, ne = _as_rows(a, n, "x")
        t = _resolve_type(a, type, ne, "x")
        bs = min(n, 1000) if batch_size is None else int(batch_size)
        if bs < 1:
            raise ValueError("batch_size must be >= 1")
        g = self._predict
        if g is None or (g.batch_size, g.ne_datapoint, g.type) != (bs, ne, t):
            if g is not None:
                g.close()
            g = self._predict = ModelGraph(self, bs, ne, t)
            g.graph = g.ctx.new_graph(2 * GRAPH_SIZE).build_forward(g.outputs)
            g.sched.alloc_graph(g.graph)
        assert g.graph is not None
        out = np.empty((n, g.outputs.ne[0]), dtype=np.float32)
        batch = np.zeros((bs, ne), dtype=a.dtype)
        for start in range(0, n, bs):
            m = min(bs, n - start)
            batch[:m] = a[start:start + m]
            batch[m:] = 0
            g.inputs.set(batch)
            g.sched.compute(g.graph)
            out[start:start + m] = g.outputs.numpy().reshape(bs, -1)[:m]
        return out

    def close(self) -> None:
        """Free the parameters, the inference graph and the backends this model made."""
        if self._predict is not None:
            self._predict.close()
            self._predict = None
        self.params_ctx.close()
        for b in self._made:
            b.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        n = sum(t.nelements for t in self.params.values()) if not self.params_ctx.closed else 0
        return (f"<{type(self).__name__} {len(self.params)} params ({n} values) on "
                f"{[b.name for b in self.backends]}>")


def _compute_mem(n_graphs: int) -> int:
    """Bytes of a ``no_alloc`` compute context for a model graph and ``n_graphs`` graphs of
    ggml-opt's size with gradients, holding up to 6 tensors per graph node."""
    return (6 * GRAPH_SIZE * lib.ggml_tensor_overhead()
            + n_graphs * lib.ggml_graph_overhead_custom(2 * GRAPH_SIZE, True) + (1 << 16))


class ModelGraph:
    """A model's graph for one batch size: a statically allocated inputs tensor
    ``ne [ne_datapoint, batch_size]`` (on the model's first backend, as ggml-opt requires), a
    ``no_alloc`` compute context, the outputs :meth:`Model.forward` built in it, and a
    :class:`~pyggml.backends.sched.Scheduler` over the model's backends.

    Raises ValueError/TypeError if the outputs are not ``ne [n, batch_size]`` F32 or the graph
    does not depend on the inputs.
    """

    def __init__(self, model: Model, batch_size: int, ne_datapoint: int, type: Any = GGMLType.F32,
                 n_graphs: int = 4):
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        self.model = model
        self.batch_size = int(batch_size)
        self.ne_datapoint = int(ne_datapoint)
        self.type = types.ggml_type(type)
        self.graph: Graph | None = None
        model.allocate()
        self.inputs_ctx = Context.for_tensors(1)
        try:
            self.inputs = self.inputs_ctx.new_tensor(self.type, [self.ne_datapoint, self.batch_size], name="inputs")
            self.inputs.set_input()
            self.inputs_ctx.alloc_tensors(model.backends[0])
            self.ctx = Context(_compute_mem(n_graphs), no_alloc=True)
            out = model.forward(self.ctx, self.inputs)
            if not isinstance(out, Tensor):
                raise TypeError(f"Model.forward must return a pyggml Tensor, not {out.__class__.__name__}")
            if out.type != GGMLType.F32:
                raise TypeError(f"the outputs must be F32 (ggml-opt's losses are F32), got {out.type_name}")
            if out.ne[1] != self.batch_size or out.ne[2] != 1 or out.ne[3] != 1:
                raise ValueError(f"the outputs must be ne [n_outputs, batch_size={self.batch_size}] "
                                 f"(ggml-opt reads ne[1] as the datapoints), got ne {list(out.ne)}")
            if out.ptr == self.inputs.ptr:
                raise ValueError("the outputs are the inputs: the model computes nothing")
            if not out.name:
                out.name = "outputs"
            out.set_output()
            self.outputs = out
            self.sched = Scheduler(model.backends, graph_size=2 * GRAPH_SIZE)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the scheduler, the compute context and the inputs."""
        for name in ("sched", "ctx", "inputs_ctx"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
