"""deploy.toml validation: one clear error naming file, key and value; exit code 2; no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
GOOD = """
[hosts.box]
gpus = 8
[models.a]
repo = "org/a"
port = 8000
gpus = [0, 1, 2, 3]
tensor_parallel = 4
[models.b]
repo = "org/b"
port = 8001
gpus = [4, 5, 6, 7]
tensor_parallel = 4
"""


def orchestrator(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run(*args, env=env, cwd=REPO)


@pytest.mark.parametrize(
    "extra,message",
    [
        ('[schedules.nightly]\ncron = "0 3 * * *"\nmodel = "nope"\n', "schedules.nightly.model: unknown model 'nope'"),
        ("", None),
    ],
)
def test_schedule_must_name_a_known_model(tmp_path: Path, extra: str, message: str | None) -> None:
    """A schedule naming an unknown model is refused; a config without one loads."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD + extra)
    result = orchestrator("models", "--config", str(cfg), "--json")
    if message is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2
        assert message in result.stderr


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("port = 8001", "port = 8000", "models.b.port: port 8000 is already used by model a on host box"),
        (
            "gpus = [4, 5, 6, 7]",
            "gpus = [4, 5, 6, 9]",
            "models.b.gpus: GPU index 9 is out of range: host box has 8 GPUs",
        ),
        (
            "tensor_parallel = 4\n[models.b]",
            "tensor_parallel = 2\n[models.b]",
            "models.a: tensor_parallel 2 x pipeline_parallel 1 x data_parallel 1 = 2 GPUs, but gpus lists 4",
        ),
        ('repo = "org/a"', 'repo = "org/a"\ntensor_paralel = 4', "models.a.tensor_paralel: unknown key"),
        ("gpus = 8", 'gpus = "eight"', "hosts.box.gpus: must be an integer, not a string (got 'eight')"),
        ('repo = "org/a"', 'repo = "org/a"\nargs = ["--x", "a\\nExecStartPre=/bin/sh"]', "control character"),
        (
            'repo = "org/a"',
            'repo = "org/a"\nenv = { HF_TOKEN = "hf_abc" }',
            "models.a.env.HF_TOKEN: holds a secret by its name",
        ),
        ("[hosts.box]", "[hosts.box\n", "not valid TOML"),
        (
            "tensor_parallel = 4\n[models.b]",
            "tensor_parallel = 4\nload_deadline_s = inf\n[models.b]",
            "models.a.load_deadline_s: Input should be a finite number (got inf)",
        ),
        (
            "tensor_parallel = 4\n[models.b]",
            "tensor_parallel = 4\nload_deadline_s = 1e300\n[models.b]",
            "models.a.load_deadline_s: Input should be less than or equal to 604800 (got 1e+300)",
        ),
        (
            "gpus = 8",
            "gpus = 8\n[defaults]\nstop_timeout_s = nan",
            "defaults.stop_timeout_s: Input should be a finite number",
        ),
        (
            "gpus = 8",
            "gpus = 8\n[policy]\nwatch_interval_s = 1e-300",
            "policy.watch_interval_s: Input should be greater",
        ),
        (
            'repo = "org/a"',
            'repo = "org/a"\nrevision = "../../../../etc"',
            "models.a.revision: revision '../../../../etc' contains '..'",
        ),
        (
            'repo = "org/a"',
            'repo = "org/a"\nrevision = "-x"',
            "models.a.revision: revision '-x' must not start with '-'",
        ),
        ('repo = "org/a"', 'repo = ".."', "models.a.repo: repo '..' is not a Hugging Face repo id"),
        (
            'repo = "org/a"',
            'repo = "org/a"\nargs = ["--x", "safe\u202eevil"]',
            "models.a.args: argument 'safe\\u202eevil' contains the invisible format character '\\u202e' (U+202E",
        ),
        (
            'repo = "org/a"',
            'repo = "org/a"\nserved_name = "a\u200bb"',
            "models.a.served_name: value 'a\\u200bb' contains",
        ),
        (
            'repo = "org/a"',
            'repo = "org/a"\nenv = { FOO = "x\u2029y" }',
            "models.a.env: value of FOO 'x\\u2029y' contains",
        ),
        (
            'repo = "org/a"',
            'repo = "org/a"\nenv = { FOO = "x\ty" }',
            "models.a.env: value of FOO 'x\\ty' contains the control",
        ),
        (
            "[hosts.box]",
            '[schedules.s]\ncron = "not a cron"\nmodel = "a"\n[hosts.box]',
            "schedules.s.cron: 'not a cron' is not a valid cron expression",
        ),
        (
            "[hosts.box]",
            '[schedules.s]\ncron = "0 3 * * *"\nmodel = "a"\nwindow = "25:99-99:00"\n[hosts.box]',
            "schedules.s.window: window '25:99-99:00' has a time out of range",
        ),
        (
            "[hosts.box]",
            '[schedules.s]\ncron = "0 3 * * *"\nmodel = "a"\ntimezone = "Nowhere/City"\n[hosts.box]',
            "schedules.s.timezone: unknown time zone 'Nowhere/City'",
        ),
        (
            'gpus = 8\n[models.a]\nrepo = "org/a"',
            'gpus = 8\n[proxy]\nenabled = true\n[models.a]\nrepo = "org/a"\nserved_name = "my model"',
            "models.a.served_name: 'my model' cannot be routed by the front proxy",
        ),
        (
            "gpus = 8\n[models.a]",
            "gpus = 8\n[proxy]\nenabled = true\nport = 8001\n[models.a]",
            "models.b.port: port 8001 is the front proxy's port",
        ),
        (
            "[hosts.box]",
            "[proxy]\ndrain_timeout_s = -1\n[hosts.box]",
            "proxy.drain_timeout_s: Input should be greater than 0",
        ),
    ],
)
def test_invalid_file_names_file_key_and_value(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Each invalid deploy.toml exits 2 with one error naming the file, the key path and the value."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD.replace(old, new, 1))
    result = orchestrator("render", "--config", str(cfg), "--out", str(tmp_path / "units"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {cfg}: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "units").exists()


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    """ORCHESTRATOR_* variables override deploy.toml values."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD)
    env = {"PATH": "/usr/bin:/bin", "ORCHESTRATOR_CONFIG": str(cfg), "ORCHESTRATOR_DEFAULTS__LOAD_DEADLINE_S": "42"}
    result = orchestrator("models", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert '"load_deadline_s": 42.0' in result.stdout


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    """A missing deploy.toml names the path and how to point at another."""
    result = orchestrator("models", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert "nope.toml: file not found" in result.stderr


def test_render_writes_every_unit_and_diff_reports_changes(tmp_path: Path) -> None:
    """render writes units/vllm-<model>.service; --diff shows and exits 1 only when they differ."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD)
    out = tmp_path / "units"
    assert orchestrator("render", "--config", str(cfg), "--out", str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["vllm-a.service", "vllm-b.service"]
    assert orchestrator("render", "--config", str(cfg), "--out", str(out), "--diff").returncode == 0
    cfg.write_text(GOOD.replace('repo = "org/a"', 'repo = "org/a"\nmax_model_len = 4096'))
    changed = orchestrator("render", "a", "--config", str(cfg), "--out", str(out), "--diff")
    assert changed.returncode == 1
    assert "+ExecStart=" in changed.stdout and '"--max-model-len" "4096"' in changed.stdout


@pytest.mark.parametrize("command", [["models"], ["render", "--diff"], ["schedules"], ["status", "--local"]])
def test_invalid_schedule_is_refused_by_every_command(tmp_path: Path, command: list[str]) -> None:
    """A bad cron or an unknown host in a schedule stops every command at load time with the same line."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD + '[schedules.s]\ncron = "0 0 31 2 *"\nmodel = "a"\nhost = "nope"\n')
    result = orchestrator(*command, "--config", str(cfg))
    assert result.returncode == 2
    assert result.stderr == (f"error: {cfg}: schedules.s.cron: cron expression '0 0 31 2 *' never fires\n")
    cfg.write_text(GOOD + '[schedules.s]\ncron = "0 3 * * *"\nmodel = "a"\nhost = "nope"\n')
    result = orchestrator(*command, "--config", str(cfg))
    assert (result.returncode, result.stderr) == (
        2,
        (f"error: {cfg}: schedules.s.host: unknown host 'nope' (known: box)\n"),
    )


def test_non_utf8_file_names_the_byte_and_line(tmp_path: Path) -> None:
    """A deploy.toml that is not UTF-8 is one line naming the file, the byte and where it is; exit 2."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    result = orchestrator("models", "--config", str(cfg))
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {cfg}: not UTF-8 text: byte 0xe9 at line 14, column 6 (TOML, JSON and deploy files must be UTF-8)\n"
    )


@pytest.mark.parametrize(
    "var,value,message",
    [
        (
            "ORCHESTRATOR_HOSTS",
            "{not json",
            ("environment variable ORCHESTRATOR_HOSTS: hosts: not valid JSON for a table or list (got '{not json')"),
        ),
        (
            "ORCHESTRATOR_DEFAULTS__LOAD_DEADLINE_S",
            "abc",
            (
                "environment variable ORCHESTRATOR_DEFAULTS__LOAD_DEADLINE_S: "
                "defaults.load_deadline_s: Input should be a valid number"
            ),
        ),
        (
            "ORCHESTRATOR_POLICY__ON_UNHEALTHY",
            "explode",
            ("environment variable ORCHESTRATOR_POLICY__ON_UNHEALTHY: policy.on_unhealthy: Input should be"),
        ),
    ],
)
def test_environment_override_error_names_the_variable(tmp_path: Path, var: str, value: str, message: str) -> None:
    """A bad ORCHESTRATOR_* override is reported as coming from that variable, not from the file."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(GOOD)
    result = orchestrator("models", "--config", str(cfg), env={"PATH": "/usr/bin:/bin", var: value})
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert "Traceback" not in result.stderr and str(cfg) not in result.stderr
