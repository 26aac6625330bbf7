"""Choosing the next token from the logits, with NumPy.

The order is llama.cpp's: repetition penalty, top-k, temperature, top-p, then a draw from the
remaining distribution (``numpy.random.Generator`` seeded by ``seed``). ``temperature <= 0``
(or ``greedy``) takes the arg max after the penalty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["Sampler"]


@dataclass
class Sampler:
    """Sampling settings plus the random generator they draw with.

    ``top_k`` <= 0 keeps every token; ``top_p`` >= 1 keeps every token; ``repeat_penalty`` 1.0
    is off, otherwise the logits of the last ``repeat_last_n`` tokens are divided by it when
    positive and multiplied by it when negative (as llama.cpp and transformers do).
    Raises ValueError for settings out of range.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    greedy: bool = False
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not self.repeat_penalty > 0:
            raise ValueError("repeat_penalty must be > 0")
        if self.repeat_last_n < 0:
            raise ValueError("repeat_last_n must be >= 0")
        self.rng = np.random.default_rng(self.seed)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id for ``logits`` (float32, NumPy shape (n_vocab,)) given the ids seen so
        far (prompt and generated, for the repetition penalty)."""
        if self.repeat_penalty != 1.0 and self.repeat_last_n and len(history):
            logits = logits.copy()
            recent = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
            vals = logits[recent]
            logits[recent] = np.where(vals > 0, vals / self.repeat_penalty, vals * self.repeat_penalty)
        if self.is_greedy:
            return int(np.argmax(logits))
        # a step's time is mostly memory traffic (the logits are 49,152 values for SmolLM2, and
        # ggml has just streamed the weights through the caches): one pass finds the k-th
        # largest value, one picks the ids at or above it; the rest works on k values
        n, k = logits.shape[0], self.top_k
        if 0 < k < n:
            kth = np.partition(logits, n - k)[n - k]
            ids = np.flatnonzero(logits >= kth)        # k ids, more when the k-th value is tied
        else:
            ids, k = np.arange(n), n
        vals = logits[ids].astype(np.float64)
        order = np.argsort(-vals, kind="stable")[:k]   # ties: the lower id first
        ids = ids[order]
        cdf = np.cumsum(np.exp((vals[order] - vals[order[0]]) / self.temperature))
        if self.top_p < 1.0:   # the smallest set whose probability reaches top_p
            cdf = cdf[:int(np.searchsorted(cdf, self.top_p * cdf[-1])) + 1]
        # Generator.choice(len(ids), p=...)'s draw, without its checks of p
        return int(ids[int(np.searchsorted(cdf / cdf[-1], self.rng.random(), side="right"))])
