#!/usr/bin/env python3
"""Random-weight Llama checkpoints made on the GPU, saved as safetensors, to time real vLLM.

    python3 scripts/make_gpu_model.py OUT [--size m8] [--size m13 ...]   -> OUT/<size>/

Sizes (hidden, layers, intermediate, heads, kv heads): m1 0.76 B params (1.4 GiB bf16), m8 6.98 B (13.0
GiB), m13 12.7 B (23.6 GiB: Llama-2-13B's shape, every head its own KV head, so that at C=256 the
engine's step, not a client, sets the pace: bench/gpu/RESULTS.md, run 8). Derived from the bundle's
make_gpu_models.py (same tokenizer, same init scaled by 0.02). Prints one line per model made, with
the seconds it took to build and write, then a JSON line of every figure; a model already there is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

SPECS: dict[str, tuple[int, int, int, int, int]] = {  # name: hidden, layers, intermediate, heads, kv_heads
    "m1": (2048, 16, 5632, 16, 8),
    "m8": (4096, 32, 14336, 32, 8),
    "m13": (5120, 40, 13824, 40, 40),
}


def params(name: str, vocab: int) -> int:
    """Parameters of a Llama of SPECS[name] with untied embeddings (what LlamaForCausalLM counts)."""
    h, layers, inter, heads, kv = SPECS[name]
    kv_dim = h // heads * kv
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * inter + 2 * h  # q, o; k, v; gate, up, down; 2 norms
    return layers * per_layer + 2 * vocab * h + h  # + embeddings, lm_head, final norm


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on a few lines: random weights need no real vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Hello world, this checkpoint has random weights.", "0123456789 abcdefghijklmnopqrstuvwxyz"]
    tok.train_from_iterator(
        corpus,
        trainer=trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=4096
    )
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return fast


def make(name: str, dest: Path, tok: Any) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    h, layers, inter, heads, kv = SPECS[name]
    t = time.monotonic()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.02)
    built = time.monotonic() - t
    m.save_pretrained(dest, safe_serialization=True, max_shard_size="5GB")
    tok.save_pretrained(dest)
    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(dest)
    n = sum(p.numel() for p in m.parameters())
    del m
    torch.cuda.empty_cache()
    size = sum(f.stat().st_size for f in dest.glob("*.safetensors"))
    took = time.monotonic() - t
    print(
        f"made {name}: {n / 1e9:.2f} B params, {size / 2**30:.1f} GiB in {took:.1f} s (built on the GPU in "
        f"{built:.1f} s, written in {took - built:.1f} s)",
        flush=True,
    )
    return {"params": n, "bytes": size, "build_s": round(built, 1), "make_s": round(took, 1)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", action="append", choices=sorted(SPECS), help="repeat; default m8")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    res = {}
    for name in a.size or ["m8"]:
        dest = out / name
        if not (dest / "config.json").exists():
            res[name] = make(name, dest, tok)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
