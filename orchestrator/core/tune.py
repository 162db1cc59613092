"""Pure decisions of `orchestrator tune`: what to try, how to score it, who won and by how much.

No I/O. The application (orchestrator/rollout/tune.py) feeds in the planner's input and the
benchmark records it measured; this module parses the user's input strictly (every error is a
one-line UsageError naming the option and the bad value), builds the variants, and judges.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from orchestrator.core import bounds, planner
from orchestrator.core.catalog import NAME_RE, Model
from orchestrator.core.documents import clip
from orchestrator.errors import UsageError

_PART_RE = re.compile(r"^(tp|pp|dp)([0-9]{1,4})$")
# Streams one benchmark level opens at once; the engine's scheduler cap (the catalog's max_num_seqs bound).
MAX_CONCURRENCY = 65_536
MAX_NUM_SEQS = 1_000_000


# -- layouts ----------------------------------------------------------------------------------------


def parse_layout(text: str) -> planner.Layout:
    """``tp4``, ``tp8+ep``, ``tp2+pp2``, ``tp4+dp2+ep``: tp first, each part once."""
    raw = text.strip().lower()
    sizes: dict[str, int] = {}
    ep = False
    parts = raw.split("+") if raw else []
    for part in parts:
        m = _PART_RE.fullmatch(part)
        if part == "ep" and not ep:
            ep = True
        elif m and m.group(1) not in sizes and int(m.group(2)) >= 1:
            sizes[m.group(1)] = int(m.group(2))
        else:
            raise UsageError(f"--layouts: {clip(text)} is not a layout: write tpN[+ppN][+dpN][+ep], e.g. tp4 or tp8+ep")
    if "tp" not in sizes:
        raise UsageError(f"--layouts: {clip(text)} is not a layout: write tpN[+ppN][+dpN][+ep], e.g. tp4 or tp8+ep")
    return planner.Layout(tp=sizes["tp"], pp=sizes.get("pp", 1), dp=sizes.get("dp", 1), ep=ep)


def parse_layouts(text: str) -> tuple[planner.Layout, ...]:
    layouts = tuple(parse_layout(p) for p in text.split(","))
    dupes = sorted({token(x) for x in layouts if layouts.count(x) > 1})
    if dupes:
        raise UsageError(f"--layouts {clip(text)}: {', '.join(dupes)} given twice")
    return layouts


def token(layout: planner.Layout) -> str:
    """The short form used on the command line and in variant names: tp8+ep."""
    parts = [f"tp{layout.tp}"] + [f"{n}{v}" for n, v in (("pp", layout.pp), ("dp", layout.dp)) if v != 1]
    return "+".join(parts + (["ep"] if layout.ep else []))


def parse_concurrency(text: str, option: str = "--concurrency", hi: int = MAX_CONCURRENCY) -> tuple[int, ...]:
    """``1,64,256``: integers in 1..hi, each once, kept in the given order (bench's and tune's)."""
    try:
        return bounds.parse_int_list(text, 1, hi)
    except ValueError as exc:
        raise UsageError(f"{option} {clip(text)}: {exc} (comma-separated levels in 1-{hi}, like 1,64,256)") from None


def parse_seqs(text: str | None) -> tuple[int | None, ...]:
    """``--max-num-seqs 16,256``: the same layout tried with each scheduler cap (None: the model's own)."""
    if text is None:
        return (None,)
    return tuple(int(v) for v in parse_concurrency(text, "--max-num-seqs", MAX_NUM_SEQS))


# -- candidates -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    name: str  # the variant's catalog name (and unit name part): minimax-m25.tp8-ep
    layout: planner.Layout
    max_num_seqs: int | None = None  # None: the model's own

    @property
    def label(self) -> str:
        return token(self.layout) + (f" seqs={self.max_num_seqs}" if self.max_num_seqs else "")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layout": token(self.layout), "max_num_seqs": self.max_num_seqs}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        return cls(str(d["name"]), parse_layout(str(d["layout"])), d.get("max_num_seqs"))


@dataclass(frozen=True)
class Refused:
    layout: planner.Layout
    reason: str


@dataclass(frozen=True)
class Selection:
    candidates: tuple[Candidate, ...]
    refused: tuple[Refused, ...]


def variant_name(model: str, layout: planner.Layout, seqs: int | None = None) -> str:
    """``minimax-m25.tp8-ep``: a valid catalog name and systemd unit name ("@" and "+" are not:
    "@" would make the unit a template instance)."""
    name = f"{model}.{token(layout).replace('+', '-')}" + (f"-s{seqs}" if seqs else "")
    if not NAME_RE.fullmatch(name):
        raise UsageError(
            f"tune {model}: variant name {name!r} is longer than 63 characters; give the model a shorter name"
        )
    return name


def select(
    model: Model,
    config: Mapping[str, Any],
    hw: planner.Hardware,
    workload: planner.Workload,
    weight_bytes: int | None,
    requested: Sequence[planner.Layout] | None,
    top: int,
    seqs: Sequence[int | None] = (None,),
) -> Selection:
    """The planner's best ``top`` valid layouts, or the requested ones with the refused set apart."""
    refused: list[Refused] = []
    if requested is None:
        layouts = [v.layout for v in planner.layouts(config, hw, workload, weight_bytes, engine=model.engine)[:top]]
    else:
        layouts = []
        for lay in requested:
            v = planner.check(config, lay, hw, workload, weight_bytes, engine=model.engine)
            if v.valid:
                layouts.append(lay)
            else:
                refused.append(Refused(lay, "; ".join(v.reasons)))
    cands = tuple(Candidate(variant_name(model.name, lay, s), lay, s) for lay in layouts for s in seqs)
    return Selection(cands, tuple(refused))


def variant_gpus(model: Model, layout: planner.Layout, host_gpus: int) -> tuple[int, ...]:
    """The model's own GPUs first, then the host's lowest free indices, as many as the layout needs."""
    need = layout.gpus
    pool = list(model.gpus) + [g for g in range(host_gpus) if g not in model.gpus]
    if need > len(pool):
        raise UsageError(f"tune {model.name}: {token(layout)} needs {need} GPUs, the host has {host_gpus}")
    return tuple(pool[:need])


def variant(model: Model, cand: Candidate, host_gpus: int) -> Model:
    """The model with the candidate's layout: same repo, revision, weights, port, served name."""
    data = model.model_dump()
    data.update(
        name=cand.name,
        served_name=model.served,
        tensor_parallel=cand.layout.tp,
        pipeline_parallel=cand.layout.pp,
        data_parallel=cand.layout.dp,
        expert_parallel=cand.layout.ep,
        gpus=variant_gpus(model, cand.layout, host_gpus),
    )
    if cand.max_num_seqs is not None:
        data["max_num_seqs"] = cand.max_num_seqs
    return Model.model_validate(data)


# -- objectives -------------------------------------------------------------------------------------

Kind = Literal["throughput", "single-stream", "tok-per-gpu", "ttft-p90"]
OBJECTIVES_HELP = (
    "throughput[@C] (output tok/s at C, default the highest level), single-stream (tok/s of "
    "one stream at C=1), tok-per-gpu[@C], ttft-p90@C:FLOOR (lowest TTFT p90 at C among "
    "candidates with at least FLOOR tok/s there)"
)
_OBJ_RE = re.compile(
    r"^(throughput|single-stream|tok-per-gpu|ttft-p90)"
    r"(?:@([0-9]{1,6}))?(?::([0-9]{1,12}(?:\.[0-9]{1,6})?))?$",
    re.ASCII,
)


@dataclass(frozen=True)
class Objective:
    kind: Kind
    concurrency: int
    floor_tok_s: float | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.kind != "ttft-p90"

    @property
    def unit(self) -> str:
        return {"throughput": "tok/s", "single-stream": "tok/s", "tok-per-gpu": "tok/s/GPU", "ttft-p90": "ms"}[
            self.kind
        ]

    def __str__(self) -> str:
        if self.kind == "single-stream":
            return "single-stream"
        return f"{self.kind}@{self.concurrency}" + (f":{self.floor_tok_s:g}" if self.floor_tok_s is not None else "")


def parse_objective(text: str, levels: Sequence[int]) -> Objective:
    m = _OBJ_RE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--objective {clip(text)}: unknown objective; use {OBJECTIVES_HELP}")
    kind, conc, floor = m.group(1), m.group(2), m.group(3)
    if kind == "single-stream":
        if conc or floor:
            raise UsageError(f"--objective {clip(text)}: single-stream takes no @C or floor (it is measured at C=1)")
        c = 1
    else:
        c = int(conc) if conc else max(levels)
    if (floor is None) == (kind == "ttft-p90"):
        raise UsageError(
            f"--objective {clip(text)}: "
            + (
                "ttft-p90 needs a throughput floor, e.g. ttft-p90@64:1500"
                if kind == "ttft-p90"
                else f"{kind} takes no :FLOOR"
            )
        )
    if c not in levels:
        raise UsageError(
            f"--objective {clip(text)}: concurrency {c} is not among --concurrency {','.join(map(str, levels))}"
        )
    return Objective(kind, c, float(floor) if floor is not None else None)  # type: ignore[arg-type]


def level(record: Mapping[str, Any], concurrency: int) -> Mapping[str, Any] | None:
    return next((lv for lv in record.get("levels") or [] if lv.get("concurrency") == concurrency), None)


def score(obj: Objective, record: Mapping[str, Any], gpus: int) -> float | None:
    """The objective's figure for one benchmark run, or None when it does not qualify (no successful
    request at that level, or under the floor)."""
    lv = level(record, obj.concurrency)
    if lv is None or not lv.get("requests_ok"):
        return None
    if obj.kind == "throughput":
        return float(lv["output_tok_s"])
    if obj.kind == "single-stream":
        return float(lv["output_tok_s_per_stream"])
    if obj.kind == "tok-per-gpu":
        return float(lv["output_tok_s"]) / max(gpus, 1)
    assert obj.floor_tok_s is not None
    if float(lv["output_tok_s"]) < obj.floor_tok_s:
        return None
    p90 = (lv.get("ttft_ms") or {}).get("p90")
    return None if p90 is None else float(p90)


# -- the verdict ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One candidate's outcome: the bench records of its repeats, or the error that stopped it."""

    candidate: Candidate
    gpus: int
    records: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None  # the engine's own line when it failed to load
    revision: int | None = None


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    score: float | None  # mean over repeats; None: failed or did not qualify
    spread_pct: float | None  # (max - min) / mean over repeats, when repeated


@dataclass(frozen=True)
class Decision:
    objective: Objective
    ranking: tuple[Ranked, ...]  # qualified best first, then the rest
    winner: Candidate | None
    runner_up: Candidate | None
    margin_pct: float | None  # how much better the winner is than the runner-up
    noise_pct: float | None  # the larger spread of the two, from repeats
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": str(self.objective),
            "unit": self.objective.unit,
            "winner": self.winner.name if self.winner else None,
            "runner_up": self.runner_up.name if self.runner_up else None,
            "margin_pct": _r(self.margin_pct),
            "noise_pct": _r(self.noise_pct),
            "note": self.note,
            "ranking": [
                {
                    "candidate": r.candidate.name,
                    "layout": r.candidate.label,
                    "score": _r(r.score),
                    "spread_pct": _r(r.spread_pct),
                }
                for r in self.ranking
            ],
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def decide(obj: Objective, measured: Sequence[Measured]) -> Decision:
    ranked: list[Ranked] = []
    for m in measured:
        scores = [s for s in (score(obj, r, m.gpus) for r in m.records) if s is not None]
        if m.error is not None or not scores or len(scores) < len(m.records):
            ranked.append(Ranked(m.candidate, None, None))
            continue
        mean = statistics.fmean(scores)
        spread = (max(scores) - min(scores)) / mean * 100 if len(scores) > 1 and mean else None
        ranked.append(Ranked(m.candidate, mean, spread))
    sign = -1.0 if obj.higher_is_better else 1.0
    ranked.sort(key=lambda r: (r.score is None, sign * (r.score or 0.0)))
    ok = [r for r in ranked if r.score is not None]
    if not ok:
        return Decision(obj, tuple(ranked), None, None, None, None, note=f"no candidate qualified for {obj}")
    win = ok[0]
    if len(ok) == 1:
        return Decision(
            obj, tuple(ranked), win.candidate, None, None, win.spread_pct, note="the only candidate that qualified"
        )
    run = ok[1]
    assert win.score is not None and run.score is not None
    margin = (
        (
            (win.score - run.score) / run.score * 100
            if obj.higher_is_better
            else (run.score - win.score) / run.score * 100
        )
        if run.score
        else None
    )
    spreads = [s for s in (win.spread_pct, run.spread_pct) if s is not None]
    noise = max(spreads) if spreads else None
    note = ""
    if noise is None:
        note = "measured once each: repeat (--repeats 3) to see the noise"
    elif margin is not None and margin <= noise:
        note = f"margin {margin:.1f}% is within the noise of {noise:.1f}%: the two are a tie"
    return Decision(obj, tuple(ranked), win.candidate, run.candidate, margin, noise, note)


# -- the engine's error -----------------------------------------------------------------------------

_SYSTEMD_NOISE = re.compile(
    r"^(\S+\.service: |Started |Starting |Stopped |Stopping |Failed to start |"
    r"Scheduled restart|Consumed |Deactivated )"
)
_ERRORISH = re.compile(r"(error|exception|refuses|traceback|out of memory|failed)", re.IGNORECASE)


def engine_error_line(error: str) -> str:
    """The engine's own last error line from a failed switch's message (its journal tail), else the
    message's first line."""
    lines = error.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("last lines of the journal of "))
    except StopIteration:
        return lines[0] if lines else error
    tail = [ln.strip() for ln in lines[start + 1 :] if ln.strip()]
    engine = [ln for ln in tail if not _SYSTEMD_NOISE.match(ln)]
    hits = [ln for ln in engine if _ERRORISH.search(ln) and not ln.startswith("Traceback")]
    return (hits or engine or [lines[0]])[-1]


