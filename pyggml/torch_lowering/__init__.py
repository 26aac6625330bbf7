"""PyTorch models on ggml: ``torch.compile(model, backend="pyggml")``.

Modules, one concept each:

* :mod:`.layout`    -- torch shapes, dims and dtypes as ggml ``ne``, axes and types
* :mod:`.table`     -- the lowering table (ATen overload -> :class:`~.table.Lowering`)
* ``ops_*``         -- the lowerings, by family: :mod:`.ops_elementwise`, :mod:`.ops_shape`,
  :mod:`.ops_matrix`, :mod:`.ops_normalisation`, :mod:`.ops_indexing`, :mod:`.ops_conv`,
  :mod:`.ops_creation`
* :mod:`.graph`     -- an FX graph of lowerable nodes as ggml graphs (:class:`~.graph.LoweredGraph`)
* :mod:`.partition` -- which nodes go to ggml, which stay in torch, and why
* :mod:`.backend`   -- the ``torch.compile`` backend and :func:`~.backend.explain`

Needs torch (``pip install ".[torch]"``).
"""
from __future__ import annotations

from . import (ops_conv, ops_creation, ops_elementwise, ops_indexing, ops_matrix,  # noqa: F401  (fill TABLE)
               ops_normalisation, ops_shape)
from .backend import Options, compile_fx, explain, lower_module
from .graph import LoweredGraph
from .partition import Explanation
from .table import TABLE, Lowering, LoweringError, why_not

__all__ = ["compile_fx", "explain", "lower_module", "Options", "LoweredGraph", "Explanation", "TABLE",
           "Lowering", "LoweringError", "why_not"]
