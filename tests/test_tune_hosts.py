"""`orchestrator tune` end to end on real systemd test hosts, with the stand-in engine streaming at a
different speed per layout (STANDIN_LAYOUT_DELAY_S) and refusing one layout (STANDIN_REFUSE_LAYOUTS).

Every test runs the real CLI in a subprocess and asserts the host's systemd state and the stored records.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.wiring import operations
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.hubstub.models import safetensors_bytes
from tests.test_switch_hosts import MODELS, config_text, unit_states

pytestmark = pytest.mark.hosts

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
TINY = {"port": 8120, "source": "local:/srv/tiny", "tensor_parallel": 2, "gpus": [0, 1], "args": ["--load-time", "0.2"]}
TINY_ENV = '[models.tiny.env]\nSTANDIN_LAYOUT_DELAY_S = "tp2=0.004,tp4=0.0005"\nSTANDIN_REFUSE_LAYOUTS = "tp8"\n'
BENCH = ["--concurrency", "1,4", "--requests", "8", "--max-tokens", "16", "--prompt-tokens", "8", "--yes"]


def put_tiny(host: Host) -> None:
    """The tiny model's files in /srv/tiny on the host."""
    host.write_file("/srv/tiny/config.json", json.dumps(TINY_CONFIG))
    # Weights used in place are verified like any others: the directory needs a whole safetensors file.
    (host.root / "srv/tiny/model.safetensors").write_bytes(safetensors_bytes({"lm_head.weight": (16,)}))


@pytest.fixture
def cfg(host: Host, tmp_path: Path) -> Path:
    put_tiny(host)
    path = tmp_path / "deploy.toml"
    path.write_text(config_text(host, tmp_path / "state", {"alpha": MODELS["alpha"], "tiny": TINY}) + TINY_ENV)
    assert operations(settings.load(path)).switch("alpha")["outcome"] == "active"
    return path


