#!/usr/bin/env python3
"""The GPU-box run's figures from its raw results (the tarballs `there.sh run` brings back), re-derived.

    python3 scripts/gpubox/report.py bench/gpu/box/run1-A.tar.gz bench/gpu/box/run1-B.tar.gz ...

Per step: what happened against what was promised (the scenario's verdict), the client's
counts in the step's window, the switch's wall time, and for warm
switches the client-visible gap beside vLLM's own sleep + wake (its journal lines "It took X seconds to fall
asleep" / "to wake up", taken in order).
"""

from __future__ import annotations

import io
import json
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prober import classify  # the same rules as the run, so a rule fixed later re-judges old raw data


def members(path: str) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {
            Path(m.name).name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def report(path: str) -> list[str]:
    files = members(path)
    steps = [json.loads(line) for line in io.StringIO(files["steps.jsonl"].decode())]
    part = steps[-1]["part"] if steps else "?"
    steps = [s for s in steps if s["part"] == part]  # steps.jsonl gathers every part run on the box
    records = json.loads(files.get(f"prober-{part}.json", b"[]"))
    # Streams the run's first prober rule called cut (fewer SSE events than tokens asked) that ended
    # with finish_reason "length" and [DONE]: when today's rule finds no cut stream in the part, a step
    # whose only fault was those is re-judged (marked "PASS*").
    recut = sum(1 for r in records if r["kind"] == "stream" and classify(r) == "cut")
    engine = json.loads(files.get(f"engine-{part}.json", b"{}"))
    out = [
        f"## {Path(path).name} (part {part}, {len(steps)} steps)",
        "",
        "| step | verdict | outcome | s | ok | 503+RA | failed | cut | hung | gap ms | what failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        c = dict(s["client"])
        verdict = s["verdict"]
        if recut == 0 and c["cut"] and set(c.get("bad_statuses") or {}) == {"200"}:
            c.update(cut=0, bad_statuses={})
            verdict = "PASS*" if c["failed"] == c["hung"] == 0 else verdict
        out.append(
            f"| {s['step']} | {verdict} | {s.get('outcome', s.get('rc'))} | {s['seconds']} | {c['ok']} | "
            f"{c['503']} | {c['failed']} | {c['cut']} | {c['hung']} | {c['gap_ms']} | "
            f"{c.get('bad_statuses') or ''} |"
        )
    warm = [s for s in steps if s["step"].startswith("warm_") and s["step"] != "warm_rollback"]
    if warm:
        gaps = sorted(s["client"]["gap_ms"] for s in warm)
        out += [
            "",
            (
                f"warm switches: {len(warm)}, client-visible gap median {gaps[len(gaps) // 2]} ms, "
                f"max {gaps[-1]} ms; failed {sum(s['client']['failed'] for s in warm)}, "
                f"503 {sum(s['client']['503'] for s in warm)}, hung {sum(s['client']['hung'] for s in warm)}; "
                f"cut {recut} of {sum(1 for r in records if r['kind'] == 'stream')} streams in the part"
            ),
        ]
    floor = [s for s in steps if s["step"].startswith(("floor_", "warm_"))]
    if floor:
        out += [
            "",
            (
                "| switch | gap ms | displaced finishing (drained) s | sleep s | wake + first completion s | "
                "the switch's own ms |"
            ),
            "|---|---|---|---|---|---|",
        ]
        own = []
        for s in floor:
            text = s.get("output", "")
            got = {
                k: float(m.group(1))
                for k, pat in (
                    ("drained", r"finished \(([\d.]+) s\)"),
                    ("sleep", r"sleeps \(level\d, ([\d.]+) s\)"),
                    ("wake", r"woke and answered a completion \(([\d.]+) s\)"),
                )
                if (m := re.search(pat, text))
            }
            if len(got) == 3:
                own.append(s["client"]["gap_ms"] - 1000 * sum(got.values()))
            out.append(
                f"| {s['step']} | {s['client']['gap_ms']} | {got.get('drained', '')} | {got.get('sleep', '')} | "
                f"{got.get('wake', '')} | {round(own[-1]) if len(got) == 3 else ''} |"
            )
        if own:
            own.sort()
            out.append(
                f"the switch's own part of the gap (gap - drained - sleep - wake with its first completion): "
                f"median {round(own[len(own) // 2])} ms, max {round(own[-1])} ms over {len(own)} switches"
            )
    for model, e in engine.items():
        out.append(
            f"vLLM's own words, {model}: init engine {e.get('init_engine')} s; sleep {e.get('sleep_s')} s; "
            f"wake {e.get('wake_s')} s; freed {sorted(set(e.get('sleep_freed', [])))}"
        )
    for s in steps:
        extra = {
            k: v
            for k, v in s.items()
            if k
            in (
                "killed_at_s",
                "converge_s",
                "hog_mib",
                "back_s",
                "old_gpu_procs_gone_s",
                "gpu_free_s",
                "agent_watch_lines",
            )
        }
        if extra:
            out.append(f"{s['step']}: {json.dumps(extra)[:600]}")
    return out + [""]


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("\n".join(report(arg)))
