"""`orchestrator adopt` on a real systemd test host, over SSH: engines a team runs by hand taken over.

The engine is the stand-in run as `python3 -m vllm.entrypoints.openai.api_server` (tests/standin/vllmpkg:
the stand-in server in that very process), so its unit's ExecStart and its /proc cmdline read as vLLM's.
A hand-written unit is adopted, a switch replaces it (disabled), and rollback brings it back, answered by a
real completion; a process started with setsid outside systemd is adopted, and the next switch stops it and
finds its GPUs free (the stand-in's nvidia-smi counts its memory by PID).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from orchestrator import settings
from orchestrator.cli import main
from orchestrator.wiring import operations
from tests.builders.agent import CONFIG, STATE, install_agent
from tests.builders.switch import MODELS, config_text
from tests.hosts.machine import REPO, Host, in_host
from tests.hubstub.models import sharded_model

pytestmark = pytest.mark.hosts

STANDIN_VLLM = in_host(REPO / "tests" / "standin" / "vllmpkg")
PYTHON = in_host(sys.executable)
API_SERVER = [PYTHON, "-m", "vllm.entrypoints.openai.api_server"]
SERVE = [in_host(REPO / "tests" / "standin" / "bin" / "vllm"), "serve"]  # a console script (#!/usr/bin/python3)
# The two shapes of a hand-written unit's ExecStart (the engine, then its words), as the seeds wrote them.
SHAPES = {
    "api_server": (
        API_SERVER,
        (
            "--model {folder}/alpha --served-model-name alpha-hand --tensor-parallel-size 4 \\\n"
            "    --port 8111 --host {address} --load-time=0.3"
        ),
    ),
    "vllm serve": (
        SERVE,
        (
            "{folder}/alpha --served-model-name=alpha-hand --tensor-parallel-size=4 --port 8111 \\\n"
            "    --host {address} --load-time=0.3"
        ),
    ),
}
UNIT = "vllm-alpha-hand.service"
FOLDER = "/srv/adopt-models"


def base_config(host: Host, state: Path, engine: list[str] = API_SERVER, transport: str = "ssh") -> str:
    """The switch tests' deploy.toml, its engine vLLM's (the stand-in's), with beta only."""
    text = config_text(host, state, {"beta": MODELS["beta"]}, transport=transport)
    text = (
        "\n".join(
            f"engine = {json.dumps(engine)}" if line.startswith("engine = ") else line for line in text.splitlines()
        )
        + "\n"
    )
    return text + f'[models.beta.env]\nPYTHONPATH = "{STANDIN_VLLM}"\n'


def hand_unit(host: Host, shape: str) -> str:
    engine, words = SHAPES[shape]
    command = " ".join(engine) + " " + words.format(folder=FOLDER, address=host.address)
    return f"""[Unit]
Description=alpha, written by hand
After=network-online.target

[Service]
Type=simple
User=root
Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" "PYTHONPATH={STANDIN_VLLM}"
Environment=NCCL_IB_DISABLE=1
ExecStart={command}
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def answers(host: Host, port: int, model: str, deadline: float = 30.0) -> str:
    """A real completion from ``model`` on ``port`` (waits for the engine to load)."""
    end = time.monotonic() + deadline
    while True:
        try:
            r = httpx.post(
                f"http://{host.address}:{port}/v1/completions",
                json={"model": model, "prompt": "hi", "max_tokens": 4},
                timeout=5,
            )
            if r.status_code == 200:
                text: str = r.json()["choices"][0]["text"]
                return text
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"{model} on :{port} gave no completion in {deadline:g} s")
        time.sleep(0.2)


def adopt(cfg: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["adopt", "--config", str(cfg), "--local", "--json", *args])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


@pytest.fixture
def folders(host: Host) -> Any:
    """Each engine's --model folder: a real (tiny) model, as staging verifies a local: folder in place."""
    for model in ("alpha", "gamma"):
        host.run(f"mkdir -p {FOLDER}/{model}")
        files = sharded_model(["model-00001-of-00001.safetensors"], 16)
        files["config.json"] = json.dumps(
            {  # what the planner reads of a model (a switch to the entry plans it)
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "intermediate_size": 512,
                "vocab_size": 1024,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
            }
        ).encode()
        for name, data in files.items():
            host.run(f"base64 -d > {FOLDER}/{model}/{name}", input=base64.b64encode(data).decode())
    yield
    host.run(f"rm -rf {FOLDER}", check=False)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hand_written_unit_adopted_replaced_and_rolled_back(
    host: Host, tmp_path: Path, folders: None, shape: str
) -> None:
    """adopt --apply of a hand-written unit; a switch stops and disables it; rollback reinstalls its own text,
    answered."""
    unit = hand_unit(host, shape)
    host.run(
        f"cat > /etc/systemd/system/{UNIT} <<'EOF'\n{unit}EOF\nsystemctl daemon-reload && systemctl enable --now {UNIT}"
    )
    answers(host, 8111, "alpha-hand")
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(base_config(host, tmp_path / "state", SHAPES[shape][0]))

    review = adopt(cfg)
    [found] = review["adopted"]
    assert (found["unit"], found["name"], found["blockers"], found["differences"]) == (UNIT, "alpha-hand", [], [])
    assert found["entry"]["gpus"] == [0, 1, 2, 3] and found["entry"]["args"] == ["--load-time=0.3"]
    assert found["rendered_argv"][: len(SHAPES[shape][0])] == SHAPES[shape][0]
    assert cfg.read_text() == base_config(host, tmp_path / "state", SHAPES[shape][0])  # a review changes nothing

    applied = adopt(cfg, "--apply")
    [rec] = applied["recorded"]
    assert rec["unit"] == UNIT and "[models.alpha-hand]" in cfg.read_text()
    ops = operations(settings.load(cfg))
    [first] = ops.history(host.name)
    assert (first["trigger"], first["outcome"], first["unit"]) == ("adopt", "active", UNIT)
    assert adopt(cfg)["adopted"] == []  # adopted once: not found again

    assert ops.switch("beta")["outcome"] == "active"
    assert host.run(["systemctl", "is-active", UNIT], check=False).stdout.strip() == "inactive"
    assert host.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "disabled"

    back = operations(settings.load(cfg)).rollback(host.name)
    assert (back["outcome"], back["model"], back["unit"]) == ("active", "alpha-hand", UNIT), back["error"]
    assert host.run(["cat", f"/etc/systemd/system/{UNIT}"]).stdout == unit
    assert host.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "enabled"
    assert answers(host, 8111, "alpha-hand")

    refused = CliRunner().invoke(main, ["adopt", "--config", str(cfg), "--local", "--apply", "nosuch"])
    assert refused.exit_code == 2 and "unit nosuch.service is inactive" in refused.output


def start_by_hand(host: Host) -> int:
    """gamma-hand, an engine started from a shell outside systemd (setsid) as the seeds did; its PID once it answers."""
    host.run(
        f"cd / && CUDA_VISIBLE_DEVICES=4,5,6,7 PYTHONPATH={STANDIN_VLLM} setsid -f {PYTHON} -m "
        f"vllm.entrypoints.openai.api_server --model {FOLDER}/gamma --served-model-name gamma-hand "
        f"--tensor-parallel-size 4 --port 8112 --host {host.address} --load-time 0.3 "
        "> /var/log/gamma-hand.log 2>&1 < /dev/null"
    )
    answers(host, 8112, "gamma-hand")
    return int(host.run("pgrep -f 'served-model-name gamma-hand'").stdout.split()[0])


def test_hand_run_process_adopted_then_stopped_by_the_next_switch(host: Host, tmp_path: Path, folders: None) -> None:
    """A setsid engine outside systemd: adopted with its PID; the next switch stops it and its GPUs read free."""
    pid = start_by_hand(host)
    try:
        cfg = tmp_path / "deploy.toml"
        cfg.write_text(base_config(host, tmp_path / "state").replace("gpus = [0, 1, 2, 3]", "gpus = [4, 5, 6, 7]"))
        [found] = adopt(cfg)["adopted"]
        assert (found["pid"], found["unit"], found["name"], found["blockers"]) == (pid, None, "gamma-hand", [])
        [rec] = adopt(cfg, "--apply")["recorded"]
        assert rec["pid"] == pid
        ops = operations(settings.load(cfg))
        serving, healthy, _ = ops.probe(host.name)
        assert serving is not None and serving.spec.pid == pid and healthy  # no unit: its PID and its answers
        smi = host.run("nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout.split()
        assert str(pid) in smi

        assert ops.switch("beta")["outcome"] == "active"
        assert host.run(["kill", "-0", str(pid)], check=False).returncode != 0
        holders = host.run("nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader").stdout
        assert str(pid) not in holders
        assert answers(host, 8102, "beta")
    finally:
        host.run(["kill", "-KILL", str(pid)], check=False)


def test_hand_run_process_taken_under_systemd_by_a_switch_to_its_entry(
    host: Host, tmp_path: Path, folders: None
) -> None:
    """Adopted, then `switch` to its own entry: the process stops, its entry's unit starts on the same port
    (the port it held was not refused: this switch frees it first) and answers."""
    pid = start_by_hand(host)
    try:
        cfg = tmp_path / "deploy.toml"
        cfg.write_text(base_config(host, tmp_path / "state"))
        [rec] = adopt(cfg, "--apply")["recorded"]
        assert rec["pid"] == pid
        done = operations(settings.load(cfg)).switch("gamma-hand")
        assert (done["outcome"], done["unit"]) == ("active", "vllm-gamma-hand.service"), done["error"]
        assert host.run(["kill", "-0", str(pid)], check=False).returncode != 0
        assert host.run(["systemctl", "is-active", "vllm-gamma-hand.service"]).stdout.strip() == "active"
        assert answers(host, 8112, "gamma-hand")
    finally:
        host.run(["kill", "-KILL", str(pid)], check=False)


def test_stop_of_an_adopted_hand_run_process(host: Host, tmp_path: Path, folders: None) -> None:
    """`stop` of an adopted hand-run engine: its process goes, its GPUs read free, nothing serves."""
    pid = start_by_hand(host)
    try:
        cfg = tmp_path / "deploy.toml"
        cfg.write_text(base_config(host, tmp_path / "state"))
        adopt(cfg, "--apply")
        stopped = operations(settings.load(cfg)).stop("gamma-hand")
        assert (stopped["outcome"], stopped["serving"]) == ("stopped", [])
        assert host.run(["kill", "-0", str(pid)], check=False).returncode != 0
        assert host.run("nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout.strip() == ""
    finally:
        host.run(["kill", "-KILL", str(pid)], check=False)


def test_through_the_agent_over_ssh(host: Host, tmp_path: Path, folders: None) -> None:
    """`orchestrator --host box adopt --apply`: the agent's config push takes the entry, the agent records the
    revision; switch and rollback through it bring the hand-written unit back, answered."""
    unit = hand_unit(host, "api_server")
    host.run(
        f"cat > /etc/systemd/system/{UNIT} <<'EOF'\n{unit}EOF\nsystemctl daemon-reload && systemctl enable --now {UNIT}"
    )
    answers(host, 8111, "alpha-hand")
    install_agent(host, base_config(host, Path(STATE), transport="local"), tmp_path)
    hosts_file = tmp_path / "hosts.toml"
    hosts_file.write_text(
        f'[box]\nurl = "ssh://root@{host.address}:{host.port}"\nkey = "{host.key_path}"\n'
        f'known_hosts = "{host.known_hosts_path}"\npython = "{sys.executable}"\n'
        f'socket = "{STATE}/agent.sock"\n'
    )

    def client(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", "--host", "box", *args],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env={"PATH": "/usr/bin:/bin", "ORCHESTRATOR_HOSTS_FILE": str(hosts_file)},
        )

    try:
        applied = client("adopt", "--apply", "--json")
        assert applied.returncode == 0, applied.stderr
        result = json.loads(applied.stdout)
        assert [r["unit"] for r in result["recorded"]] == [UNIT] and result["config"]["changed"]
        assert "[models.alpha-hand]" in host.run(["cat", CONFIG]).stdout
        assert client("switch", "beta").returncode == 0
        assert host.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "disabled"
        back = client("rollback")
        assert back.returncode == 0, back.stderr
        assert answers(host, 8111, "alpha-hand")
        history = json.loads(client("history", "--json").stdout)
        assert [h["trigger"].split(":")[0] for h in history][-1] == "adopt"
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service; systemctl reset-failed orchestrator-agent.service", check=False
        )
