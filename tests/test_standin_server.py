"""The stand-in OpenAI-compatible server behaves as its contract says, over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.hosts.wait import wait_for
from tests.standin import StandinServer

NAME = "tiny-standin"


def alive(pid: int) -> bool:
    """True while pid runs (a zombie counts as dead: its memory is already freed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standin(StandinServer):
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def health(self) -> int:
        return httpx.get(self.url + "/health").status_code


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    started: list[Standin] = []

    def _start(*args: str, port: int = 0, env: dict[str, str] | None = None) -> Standin:
        s = Standin("--served-name", NAME, *args, port=port, env=env)
        started.append(s)
        return s

    yield _start
    for s in started:
        s.kill()
    for pid in gpu_files(tmp_path / "gpu"):  # children left behind on purpose by orphan tests
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def gpu_files(d: Path) -> dict[int, dict[str, object]]:
    """The GPU files present now; one removed while we read is simply gone."""
    found = {}
    for f in d.glob("*.json"):
        with contextlib.suppress(FileNotFoundError):
            found[int(f.stem)] = json.loads(f.read_text())
    return found


def test_health_is_503_while_loading_then_200(start: Callable[..., Standin]) -> None:
    """/health answers 503 until the load time has passed, then 200."""
    s = start("--load-time", "1.5").wait_listening()
    assert s.health() == 503
    wait_for(lambda: s.health() == 200, what="health 200")


def test_listen_after_load_refuses_connections_while_loading(start: Callable[..., Standin]) -> None:
    """With --listen-after-load the port refuses connections until the model is loaded."""
    port = free_port()
    s = start("--load-time", "2", "--listen-after-load", port=port)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health")
    s.wait_listening()
    assert s.health() == 200


def test_models_lists_the_served_name(start: Callable[..., Standin]) -> None:
    """/v1/models lists the served name in OpenAI format."""
    s = start().wait_listening()
    assert [m.id for m in s.client().models.list()] == [NAME]


def test_completion_honours_max_tokens(start: Callable[..., Standin]) -> None:
    """A non-streamed completion returns max_tokens tokens with usage and a cmpl- id."""
    s = start().wait_listening()
    r = s.client().completions.create(model=NAME, prompt="one two three", max_tokens=7)
    assert (
        r.id.startswith("cmpl-"),
        r.choices[0].finish_reason,
        r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens),
    ) == (True, "length", (3, 7))


