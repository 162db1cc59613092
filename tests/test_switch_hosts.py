"""The switch end to end on real systemd test hosts, over SSH, with the stand-in server as the engine.

Every test asserts the host's final systemd state and the stored history, not only the outcome.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.deploy.operations import Operations
from orchestrator.deploy.planning import default_template
from orchestrator.errors import Busy
from orchestrator.wiring import operations, ports_factory
from tests.builders.switch import MODELS, config_text
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.hosts


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Operations:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(host, tmp_path / "state", MODELS))
    return operations(settings.load(cfg))


def unit_states(host: Host, *models: str) -> dict[str, str]:
    out = {}
    for m in models:
        r = host.run(["systemctl", "is-active", f"vllm-{m}.service"], check=False)
        out[m] = r.stdout.strip()
    return out


def test_switch_a_to_b(host: Host, ops: Operations) -> None:
    """A -> B: B serves, A is stopped and disabled, history has both as active with phase timings."""
    assert ops.switch("alpha")["outcome"] == "active"
    result = ops.switch("beta")
    assert result["outcome"] == "active"
    assert unit_states(host, "alpha", "beta") == {"alpha": "inactive", "beta": "active"}
    assert host.run(["systemctl", "is-enabled", "vllm-beta.service"]).stdout.strip() == "enabled"
    history = ops.history(host.name)
    assert [(h["revision"], h["model"], h["outcome"]) for h in history] == [
        (2, "beta", "active"),
        (1, "alpha", "active"),
    ]
    assert {p["phase"] for p in history[0]["phases"]} >= {"stopping", "freeing", "starting", "checking"}


@pytest.mark.parametrize(
    "bad,error",
    [
        ("beta-slow", "not ready after its load deadline of 3 s"),
        ("beta-crash", "vllm-beta-crash.service"),
        ("beta-mute", "completions failed"),
    ],
)
def test_failed_switch_rolls_back_to_a(host: Host, ops: Operations, bad: str, error: str) -> None:
    """B never ready, B crashing on start, B failing completions: A serves again, both recorded."""
    ops.switch("alpha")
    result = ops.switch(bad)
    assert result["outcome"] == "rolled_back"
    assert error in result["error"]
    assert unit_states(host, "alpha", bad) == {"alpha": "active", bad: "inactive"}
    assert ops.status(host.name)["hosts"][host.name]["serving"]["model"] == "alpha"
    history = ops.history(host.name)
    assert [(h["model"], h["outcome"]) for h in history] == [(bad, "rolled_back"), ("alpha", "active")]
    assert any(p["phase"] == "rolling_back" for p in history[0]["phases"])


def test_foreign_process_on_gpus_stops_switch_and_rolls_back(host: Host, ops: Operations) -> None:
    """A process outside our units on B's GPUs is named (PID, name, memory); A comes back."""
    ops.switch("gamma")
    stray = host.run(
        [
            "systemd-run",
            "--unit=stray-gpu-holder",
            "--property=Type=exec",
            sys.executable,
            str(REPO / "tests/standin/openai_server.py"),
            "--host",
            host.address,
            "--port",
            "8199",
            "--served-name",
            "stray",
            "--gpus",
            "0,1",
            "--gpu-mib",
            "20480",
        ]
    )
    assert stray.returncode == 0
    try:
        result = ops.switch("beta")
        assert result["outcome"] == "rolled_back"
        assert "holds 20.0 GiB on GPU 0" in result["error"]
        assert unit_states(host, "gamma", "beta") == {"gamma": "active", "beta": "inactive"}
    finally:
        host.run(["systemctl", "stop", "stray-gpu-holder.service"], check=False)


def test_leftover_engine_of_old_unit_is_reaped(host: Host, tmp_path: Path) -> None:
    """A legacy unit (KillMode=process) leaves its engine child holding the GPUs: it is killed, B starts."""
    cfg = tmp_path / "deploy.toml"
    models = {
        **MODELS,
        "alpha": {**MODELS["alpha"], "args": ["--load-time", "0.3", "--engine-child", "--child-ignores-sigterm"]},
    }
    cfg.write_text(config_text(host, tmp_path / "state", models))
    catalog = settings.load(cfg)
    legacy = default_template().replace("KillMode=control-group", "KillMode=process")
    assert Operations(catalog, ports_factory(catalog), template=legacy).switch("alpha")["outcome"] == "active"
    result = operations(catalog).switch("beta")
    assert result["outcome"] == "active"
    assert unit_states(host, "alpha", "beta") == {"alpha": "inactive", "beta": "active"}
    assert host.run(["systemctl", "show", "-p", "ControlGroup", "--value", "vllm-alpha.service"]).returncode == 0
    assert ops_pids(host, "vllm-alpha.service") == []


