"""Figures of a run: the table printed at the end and bench/RESULTS.md (machine, date, commands)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.downtime import methods
from bench.downtime.footprint import Window
from bench.downtime.setup import Bench, BenchModel, Timing

OURS = "orchestrator"
LOCAL = "orchestrator-local"


@dataclass(frozen=True)
class Trial:
    method: str
    old: str
    new: str
    downtime_s: float
    command_s: float  # wall time of the whole command (includes work done while A still serves)
    floor_s: float  # S + L
    note: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # ours only: seconds per recorded phase

    @property
    def overhead(self) -> float:
        return self.downtime_s - self.floor_s


@dataclass
class Results:
    args: list[str]
    timing: Timing
    sizes_gb: list[float]
    trials: dict[str, list[Trial]] = field(default_factory=dict)
    agent: dict[str, Window] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    baseline: str = OURS  # what the staged switches compare to: A's switches in the same catalog
    load_before: tuple[str, float] = ("", 0.0)
    load_after: tuple[str, float] = ("", 0.0)


def load_now() -> tuple[str, float]:
    """(/proc/loadavg's three averages, CPU seconds all cores spent busy since boot)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]), busy


PHASES = ("stopping", "freeing", "installing", "starting", "checking")


def phase_rows(r: Results) -> list[list[str]]:
    tools = [m for m in (OURS, LOCAL) if r.trials.get(m)]
    return (
        [[p, *(f"{median([t.phases.get(p, 0.0) for t in r.trials[m]]):.3f}" for m in tools)] for p in PHASES]
        if tools
        else []
    )


def phase_head(r: Results) -> list[str]:
    return ["phase", *(f"{m} median s" for m in (OURS, LOCAL) if r.trials.get(m))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary_rows(r: Results) -> list[list[str]]:
    ours = median([t.overhead for t in r.trials.get(OURS, [])])
    rows = []
    for method, trials in r.trials.items():
        if method == "staged":
            continue
        over = median([t.overhead for t in trials])
        ratio = "1.0x" if method == OURS else (f"{over / ours:.1f}x" if ours > 0 else "n/a")
        rows.append(
            [
                method,
                str(len(trials)),
                f"{median([t.downtime_s for t in trials]):.3f}",
                f"{min(t.downtime_s for t in trials):.3f}-{max(t.downtime_s for t in trials):.3f}",
                f"{over:.3f}",
                ratio,
                f"{median([t.command_s for t in trials]):.2f}",
            ]
        )
    return rows


def ratio_lines(r: Results) -> list[str]:
    """Each other tool's median overhead as a multiple of each of ours."""
    ours = {m: median([t.overhead for t in r.trials[m]]) for m in (OURS, LOCAL) if r.trials.get(m)}
    out = []
    for method in ("ansible", "bash"):
        if r.trials.get(method):
            over = median([t.overhead for t in r.trials[method]])
            out.append(
                f"{method}'s median overhead = "
                + ", ".join(f"{over / o:.1f}x {m}'s" if o > 0 else f"n/a vs {m}" for m, o in ours.items())
            )
    return out


def staged_rows(r: Results) -> list[list[str]]:
    rows = []
    present = median([t.downtime_s for t in r.trials.get(r.baseline, [])])
    for size in r.sizes_gb:
        trials = [t for t in r.trials.get("staged", []) if t.note.startswith(f"{size:g} GB")]
        if not trials:
            continue
        d = median([t.downtime_s for t in trials])
        rows.append(
            [
                f"{size:g} GB",
                str(len(trials)),
                ", ".join(f"{t.downtime_s:.3f}" for t in trials),
                f"{d:.3f}",
                f"{d - present:+.3f}",
                ", ".join(f"{t.command_s:.1f}" for t in trials),
                f"{median([t.phases.get('staging', 0.0) for t in trials]):.2f}",
                f"{median([t.phases.get('installing', 0.0) for t in trials]):.3f}",
            ]
        )
    return rows


def agent_rows(r: Results) -> list[list[str]]:
    return [
        [
            name,
            f"{w.seconds:.1f}",
            f"{w.cpu_s:.3f}",
            f"{100 * w.cpu_s / w.seconds:.2f}",
            f"{w.rss_min_mib:.1f}",
            f"{w.rss_max_mib:.1f}",
        ]
        for name, w in r.agent.items()
    ]


SUMMARY_HEAD = [
    "method",
    "switches",
    "downtime median s",
    "min-max s",
    "overhead median s",
    "overhead vs ours",
    "command median s",
]
STAGED_HEAD = [
    "weights",
    "switches",
    "downtime s (each)",
    "median s",
    "vs weights-present median",
    "command s (each)",
    "staging phase median s",
    "installing median s",
]
AGENT_HEAD = ["agent window", "seconds", "CPU s", "CPU % of one core", "RSS min MiB", "RSS max MiB"]


def _plain(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)])


def _md(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]
    )