# -- time estimate ----------------------------------------------------------------------------------


def estimate(
    n: int,
    load_deadline_s: float,
    typical_load_s: float | None,
    levels: int,
    duration_s: float | None,
    requests: int | None,
    repeats: int,
) -> str:
    """A readable bound: loads (typical when known, at most the deadline) plus the benchmark time."""
    if duration_s is not None or requests is None:
        per_bench = (duration_s or 30.0) * levels * repeats
        bench = f"{n * per_bench / 60:.1f} min of benchmark ({levels} levels x {duration_s or 30.0:g} s"
        bench += f" x {repeats} repeats)" if repeats > 1 else ")"
    else:
        bench = f"{n * levels * repeats} benchmark passes of {requests} requests"
    loads = f"{n} loads of at most {load_deadline_s / 60:.1f} min (the load deadline)"
    if typical_load_s is not None:
        loads = f"{n} loads of ~{typical_load_s:.0f} s (last seen; at most {load_deadline_s / 60:.1f} min)"
    return f"{loads} + {bench}"


# -- what tune measured, fed back into `plan` -------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    layout: str  # token, e.g. tp8
    error: str
    at: float
    run: int


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def with_measurements(
    plan: planner.Plan, failures: Sequence[Failure], ranking: Sequence[tuple[str, float]], source: str
) -> tuple[planner.Plan, str]:
    """The plan with what tune saw on this host: measured layouts first in measured order (then the
    heuristic's), layouts that failed to load last with their error and date; returns the plan and a
    note saying which ranking it shows."""
    failed: dict[str, Failure] = {}
    for f in failures:  # newest first: keep the latest failure of each layout
        failed.setdefault(f.layout, f)
    score_of = dict(ranking)
    order = {lay: i for i, (lay, _) in enumerate(ranking)}

    def annotate(v: planner.Verdict) -> planner.Verdict:
        tok = token(v.layout)
        if tok in failed:
            f = failed[tok]
            return replace(v, why=f"FAILED to load on this host {_day(f.at)} (tune run #{f.run}): {f.error}")
        if tok in score_of:
            return replace(v, why=f"measured {score_of[tok]:,.1f} ({source}); {v.why}")
        return v

    def key(v: planner.Verdict) -> tuple[int, int]:
        tok = token(v.layout)
        return (2, 0) if tok in failed else (0, order[tok]) if tok in order else (1, 0)

    layouts = tuple(sorted((annotate(v) for v in plan.layouts), key=key))
    requested = plan.requested
    tok = token(requested.layout)
    if tok in failed:
        f = failed[tok]
        requested = replace(
            requested,
            warnings=(
                *requested.warnings,
                (f"{tok} failed to load on this host {_day(f.at)} (tune run #{f.run}): {f.error}"),
            ),
        )
    note = f"ranked by measurement ({source}), then by the planner" if ranking else ""
    if failed and not note:
        note = "layouts that failed to load on this host are listed last"
    return replace(plan, requested=requested, layouts=layouts), note