def test_engine_orphaned_by_sigkill_of_the_api_server_is_reaped(host: Host, tmp_path: Path) -> None:
    """SIGKILL of alpha's API server alone leaves its EngineCore holding GPUs 0-3 (as on an H200): the switch
    to beta finds it by PID in alpha's cgroup, reaps it with the tracker child, and beta starts."""
    cfg = tmp_path / "deploy.toml"
    models = {**MODELS, "alpha": {**MODELS["alpha"], "args": ["--load-time", "0.3", "--engine-child"]}}
    cfg.write_text(config_text(host, tmp_path / "state", models))
    catalog = settings.load(cfg)
    # KillMode=process: systemd leaves the rest of the cgroup alone when the main process dies, as a unit
    # written before the product's template does; the product's freeing step is then all that reaps it.
    legacy = default_template().replace("KillMode=control-group", "KillMode=process")
    assert Operations(catalog, ports_factory(catalog), template=legacy).switch("alpha")["outcome"] == "active"
    main = host.run(["systemctl", "show", "-p", "MainPID", "--value", "vllm-alpha.service"]).stdout.strip()
    holders = wait_for(lambda: gpu_holders(host), what="alpha's engine in nvidia-smi")
    host.run(["kill", "-KILL", main])
    wait_for(lambda: host.run(["test", "-e", f"/proc/{main}"], check=False).returncode != 0, what="API server gone")
    assert gpu_holders(host) == holders  # the orphan still holds the memory, by PID
    orphans = ops_pids(host, "vllm-alpha.service")
    result = operations(catalog).switch("beta")
    assert result["outcome"] == "active"
    assert unit_states(host, "alpha", "beta") == {"alpha": "inactive", "beta": "active"}
    assert [p for p in orphans if host.run(["test", "-e", f"/proc/{p}"], check=False).returncode == 0] == []
    assert ops_pids(host, "vllm-alpha.service") == []


def gpu_holders(host: Host) -> list[str]:
    out = host.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
    ).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def ops_pids(host: Host, unit: str) -> list[str]:
    cg = host.run(["systemctl", "show", "-p", "ControlGroup", "--value", unit]).stdout.strip()
    if not cg:
        return []
    return host.run(f"cat /sys/fs/cgroup{cg}/cgroup.procs 2>/dev/null || true").stdout.split()


def test_invalid_unit_file_is_caught_before_stopping(host: Host, tmp_path: Path, ops: Operations) -> None:
    """A unit systemd refuses to load is caught while A still serves: aborted, file removed, A untouched."""
    ops.switch("alpha")
    broken = default_template().replace("ExecStart={{ exec_start }}", "ExecStart=relative/path {{ exec_start }}")
    bad_ops = Operations(ops.catalog, ops.ports_for, store=ops.store, template=broken)
    result = bad_ops.switch("beta")
    assert result["outcome"] == "aborted"
    assert "did not load after daemon-reload" in result["error"]
    assert unit_states(host, "alpha") == {"alpha": "active"}
    assert host.run(["test", "-e", "/etc/systemd/system/vllm-beta.service"], check=False).returncode == 1
    assert [(h["model"], h["outcome"]) for h in ops.history(host.name)] == [("beta", "aborted"), ("alpha", "active")]


def test_rollback_and_rollback_to(host: Host, ops: Operations) -> None:
    """rollback returns to the previous model; rollback --to N redeploys revision N's exact unit."""
    ops.switch("alpha")
    ops.switch("beta")
    back = ops.rollback(host.name)
    assert (back["revision"], back["model"], back["outcome"]) == (3, "alpha", "active")
    assert back["unit_sha256"] == ops.history(host.name)[-1]["unit_sha256"]
    again = ops.rollback(host.name, to_revision=2)
    assert (again["model"], again["outcome"]) == ("beta", "active")
    assert unit_states(host, "alpha", "beta") == {"alpha": "inactive", "beta": "active"}
    assert [h["trigger"] for h in ops.history(host.name)][:2] == ["rollback:to-2", "rollback:to-1"]


