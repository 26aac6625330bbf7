"""CUDA graphs of plans: a plan computed again unchanged is captured once and then replayed.

ggml-cuda captures a graph into a CUDA graph at its second compute when nothing changed since the
first (the warm-up of ``ggml_backend_cuda_graph_compute``) and launches that graph from then on.
A plan of the torch backend on a CUDA device does the same, one compute later: the compute that
builds it and the next one run its steps eagerly on the backend's stream; right after that second
eager run (torch's warm-up before a capture; it computed this compute's results), the steps run
once more inside ``torch.cuda.graph`` on the same stream, which records their kernels without
running them; from the third compute on, ``graph.replay()`` launches them all, with no Python per
node (:data:`WARMUP` eager computes, then replays).

Never captured: a plan with a step marked :func:`~pyggml.impl.torch.table.eager` (it reads data
to the host: ARGMAX's rows with NaN, OPT_STEP_ADAMW's parameters, the row-index checks and
FLASH_ATTN_EXT's cut of masked keys on ``cpu``; or it writes into weights and drops their float32
copies), since a graph would replay none of that. A graph reads the float32 copies of weights
(``memory.WeightsCache``) that existed when it was captured: when one of those caches is emptied
(a write into the weights), the graph is dropped before its next replay, and the plan runs eagerly
and is captured again after :data:`WARMUP` more computes. A changed graph gets a new plan, which
starts over; freeing a ``TorchBuffer`` drops the plans that see its memory.

A capture that raises is kept in ``GraphReplay.error``. An operation torch cannot capture is
logged as a warning (logger ``pyggml.torch``), and the backend captures no plan from then on (its
plans run eagerly: a failed ``torch.cuda.graph`` may leave torch's capture state behind, pytorch
issues #180395 and #190308, so the backend does not enter it again). A kernel fault of the eager
run just before (CUDA reports it late, at the capture's synchronize, and it is sticky: the
process's CUDA context is unusable after it, :func:`sticky`) is logged as an error and raised by
the compute, as without capture.

``PYGGML_TORCH_CUDA_GRAPHS=0`` disables capture for backends made afterwards (as
``GGML_CUDA_DISABLE_GRAPHS`` does for ggml-cuda). How a plan is captured is a ``Capturer``, a
function given the plan's eager run that returns the replay; tests give fakes.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable

import torch

__all__ = ["WARMUP", "Capturer", "GraphReplay", "enabled", "cuda_capturer", "sticky",
           "EAGER", "CAPTURED", "GRAPH", "FAILED"]

logger = logging.getLogger("pyggml.torch")

#: eager computes of a plan before its capture (the capture follows the last one's eager run)
WARMUP = 2

#: captures ``run`` (a plan's eager run) and returns what replays it; raises if it cannot
Capturer = Callable[[Callable[[], None]], Callable[[], object]]

#: what a compute of a plan did (:meth:`GraphReplay.run`): ran the steps; ran them and captured
#: them; replayed the graph; ran them and failed to capture them
EAGER, CAPTURED, GRAPH, FAILED = "eager", "captured", "graph", "failed"


#: CUDA's sticky errors (a kernel fault: every later CUDA call of the process fails), as torch
#: words them (``cudaGetErrorString``)
_STICKY = re.compile(r"illegal memory access|device-side assert|misaligned address|unspecified "
                     r"launch failure|illegal instruction|hardware stack error|launch timed out")


def sticky(error: BaseException) -> bool:
    """Whether ``error`` (raised by a capture) is a kernel fault CUDA reported late, not an
    operation the capture could not record."""
    return bool(_STICKY.search(str(error)))


def enabled() -> bool:
    """False when ``$PYGGML_TORCH_CUDA_GRAPHS`` is ``0``."""
    return os.environ.get("PYGGML_TORCH_CUDA_GRAPHS", "").strip() != "0"


def cuda_capturer(stream: torch.cuda.Stream) -> Capturer:
    """A ``Capturer`` recording into a ``torch.cuda.CUDAGraph`` on ``stream`` (the backend's:
    replay it with ``stream`` current). Torch's errors propagate."""
    def capture(run: Callable[[], None]) -> Callable[[], object]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            run()
        return graph.replay
    return capture


class GraphReplay:
    """The CUDA graph of one plan: ``capture`` (None: never captured) and the weights caches
    (``memory.WeightsCache``) whose tensors the plan's steps may read. ``replay``: the captured
    graph's replay, or None; ``error``: the exception of a failed capture."""

    def __init__(self, capture: Capturer | None, caches: list[Any]):
        self.capture = capture
        self.caches = caches
        self.eager_runs = 0
        self.replay: Callable[[], object] | None = None
        self.epochs: tuple[int, ...] = ()
        self.error: Exception | None = None

    def _epochs(self) -> tuple[int, ...]:
        return tuple(c.epoch for c in self.caches)

    def run(self, eager: Callable[[], None]) -> str:
        """One compute of the plan whose steps ``eager`` runs: replay its graph, or run the steps
        (their exceptions propagate) and capture them after :data:`WARMUP` such runs.
        Returns what it did: ``EAGER``, ``CAPTURED``, ``GRAPH`` or ``FAILED``."""
        if self.replay is not None:
            if self._epochs() == self.epochs:
                self.replay()
                return GRAPH
            self.replay, self.eager_runs = None, 0        # weights written: warm up again
        eager()
        self.eager_runs += 1
        if self.capture is None or self.eager_runs < WARMUP:
            return EAGER
        epochs = self._epochs()
        try:
            self.replay = self.capture(eager)
        except Exception as e:  # noqa: BLE001 - any failure of torch's capture
            self.capture, self.error = None, e
            if sticky(e):
                logger.error("a kernel of a torch backend plan failed on the GPU (reported when its "
                             "CUDA graph was captured; the error is sticky): %r", e)
                raise
            logger.warning("a torch backend plan could not be captured into a CUDA graph: %r; "
                           "that backend captures no plan from now on (they run without CUDA graphs)", e)
            return FAILED
        self.epochs = epochs
        return CAPTURED