def test_streamed_completion_ends_with_a_usage_chunk(start: Callable[..., Standin]) -> None:
    """A streamed completion sends one chunk per token, then a usage chunk with no choices."""
    s = start().wait_listening()
    chunks = list(
        s.client().completions.create(
            model=NAME, prompt="hi", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert (len(texts), chunks[-1].choices, usage and usage.completion_tokens) == (5, [], 5)


def test_chat_completion_honours_max_tokens(start: Callable[..., Standin]) -> None:
    """A non-streamed chat completion answers as the assistant with max_tokens tokens."""
    s = start().wait_listening()
    r = s.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert (r.id.startswith("chatcmpl-"), r.choices[0].message.role, r.usage and r.usage.completion_tokens) == (
        True,
        "assistant",
        4,
    )


def test_streamed_chat_ends_with_a_usage_chunk(start: Callable[..., Standin]) -> None:
    """A streamed chat completion sends the role, one delta per token, then a usage chunk."""
    s = start().wait_listening()
    chunks = list(
        s.client().chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    usage = chunks[-1].usage
    assert (chunks[0].choices[0].delta.role, len(contents), usage and usage.completion_tokens) == ("assistant", 6, 6)


def test_unknown_model_is_not_found(start: Callable[..., Standin]) -> None:
    """A request for another model name gets 404, as from vLLM."""
    s = start().wait_listening()
    with pytest.raises(openai.NotFoundError):
        s.client().completions.create(model="other", prompt="hi", max_tokens=1)


def test_health_ok_but_completions_fail(start: Callable[..., Standin]) -> None:
    """With --health-ok-but-completions-fail, /health is 200 and every completion is a 500."""
    s = start("--health-ok-but-completions-fail").wait_listening()
    assert s.health() == 200
    with pytest.raises(openai.InternalServerError):
        s.client().completions.create(model=NAME, prompt="hi", max_tokens=1)


def test_crash_after_exits_non_zero(start: Callable[..., Standin]) -> None:
    """--crash-after makes the serving process exit 1 by itself."""
    s = start("--crash-after", "0.5").wait_listening()
    assert s.proc.wait(15) == 1


def test_refuse_to_start_exits_1_with_a_message(start: Callable[..., Standin]) -> None:
    """--refuse-to-start exits 1 at once and says why on stderr."""
    s = start("--refuse-to-start")
    assert s.proc.wait(15) == 1
    wait_for(lambda: any("refuses to start" in line for line in s.stderr), what="stderr message")


def test_stop_time_delays_exit_after_sigterm(start: Callable[..., Standin]) -> None:
    """After SIGTERM the server stops listening at once but exits 0 only after the stop time."""
    s = start("--stop-time", "3").wait_listening()
    s.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: s.proc.poll() is not None or _refused(s.port), what="listener closed")
    assert (s.proc.poll(), s.proc.wait(15)) == (None, 0)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True  # a reset: the listener closed with our connection still in its queue
    except TimeoutError:
        return False  # a loaded machine: ask again, the wait has its own deadline
    return False


def test_gpu_file_is_written_while_loading_and_removed_on_exit(start: Callable[..., Standin], tmp_path: Path) -> None:
    """The server writes <dir>/<pid>.json as loading starts and removes it on a clean exit."""
    d = tmp_path / "gpu"
    s = start("--load-time", "30", "--gpus", "0,2", "--gpu-mib", "1234", "--gpu-state-dir", str(d))
    wait_for(lambda: gpu_files(d), what="gpu file")
    seen = gpu_files(d)
    assert (seen[s.proc.pid]["gpus"], seen[s.proc.pid]["mib_per_gpu"], s.stop(), gpu_files(d)) == ([0, 2], 1234, 0, {})


def test_gpu_dir_comes_from_environment(start: Callable[..., Standin], tmp_path: Path) -> None:
    """STANDIN_GPU_DIR sets the GPU state directory when no flag is given."""
    d = tmp_path / "gpu"
    s = start("--gpus", "1", env={"STANDIN_GPU_DIR": str(d)}).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    assert list(gpu_files(d)) == [s.proc.pid]


def test_engine_child_holds_the_memory(start: Callable[..., Standin], tmp_path: Path) -> None:
    """--engine-child: a child named VLLM::EngineCore holds the memory and exits with the server."""
    d = tmp_path / "gpu"
    s = start("--engine-child", "--gpus", "0", "--gpu-state-dir", str(d)).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((pid, info),) = gpu_files(d).items()
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    assert (pid != s.proc.pid, info["name"], comm, s.stop(), gpu_files(d), alive(pid)) == (
        True,
        "VLLM::EngineCore",
        "VLLM::EngineCor",
        0,
        {},
        False,
    )


def test_process_name_names_the_child(start: Callable[..., Standin], tmp_path: Path) -> None:
    """--process-name sets the name of the process holding the memory."""
    d = tmp_path / "gpu"
    start("--engine-child", "--process-name", "vllm-worker", "--gpus", "0", "--gpu-state-dir", str(d)).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((pid, info),) = gpu_files(d).items()
    assert (info["name"], Path(f"/proc/{pid}/comm").read_text().strip()) == ("vllm-worker", "vllm-worker")


def test_child_ignoring_sigterm_outlives_the_server(start: Callable[..., Standin], tmp_path: Path) -> None:
    """--child-ignores-sigterm leaves an orphan that keeps its GPU file until SIGKILL."""
    d = tmp_path / "gpu"
    s = start("--engine-child", "--child-ignores-sigterm", "--gpus", "0,1", "--gpu-state-dir", str(d)).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((pid, _),) = gpu_files(d).items()
    assert (s.stop(), alive(pid), list(gpu_files(d))) == (0, True, [pid])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), what="orphan killed")


def test_engine_child_exits_after_its_max_life(start: Callable[..., Standin], tmp_path: Path) -> None:
    """An orphaned child exits by itself after --child-max-life and removes its file."""
    d = tmp_path / "gpu"
    s = start(
        "--engine-child", "--child-ignores-sigterm", "--child-max-life", "2", "--gpus", "0", "--gpu-state-dir", str(d)
    ).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((pid, _),) = gpu_files(d).items()
    s.stop()
    wait_for(lambda: not alive(pid) and not gpu_files(d), what="child gone with its file")
    assert gpu_files(d) == {}