def test_switch_to_active_model_is_noop(host: Host, ops: Operations) -> None:
    """Switching to the healthy active model says so and records nothing."""
    ops.switch("alpha")
    result = ops.switch("alpha")
    assert result["noop"] is True and "already active and healthy" in result["message"]
    assert len(ops.history(host.name)) == 1
    assert unit_states(host, "alpha") == {"alpha": "active"}


def test_second_switch_on_busy_host_is_refused(host: Host, ops: Operations, tmp_path: Path) -> None:
    """While one switch runs, another on the same host is refused naming the running deployment."""
    ops.switch("alpha")
    seen: list[str] = []
    done = threading.Event()
    first = threading.Thread(
        target=lambda: (ops.switch("beta-long", progress=lambda e, f: seen.append(str(f.get("phase")))), done.set())
    )
    first.start()
    wait_for(lambda: "checking" in seen, what="the first switch to reach checking")
    other = operations(ops.catalog)
    with pytest.raises(Busy, match=r"deployment #2 \(revision 2, beta-long, .*\) is in phase checking"):
        other.switch("beta")
    first.join(60)
    assert done.is_set()
    assert unit_states(host, "beta-long") == {"beta-long": "active"}


def test_switch_through_dbus_inside_the_host(host: Host) -> None:
    """The local transport (pydbus) switches A -> B from a CLI running on the host itself."""
    cfg = config_text(host, Path("/var/lib/orchestrator-test"), MODELS, transport="local")
    host.write_file("/etc/orchestrator-test.toml", cfg)
    for model in ("alpha", "beta"):
        r = host.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "switch",
                model,
                "--config",
                "/etc/orchestrator-test.toml",
                "--json",
            ],
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert f'"model": "{model}"' in r.stdout and '"outcome": "active"' in r.stdout
    assert unit_states(host, "alpha", "beta") == {"alpha": "inactive", "beta": "active"}


def test_switch_stages_weights_from_the_hub_before_stopping(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub model is downloaded and verified while A serves; the unit runs the staged revision."""
    import json

    from tests.hubstub import HubStub, StubRepo, sharded_model

    files = sharded_model(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], 50_000)
    files["config.json"] = json.dumps(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "intermediate_size": 512,
            "vocab_size": 1000,
            "max_position_embeddings": 2048,
            "torch_dtype": "float32",
        }
    ).encode()
    with HubStub() as hub:
        hub.add(StubRepo.of("org/staged", files, sha="b" * 40))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        cfg = tmp_path / "deploy.toml"
        staged = {"repo": "org/staged", "source": "hub", "port": 8110, "args": ["--load-time", "0.3"]}
        cfg.write_text(config_text(host, tmp_path / "state", {**MODELS, "staged": staged}))
        ops = operations(settings.load(cfg))
        ops.switch("alpha")
        phases: list[str] = []
        result = ops.switch("staged", progress=lambda e, f: phases.append(e if e != "phase" else f["phase"]))
    assert result["outcome"] == "active", result.get("error")
    assert "staged" in phases and phases.index("staged") < phases.index("stopping"), phases
    model_dir = f"/models/org--staged/{'b' * 40}"
    unit = host.run(["systemctl", "cat", "vllm-staged.service"]).stdout
    assert f'"--model" "{model_dir}"' in unit
    assert host.run(["test", "-f", f"{model_dir}/.orchestrator-manifest.json"], check=False).returncode == 0
    assert unit_states(host, "alpha", "staged") == {"alpha": "inactive", "staged": "active"}


def test_render_diff_against_installed_unit(host: Host, ops: Operations, tmp_path: Path) -> None:
    """render --diff --installed shows what a changed deploy.toml would change in the unit on the host."""
    import subprocess

    ops.switch("alpha")
    changed = {**MODELS, "alpha": {**MODELS["alpha"], "max_model_len": 4096}}
    cfg = tmp_path / "changed.toml"
    cfg.write_text(config_text(host, tmp_path / "state", changed))
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "render", "alpha", "--config", str(cfg), "--diff", "--installed"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1, r.stderr
    assert f"{host.name}:/etc/systemd/system/vllm-alpha.service" in r.stdout
    assert '"--max-model-len" "4096"' in r.stdout