def cli(cfg: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args, "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def history(cfg: Path) -> list[dict[str, Any]]:
    return operations(settings.load(cfg)).history()


def test_tune_picks_the_fastest_layout_and_leaves_it_serving(host: Host, cfg: Path, tmp_path: Path) -> None:
    """tp4 streams fastest and wins; tp8 fails to load, is recorded with the engine's line and skipped."""
    chart = tmp_path / "tune.svg"
    r = cli(cfg, "tune", "tiny", "--layouts", "tp2,tp4,tp8", *BENCH, "--json", "--chart", str(chart))
    report = json.loads(r.stdout)
    rows = {row["layout"]: row for row in report["candidates"]}
    assert report["decision"]["winner"] == "tiny.tp4" and report["decision"]["runner_up"] == "tiny.tp2"
    assert rows["tp4"]["levels"]["4"]["tok_s"] > rows["tp2"]["levels"]["4"]["tok_s"]
    assert rows["tp8"]["status"] == "failed" and "output_size of gate's and up's weight = 192" in rows["tp8"]["error"]
    assert report["serving"]["model"] == "tiny.tp4"
    assert unit_states(host, "alpha", "tiny.tp2", "tiny.tp4", "tiny.tp8") == {
        "alpha": "inactive",
        "tiny.tp2": "inactive",
        "tiny.tp4": "active",
        "tiny.tp8": "inactive",
    }
    svg = chart.read_text()
    assert all(label in svg for label in ("tp2", "tp4 (winner)", "tp8 (failed to load)"))
    assert "\n-tensor_parallel = 2\n" in report["diff"] and "\n+tensor_parallel = 4\n" in report["diff"]
    assert "\n+gpus = [0, 1, 2, 3]\n" in report["diff"]


def test_tune_table_and_chart_show_every_layout(host: Host, cfg: Path) -> None:
    """The human output has the table (winner marked, the failure's line), the terminal chart and the diff."""
    r = cli(cfg, "tune", "tiny", "--layouts", "tp4,tp8", *BENCH)
    out = r.stdout
    assert "tune run #1: tiny on h1, objective throughput@4" in out
    assert "\ntp8 failed to load: ValueError: The output_size of gate's" in out
    assert "output tok/s by concurrency" in out and "  *tp4  #" in out and "   tp8  failed to load" in out
    assert "winner: tiny.tp4" in out and "serving: tiny.tp4 (revision 2)" in out
    assert "deploy.toml change (write it with --apply):\n--- a/deploy.toml" in out


def test_winner_measured_first_is_switched_back_to(host: Host, cfg: Path) -> None:
    """When the last candidate is not the winner, the winner is deployed again and left serving."""
    report = json.loads(cli(cfg, "tune", "tiny", "--layouts", "tp4,tp2", *BENCH, "--json").stdout)
    assert report["decision"]["winner"] == "tiny.tp4" and report["serving"]["model"] == "tiny.tp4"
    assert unit_states(host, "tiny.tp2", "tiny.tp4") == {"tiny.tp2": "inactive", "tiny.tp4": "active"}
    assert history(cfg)[0]["trigger"] == "tune:1:winner"


def test_tune_results_are_in_compare(host: Host, cfg: Path) -> None:
    """Every measured layout is stored with its revision: `compare` lists it afterwards."""
    cli(cfg, "tune", "tiny", "--layouts", "tp2,tp4", *BENCH, "--json")
    rows = json.loads(cli(cfg, "compare", "--json").stdout)
    assert {r["model"] for r in rows} >= {"tiny.tp2", "tiny.tp4"}


def test_without_yes_and_no_terminal_nothing_stops(host: Host, cfg: Path) -> None:
    """With no terminal to confirm on and no --yes, tune refuses before stopping anything."""
    r = cli(cfg, "tune", "tiny", "--layouts", "tp2", "--concurrency", "1", check=False)
    assert r.returncode == 2 and "pass --yes" in r.stderr
    assert [h["model"] for h in history(cfg)] == ["alpha"]


def test_restore_brings_back_what_served_before(host: Host, cfg: Path) -> None:
    """With --restore, alpha serves again after the run, through its recorded unit."""
    r = cli(cfg, "tune", "tiny", "--layouts", "tp2,tp4", *BENCH, "--restore", "--json")
    report = json.loads(r.stdout)
    assert report["decision"]["winner"] == "tiny.tp4"
    assert report["serving"]["model"] == "alpha"
    assert unit_states(host, "alpha", "tiny.tp2", "tiny.tp4") == {
        "alpha": "active",
        "tiny.tp2": "inactive",
        "tiny.tp4": "inactive",
    }
    assert history(cfg)[0]["trigger"].endswith(":restore:to-1")


def test_apply_writes_the_layout_into_deploy_toml(host: Host, cfg: Path) -> None:
    """--apply writes the winner's layout into the model's table; the file still loads."""
    cli(cfg, "tune", "tiny", "--layouts", "tp2,tp4", *BENCH, "--apply", "--json")
    tiny = settings.load(cfg).models["tiny"]
    assert (tiny.tensor_parallel, tiny.gpus) == (4, (0, 1, 2, 3))


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--layouts", "tp3"], "layout tp3 cannot load on host"),
        (["--objective", "fastest"], "--objective 'fastest': unknown objective"),
        (["--concurrency", "1,0,4"], "--concurrency '1,0,4': '0' is less than 1"),
        (["--concurrency", "-4"], "--concurrency '-4': '-4' is less than 1"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_deploys_nothing(host: Host, cfg: Path, args: list[str], msg: str) -> None:
    """A refused layout, an unknown objective or a non-positive level: exit 2, one error line (after
    the staging progress, for a layout checked against the staged config), nothing deployed."""
    r = cli(cfg, "tune", "tiny", *args, "--yes", check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and msg in errors[0], r.stderr
    assert [h["model"] for h in history(cfg)] == ["alpha"]
    assert unit_states(host, "alpha") == {"alpha": "active"}


def _measured(state: Path) -> int:
    db = sqlite3.connect(state / "state.db")
    try:
        return int(db.execute("SELECT COUNT(*) FROM tune_results").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def _kill_after_first(cfg: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "tune",
            "tiny",
            "--layouts",
            "tp2,tp4",
            *BENCH,
            "--json",
            "--config",
            str(cfg),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _measured(tmp_path / "state"), lambda n: n >= 1, timeout=120, what="first candidate measured")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_resume_after_a_crash_does_not_measure_twice(host: Host, cfg: Path, tmp_path: Path) -> None:
    """Killed after its first candidate, `tune --resume` measures only the rest and picks the winner."""
    _kill_after_first(cfg, tmp_path)
    refused = cli(cfg, "tune", "tiny", "--layouts", "tp2", *BENCH, check=False)
    assert refused.returncode == 2 and "is unfinished" in refused.stderr
    report = json.loads(cli(cfg, "tune", "--resume", "--yes", "--json").stdout)
    assert report["decision"]["winner"] == "tiny.tp4"
    benched = [h for h in history(cfg) if h["model"] == "tiny.tp2" and h["bench"]]
    assert len(benched) == 1
    assert unit_states(host, "tiny.tp4") == {"tiny.tp4": "active"}


def test_abort_returns_what_served_before(host: Host, cfg: Path, tmp_path: Path) -> None:
    """Killed mid-run, `tune --abort` brings alpha back and closes the run."""
    _kill_after_first(cfg, tmp_path)
    r = cli(cfg, "tune", "--abort", "--json")
    assert json.loads(r.stdout)["serving"]["model"] == "alpha"
    assert unit_states(host, "alpha") == {"alpha": "active"}
    assert "no unfinished tune run" in cli(cfg, "tune", "--resume", check=False).stderr


def test_plan_shows_what_tune_measured(host: Host, cfg: Path, tmp_path: Path) -> None:
    """After a tune, `plan` ranks the measured layouts first and shows the failed one with its error and date."""
    cli(cfg, "tune", "tiny", "--layouts", "tp2,tp4,tp8", *BENCH, "--json")
    model_config = tmp_path / "config.json"
    model_config.write_text(json.dumps(TINY_CONFIG))
    r = cli(cfg, "plan", "tiny", "--tp", "8", "--model-config", str(model_config), "--json")
    out = json.loads(r.stdout)
    names = [lay["layout"]["name"] for lay in out["layouts"]]
    assert names[:2] == ["TP=4", "TP=2"] and names[-1] == "TP=8"
    assert out["layouts"][-1]["why"].startswith("FAILED to load on this host 20")
    assert "output_size of gate's and up's weight = 192" in out["warnings"][-1]
    assert out["ranking"].startswith("ranked by measurement (throughput@4 tok/s, tune run #1)")
