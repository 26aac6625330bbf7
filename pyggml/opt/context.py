"""The training step: :class:`OptContext` (``ggml_opt_context``: a model's graph with the loss,
the backward pass and the optimizer step), and the checks of what ``ggml_opt_init`` would abort
on.
"""
from __future__ import annotations

from typing import Any

import numpy as np


from .._cobject import CObject
from ..core.context import Context
from ..enums import GGMLType
from ..raw import callbacks, ffi, lib
from ..raw.boundary import calling
from ..core.tensor import Tensor
from .dataset import Dataset, _borrowed_tensor, _Lender
from .model import GRAPH_SIZE, Model, ModelGraph, _compute_mem
from .optimizer import (
    SGD,
    AdamW,
    BuildType,
    Loss,
    OptimizerParams,
    Schedule,
    _check_params,
    _fill_params,
    _read_params,
)
from .result import Result

__all__ = ["OptContext"]


def _check_graph(g: ModelGraph, loss_type: Loss, build_type: BuildType, opt_period: int = 1) -> None:
    """Build, in a scratch context, what ``ggml_opt_init`` will build (loss, and for training
    the backward graph) with pyggml's checked ops and
    :meth:`~pyggml.core.graph.Graph.build_backward`, so that anything ggml would abort on raises here;
    and check the node counts against ggml-opt's graph size. Without gradient accumulation
    (``opt_period`` 1) ggml's optimizer steps read each parameter's gradient as built, at the
    parameter's strides: a gradient that is a transposed or permuted view is refused."""
    outputs = g.outputs
    params = [t for t in g.model.params.values() if t.flags & lib.GGML_TENSOR_FLAG_PARAM]
    scratch = Context(_compute_mem(2) + 16 * GRAPH_SIZE * lib.ggml_tensor_overhead(), no_alloc=True)
    try:
        fwd = scratch.new_graph(4 * GRAPH_SIZE, grads=True).build_forward(outputs)
        for t in fwd.nodes:
            if t.flags & lib.GGML_TENSOR_FLAG_LOSS:
                raise ValueError(f"node {t.name!r} is marked as a loss (set_loss): ggml-opt adds the "
                                 "loss itself (extra loss terms are not supported)")
        if fwd.n_nodes + 8 >= GRAPH_SIZE or len(fwd.leafs) + 8 >= GRAPH_SIZE:
            raise ValueError(f"the model graph has {fwd.n_nodes} nodes and {len(fwd.leafs)} leafs: "
                             f"ggml-opt's graphs hold fewer than {GRAPH_SIZE}")
        if not any(s.ptr == g.inputs.ptr for s in fwd.leafs):
            raise ValueError("the outputs do not depend on the inputs tensor")
        if loss_type in (Loss.CROSS_ENTROPY, Loss.MEAN_SQUARED_ERROR):
            labels = scratch.new_tensor(outputs.type, list(outputs.ne), name="labels")
        if loss_type == Loss.CROSS_ENTROPY:
            loss = scratch.cross_entropy_loss(outputs, labels)
            scratch.argmax(outputs)  # ggml-opt's predictions: asserts a matrix
        elif loss_type == Loss.MEAN_SQUARED_ERROR:
            loss = scratch.scale(scratch.sum(scratch.sqr(scratch.sub(outputs, labels))), 1.0)
        else:
            loss = scratch.sum(outputs)
        loss.set_loss()  # F32 scalar, as ggml_set_loss asserts
        g_train = scratch.new_graph(4 * GRAPH_SIZE, grads=True).build_forward(loss)
        if build_type != BuildType.FORWARD:
            if not params:
                raise ValueError("the model has no trainable parameter in this graph (Model.param)")
            g_train.build_backward(scratch)  # raises for ops without a backward pass, in-place ops...
        # the scheduler aborts on a node no backend supports (the optimizer steps are F32 ops
        # every CPU backend has, and the CPU backend comes last)
        for t in g_train.nodes:
            if not t.is_empty_op() and not any(b.supports_op(t) for b in g.model.backends):
                srcs = ", ".join(s.type_name for s in t.src)
                why = "; ".join(f"{b.name}: {b._why_not(t._ptr)}" for b in g.model.backends)
                raise ValueError(f"no backend of the model ({', '.join(b.name for b in g.model.backends)}) "
                                 f"can compute {t.op_name} of {srcs} -> {t.type_name} ({t.name!r}): {why}")
        if build_type == BuildType.FORWARD:
            return
        n_steps = sum(1 for t in g_train.nodes if t.flags & lib.GGML_TENSOR_FLAG_PARAM)
        if g_train.n_nodes + n_steps + 8 >= GRAPH_SIZE or len(g_train.leafs) + 2 * n_steps + 8 >= GRAPH_SIZE:
            raise ValueError(f"the training graph has {g_train.n_nodes + n_steps} nodes and "
                             f"{len(g_train.leafs) + 2 * n_steps} leafs: ggml-opt's graphs hold fewer "
                             f"than {GRAPH_SIZE}")
        for t in g_train.nodes:
            if t.flags & lib.GGML_TENSOR_FLAG_PARAM and t.type != GGMLType.F32:
                raise TypeError(f"parameter {t.name!r} is {t.type_name}: ggml's optimizer steps are F32 only")
        if opt_period == 1:  # else ggml-opt accumulates into a contiguous tensor and steps from that
            for t in params:
                grad = g_train.grad(t)
                if grad is not None and not lib.ggml_is_contiguous(grad.ptr):
                    raise ValueError(
                        f"parameter {t.name!r} reaches the loss only through a transpose or permute, so "
                        "ggml's gradient of it is a transposed or permuted view, and ggml's optimizer step "
                        "(OPT_STEP_ADAMW / OPT_STEP_SGD) reads it at the parameter's strides (a scrambled "
                        "update, no error): store the parameter in the layout the model uses it in, or "
                        "accumulate gradients (opt_period > 1, nbatch_logical > batch_size)")
    finally:
        scratch.close()


