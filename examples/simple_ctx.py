#!/usr/bin/env python3
"""Port of upstream ggml's examples/simple/simple-ctx.cpp to pyggml's Pythonic API.

A 4x2 matrix A times the transpose of a 3x2 matrix B, with tensor data in the context's own
memory and the graph computed on the CPU; prints what the C program prints.
"""
import numpy as np

import pyggml
from pyggml import GGMLType
from pyggml.backends.cpu import graph_compute

# NumPy order (rows, cols): ggml ne = [cols, rows]
matrix_A = np.array([[2, 8], [5, 1], [4, 2], [8, 6]], dtype=np.float32)
matrix_B = np.array([[10, 5], [9, 9], [5, 4]], dtype=np.float32)


def format_result(out: np.ndarray) -> str:
    """The C example's printout of a result with NumPy shape (ne1, ne0)."""
    rows = "\n".join("".join(f" {v:.2f}" for v in row) for row in out)
    return f"mul mat ({out.shape[1]} x {out.shape[0]}) (transposed result):\n[{rows} ]"


def main() -> np.ndarray:
    with pyggml.Context(16 * 1024 * 1024) as ctx:           # data lives in the context
        a = ctx.from_numpy(matrix_A)                          # ne [2, 4]
        b = ctx.from_numpy(matrix_B)                          # ne [2, 3]
        result = ctx.mul_mat(a, b)                            # ne [4, 3]: B @ A.T in NumPy order
        assert result.type == GGMLType.F32
        graph = ctx.new_graph().build_forward(result)
        graph_compute(graph, n_threads=1)
        out = result.numpy()
    print(format_result(out))
    return out


if __name__ == "__main__":
    main()