def table(r: Results) -> str:
    floor = r.timing.stop_s + r.timing.load_s
    parts = [
        (
            f"switch downtime (floor S + L = {r.timing.stop_s:g} + {r.timing.load_s:g} = {floor:g} s; "
            f"load average {r.load_before[0]} -> {r.load_after[0]}, cores busy {_busy_pct(r):.0f}%)"
        ),
        _plain(SUMMARY_HEAD, summary_rows(r)),
    ]
    parts += ratio_lines(r)
    if phase_rows(r):
        parts += ["", "orchestrator phases (median s)", _plain(phase_head(r), phase_rows(r))]
    if staged_rows(r):
        parts += [
            "",
            "switches to models whose weights were staged inside the switch",
            _plain(STAGED_HEAD, staged_rows(r)),
        ]
    if r.agent:
        parts += ["", "agent footprint (python -m orchestrator agent)", _plain(AGENT_HEAD, agent_rows(r))]
    return "\n".join(parts)


def example_commands(bench: Bench, a: BenchModel, b: BenchModel) -> dict[str, str]:
    """One switch A -> B per tool, as run (the unit text, identical for all, shown as a placeholder)."""
    unit = bench.unit_text(b)
    ansible = methods.ansible_command(bench, a, b)
    ansible[-1] = ansible[-1].replace(json.dumps(unit), '"<the unit text>"')
    env = {**methods.bash_env(bench, a, b), "UNIT_TEXT": "$(cat unit-file)"}
    cmds = {
        "orchestrator": shlex.join(methods.orchestrator_command(bench, b)),
        "orchestrator-local": shlex.join(methods.local_command(bench, b)),
        "ansible": "ANSIBLE_CONFIG=bench/baselines/ansible/ansible.cfg " + shlex.join(ansible),
        "bash": " ".join(f'{k}="{v}"' if k == "UNIT_TEXT" else f"{k}={shlex.quote(v)}" for k, v in env.items())
        + " bash bench/baselines/bash/switch.sh",
    }
    keys = str(bench.host.key_path.parent)
    return {k: v.replace(str(bench.work), "$WORK").replace(keys, "$KEYS") for k, v in cmds.items()}


def _busy_pct(r: Results) -> float:
    cores = os.cpu_count() or 1
    return 100 * (r.load_after[1] - r.load_before[1]) / max(r.elapsed_s * cores, 1e-9)


