"""The shapes of a model that an engine's rules read: a config.json's architecture facts, normalised
(core/planner_arch.py parses them), and what a rule finds (pure: no I/O).

They live here, below the core, because the rules that judge a layout against them are the engine's
(``Engine.shape_rules``, ``Engine.kv_bytes_per_token``); the planner asks the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Attention-free models (Mamba, Mamba-2, Falcon-Mamba; Terratorch and Medusa, which engines run without
# attention; timm wrappers): no head count to ask of them.
ATTENTION_FREE_ARCHS = frozenset(
    {"MambaForCausalLM", "Mamba2ForCausalLM", "FalconMambaForCausalLM", "Terratorch", "MedusaModel"}
)
ATTENTION_FREE_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "medusa", "timm_wrapper"})


@dataclass(frozen=True)
class QuantSpec:
    """How the checkpoint's linear weights are stored, and which parts that applies to."""

    method: str | None = None  # fp8 | compressed-tensors | mxfp4 | awq | gptq | ...
    block: tuple[int, int] | None = None  # FP8 [block_n, block_k]
    group_size: int | None = None  # INT/FP4 group quantisation along the input dim
    bits: int | None = None
    attn: bool = False  # which component groups the quantisation covers
    dense_mlp: bool = False
    shared_experts: bool = False
    experts: bool = False

    @property
    def label(self) -> str:
        if self.method is None:
            return "unquantized"
        if self.method == "mxfp4":
            return "mxfp4 (experts)"
        if self.block:
            return f"{self.method} block {self.block[0]}x{self.block[1]}"
        if self.bits and self.group_size:
            return f"{self.method} int{self.bits} group {self.group_size}"
        return self.method


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the planner needs, all optional."""

    architecture: str | None
    model_type: str | None
    family: str  # one of core/planner_arch.py's families, or "generic"
    num_layers: int | None
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    intermediate_size: int | None  # dense MLP
    moe_intermediate_size: int | None
    num_experts: int  # 0 for dense models
    shared_intermediate_size: int  # all shared experts together; 0 if none
    num_dense_layers: int  # layers with a dense MLP in an MoE model
    kv_lora_rank: int | None  # set for MLA
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    v_head_dim: int | None
    q_lora_rank: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    dtype_bytes: int
    sliding_window: int | None
    num_sliding_layers: int
    quant: QuantSpec
    problems: tuple[str, ...]

    @property
    def known(self) -> bool:
        return self.family != "generic"

    @property
    def attention_free(self) -> bool:
        """It runs without attention (Mamba): it has no heads to count."""
        return self.architecture in ATTENTION_FREE_ARCHS or self.model_type in ATTENTION_FREE_TYPES

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe or self.num_layers is None:
            return 0
        return max(self.num_layers - self.num_dense_layers, 0)


@dataclass
class Findings:
    """What an engine's shape rules find for a layout: reasons it refuses it, and warnings."""

    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
