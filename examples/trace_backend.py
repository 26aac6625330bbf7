#!/usr/bin/env python3
"""A complete ggml backend in Python, in a few lines: it records every op ggml offers it,
computes the ones NumPy can (pyggml.impl.numpy) and leaves the rest to the CPU backend.

    python examples/trace_backend.py
"""
from collections import Counter

import numpy as np

import pyggml
from pyggml.impl import numpy as numpy_ops
from pyggml.memory.buffer_type import BufferType
from pyggml.backends.cpu import cpu_buffer_type
from pyggml.backends.device import device_by_name
from pyggml.impl import PyBackend, PyDevice, PyRegistry, register


class TraceBackend(PyBackend):
    device: "TraceDevice"

    def graph_compute(self, graph: pyggml.Graph) -> None:
        for node in graph.nodes:
            if not node.is_empty_op():
                self.device.computed[node.op_name] += 1
                numpy_ops.compute(node)


class TraceDevice(PyDevice):
    def __init__(self) -> None:
        super().__init__()
        self.offered: Counter[str] = Counter()
        self.computed: Counter[str] = Counter()

    def get_name(self) -> str:
        return "TRACE"

    def get_description(self) -> str:
        return "records ops, computes them with NumPy"

    def init_backend(self, params: str | None) -> TraceBackend:
        return TraceBackend(self)

    def get_buffer_type(self) -> BufferType:
        return cpu_buffer_type()          # host memory, shared with the CPU backend

    def supports_op(self, op: pyggml.Tensor) -> bool:
        self.offered[op.op_name] += 1
        return op.is_empty_op() or numpy_ops.supports(op)


if __name__ == "__main__":
    device = TraceDevice()
    register(PyRegistry("TRACE", [device]))
    backend, cpu = device_by_name("TRACE").init(), pyggml.CPUBackend()
    sched = pyggml.Scheduler([backend, cpu])
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with pyggml.Context.for_tensors(32, graph_size=64) as ctx:
        a = ctx.new_tensor(pyggml.GGMLType.F32, [64, 4]).set_input()
        w = ctx.new_tensor(pyggml.GGMLType.F32, [64, 16]).set_input()
        y = ctx.soft_max(ctx.unary("gelu", ctx.mul_mat(w, a)) * 0.5)
        graph = ctx.new_graph(64).build_forward(y)
        sched.alloc_graph(graph)
        a.set(x)
        w.set(np.eye(16, 64, dtype=np.float32))
        sched.compute(graph)
        print("result row 0:", np.round(y.numpy()[0, :4], 4))
    print(f"{sched.n_splits} split(s); offered: {dict(device.offered)}; computed: {dict(device.computed)}")