def _machine(r: Results) -> list[str]:
    mem = next(
        (ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")), "0"
    )
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    ansible = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()[:1]
    return [
        (
            f"- machine: {platform.node()}, {os.cpu_count()} CPUs ({cpu}), {int(mem) / 2**20:.1f} GiB RAM, "
            f"{platform.platform()}"
        ),
        (
            f"- Python {platform.python_version()}; {ansible[0] if ansible else 'ansible-playbook not found'}; "
            f"{subprocess.run(['ssh', '-V'], capture_output=True, text=True, check=False).stderr.strip()}"
        ),
        (
            f"- machine load (other sessions share it): load average {r.load_before[0]} at start, "
            f"{r.load_after[0]} at the end; all cores busy {_busy_pct(r):.0f}% of the run"
        ),
        (
            "- test host: systemd-nspawn container (systemd, sshd) on a loopback address of the same machine "
            "(tests/hosts); GPUs: the stand-in nvidia-smi; engine: tests/standin/vllm_compat.py -> openai_server.py"
        ),
    ]


def render(r: Results) -> str:
    t = r.timing
    floor = t.stop_s + t.load_s
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Switch downtime: orchestrator vs Ansible vs bash",
        "",
        (
            f"Written by `bench/downtime/switch_downtime.py` on {now} ({r.elapsed_s:.0f} s run). Re-run: "
            f"`{' '.join(['.venv/bin/python bench/downtime/switch_downtime.py', *map(shlex.quote, r.args)])}`."
        ),
        "",
        *_machine(r),
        "",
        (
            "Through `--host ssh://` (the relay and the box's agent) beside in-process, with the hand-script "
            "floor: [REMOTE.md](remote/REMOTE.md) (`bench/remote/remote_overhead.py`)."
        ),
        "",
        "## Method",
        "",
        (
            f"- Stand-in engine: load time L = {t.load_s:g} s (port closed until loaded, like vLLM), stop time "
            f"S = {t.stop_s:g} s (port closed at SIGTERM, exit S later). Floor = S + L = {floor:g} s."
        ),
        (
            "- Prober: one client per model port, a fresh connection and a 1-token `/v1/completions` every 50 ms; "
            "a good answer is HTTP 200. Downtime = longest gap between good answers (from either port) "
            "during the switch = A's last good answer to B's first. Overhead = downtime - (S + L)."
        ),
        (
            "- Every tool writes the same unit (the text the orchestrator renders) and starts the same engine on "
            "the same GPUs (0-3), on the same host in the same run, in rounds of one switch per tool (each to "
            "the model not serving), so load drifts hit every tool. `orchestrator`: the CLI on this machine, "
            "ssh transport (fabric/paramiko). `orchestrator-local`: the same CLI started on the host over ssh, "
            "local transport (systemd over D-Bus, no SSH inside the switch), as the agent runs on a GPU box. "
            "`via agent`: the CLI through a running agent (ssh transport). Ours: health poll every 0.2 s (default "
            "`health_interval_s`), ready = /health 200 + model listed + one real completion. Ansible and bash: "
            "stop, poll nvidia-smi until the GPUs hold < 1 GiB, write the unit, daemon-reload, start, then "
            "poll /health with a 1 s delay (`uri` ... `until`/`delay: 1`; `curl` + `sleep 1`)."
        ),
        (
            "- Overhead includes starting two Python interpreters per engine start (vllm_compat execs the "
            "stand-in), which every tool pays alike."
        ),
        "",
        "## Downtime and overhead",
        "",
        _md(SUMMARY_HEAD, summary_rows(r)),
        "",
        (
            "Ratio = the tool's median overhead / ours. Command = wall time of the whole command, including "
            "work done while A still serves (CLI start-up, SSH connect, preflight, staging, enablement)."
        ),
        "",
        *(f"- {line}" for line in ratio_lines(r)),
        "",
    ]
    if phase_rows(r):
        lines += [
            (
                "Our phases (median seconds, as recorded in the orchestrator's history; the downtime spans "
                "the end of `stopping` (S), `freeing`, `installing`, `starting` and the engine's load inside "
                "`checking`):"
            ),
            "",
            _md(phase_head(r), phase_rows(r)),
            "",
        ]
    if r.trials.get("staged"):
        lines += [
            "## Switches that stage weights first",
            "",
            (
                "Models not yet on the host: generated safetensors shards served by the local hub stand-in "
                "(tests/hubstub), downloaded and verified by the stage worker while A still serves. "
                "The baseline (weights present) is the switches back to A in the same run and catalog (row "
                f"`{r.baseline}` above). "
                "The command time and the `staging` phase grow with the size; the downtime should not. "
                "Each of these switches is also the model's first deploy, so its unit is new: `installing` "
                "writes it and reloads systemd inside the downtime, which switches between known units skip "
                "(compare the installing column with the phase table above). The staged models sit in the "
                "catalog on the same GPUs only for this part, so the main comparison runs with A and B alone: "
                "each managed unit on the GPUs costs SSH round trips inside the downtime (see the two "
                "orchestrator rows)."
            ),
            "",
            _md(STAGED_HEAD, staged_rows(r)),
            "",
        ]
    else:
        lines += ["## Switches that stage weights first", "", "Not run (--skip-staging).", ""]
    if r.agent:
        lines += [
            "## Agent footprint",
            "",
            (
                "`python -m orchestrator agent` on the controller (ssh transport to the host); RSS sampled every "
                "0.1 s, CPU = user + system time of the process over the window (10 ms ticks). Idle includes "
                "its health watch (every 15 s, the default `watch_interval_s`) and schedule loops; each switch "
                "window is one `orchestrator switch` through its socket."
            ),
            "",
            _md(AGENT_HEAD, agent_rows(r)),
            "",
        ]
    else:
        lines += ["## Agent footprint", "", "Not run (--skip-agent).", ""]
    lines += ["## Commands (one switch A -> B each; $WORK: the run's scratch folder, $KEYS: the test host's keys)", ""]
    lines += [f"- {k}: `{v}`" for k, v in r.commands.items()]
    lines += [
        "",
        "## Every switch",
        "",
        _md(
            ["method", "switch", "downtime s", "overhead s", "command s", "note"],
            [
                [
                    x.method,
                    f"{x.old} -> {x.new}",
                    f"{x.downtime_s:.3f}",
                    f"{x.overhead:+.3f}",
                    f"{x.command_s:.2f}",
                    x.note,
                ]
                for ts in r.trials.values()
                for x in ts
            ],
        ),
        "",
    ]
    return "\n".join(lines)


OWN_SECTIONS = (
    "Method",
    "Downtime and overhead",
    "Switches that stage weights first",
    "Agent footprint",
    "Commands",
    "Every switch",
)


def merge(old: str, new: str) -> str:
    """new, followed by the sections of old (``## `` headings) this script never writes: other
    benchmarks add their own sections to RESULTS.md, and a re-run must not drop them (nor keep a
    stale section of its own that this run skipped)."""

    def sections(text: str) -> list[tuple[str, str]]:
        parts = ("\n" + text).split("\n## ")[1:]
        return [(part.split("\n", 1)[0].strip(), "## " + part.rstrip("\n") + "\n") for part in parts]

    kept = [body for head, body in sections(old) if not head.startswith(OWN_SECTIONS)]
    return new.rstrip("\n") + "\n" + "".join("\n" + body for body in kept)
