"""The stand-in engine's sleep mode follows vLLM 0.25.1 (its source and the H200 runs), over real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hosts.wait import wait_for
from tests.standin import StandinServer

NAME = "m8"
NVSMI = Path(__file__).parent / "standin" / "nvidia_smi.py"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
TOTAL_MIB, FULL_MIB, RESIDUE_MIB = 20000, 15000, 1816


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    d = tmp_path / "gpu"
    d.mkdir()
    (d / "gpus.json").write_text(json.dumps({"count": 2, "memory_mib": TOTAL_MIB, "name": "NVIDIA H200"}))
    return d


@pytest.fixture
def start(gpu_dir: Path) -> Iterator[Callable[..., StandinServer]]:
    started: list[StandinServer] = []

    def _start(*args: str, env: dict[str, str] | None = DEV, sleep_mode: bool = True) -> StandinServer:
        flags = ["--enable-sleep-mode"] if sleep_mode else []
        s = StandinServer(
            "--served-name",
            NAME,
            "--gpus",
            "0",
            "--gpu-mib",
            str(FULL_MIB),
            "--gpu-state-dir",
            str(gpu_dir),
            "--wake-time",
            "0.3",
            "--sleep-time",
            "0",
            "--reload-time",
            "0",
            *flags,
            *args,
            env=env,
        )
        started.append(s)
        return s.wait_listening()

    yield _start
    for s in started:
        s.kill()
    for f in gpu_dir.glob("*.json"):  # an --engine-child outlives its API server's SIGKILL, as vLLM's does
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(f.stem), signal.SIGKILL)


def nvsmi_apps(gpu_dir: Path) -> list[tuple[int, str, int]]:
    """(pid, process name, MiB) as the stand-in nvidia-smi lists them."""
    out = subprocess.run(
        [
            sys.executable,
            str(NVSMI),
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader,nounits",
        ],
        env={**os.environ, "STANDIN_GPU_DIR": str(gpu_dir)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(int(p), n, int(m)) for p, n, m in (line.split(", ") for line in out.splitlines())]


def post(s: StandinServer, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(s.url + path, timeout=10, **kw)


def sleeping(s: StandinServer) -> bool:
    return bool(httpx.get(s.url + "/is_sleeping").json()["is_sleeping"])


def state(s: StandinServer) -> dict[str, Any]:
    return dict(httpx.get(s.url + "/standin/sleep").json())


def complete(s: StandinServer, timeout: float = 10, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        s.url + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": max_tokens}, timeout=timeout
    )


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def stream_events(s: StandinServer, max_tokens: int, first: threading.Event) -> list[dict[str, Any]]:
    """A streamed completion's events; ``first`` is set once a token arrived."""
    events = []
    with httpx.stream(
        "POST",
        s.url + "/v1/completions",
        timeout=30,
        json={"model": NAME, "prompt": "hi", "max_tokens": max_tokens, "stream": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                first.set()
    return events


def test_dev_routes_are_404_without_dev_mode(start: Callable[..., StandinServer]) -> None:
    """Without VLLM_SERVER_DEV_MODE=1, /sleep, /wake_up, /is_sleeping and /collective_rpc do not exist."""
    s = start(env={"VLLM_SERVER_DEV_MODE": "0"})
    codes = [
        post(s, "/sleep?level=1").status_code,
        post(s, "/wake_up").status_code,
        httpx.get(s.url + "/is_sleeping").status_code,
        post(s, "/collective_rpc", json={"method": "reload_weights"}).status_code,
    ]
    assert codes == [404, 404, 404, 404]


def test_sleep_and_wake_answer_200_with_an_empty_body(start: Callable[..., StandinServer]) -> None:
    """POST /sleep?level=1 and POST /wake_up answer 200, no body; /is_sleeping says so in vLLM's JSON."""
    s = start()
    slept = post(s, "/sleep?level=1")
    asleep = httpx.get(s.url + "/is_sleeping").content
    woke = post(s, "/wake_up")
    assert (slept.status_code, slept.content, asleep, woke.status_code, woke.content, sleeping(s)) == (
        200,
        b"",
        b'{"is_sleeping":true}',
        200,
        b"",
        False,
    )


def test_health_and_models_answer_while_asleep(start: Callable[..., StandinServer]) -> None:
    """A sleeping engine's /health is 200 and /v1/models lists the model (so neither proves it serves)."""
    s = start()
    post(s, "/sleep?level=1")
    models = httpx.get(s.url + "/v1/models").json()
    assert (httpx.get(s.url + "/health").status_code, [m["id"] for m in models["data"]]) == (200, [NAME])


def test_a_completion_to_a_sleeper_hangs_without_a_wake(start: Callable[..., StandinServer]) -> None:
    """No answer and no error while asleep: the client's read timeout is what ends it."""
    s = start()
    post(s, "/sleep?level=1")
    with pytest.raises(httpx.ReadTimeout):
        complete(s, timeout=1.0)


def test_a_completion_held_by_a_sleeper_completes_after_the_wake(start: Callable[..., StandinServer]) -> None:
    """The engine queues a request that arrives while asleep and serves it once woken."""
    s = start()
    post(s, "/sleep?level=1")
    t, out = in_thread(lambda: complete(s))
    wait_for(lambda: state(s)["held"] == 1, what="request held by the sleeping engine")
    post(s, "/wake_up")
    t.join(10)
    assert (out[0].status_code, out[0].json()["choices"][0]["finish_reason"]) == (200, "length")


def test_sleep_abort_ends_running_streams_with_finish_reason_abort(start: Callable[..., StandinServer]) -> None:
    """mode=abort (the default) cuts a running stream short: HTTP 200, last finish_reason "abort"."""
    s = start("--chunk-delay", "0.02")
    first = threading.Event()
    t, out = in_thread(lambda: stream_events(s, 500, first))
    first.wait(10)
    post(s, "/sleep?level=1")
    t.join(10)
    texts = [e["choices"][0]["text"] for e in out[0] if e["choices"]]
    assert (out[0][-1]["choices"][0]["finish_reason"], len(texts) < 500) == ("abort", True)


def test_sleep_wait_drains_running_streams_first(start: Callable[..., StandinServer]) -> None:
    """mode=wait: the sleep answers only after the running stream completed normally."""
    s = start("--chunk-delay", "0.01")
    first = threading.Event()
    t, out = in_thread(lambda: stream_events(s, 60, first))
    first.wait(10)
    post(s, "/sleep?level=1&mode=wait")
    done_when_slept = not t.is_alive() or state(s)["running"] == 0
    t.join(10)
    tokens = [e for e in out[0] if e["choices"]]
    assert (done_when_slept, len(tokens), tokens[-1]["choices"][0]["finish_reason"]) == (True, 60, "length")


def test_sleep_keep_pauses_streams_until_the_wake(start: Callable[..., StandinServer]) -> None:
    """mode=keep: a running stream stops mid-way while asleep and completes after the wake."""
    s = start("--chunk-delay", "0.01")
    first = threading.Event()
    t, out = in_thread(lambda: stream_events(s, 60, first))
    first.wait(10)
    post(s, "/sleep?level=1&mode=keep")
    paused = t.is_alive() and state(s)["running"] == 1
    post(s, "/wake_up")
    t.join(10)
    tokens = [e for e in out[0] if e["choices"]]
    assert (paused, len(tokens), tokens[-1]["choices"][0]["finish_reason"]) == (True, 60, "length")


def test_nvidia_smi_shows_the_residue_of_a_sleeper_per_process(
    start: Callable[..., StandinServer], gpu_dir: Path
) -> None:
    """Asleep, the EngineCore process keeps the measured residue; awake again, all of its memory."""
    s = start("--engine-child")
    ((pid, name, before),) = nvsmi_apps(gpu_dir)
    post(s, "/sleep?level=1")
    asleep = nvsmi_apps(gpu_dir)
    post(s, "/wake_up")
    assert (name, before, asleep, nvsmi_apps(gpu_dir)) == (
        "VLLM::EngineCore",
        FULL_MIB,
        [(pid, name, RESIDUE_MIB)],
        [(pid, name, FULL_MIB)],
    )


def test_residue_is_a_flag(start: Callable[..., StandinServer], gpu_dir: Path) -> None:
    """--sleep-residue-mib sets what a sleeper keeps (m1 kept 1,238 MiB)."""
    s = start("--sleep-residue-mib", "1238")
    post(s, "/sleep?level=1")
    assert [m for _, _, m in nvsmi_apps(gpu_dir)] == [1238]


def hold_memory(gpu_dir: Path, mib: int) -> subprocess.Popen[bytes]:
    """Another live process holding ``mib`` on GPU 0, in the stand-in nvidia-smi's accounting."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (gpu_dir / f"{p.pid}.json").write_text(
        json.dumps({"pid": p.pid, "name": "python3", "gpus": [0], "mib_per_gpu": mib})
    )
    return p


def test_a_wake_without_the_memory_half_wakes_and_wedges(start: Callable[..., StandinServer], gpu_dir: Path) -> None:
    """500 "out of memory", the engine holds all that was free, completions hang; later: "invalid argument"."""
    s = start()
    post(s, "/sleep?level=1")
    other = hold_memory(gpu_dir, 10000)
    try:
        oom = post(s, "/wake_up")
        half = [m for pid, _, m in nvsmi_apps(gpu_dir) if pid == s.proc.pid]
        with pytest.raises(httpx.ReadTimeout):
            complete(s, timeout=1.0)
    finally:
        other.kill()
        other.wait()
    again = post(s, "/wake_up")
    assert (
        oom.status_code,
        "CUDA Error: out of memory" in oom.json()["error"]["message"],
        half,
        again.status_code,
        "CUDA Error: invalid argument" in again.json()["error"]["message"],
        sleeping(s),
    ) == (500, True, [TOTAL_MIB - 10000], 500, True, True)


def test_a_wake_with_room_beside_another_process_succeeds(start: Callable[..., StandinServer], gpu_dir: Path) -> None:
    """Another holder that leaves enough room does not stop the wake."""
    s = start()
    post(s, "/sleep?level=1")
    other = hold_memory(gpu_dir, TOTAL_MIB - FULL_MIB)
    try:
        woke = post(s, "/wake_up")
    finally:
        other.kill()
        other.wait()
    assert (woke.status_code, complete(s).status_code) == (200, 200)


def test_sleep_keeps_memory_knob_answers_200_and_frees_nothing(
    start: Callable[..., StandinServer], gpu_dir: Path
) -> None:
    """--sleep-keeps-memory: /sleep says 200 and /is_sleeping true, but the memory stays (vllm#47654)."""
    s = start("--sleep-keeps-memory")
    code = post(s, "/sleep?level=1").status_code
    assert (code, sleeping(s), [m for _, _, m in nvsmi_apps(gpu_dir)]) == (200, True, [FULL_MIB])


def test_without_enable_sleep_mode_sleep_frees_nothing(start: Callable[..., StandinServer], gpu_dir: Path) -> None:
    """vLLM attaches the routes on the env alone; without --enable-sleep-mode its cumem pool is empty."""
    s = start(sleep_mode=False)
    code = post(s, "/sleep?level=1").status_code
    assert (code, sleeping(s), [m for _, _, m in nvsmi_apps(gpu_dir)]) == (200, True, [FULL_MIB])


def test_level2_wake_follows_vllms_sequence(start: Callable[..., StandinServer], gpu_dir: Path) -> None:
    """Level 2: wake weights, reload_weights, wake kv_cache; partly woken is still sleeping."""
    s = start()
    post(s, "/sleep?level=2")
    post(s, "/wake_up?tags=weights")
    partly = (sleeping(s), [m for _, _, m in nvsmi_apps(gpu_dir)])
    rpc = post(s, "/collective_rpc", json={"method": "reload_weights"})
    post(s, "/wake_up?tags=kv_cache")
    post(s, "/reset_prefix_cache")
    text = complete(s).json()["choices"][0]["text"]
    assert (partly, rpc.status_code, rpc.content, sleeping(s), text) == (
        (True, [RESIDUE_MIB + int(FULL_MIB * 0.114)]),
        200,
        b'{"results":[null]}',
        False,
        "Hello world, this",
    )


def test_level2_wake_without_reload_weights_answers_garbage(start: Callable[..., StandinServer]) -> None:
    """Level 2 dropped the weights: a plain wake_up serves again, but from uninitialised weights."""
    s = start()
    post(s, "/sleep?level=2")
    post(s, "/wake_up")
    assert complete(s).json()["choices"][0]["text"] != "Hello world, this"


def test_collective_rpc_without_a_method_is_400(start: Callable[..., StandinServer]) -> None:
    """/collective_rpc names the missing key as vLLM does."""
    s = start()
    r = post(s, "/collective_rpc", json={})
    assert (r.status_code, r.json()) == (400, {"detail": "Missing 'method' in request body"})


def test_a_bad_pause_mode_is_refused(start: Callable[..., StandinServer]) -> None:
    """mode must be abort, wait or keep; the engine's error says which it got."""
    s = start()
    r = post(s, "/sleep?level=1&mode=later")
    assert (r.status_code, "Invalid pause mode: later" in r.json()["error"]["message"]) == (500, True)