class OptContext(CObject):
    """``ggml_opt_context``: a model's graph with the loss, the backward pass and the optimizer
    step, built once for a fixed batch size (``ggml_opt_init`` with static graphs), owned.

    Made by :func:`fit` and :func:`evaluate`; make one yourself to write your own loop with
    :func:`epoch`. Each OptContext has its own :class:`ModelGraph` (inputs, compute context,
    scheduler), so that several can share the model's parameters (ggml-opt keeps a scheduler's
    allocation between batches).

    ``batch_size``: datapoints per physical batch (``inputs ne[1]``); ``ne_datapoint`` and
    ``type``: the inputs, as in the :class:`Dataset` (or pass ``dataset=`` to take them from it).
    ``loss``: a :class:`Loss`. ``optimizer``: :class:`AdamW` or :class:`SGD` parameters, or a
    :data:`Schedule` ``epoch -> params`` evaluated at the start of each epoch (ggml's
    ``ggml_opt_get_optimizer_params`` callback returns them to ``ggml_opt_eval``).
    ``opt_period``: physical batches per optimizer step (gradient accumulation).
    ``build_type``: :class:`BuildType` OPT, or FORWARD for evaluation only (GRAD is refused:
    ``ggml_opt_init`` aborts on it with static graphs, in ggml 0.20.2 and 0.25.3 alike).

    Raises ValueError/TypeError (see :func:`_check_graph`) for anything ``ggml_opt_init`` would
    abort on.
    """

    _kind = "opt context"
    _c_free = lib.ggml_opt_free

    def _free(self, ptr: Any) -> None:
        with calling():  # frees the buffers of the model's backends (Python buffers call back)
            lib.ggml_opt_free(ptr)

    def __init__(self, model: Model, *, batch_size: int, ne_datapoint: int | None = None,
                 type: Any = None, dataset: Dataset | None = None,
                 loss: "Loss | str" = Loss.CROSS_ENTROPY,
                 optimizer: "OptimizerParams | Schedule | None" = None, opt_period: int = 1,
                 build_type: "BuildType | str" = BuildType.OPT):
        if dataset is not None:
            ne_datapoint = dataset.ne_datapoint if ne_datapoint is None else ne_datapoint
            type = dataset.type if type is None else type
            dataset.check_batch_size(batch_size)
        if ne_datapoint is None:
            raise ValueError("OptContext needs ne_datapoint (or dataset=)")
        self.loss_type = Loss.of(loss)
        try:
            self.build_type = BuildType[build_type.upper()] if isinstance(build_type, str) else BuildType(build_type)
        except (KeyError, ValueError):
            raise ValueError(f"unknown build_type {build_type!r}: forward, grad or opt") from None
        if self.build_type == BuildType.GRAD:
            # ggml-opt.cpp (0.20.2 and 0.25.3: same file) ggml_opt_build: with static graphs, the GRAD branch
            # allocates and then falls through to GGML_ASSERT(build_type_alloc == OPT): abort
            raise ValueError("ggml cannot build an OptContext of build_type GRAD (ggml_opt_init "
                             "would abort: ggml-opt.cpp:501); use OPT, or FORWARD to evaluate")
        if not isinstance(opt_period, (int, np.integer)) or opt_period < 1:
            raise ValueError(f"opt_period must be an integer >= 1, got {opt_period!r}")
        self.opt_period = int(opt_period)
        optimizer = AdamW() if optimizer is None else optimizer
        if isinstance(optimizer, (AdamW, SGD)):
            self._schedule: Schedule | None = None
            first = _check_params(optimizer, "optimizer")
        elif callable(optimizer):
            self._schedule = optimizer
            first = _check_params(optimizer(1), "the optimizer schedule's result for epoch 1")
        else:
            raise TypeError("optimizer must be opt.AdamW(...), opt.SGD(...) or a callable epoch -> params")
        self._params_cls = first.__class__
        self.current_epoch = 1  #: the epoch number the optimizer schedule is asked for next
        self._c_params = ffi.new("struct ggml_opt_optimizer_params *")
        _fill_params(self._c_params, first)
        self.graph = ModelGraph(model, batch_size, ne_datapoint, GGMLType.F32 if type is None else type)
        try:
            _check_graph(self.graph, self.loss_type, self.build_type, self.opt_period)
            self._get_params_cb = callbacks.Callback("ggml_opt_get_optimizer_params", self._get_params)
            p = lib.ggml_opt_default_params(self.graph.sched.ptr, self.loss_type)
            p.ctx_compute = self.graph.ctx._live_ptr()
            p.inputs = self.graph.inputs.ptr
            p.outputs = self.graph.outputs.ptr
            p.build_type = self.build_type
            p.opt_period = self.opt_period
            p.get_opt_pars = self._get_params_cb.fn
            p.get_opt_pars_ud = self._get_params_cb.user_data
            p.optimizer = first.optimizer_type
            with calling(self.graph.ctx):  # allocates on the model's backends' buffer types
                ptr = lib.ggml_opt_init(p)
            self.graph.ctx._recount()  # ggml-opt made its graphs and gradient nodes there
        except BaseException:
            self.graph.close()
            raise
        super().__init__(ptr, owned=True)
        self._scope = _Lender("a ggml-opt context", self)
        self.model = model
        self._eval_ready = False

    # ------------------------------------------------------------------ optimizer parameters
    def _get_params(self, userdata: Any) -> Any:
        # called by ggml_opt_eval before each optimizer step. Never raise here: the error value
        # of this callback type is an all-zero struct, and ggml asserts alpha > 0 on it (abort).
        return self._c_params[0]

    def params_for_epoch(self, epoch: int) -> OptimizerParams:
        """Evaluate the schedule for ``epoch`` (checked) and hand the result to ggml for the
        following optimizer steps. Without a schedule: the constant parameters."""
        if self._schedule is None:
            return _read_params(self._c_params, self._params_cls)
        p = _check_params(self._schedule(epoch), f"the optimizer schedule's result for epoch {epoch}")
        if not isinstance(p, self._params_cls):
            raise TypeError(f"the optimizer schedule returned {type(p).__name__} for epoch {epoch}, "
                            f"but {self._params_cls.__name__} for epoch 1 (an OptContext has one optimizer)")
        _fill_params(self._c_params, p)
        return p

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    @property
    def optimizer_name(self) -> str:
        """``"adamw"`` or ``"sgd"`` (``ggml_opt_optimizer_name(ggml_opt_context_optimizer_type)``)."""
        return ffi.string(lib.ggml_opt_optimizer_name(lib.ggml_opt_context_optimizer_type(self.ptr))).decode()

    @property
    def static_graphs(self) -> bool:
        """``ggml_opt_static_graphs`` (always True here)."""
        return bool(lib.ggml_opt_static_graphs(self.ptr))

    @property
    def inputs(self) -> Tensor:
        """``ggml_opt_inputs``: ``ne [ne_datapoint, batch_size]``."""
        return self.graph.inputs

    @property
    def outputs(self) -> Tensor:
        """``ggml_opt_outputs``: ``ne [n_outputs, batch_size]`` (no data outside ggml-opt's
        evaluation: ggml computes a copy of the graph; use :meth:`Model.predict`)."""
        return self.graph.outputs

    def _own(self, p: Any) -> Tensor | None:
        return None if p == ffi.NULL else _borrowed_tensor(p, self._scope)

    @property
    def labels(self) -> Tensor | None:
        """``ggml_opt_labels``: the labels the loss compares with (None for MEAN/SUM)."""
        return self._own(lib.ggml_opt_labels(self.ptr))

    @property
    def loss(self) -> Tensor:
        """``ggml_opt_loss``: the scalar F32 loss of the last batch."""
        return self._own(lib.ggml_opt_loss(self.ptr))  # type: ignore[return-value]

    @property
    def pred(self) -> Tensor | None:
        """``ggml_opt_pred``: I32 ``ne [batch_size]`` argmax of the outputs (CROSS_ENTROPY)."""
        return self._own(lib.ggml_opt_pred(self.ptr))

    @property
    def ncorrect(self) -> Tensor | None:
        """``ggml_opt_ncorrect``: I64 scalar, correct predictions in the last batch."""
        return self._own(lib.ggml_opt_ncorrect(self.ptr))

    def grad_acc(self, node: Tensor) -> Tensor | None:
        """``ggml_opt_grad_acc``: the gradient accumulator of a forward-graph node (a
        parameter) in the optimizer graph, or None. ValueError for a context without an
        optimizer graph."""
        if self.build_type != BuildType.OPT:
            raise ValueError("grad_acc needs an OptContext with build_type OPT")
        return self._own(lib.ggml_opt_grad_acc(self.ptr, node.ptr))

    # ------------------------------------------------------------------ low level
    def reset(self, optimizer: bool) -> None:
        """``ggml_opt_reset``: zero the gradients and, with ``optimizer``, the AdamW moments and
        the step count."""
        with calling(self.graph.ctx, self):  # tensor memsets: Python buffers call back
            lib.ggml_opt_reset(self.ptr, bool(optimizer))

    def alloc(self, backward: bool) -> None:
        """``ggml_opt_alloc``: allocate the graph of the next :meth:`eval` (forward, or forward
        + backward (+ optimizer step every ``opt_period``-th time)). ValueError if called twice
        without :meth:`eval`, or ``backward`` on a FORWARD context."""
        if self._eval_ready:
            raise ValueError("alloc() was already called: eval() comes next")
        if backward and self.build_type == BuildType.FORWARD:
            raise ValueError("this OptContext was built for the forward pass only (build_type FORWARD)")
        with calling(self.graph.ctx, self):  # the scheduler: Python backends' supports_op, buffers
            lib.ggml_opt_alloc(self.ptr, bool(backward))
        self._eval_ready = True

    def eval(self, result: Result | None = None) -> None:
        """``ggml_opt_eval``: compute the allocated graph (the forward pass, the loss, and if
        allocated the backward pass and the optimizer step) and add the batch to ``result``.
        ValueError without :meth:`alloc` first; re-raises an exception of a Python callback
        or backend."""
        if not self._eval_ready:
            raise ValueError("call alloc() before eval()")
        if result is not None:
            result._accept(self)
        self._eval_ready = False
        with calling(self.graph.ctx, self):  # the scheduler's compute, get_opt_pars
            lib.ggml_opt_eval(self.ptr, result.ptr if result is not None else ffi.NULL)

    def get_batch(self, dataset: Dataset, ibatch: int) -> None:
        """``ggml_opt_dataset_get_batch``: copy batch ``ibatch`` of ``dataset`` (in its current
        order) to the inputs and, if the loss has them, the labels."""
        self.check_dataset(dataset)
        if ibatch < 0 or (ibatch + 1) * self.batch_size > dataset.ndata:
            raise ValueError(f"batch {ibatch} of {self.batch_size} is beyond the {dataset.ndata} datapoints")
        self._get_batch(dataset, int(ibatch))

    def _get_batch(self, dataset: Dataset, ibatch: int) -> None:
        with calling(self.graph.ctx, self):  # ggml_backend_tensor_set: Python buffers call back
            lib.ggml_opt_dataset_get_batch(dataset.ptr, self.graph.inputs.ptr, lib.ggml_opt_labels(self.ptr), ibatch)

    def check_dataset(self, dataset: Dataset) -> None:
        """ValueError/TypeError unless ``dataset`` fits this context: ne_datapoint and type of
        the inputs, labels iff the loss needs them (same ne and type as the outputs), a batch
        size that is a multiple of the shard size and divides ``ndata`` (what
        ``ggml_opt_epoch`` and ``ggml_opt_dataset_get_batch`` assert)."""
        if not isinstance(dataset, Dataset):
            raise TypeError(f"expected an opt.Dataset, got {type(dataset).__name__}")
        g = self.graph
        if dataset.ne_datapoint != g.ne_datapoint:
            raise ValueError(f"the dataset's datapoints have {dataset.ne_datapoint} elements, the model's "
                             f"inputs {g.ne_datapoint}")
        if dataset.type != g.type:
            raise TypeError(f"the dataset holds {dataset.type.name} data, the model's inputs are {g.type.name}")
        if self.loss_type.needs_labels:
            if dataset.labels is None:
                raise ValueError(f"loss {self.loss_type.name} needs labels: the dataset has none")
            if dataset.ne_label != g.outputs.ne[0]:
                raise ValueError(f"the dataset's labels have {dataset.ne_label} elements, the model's outputs "
                                 f"{g.outputs.ne[0]} (loss {self.loss_type.name} compares them"
                                 + ("; one-hot encode class indices with opt.one_hot" if dataset.ne_label == 1 else "")
                                 + ")")
            if dataset.label_type != g.outputs.type:
                raise TypeError(f"the dataset's labels are {dataset.label_type.name}, the outputs "  # type: ignore[union-attr]
                                f"{g.outputs.type_name} (loss {self.loss_type.name} compares them)")
        elif dataset.labels is not None:
            raise ValueError(f"loss {self.loss_type.name} takes no labels, but the dataset has labels "
                             "(ggml asserts that they agree): make the Dataset without labels")
        dataset.check_batch_size(self.batch_size)
        if dataset.ndata % self.batch_size:
            raise ValueError(f"batch size {self.batch_size} does not divide the dataset's {dataset.ndata} "
                             "datapoints (ggml-opt has no partial batches): trim the data or pick a divisor")

    def close(self) -> None:
        """``ggml_opt_free``, then the model graph (scheduler, compute context, inputs). Its
        tensors (labels, loss, ...) raise ClosedError afterwards."""
        scope = getattr(self, "_scope", None)
        if scope is not None:
            scope.close()
        super().close()
        g = getattr(self, "graph", None)
        if g is not None:
            g.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<OptContext (closed)>"
        return (f"<OptContext {self.build_type.name} loss={self.loss_type.name} {self.optimizer_name} "
                f"batch_size={self.batch_size} opt_period={self.opt_period}>")