def test_server_exits_when_engine_child_dies(start: Callable[..., Standin], tmp_path: Path) -> None:
    """If the engine child is killed, the server exits 1, as vLLM's API server does."""
    d = tmp_path / "gpu"
    s = start("--engine-child", "--gpus", "0", "--gpu-state-dir", str(d)).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((pid, _),) = gpu_files(d).items()
    os.kill(pid, signal.SIGKILL)
    assert (s.proc.wait(15), gpu_files(d)) == (1, {})


def children(pid: int) -> list[int]:
    """Live child processes of ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[1]) == pid:
                    out.append(int(entry.name))
    return sorted(out)


def test_sigkill_of_the_api_server_leaves_the_engine_holding_memory(
    start: Callable[..., Standin], tmp_path: Path
) -> None:
    """As measured with vLLM 0.25.1 on an H200: SIGKILL of the API server alone leaves its two children,
    EngineCore (holding the GPU memory) and a resource tracker, running; SIGTERM ends them."""
    d = tmp_path / "gpu"
    s = start("--engine-child", "--gpus", "0", "--gpu-mib", "122666", "--gpu-state-dir", str(d)).wait_listening()
    wait_for(lambda: gpu_files(d), what="gpu file")
    ((engine, info),) = gpu_files(d).items()
    kids = children(s.proc.pid)
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    time.sleep(1.0)  # the measured case: still there 1, 5 and 15 s later (nothing to await: a non-event)
    names = sorted(Path(f"/proc/{p}/comm").read_text().strip() for p in kids if alive(p))
    assert (len(kids), "VLLM::EngineCor" in names, len(names), info["mib_per_gpu"], list(gpu_files(d))) == (
        2,
        True,
        2,
        122666,
        [engine],
    )
    for p in kids:
        os.kill(p, signal.SIGTERM)
    wait_for(lambda: not any(alive(p) for p in kids) and not gpu_files(d), what="orphans gone after SIGTERM")


def test_engine_memory_follows_the_measured_start_phases(start: Callable[..., Standin], tmp_path: Path) -> None:
    """With --load-time, the engine child first holds the weights (13 of 122.7 GB on the H200), then all of
    its memory once the KV cache is allocated, and vLLM's phase lines come in vLLM's order before the port opens."""
    d = tmp_path / "gpu"
    s = start(
        "--engine-child",
        "--listen-after-load",
        "--load-time",
        "3",
        "--gpus",
        "0",
        "--gpu-mib",
        "122666",
        "--gpu-state-dir",
        str(d),
    )
    seen: list[int] = []

    def sample() -> bool:
        files = gpu_files(d)
        if files:
            mib = int(next(iter(files.values()))["mib_per_gpu"])  # type: ignore[call-overload]
            if not seen or seen[-1] != mib:
                seen.append(mib)
        return s.listening.is_set()

    wait_for(sample, what="listening", interval=0.02)
    phases = [m for line in s.stderr for m in PHASES if m in line]
    assert (seen[0] < 0.15 * 122666, seen[-1], phases) == (True, 122666, list(PHASES))


PHASES = (
    "non-default args",
    "Initializing a V1 LLM engine",
    "Loading weights took",
    "Model loading took",
    "torch.compile took",
    "Available KV cache memory",
    "Graph capturing finished",
    "init engine",
    "Starting vLLM server on",
    "Application startup complete",
)


def test_chunk_delay_paces_the_stream(start: Callable[..., Standin]) -> None:
    """--chunk-delay spaces streamed tokens at least that far apart."""
    s = start("--chunk-delay", "0.05").wait_listening()
    stamps = [
        time.monotonic()
        for c in s.client().completions.create(model=NAME, prompt="hi", max_tokens=6, stream=True)
        if c.choices
    ]
    assert (len(stamps), stamps[-1] - stamps[0] >= 5 * 0.05 * 0.9) == (6, True)


def test_load_time_from_start_counts_from_the_process_start() -> None:
    """--load-time-from-start's clock: the process's start on time.monotonic, between its spawn and its answer."""
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import openai_server as s; print(repr(s.process_start()))"
    before = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", probe, str(Path(__file__).parent / "standin")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = time.monotonic()
    tick = 1 / os.sysconf("SC_CLK_TCK")  # /proc counts the start in clock ticks
    assert before - tick <= float(out) <= after
