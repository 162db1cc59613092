#!/usr/bin/env python3
"""The GPU-box scenario: runs INSIDE the box (the CLI venv's python), as an operator and a client would.

    python scenario.py A|B OUTDIR

The operator is the `orchestrator` CLI on the box (the agent's socket); the client is prober.py through the
front proxy (a completion every 50 ms, a 64-token stream every second) during every step. After each step:
`status --json`, `history --json`, nvidia-smi (by PID) and the units' systemd state, kept in OUTDIR/steps.jsonl
with the step's outcome, what was expected, and the prober's counts for the step's window.

A: cold switch to big; cold switch to small (big sleeps); 10 warm switches back and forth.
C: the fixes in one call: cold, cold, 2 warm switches, the wedge, SIGKILL of an API server, stop.
D: doctor; cold big; small beside big; 4 wakes beside; mid beside; 8 sleep-then-wake warm switches; a rollback.
E: on demand (start, then 2 wakes of "od"); the wedge; SIGKILL of the agent at each warm phase; SIGKILL of an
   API server; stop of everything.
B: a warm rollback; a wedged wake (a foreign process holds the memory the target needs); SIGKILL of the agent
   as each warm phase begins; SIGKILL of the serving vLLM API server alone; stop of both models (GPU free by
   PID). Each line `STEP name verdict ...` says whether what happened is what the product promises.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from prober import Prober, summarise

CLI = "/opt/orch-cli/bin/orchestrator"
DRY = os.environ.get("GPUBOX_DRY") == "1"
MODELS = ("big", "small", "mid", "od")
T0 = time.monotonic()
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/wlogs/out")
os.environ.setdefault("ORCHESTRATOR_CONFIG", "/etc/orchestrator/deploy.toml")  # the box's, as an operator there


def log(msg: str) -> None:
    print(f"[scenario +{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def sh(*cmd: str, timeout: float = 900) -> tuple[int, str]:
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr).strip()


def cli(*args: str, timeout: float = 900) -> tuple[int, str]:
    return sh(CLI, *args, timeout=timeout)


def cli_json(*args: str) -> Any:
    rc, out = cli(*args, "--json", timeout=120)
    try:
        return json.loads(out)
    except ValueError:
        return {"rc": rc, "text": out[-2000:]}


def status() -> dict[str, Any]:
    doc = cli_json("status")
    return doc.get("hosts", {}).get("box", doc) if isinstance(doc, dict) else {"raw": doc}


def gpus() -> dict[str, Any]:
    _, apps = sh("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
    _, mem = sh("nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
    procs = []
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            pid = int(parts[0])
            try:
                cg = Path(f"/proc/{pid}/cgroup").read_text().strip().rsplit("/", 1)[-1]
            except OSError:
                cg = "gone"
            procs.append(
                {"pid": pid, "name": parts[1], "mib": int(parts[2]) if parts[2].isdigit() else parts[2], "unit": cg}
            )
    return {"gpus": mem.splitlines(), "procs": procs}


def units() -> dict[str, str]:
    out = {}
    for m in MODELS:
        _, text = sh("systemctl", "show", f"vllm-{m}.service", "-p", "ActiveState,SubState,MainPID,NRestarts")
        out[m] = " ".join(text.split())
    _, text = sh("systemctl", "show", "orchestrator-agent.service", "-p", "ActiveState,MainPID,NRestarts")
    out["agent"] = " ".join(text.split())
    return out


def awake(st: dict[str, Any]) -> list[str]:
    """Models the residency calls serving (awake); falls back to the serving pointer."""
    res = st.get("residency") or {}
    models = res.get("models") if isinstance(res, dict) else None
    if isinstance(models, list):
        return sorted(m.get("model", "?") for m in models if m.get("state") == "serving")
    serving = st.get("serving") or {}
    return [serving["model"]] if serving.get("model") else []


def serving_model(st: dict[str, Any]) -> str | None:
    return (st.get("serving") or {}).get("model")


def wait_for(what: str, pred: Callable[[dict[str, Any]], bool], timeout: float) -> tuple[bool, float, dict[str, Any]]:
    """Poll `status --json` until pred holds (or the timeout): (held, seconds, last status)."""
    t, st = time.monotonic(), {}
    while time.monotonic() - t < timeout:
        try:
            st = status()
        except subprocess.TimeoutExpired:
            st = {"error": "status timed out"}
        if pred(st):
            return True, time.monotonic() - t, st
        time.sleep(0.5)
    log(f"  gave up waiting for {what} after {timeout:.0f} s")
    return False, time.monotonic() - t, st


def settled(model: str | None = None) -> Callable[[dict[str, Any]], bool]:
    """No operation running, one model serving and healthy (that model, if named)."""

    def pred(st: dict[str, Any]) -> bool:
        s = st.get("serving") or {}
        return not st.get("running") and bool(s.get("healthy")) and (model is None or s.get("model") == model)

    return pred


class Run:
    def __init__(self, part: str) -> None:
        self.part = part
        self.prober = Prober("127.0.0.1", 8000, "chat").start()
        self.steps: list[dict[str, Any]] = []
        OUT.mkdir(parents=True, exist_ok=True)
        self.file = (OUT / "steps.jsonl").open("a")

    def step(
        self, name: str, expect: str, fn: Callable[[], dict[str, Any]], verdict: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        log(f"STEP {name}: {expect}")
        t0 = time.monotonic()
        try:
            got = fn()
        except Exception as exc:  # noqa: BLE001 - a harness error is a result too: keep going with the next step
            got = {"harness_error": f"{type(exc).__name__}: {exc}"}
        t1 = time.monotonic()
        time.sleep(1.0)  # requests started in the window finish; counted by start time
        row = {
            "part": self.part,
            "step": name,
            "expect": expect,
            "t0": t0,
            "t1": t1,
            "seconds": round(t1 - t0, 2),
            **got,
            "client": summarise(self.prober.records, t0, t1),
            "status": status(),
            "gpu": gpus(),
            "units": units(),
            "history": cli_json("history", "--limit", "2"),
            # what an operator reads, for the docs
            "status_text": cli("status", timeout=60)[1],
            "history_text": cli("history", "--limit", "3", timeout=60)[1],
        }
        row["verdict"] = "PASS" if verdict(row) else "FAIL"
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        c = row["client"]
        log(
            f"STEP {name} {row['verdict']} in {row['seconds']} s: "
            + ", ".join(f"{k}={v}" for k, v in got.items() if k not in ("output",))[:600]
            + f" | client ok={c['ok']} 503={c['503']} failed={c['failed']} cut={c['cut']} hung={c['hung']}"
            f" gap={c['gap_ms']} ms {c['bad_statuses'] or ''} | serving={serving_model(row['status'])}"
            f" gpu={[(p['pid'], p['unit'], p['mib']) for p in row['gpu']['procs']]}"
        )
        self.steps.append(row)
        return row

    def finish(self) -> int:
        records = self.prober.stop()
        (OUT / f"prober-{self.part}.json").write_text(json.dumps(records))
        fails = [s["step"] for s in self.steps if s["verdict"] != "PASS"]
        total = summarise(records, 0, time.monotonic())
        log(
            f"PART {self.part}: {len(self.steps)} steps, {len(fails)} not as promised {fails}; client over the "
            f"part: {total}"
        )
        return 1 if fails else 0


# -- steps ------------------------------------------------------------------------------------------------
def switch(model: str, *extra: str, timeout: float = 900) -> dict[str, Any]:
    t = time.monotonic()
    try:
        rc, out = cli("switch", model, *extra, timeout=timeout)
    except subprocess.TimeoutExpired:
        rc, out = -1, f"switch {model}: no answer within {timeout:.0f} s"
    res = {"rc": rc, "switch_s": round(time.monotonic() - t, 2), "output": out[-3000:]}
    m = re.search(r"revision (\d+) \((\S+)\) on box: (\w+)", out)
    if m:
        res["outcome"] = m.group(3)
    return res


def phases(row: dict[str, Any]) -> dict[str, Any]:
    hist = row.get("history")
    rows = hist if isinstance(hist, list) else (hist or {}).get("rows", [])
    return rows[0] if rows else {}


def ok_switch(model: str, warm: bool) -> Callable[[dict[str, Any]], bool]:
    def verdict(row: dict[str, Any]) -> bool:
        c = row["client"]
        clean = c["failed"] == 0 and c["cut"] == 0 and c["hung"] == 0 and (not warm or c["503"] == 0)
        return row.get("rc") == 0 and serving_model(row["status"]) == model and clean

    return verdict


def part_a(run: Run, warm: int = 10) -> None:
    if not cold_big(run):
        return
    run.step(
        "cold_small",
        "cold start of small on the same GPU: big sleeps (level1); 503 + Retry-After in the gap",
        lambda: switch("small"),
        ok_switch("small", warm=False),
    )
    for i in range(warm):
        target = MODELS[i % 2]
        run.step(
            f"warm_{i + 1}_{target}",
            "warm switch: 0 failed, 0 503, 0 cut; the gap near vLLM's sleep + wake",
            lambda t=target: switch(t),
            ok_switch(target, warm=True),
        )


def hog_start(mib: int) -> subprocess.Popen[str]:
    """A foreign process holding `mib` MiB of GPU 0 until its stdin closes."""
    if DRY:
        code = (
            "import json, os, sys\n"
            "d = '/run/standin-gpu'\n"
            "json.dump({'pid': os.getpid(), 'name': 'python3', 'gpus': [0], 'mib_per_gpu': int(sys.argv[1])},"
            " open(f'{d}/{os.getpid()}.json', 'w'))\n"
            "print('holding', flush=True)\nsys.stdin.read()\n"
        )
        cmd = ["/usr/bin/python3", "-c", code, str(mib)]
    else:
        code = (
            "import sys, torch\nx = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda')\n"
            "print('holding', flush=True)\nsys.stdin.read()\n"
        )
        cmd = ["/opt/torch/.venv/bin/python3", "-c", code, str(mib)]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.readline()
    return p


def wedge() -> dict[str, Any]:
    """small serves, big asleep; a foreign process takes so much that big cannot wake after small sleeps, but
    small could wake again: the switch to big must not leave the box without small, nor a client hanging."""
    total = int(gpus()["gpus"][0].split(",")[2])
    hog_mib = int(total * 0.42)  # 140 GiB GPU: 59 GiB; big needs 0.6 of it, small 0.3
    hog = hog_start(hog_mib)
    try:
        res = switch("big", timeout=300)
        held, secs, _ = wait_for("small serving again", settled("small"), 45)
        res.update(hog_mib=hog_mib, hog_pid=hog.pid, back_to_small=held, back_s=round(secs, 1))
    finally:
        assert hog.stdin is not None
        hog.stdin.close()
        hog.wait(30)
    return res


def kill_agent_at(phase: str, target: str) -> dict[str, Any]:
    """Start a warm switch to `target`; SIGKILL the agent's whole unit as `phase` begins; wait until it converges."""
    t = time.monotonic()
    p = subprocess.Popen([CLI, "switch", target], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    killed_at = None
    lines = []
    for line in p.stdout:
        lines.append(line.rstrip())
        if re.search(rf"#\d+ {target}: {phase}:", line):
            sh("systemctl", "kill", "-s", "SIGKILL", "orchestrator-agent.service")
            killed_at = round(time.monotonic() - t, 2)
            break
    p.kill()
    p.wait()
    held, secs, st = wait_for("one model serving, nothing running", settled(), 180)
    return {
        "killed_at_s": killed_at,
        "converged": held,
        "converge_s": round(secs, 1),
        "serving": serving_model(st),
        "awake": awake(st),
        "output": "\n".join(lines[-20:]),
    }


def kill_api() -> dict[str, Any]:
    """SIGKILL the serving engine's API server (its unit's main PID) alone; it must come back, orphan-free."""
    st = status()
    model = serving_model(st) or "small"
    _, pid = sh("systemctl", "show", "-p", "MainPID", "--value", f"vllm-{model}.service")
    before = gpus()
    os.kill(int(pid), signal.SIGKILL)
    t = time.monotonic()
    freed_s = None
    while time.monotonic() - t < 120:  # the EngineCore (another PID of the unit) must go too
        now = gpus()["procs"]
        if not any(
            p["unit"] == "gone"
            or (p["unit"] == f"vllm-{model}.service" and p["pid"] != int(pid))
            and p["pid"] in [q["pid"] for q in before["procs"]]
            for p in now
        ):
            freed_s = round(time.monotonic() - t, 1)
            break
        time.sleep(0.2)
    held, secs, st = wait_for(f"{model} serving again", settled(model), 240)
    _, journal = sh("journalctl", "-u", "orchestrator-agent", "-n", "300", "--no-pager", "-o", "cat")
    watch = [line for line in journal.splitlines() if "watch" in line or "unhealthy" in line or "restart" in line]
    return {
        "model": model,
        "killed_pid": int(pid),
        "old_gpu_procs_gone_s": freed_s,
        "back": held,
        "back_s": round(secs, 1),
        "agent_watch_lines": watch[-15:],
    }


def stop_all() -> dict[str, Any]:
    res: dict[str, Any] = {}
    for m in MODELS:
        rc, out = cli("stop", m)
        res[f"stop_{m}"] = {"rc": rc, "output": out[-500:]}
    t = time.monotonic()
    while gpus()["procs"] and time.monotonic() - t < 20:
        time.sleep(0.2)
    res["gpu_free_s"] = round(time.monotonic() - t, 2)
    return res


def faults(run: Run) -> None:
    """small serving: the wedge, SIGKILL of the serving API server, then stop of both (the sleeper too)."""
    run.step(
        "wedge",
        "a foreign process holds the memory big needs: the switch is refused before anything "
        "sleeps (or rolled back), small serves, no client hangs, the route never on a sleeper",
        wedge,
        lambda r: r.get("back_to_small") is True and r["client"]["hung"] == 0 and r["client"]["failed"] == 0,
    )
    if run.part in ("B", "E"):
        agent_kills(run)
    run.step(
        "kill_api",
        "SIGKILL of the serving API server alone: no orphan on the GPU, systemd restarts it and the "
        "watch leaves the load alone, clients get 503 + Retry-After or wait",
        kill_api,
        lambda r: (
            r.get("back") is True
            and r.get("old_gpu_procs_gone_s") is not None
            and r["client"]["hung"] == 0
            and r["client"]["failed"] == 0
        ),
    )
    run.step(
        "stop",
        "stop both models, the sleeper too: the GPU holds nothing (by PID)",
        stop_all,
        lambda r: not r["gpu"]["procs"] and all(v["rc"] == 0 for k, v in r.items() if k.startswith("stop_")),
    )


def agent_kills(run: Run) -> None:
    target = "big" if serving_model(status()) != "big" else "small"
    for phase in ("sleeping", "verifying", "waking", "routing"):
        run.step(
            f"kill_agent_{phase}",
            f"SIGKILL of the agent as `{phase}` begins: converges, one model awake",
            lambda ph=phase, t=target: kill_agent_at(ph, t),
            lambda r: r.get("converged") is True and len(r.get("awake", [])) == 1 and r["client"]["hung"] == 0,
        )
        target = "small" if serving_model(status()) == "big" else "big"
    if serving_model(status()) != "small":
        run.step("to_small_again", "warm switch to small", lambda: switch("small"), ok_switch("small", warm=True))


def part_b(run: Run) -> None:
    warm_rollback(run)
    if serving_model(status()) != "small":
        run.step("to_small", "warm switch to small", lambda: switch("small"), ok_switch("small", warm=True))
    faults(run)


def part_c(run: Run) -> None:
    """The fixes, in one device call: cold, cold, two warm switches, the wedge, SIGKILL of an API server, stop."""
    part_a(run, warm=2)
    if serving_model(status()) == "small":
        faults(run)


# -- D and E: the beside-start, the warm floor, on demand ------------------------------------------------
def beside_ok(model: str) -> Callable[[dict[str, Any]], bool]:
    """A switch whose target fits awake beside what serves: no gap at all (0 503), the plan says beside."""

    def verdict(row: dict[str, Any]) -> bool:
        return ok_switch(model, warm=True)(row) and "beside" in row.get("output", "")

    return verdict


def doctor_json() -> dict[str, Any]:
    t = time.monotonic()
    rc, out = cli("doctor", "--json", timeout=300)
    (OUT / "doctor.json").write_text(out)
    return {"rc": rc, "doctor_s": round(time.monotonic() - t, 1), "output": out[-3000:]}


def doctor() -> dict[str, Any]:
    rc, out = cli("doctor", "--json", timeout=300)
    (OUT / "doctor.json").write_text(out)
    rc_text, text = cli("doctor", timeout=300)
    (OUT / "doctor.txt").write_text(text)
    return {"rc": rc, "rc_text": rc_text, "output": text[-3000:]}


def gpu_probe() -> dict[str, Any]:
    """bench/gpu_probe/bench.py --real with the CLI's python (the product's adapters): both probes' figures."""
    if DRY:
        return {
            "rc": 0,
            "output": "equal processes: True; GPU used MiB apart by at most 0\n(dry run: no driver here, not measured)",
        }
    rc, out = sh(
        str(Path(CLI).parent / "python"),
        str(Path(__file__).parent / "gpu_probe_bench.py"),
        "--real",
        "--calls",
        "200",
        timeout=300,
    )
    (OUT / "gpu_probe.txt").write_text(out)
    return {"rc": rc, "output": out[-3000:]}


def cold_big(run: Run) -> bool:
    """The cold start of big; False (logged) when it does not serve: the rest of a part cannot run."""
    first = run.step(
        "cold_big",
        "cold start of big; clients get 503 + Retry-After until it serves, none fails",
        lambda: switch("big"),
        ok_switch("big", warm=False),
    )
    if serving_model(first["status"]) != "big":
        log("big does not serve: the rest of the part cannot run (device time is scarce)")
        return False
    return True


def warm_rollback(run: Run) -> None:
    before = serving_model(status())
    run.step(
        "warm_rollback",
        "rollback of the last warm switch: warm, 0 failed, 0 503",
        _rollback,
        lambda r: (
            r.get("rc") == 0
            and serving_model(r["status"]) != before
            and r["client"]["failed"] == 0
            and r["client"]["hung"] == 0
            and r["client"]["503"] == 0
        ),
    )


def probe_step(run: Run) -> None:
    run.step(
        "gpu_probe",
        "NVML against nvidia-smi on the real GPU while big holds it: equal processes, GPU totals within a MiB",
        gpu_probe,
        lambda r: (
            r.get("rc") == 0
            and re.search(
                r"equal processes: True; GPU used MiB apart by at most [01]$", r.get("output", ""), flags=re.MULTILINE
            )
            is not None
        ),
    )


def proxy_loads() -> int:
    """HAProxy's "Loading success" lines so far: its start and every reload."""
    _, j = sh("journalctl", "-u", "orchestrator-proxy.service", "--no-pager", "-o", "cat")
    return j.count("Loading success")


def part_f(run: Run, floor: int = int(os.environ.get("GPUBOX_FLOOR", "6"))) -> None:
    """The round's merged code in what device time is left: doctor (one engine probe for the four models of one
    environment), cold big, gpu_probe, mid (big sleeps: they do not fit awake together), `floor` warm switches
    big <-> mid whose route moves through HAProxy's runtime API (no reload), a warm rollback."""
    if os.environ.get("GPUBOX_DOCTOR", "1") == "1":  # 0: the device time left does not cover it
        run.step("doctor", "doctor's report on the real box: one engine probe", doctor_json, lambda r: r["rc"] == 0)
    if not cold_big(run):
        return
    probe_step(run)
    run.step(
        "cold_mid",
        "mid starts while big sleeps (no room for both awake)",
        lambda: switch("mid"),
        ok_switch("mid", warm=False),
    )
    loads = proxy_loads()
    for i in range(floor):
        target = ("big", "mid")[i % 2]
        run.step(
            f"floor_{i + 1}_{target}",
            "warm switch, route moved by the runtime API: 0 failed, 0 503, 0 cut; gap near vLLM's sleep + wake",
            lambda t=target: switch(t),
            ok_switch(target, warm=True),
        )
    run.step(
        "no_reload",
        "the warm switches moved the route without one HAProxy reload",
        lambda: {"reloads": proxy_loads() - loads},
        lambda r: r["reloads"] == 0,
    )
    warm_rollback(run)


def part_d(run: Run, floor: int = 8) -> None:
    """doctor; cold big; small beside big (no gap); 4 wakes beside; mid beside small; `floor` warm switches
    big <-> mid (they do not fit together: sleep, then wake); a warm rollback."""
    run.step("doctor", "doctor's report on the real box: no fail", doctor, lambda r: r.get("rc") == 0)
    if not cold_big(run):
        return
    probe_step(run)
    run.step(
        "beside_small",
        "small fits awake beside big: starts beside, checked, route moves, big sleeps: no gap",
        lambda: switch("small"),
        beside_ok("small"),
    )
    for i in range(4):
        target = ("big", "small")[i % 2]
        run.step(
            f"beside_wake_{i + 1}_{target}",
            "a sleeper that fits beside wakes beside: no gap",
            lambda t=target: switch(t),
            beside_ok(target),
        )
    run.step(
        "beside_mid",
        "mid (0.5) fits beside small (0.3) with big asleep: cold start beside, no gap",
        lambda: switch("mid"),
        beside_ok("mid"),
    )
    for i in range(floor):
        target = ("big", "mid")[i % 2]
        run.step(
            f"floor_{i + 1}_{target}",
            "warm switch (sleep, then wake): 0 failed, 0 503, 0 cut; gap near vLLM's sleep + wake",
            lambda t=target: switch(t),
            ok_switch(target, warm=True),
        )
    warm_rollback(run)


def ask_od(timeout: float = 600) -> dict[str, Any]:
    """One completion for "od" through the proxy: held while the agent starts or wakes it."""
    import http.client

    t = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps({"model": "od", "prompt": "hi", "max_tokens": 4}),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        body = resp.read()[:300].decode("utf-8", "replace")
        return {"od_status": resp.status, "od_wait_s": round(time.monotonic() - t, 3), "od_body": body}
    except OSError as exc:
        return {"od_status": None, "od_wait_s": round(time.monotonic() - t, 3), "od_error": str(exc)}
    finally:
        conn.close()


def residency_of(model: str) -> str | None:
    res = status().get("residency") or {}
    for m in res.get("models", []) if isinstance(res, dict) else []:
        if m.get("model") == model:
            return m.get("state")
    return None


def part_e(run: Run) -> None:
    """On demand (a request for od starts it, later wakes it), the wedge, SIGKILL of the agent at each warm phase,
    SIGKILL of an API server, stop of everything (GPU free by PID)."""
    run.step(
        "demand_start",
        "a request for od (stopped) is held while the agent starts it, then answered 200",
        ask_od,
        lambda r: r.get("od_status") == 200 and r["client"]["hung"] == 0,
    )
    run.step(
        "back_to_chat",
        "switch back to big: od sleeps (warm or beside), chat serves again",
        lambda: switch("big"),
        lambda r: r.get("rc") == 0 and serving_model(r["status"]) == "big" and r["client"]["hung"] == 0,
    )
    for i in range(2):

        def wake_od() -> dict[str, Any]:
            res: dict[str, Any] = {"od_before": residency_of("od")}
            res.update(ask_od())
            if res.get("od_status") == 429 and "keeps its GPUs" in res.get("od_body", ""):
                # The policy (run 3 met it): a lone request does not displace a busier model; it is told so
                # at once with Retry-After, and asks again later as a client would.
                res["refused"] = {k: res.pop(k) for k in ("od_status", "od_wait_s", "od_body")}
                time.sleep(3)
                res.update(ask_od())
            return res

        run.step(
            f"demand_wake_{i + 1}",
            "a request for od (asleep) is held while the agent wakes it (waits about sleep + wake), or refused at "
            "once (429 model_queue_full) while chat is busier and woken when asked again",
            wake_od,
            lambda r: (
                r.get("od_status") == 200
                and r.get("od_before") == "asleep"
                and r["client"]["hung"] == 0
                and (r.get("refused") is None or r["refused"]["od_wait_s"] < 0.5)
            ),
        )
        run.step(
            f"chat_again_{i + 1}",
            "switch back to big",
            lambda: switch("big"),
            lambda r: r.get("rc") == 0 and serving_model(r["status"]) == "big" and r["client"]["hung"] == 0,
        )
    if serving_model(status()) != "small":
        run.step(
            "to_small",
            "warm switch to small",
            lambda: switch("small"),
            lambda r: (
                r.get("rc") == 0
                and serving_model(r["status"]) == "small"
                and r["client"]["hung"] == 0
                and r["client"]["failed"] == 0
            ),
        )
    faults(run)


def _rollback() -> dict[str, Any]:
    t = time.monotonic()
    rc, out = cli("rollback")
    return {"rc": rc, "switch_s": round(time.monotonic() - t, 2), "output": out[-3000:]}


def engine_timings() -> dict[str, Any]:
    """vLLM's own words: start, sleep and wake times from the units' journals."""
    out: dict[str, Any] = {}
    for m in MODELS:
        _, j = sh("journalctl", "-u", f"vllm-{m}.service", "--no-pager", "-o", "cat")
        out[m] = {
            "wake_s": [float(x) for x in re.findall(r"It took ([\d.]+) seconds to wake up", j)],
            "sleep_freed": re.findall(r"Sleep mode freed ([\d.]+ GiB)", j),
            "init_engine": re.findall(r"init engine .* took ([\d.]+) s", j),
            "sleep_s": [float(x) for x in re.findall(r"It took ([\d.]+) seconds to fall asleep", j)],
        }
    return out


def main() -> int:
    part = sys.argv[1]
    run = Run(part)
    log(f"part {part}; status before: serving={serving_model(status())}; gpu={gpus()}")
    {"A": part_a, "B": part_b, "C": part_c, "D": part_d, "E": part_e, "F": part_f}[part](run)
    rc = run.finish()
    (OUT / f"engine-{part}.json").write_text(json.dumps(engine_timings(), indent=1))
    log(f"engine timings: {json.dumps(engine_timings())}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
