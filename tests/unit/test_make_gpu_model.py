"""scripts/make_gpu_model.py: the sizes it makes, counted without torch."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from make_gpu_model import SPECS, params  # scripts/ is a folder of scripts


def test_the_parameter_count_matches_what_the_gpu_made() -> None:
    """m8's count is the one LlamaForCausalLM reported on the H200 (run 7: 6,982,299,648, vocab 331)."""
    assert params("m8", 331) == 6_982_299_648


def test_m13_has_llama_2_13b_layers_and_one_kv_head_per_head() -> None:
    """m13 is Llama-2-13B's shape (its 13.0 B less a 32,000-token vocabulary's embeddings)."""
    assert SPECS["m13"] == (5120, 40, 13824, 40, 40)
    assert params("m13", 32000) == 13_015_864_320
