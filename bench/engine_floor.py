"""The engine's own floor of a warm switch or an on-demand swap, from the engines' journals, and the
client through the front proxy (bench/warm_switch.py, bench/on_demand.py).

The stand-in (tests/standin/sleep_mode.py) logs what vLLM logs: "Waiting for in-flight requests to complete
before sleeping..." (sleep with mode=wait), "It took X seconds to fall asleep." and "It took X seconds to
wake up tags {...}."; each line carries journald's own microsecond timestamp. The floor of a switch is the
displaced engine's sleep seconds + the target's wake seconds + the first token (a 1-token completion on the
target's own port); the drain is the time the displaced engine waited for its in-flight requests before its
sleep began (the "Waiting ..." line to the sleep's start), part of the gap by design.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ASLEEP = re.compile(r"It took ([0-9.]+) seconds to fall asleep")
AWAKE = re.compile(r"It took ([0-9.]+) seconds to wake up")
WAITING = "Waiting for in-flight requests to complete before sleeping"


def load_prober() -> Any:
    """scripts/gpubox/prober.py (stdlib; the GPU-box scenario's witness), loaded from its path."""
    spec = importlib.util.spec_from_file_location("gpubox_prober", ROOT / "scripts/gpubox/prober.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def classify(prober: Any, rec: dict[str, Any]) -> str:
    """The prober's classification, stricter for streams: a stream is cut unless it ends with [DONE],
    finish_reason "length" and a usage chunk that counts all its tokens."""
    kind = str(prober.classify(rec))
    if kind == "ok" and rec["kind"] == "stream" and rec.get("usage_tokens") != prober.STREAM_TOKENS:
        return "cut"
    return kind


@dataclass
class Line:
    wall: float  # journald's realtime stamp, seconds since the epoch
    unit: str
    text: str


def engine_lines(host: Any, units: list[str]) -> list[Line]:
    """The engines' sleep/wake lines, from the test host's journal."""
    out = host.run(
        ["journalctl", "-o", "json", "--no-pager", *[a for u in units for a in ("-u", u)]], check=False
    ).stdout
    lines = []
    for raw in out.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        text = entry.get("MESSAGE")
        if not isinstance(text, str) or not (ASLEEP.search(text) or AWAKE.search(text) or WAITING in text):
            continue
        lines.append(Line(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, str(entry.get("_SYSTEMD_UNIT", "")), text))
    return sorted(lines, key=lambda x: x.wall)


def engine_steps(lines: list[Line], w0: float, w1: float) -> dict[str, Any]:
    """What the engines logged in [w0, w1]: the last sleep and wake (seconds, unit) and the drain before it."""
    inside = [x for x in lines if w0 <= x.wall <= w1]
    steps: dict[str, Any] = {
        "sleep_s": None,
        "wake_s": None,
        "drain_s": None,
        "slept": None,
        "woke": None,
        "sleep_called_at": None,
        "asleep_at": None,
        "woke_at": None,
    }
    waiting: dict[str, float] = {}
    for x in inside:
        if WAITING in x.text:
            waiting[x.unit] = x.wall
        elif m := ASLEEP.search(x.text):
            steps["sleep_s"], steps["slept"], steps["asleep_at"] = float(m.group(1)), x.unit, x.wall
            began = x.wall - float(m.group(1))
            steps["sleep_called_at"] = waiting.get(x.unit, began)
            if x.unit in waiting:
                steps["drain_s"] = round(max(0.0, began - waiting[x.unit]), 3)
        elif m := AWAKE.search(x.text):
            steps["wake_s"], steps["woke"], steps["woke_at"] = float(m.group(1)), x.unit, x.wall
    return steps


def first_token(address: str, port: int, model: str, max_tokens: int = 1) -> float | None:
    """Seconds of one completion (1 token: the first token) on the engine's own port (None: not a 200)."""
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": max_tokens})
    conn = http.client.HTTPConnection(address, port, timeout=30)
    try:
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return time.monotonic() - t0 if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


NVML_DIR = "/var/lib/standin-nvml"
FAKE_NVML_SOURCE = ROOT / "tests" / "standin" / "fake_nvml.c"


def standin_nvml(host: Any) -> str:
    """The test host's agent reads GPU memory through NVML, as on a GPU box: the stand-in libnvidia-ml.so.1
    (tests/standin/fake_nvml.c, the stand-in GPUs' state) built in the host, found by the agent's dynamic
    linker; call before the agent starts. Returns the host key that makes NVML a must."""
    host.run(
        f"mkdir -p {NVML_DIR} /etc/systemd/system/orchestrator-agent.service.d && gcc -shared -fPIC "
        f"-O2 -Wl,-soname,libnvidia-ml.so.1 -o {NVML_DIR}/libnvidia-ml.so.1 {FAKE_NVML_SOURCE}"
    )
    host.write_file(
        "/etc/systemd/system/orchestrator-agent.service.d/nvml.conf",
        f"[Service]\nEnvironment=LD_LIBRARY_PATH={NVML_DIR}\n",
    )
    return 'gpu_probe = "nvml"\n'


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"
