"""The readable form of a Plan, for ``orchestrator plan`` without ``--json``."""

from __future__ import annotations

from orchestrator.core.planner import Memory, Plan


def _memory_line(mem: Memory) -> str:
    return (f"per GPU: weights {mem.weights_gib:.1f} GiB ({mem.weights_source}) + KV cache "
            f"{mem.kv_cache_gib:.1f} GiB ({mem.max_model_len} tokens) + overhead {mem.overhead_gib:.1f} GiB "
            f"= {mem.required_gib:.1f} of {mem.budget_gib:.1f} GiB")


def render_plan(plan: Plan, limit: int = 8) -> str:
    """Verdict first (reasons, fix), then the best valid layouts with why."""
    v = plan.requested
    model = plan.model
    head = (f"model: {model.get('architecture') or 'unknown'} ({model.get('attention')}, "
            f"{model.get('experts') or 0} experts, {model.get('quantization')})")
    lines = [head, f"{v.layout}: {'VALID' if v.valid else 'INVALID'}"]
    lines += [f"  - {r}" for r in v.reasons]
    lines += [f"  ! {w}" for w in v.warnings]
    if v.memory:
        lines.append(f"  {_memory_line(v.memory)}")
    if v.fix:
        lines.append(f"fix: {v.fix}")
    if plan.layouts:
        lines.append("valid layouts, best first:")
        for i, lay in enumerate(plan.layouts[:limit], 1):
            lines.append(f"  {i}. {lay.layout}: {lay.why}")
        if len(plan.layouts) > limit:
            lines.append(f"  ... and {len(plan.layouts) - limit} more (--json lists all)")
    else:
        lines.append("no valid layout on this host")
    return "\n".join(lines)
