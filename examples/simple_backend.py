#!/usr/bin/env python3
"""Port of upstream ggml's examples/simple/simple-backend.cpp to pyggml's Pythonic API.

The best available backend (a GPU if one is loaded, else the CPU) and a CPU backend run under a
scheduler, which allocates the graph and computes A x B^T; prints what the C program prints.
"""
import numpy as np

import pyggml
from pyggml import GGMLType
from pyggml.backends.device import device_by_type, init_best
from pyggml.backends.registry import load_all

from simple_ctx import format_result, matrix_A, matrix_B


def main() -> np.ndarray:
    load_all()                                               # backend modules in pyggml/lib, if any
    backend = init_best()                                    # ggml_backend_init_best
    cpu = device_by_type("cpu").init()                       # ggml_backend_init_by_type(CPU)
    sched = pyggml.Scheduler([backend, cpu])
    with pyggml.Context.for_tensors(pyggml.lib.GGML_DEFAULT_GRAPH_SIZE, graph_size=pyggml.lib.GGML_DEFAULT_GRAPH_SIZE) as ctx:
        a = ctx.new_tensor(GGMLType.F32, [2, 4])
        b = ctx.new_tensor(GGMLType.F32, [2, 3])
        result = ctx.mul_mat(a, b)
        graph = ctx.new_graph().build_forward(result)
        sched.reset()
        sched.alloc_graph(graph)
        a.set(matrix_A)
        b.set(matrix_B)
        sched.compute(graph)
        out = graph.nodes[-1].numpy()
    print(format_result(out))
    for obj in (sched, cpu, backend):
        obj.close()
    return out


if __name__ == "__main__":
    main()
