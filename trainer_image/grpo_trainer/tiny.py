"""A tiny randomly initialised Qwen2 model and character-level tokenizer, saved like a Hub checkpoint.

No model hub is reachable from CPU test machines; this gives TRL a real (if small) causal LM to train.
``python -m grpo_trainer.tiny OUT_DIR`` writes one for demos.

The model is one vLLM's CPU build serves: its attention kernels support head sizes 32, 64, 80, 96, 112,
128, 160, 192, 224, 256 and 512 only (a head of 16 passes /health and then kills the engine on the first
request), so heads are HEAD_DIM wide. Its output layer is not tied to the embedding by default, because
a tied model's served output layer does not follow weight updates on vLLM's CPU build
(docs/trainer.md, "Served-model check"); ``tie_embeddings=True`` builds one to test exactly that."""

from __future__ import annotations

import string
import sys
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list(string.ascii_lowercase + string.digits + " .,:;?!=+-*/#()'\"\n")
HEAD_DIM = 32


def build_tokenizer() -> object:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Without Fuse a WordLevel tokenizer decodes with spaces between characters.
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=512,
    )


def build(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    seed: int = 0,
    tie_embeddings: bool = False,
    head_dim: int = HEAD_DIM,
    dtype: str = "float32",
    device: str = "cpu",
) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab_size = len(SPECIALS) + len(CHARS)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        # Qwen2 derives the head size as hidden_size / num_attention_heads.
        num_attention_heads=max(1, hidden_size // head_dim),
        num_key_value_heads=max(1, hidden_size // head_dim // 2),
        max_position_embeddings=512,
        tie_word_embeddings=tie_embeddings,
        pad_token_id=SPECIALS.index("<pad>"),
        eos_token_id=SPECIALS.index("<eos>"),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    # A billion-parameter model initialises in seconds on a GPU and in minutes on a CPU (bench/gpu_check.py).
    with torch.device(device):
        model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id, do_sample=True
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m grpo_trainer.tiny OUT_DIR")
    print(build(sys.argv[1]))
