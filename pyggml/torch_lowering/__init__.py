"""PyTorch models on ggml: ``torch.compile(model, backend="pyggml")``, and ``torch.export``
programs through :func:`~pyggml.torch_lowering.backend.compile_exported`.

Modules, one concept each:

* :mod:`~pyggml.torch_lowering.layout`    -- torch shapes, dims and dtypes as ggml ``ne``, axes and types
* :mod:`~pyggml.torch_lowering.table`     -- the lowering table (ATen overload -> :class:`~pyggml.torch_lowering.table.Lowering`)
* ``ops_*``         -- the lowerings, by family: :mod:`~pyggml.torch_lowering.ops_elementwise`, :mod:`~pyggml.torch_lowering.ops_shape`,
  :mod:`~pyggml.torch_lowering.ops_matrix`, :mod:`~pyggml.torch_lowering.ops_normalisation`, :mod:`~pyggml.torch_lowering.ops_indexing`, :mod:`~pyggml.torch_lowering.ops_conv`,
  :mod:`~pyggml.torch_lowering.ops_creation`, :mod:`~pyggml.torch_lowering.ops_rope`, :mod:`~pyggml.torch_lowering.ops_logical`
* :mod:`~pyggml.torch_lowering.custom_ops` -- pyggml's own torch ops, which rewrites put in place of ATen patterns
* :mod:`~pyggml.torch_lowering.graph`     -- an FX graph of lowerable nodes as ggml graphs (:class:`~pyggml.torch_lowering.graph.LoweredGraph`)
* :mod:`~pyggml.torch_lowering.rewrites` -- rewrites that let more of a graph reach ggml
* :mod:`~pyggml.torch_lowering.partition` -- which nodes go to ggml, which stay in torch, and why
* :mod:`~pyggml.torch_lowering.backend`   -- the ``torch.compile`` backend, ``torch.export`` programs and :func:`~pyggml.torch_lowering.backend.explain`

Needs torch (``pip install ".[torch]"``).
"""
from __future__ import annotations

from . import (ops_conv, ops_creation, ops_elementwise, ops_indexing, ops_logical,  # noqa: F401  (fill TABLE)
               ops_matrix, ops_normalisation, ops_rope, ops_shape)
from .backend import Options, compile_exported, compile_fx, explain, lower_module
from .graph import LoweredGraph
from .partition import Explanation
from .table import TABLE, Lowering, LoweringError, why_not

__all__ = ["compile_fx", "compile_exported", "explain", "lower_module", "Options", "LoweredGraph", "Explanation", "TABLE",
           "Lowering", "LoweringError", "why_not"]
