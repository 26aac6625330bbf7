"""The architecture zoo of the torch lowering: small random-weight models of transformers'
architectures (no download), each with an input: :data:`ZOO` maps a name to a function that
makes ``(model, inputs)``. Shared by ``tests/torch_lowering/test_zoo.py`` and
``scripts/torch_lowering_zoo.py`` (which writes ``docs/torch_zoo.rst``)."""
from __future__ import annotations

from typing import Any, Callable

import torch
import transformers as T

#: the sizes every text model shares: 2 layers of 32 values, 4 heads, a vocabulary of 100
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=100, max_position_embeddings=64)


def _ids() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))}


def _text(cfg_cls: Any, model_cls: Any, **kw: Any) -> Callable[[], tuple[Any, dict[str, torch.Tensor]]]:
    return lambda: (model_cls(cfg_cls(**{**SMALL, **kw})), _ids())


_WHISPER = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)

#: name -> a function making (model, keyword inputs); models in float32, random weights
ZOO: dict[str, Callable[[], tuple[Any, dict[str, torch.Tensor]]]] = {
    "BERT": _text(T.BertConfig, T.BertModel),
    "RoBERTa": _text(T.RobertaConfig, T.RobertaModel),
    "DistilBERT": lambda: (T.DistilBertModel(T.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                                vocab_size=100)), _ids()),
    "ALBERT": _text(T.AlbertConfig, T.AlbertModel, embedding_size=16),
    "ELECTRA": _text(T.ElectraConfig, T.ElectraModel, embedding_size=32),
    "GPT-2": lambda: (T.GPT2Model(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64)),
                      _ids()),
    "GPT-NeoX": _text(T.GPTNeoXConfig, T.GPTNeoXModel),
    "Llama": _text(T.LlamaConfig, T.LlamaModel, num_key_value_heads=2),
    "Mistral": _text(T.MistralConfig, T.MistralModel, num_key_value_heads=2),
    "Qwen2": _text(T.Qwen2Config, T.Qwen2Model, num_key_value_heads=2),
    "Qwen3": _text(T.Qwen3Config, T.Qwen3Model, num_key_value_heads=2, head_dim=8),
    "Gemma": _text(T.GemmaConfig, T.GemmaModel, num_key_value_heads=2, head_dim=8),
    "Phi-3": _text(T.Phi3Config, T.Phi3Model, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "OPT": lambda: (T.OPTModel(T.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                                           vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32)),
                    _ids()),
    "T5 encoder": lambda: (T.T5EncoderModel(T.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                                       vocab_size=100)), _ids()),
    "BART encoder": lambda: (T.BartModel(T.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64)).get_encoder(), _ids()),
    "ViT": lambda: (T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, image_size=32, patch_size=8)),
                    {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))}),
    "Whisper encoder": lambda: (T.WhisperModel(T.WhisperConfig(num_mel_bins=16, max_source_positions=20,
                                                               **_WHISPER)).get_encoder(),
                                {"input_features": torch.randn(2, 16, 40, generator=torch.Generator().manual_seed(1))}),
    "Wav2Vec2": lambda: (T.Wav2Vec2Model(T.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
        {"input_values": torch.randn(2, 400, generator=torch.Generator().manual_seed(1))}),
}


#: the decoder-only architectures of :data:`ZOO` with a language-model head: name -> a function
#: making the model (the same sizes), for generation with transformers' static cache
CAUSAL: dict[str, Callable[[], Any]] = {
    "GPT-2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64)),
    "GPT-NeoX": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**SMALL)),
    "Llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**SMALL, num_key_value_heads=2)),
    "Mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**SMALL, num_key_value_heads=2)),
    "Qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**SMALL, num_key_value_heads=2)),
    "Qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8)),
    "Gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=8)),
    "Phi-3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                                                    eos_token_id=2)),
    "OPT": lambda: T.OPTForCausalLM(T.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                                                vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32)),
}


def coverage(name: str) -> dict[str, Any]:
    """Compile ``ZOO[name]`` with ``torch.compile(backend="pyggml", dynamic=False)`` (float32
    weights, exact attention) and run it beside eager: ``nodes`` (ATen nodes of the compiled
    graphs), ``ggml`` (of them lowered), ``breaks`` (dynamo's graph breaks), ``max_diff`` (the
    largest absolute difference of ``last_hidden_state`` to eager), ``torch`` (overload -> why
    it stays in torch)."""
    from pyggml.torch_lowering import backend
    from pyggml.torch_lowering.partition import explain_graph

    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model = model.eval()
    stats: dict[str, Any] = {"nodes": 0, "ggml": 0, "torch": {}}
    lower = backend.lower_module

    def counting(gm: Any, *args: Any, **kw: Any) -> Any:
        e = explain_graph(backend.rewrite(gm))
        stats["ggml"] += sum(e.ggml.values())
        stats["nodes"] += sum(e.ggml.values()) + sum(e.torch_nodes.values())
        stats["torch"].update(e.torch)
        return lower(gm, *args, **kw)

    torch._dynamo.reset()
    backend.lower_module = counting
    try:
        compiled = torch.compile(model, backend="pyggml", dynamic=False, options={"attention": "exact", "weights": "f32"})
        with torch.no_grad():
            want = model(**inputs).last_hidden_state
            got = compiled(**inputs).last_hidden_state
        stats["breaks"] = torch._dynamo.explain(model)(**inputs).graph_break_count
    finally:
        backend.lower_module = lower
        torch._dynamo.reset()
    stats["max_diff"] = float((got - want).abs().max())
    return stats
