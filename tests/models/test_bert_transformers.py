"""pyggml.models.bert against transformers' own BertModel, RobertaModel and XLMRobertaModel on
small random-weight folders (saved by transformers with ``save_pretrained``, a word-level
``tokenizer.json`` made with ``tokenizers``): the token embeddings, mean or CLS pooled, L2
normalised where sentence-transformers' ``modules.json`` says so, match transformers' in float32.
Runs where torch and transformers are installed (CI's torch step)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from pyggml.models.bert import Embedder, ModelError  # noqa: E402

WORDS = "the cat sat on a warm mat while dog barked at passing cars and rain fell all day long".split()
SENTENCES = ["the cat sat on a warm mat", "dog", "rain fell all day long while the dog barked at passing cars",
             "a cat and a dog", "the the the the the the the the the the the the the the the the the the"]


def _tokenizer(folder: Path, specials: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=specials[1]))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    cls, sep = specials[2], specials[3]
    tk.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}",
                                                      special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    tk.save(str(folder / "tokenizer.json"))


def _folder(tmp_path: Path, kind: str, pooling: str | None) -> tuple[Path, object]:
    torch.manual_seed(0)
    n_vocab = 4 + len(WORDS)
    common = dict(vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=72)
    if kind == "bert":
        cfg = transformers.BertConfig(**common, pad_token_id=0)
        model = transformers.BertModel(cfg, add_pooling_layer=False)
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    else:
        cls = transformers.RobertaConfig if kind == "roberta" else transformers.XLMRobertaConfig
        cfg = cls(**common, pad_token_id=1, type_vocab_size=1)
        model = (transformers.RobertaModel if kind == "roberta" else transformers.XLMRobertaModel)(cfg, add_pooling_layer=False)
        specials = ["<unk>", "<pad>", "<s>", "</s>"]   # ids 0..3: the pad is 1, as RoBERTa's
    model.eval()
    folder = tmp_path / kind
    model.save_pretrained(folder, safe_serialization=True)
    _tokenizer(folder, specials)
    if pooling is not None:   # sentence-transformers' files: pooling, then Normalize
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean"}))
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return folder, model


def _reference(folder: Path, model, pooling: str, normalize: bool) -> np.ndarray:
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = []
    with torch.no_grad():
        for s in SENTENCES:
            ids = torch.tensor([tk.encode(s).ids])
            h = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            e = h[0] if pooling == "cls" else h.mean(0)
            out.append(torch.nn.functional.normalize(e, dim=0) if normalize else e)
    return torch.stack(out).numpy()


@pytest.mark.parametrize("kind, pooling", [("bert", "mean"), ("bert", None), ("roberta", "cls"),
                                           ("xlm-roberta", "mean")])
def test_embeddings_match_transformers(tmp_path, kind, pooling):
    folder, model = _folder(tmp_path, kind, pooling)
    want = _reference(folder, model, pooling or "mean", normalize=pooling is not None)
    with Embedder(folder, n_threads=2, wtype="f32") as m:
        assert m.config.pooling == (pooling or "mean") and m.config.normalize == (pooling is not None)
        for batch_size in (1, 3):
            got = m.encode(SENTENCES, batch_size=batch_size)
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_a_model_of_another_family_is_refused(tmp_path):
    folder, _ = _folder(tmp_path, "bert", "mean")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "distilbert"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="distilbert"):
        Embedder(folder)
