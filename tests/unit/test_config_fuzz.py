"""Generated deploy.toml documents through the real CLI: exit 0 or 2, never a traceback, nothing
written outside --out, and no secret in any unit or message."""

from __future__ import annotations

import contextlib
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.secrets import secret_name, secret_value_kind

HF = "hf_" + "Qw3" * 12
SK = "sk-" + "Zx8" * 10
AKIA = "AKIA" + "QWERTYUIOPASDFGH"
PLAIN = "plain-s3cret-value"  # a secret only by where it is put: after --api-key, under HF_TOKEN
SHAPED = (HF, SK, AKIA)


def base() -> dict[str, Any]:
    return {
        "state_dir": "/var/lib/orchestrator",
        "defaults": {"engine": ["/opt/vllm/bin/vllm", "serve"], "load_deadline_s": 600},
        "policy": {"rollback_on_failure": True},
        "hosts": {"box": {"gpus": 4, "transport": "ssh", "address": "10.0.0.5"}},
        "models": {
            "a": {
                "repo": "org/a",
                "revision": "main",
                "gpus": [0, 1],
                "tensor_parallel": 2,
                "port": 8000,
                "args": ["--trust-remote-code"],
                "env": {"NCCL_IB_DISABLE": "1"},
            },
            "b": {"repo": "org/b", "gpus": [2, 3], "tensor_parallel": 2, "port": 8001},
        },
        "schedules": {"nightly": {"cron": "0 3 * * *", "action": "switch", "model": "a", "window": "01:00-05:00"}},
    }


KNOWN_PATHS: list[tuple[str, ...]] = [
    ("state_dir",),
    ("socket_group",),
    ("metrics_port",),
    ("nonsense",),
    *[
        ("defaults", k)
        for k in (
            "user",
            "group",
            "engine",
            "bind",
            "gpu_memory_utilization",
            "load_deadline_s",
            "stop_timeout_s",
            "free_timeout_s",
            "health_interval_s",
            "restart_sec",
            "start_limit_burst",
            "env_dir",
            "typo",
        )
    ],
    *[
        ("policy", k)
        for k in (
            "rollback_on_failure",
            "watch_interval_s",
            "unhealthy_after_s",
            "on_unhealthy",
            "min_tok_s_ratio",
            "keep_revisions",
        )
    ],
    *[
        ("hosts", "box", k)
        for k in (
            "transport",
            "address",
            "ssh_port",
            "gpus",
            "gpu_memory_gib",
            "models_dir",
            "engine",
            "bind",
            "python",
        )
    ],
    *[
        ("models", "a", k)
        for k in (
            "repo",
            "revision",
            "source",
            "served_name",
            "port",
            "gpus",
            "tensor_parallel",
            "expert_parallel",
            "max_model_len",
            "max_num_seqs",
            "gpu_memory_utilization",
            "load_deadline_s",
            "args",
            "env",
            "host",
        )
    ],
    ("models", "a", "env", "FOO"),
    ("models", "a", "env", "HF_TOKEN"),
    ("models", "a", "args", "0"),
    *[("schedules", "nightly", k) for k in ("cron", "action", "model", "host", "window", "on_busy", "timezone")],
    ("models", "../x"),
    ("hosts", "Bad Name"),
]

interesting = st.sampled_from(
    [
        "../../etc",
        "/etc/passwd",
        "a\nExecStartPre=/bin/sh",
        "x\u202ey",
        "\u200b",
        "%n%h",
        "$HOME",
        "main",
        "0" * 40,
        "",
        " ",
        "--api-key",
        "25:99-99:00",
        "not a cron",
        "0 0 31 2 *",
        "Europe/Berlin",
        "hf_transfer",
        "local:/x",
        "none",
        'un"balanced',
        "refs/pr/1",
        "-rf",
        "a@{1}",
        "vllm-x.service",
        "127.0.0.1",
        "skip",
        "queue",
    ]
)
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1.0, 0.0, 1e-300, 2**31, 65536]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
    interesting,
    st.sampled_from(SHAPED),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3),
    max_leaves=6,
)
secret_injections = st.sampled_from(
    [
        (("models", "a", "args"), ["--api-key", PLAIN]),
        (("models", "a", "args"), [f"--hf-token={PLAIN}"]),
        (("models", "a", "env", "HF_TOKEN"), PLAIN),
        (("models", "a", "env", "AWS_SECRET_ACCESS_KEY"), PLAIN),
        (("models", "b", "env"), {"X": HF}),
        (("models", "a", "args"), ["--x", SK]),
        (("models", "b", "served_name"), AKIA),
    ]
)
# Values of the right type where text is expected: most such documents are valid and render.
# PLAIN only ever goes where it is a secret by position: after a secret flag, under a secret name.
words = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=16),
    interesting,
    st.sampled_from(SHAPED),
    st.sampled_from(["--api-key", "--token", "--x", "--max-num-batched-tokens"]),
)
arg_chunks = st.one_of(
    words.map(lambda w: [w]), st.sampled_from([["--api-key", PLAIN], ["--hf-token", PLAIN], [f"--password={PLAIN}"]])
)
args = st.lists(arg_chunks, max_size=4).map(lambda chunks: [a for c in chunks for a in c])
env = st.builds(
    lambda plain, secret: {**plain, **secret},
    st.dictionaries(st.sampled_from(["FOO", "TOKENIZERS_PARALLELISM", "BAR_2"]), words, max_size=3),
    st.dictionaries(st.sampled_from(["HF_TOKEN", "MY_KEY", "DB_PASSWORD"]), st.just(PLAIN) | words, max_size=1),
)
plausible = st.one_of(
    st.tuples(st.just(("models", "a", "args")), args),
    st.tuples(st.sampled_from([("models", "b", "env"), ("models", "a", "env")]), env),
    st.tuples(
        st.sampled_from(
            [
                ("models", "a", "served_name"),
                ("models", "b", "revision"),
                ("models", "a", "repo"),
                ("defaults", "bind"),
                ("hosts", "box", "models_dir"),
                ("schedules", "nightly", "cron"),
                ("schedules", "nightly", "window"),
                ("schedules", "nightly", "timezone"),
            ]
        ),
        words,
    ),
    st.tuples(
        st.sampled_from(
            [
                ("defaults", "load_deadline_s"),
                ("models", "a", "load_deadline_s"),
                ("defaults", "stop_timeout_s"),
                ("models", "a", "max_model_len"),
            ]
        ),
        st.one_of(st.integers(min_value=-5, max_value=10**7), st.floats(allow_nan=True)),
    ),
)
mutation = st.one_of(
    plausible,
    plausible,
    st.tuples(st.sampled_from(KNOWN_PATHS), values),
    st.tuples(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3).map(tuple), values),
    secret_injections,
)


def put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml(doc: dict[str, Any]) -> str:
    return "".join(f"{toml_value(k)} = {toml_value(v)}\n" for k, v in doc.items())


def env_keys(unit: str) -> list[str]:
    return re.findall(r'^Environment="([^=]+)=', unit, flags=re.MULTILINE)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(mutation, min_size=1, max_size=3))
def test_generated_configs_exit_cleanly_and_keep_secrets_out(mutations: list[tuple[tuple[str, ...], Any]]) -> None:
    """Any document: exit 0 or 2, no traceback, files only under --out, no secret in a unit or a message."""
    doc = base()
    for path, value in mutations:
        put(doc, path, value)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = root / "deploy.toml"
        cfg.write_text(toml(doc), encoding="utf-8")
        runner = CliRunner()
        cwd = root / "cwd"
        cwd.mkdir()
        with contextlib.chdir(cwd):
            listed = runner.invoke(main, ["models", "--config", str(cfg), "--json"])
            rendered = runner.invoke(main, ["render", "--config", str(cfg), "--out", "out"])
            written = sorted(str(p.relative_to(cwd)) for p in Path(cwd).rglob("*"))
            units = [p.read_text() for p in sorted(Path(cwd, "out").glob("*"))]
        assert sorted(p.name for p in root.iterdir()) == ["cwd", "deploy.toml"]  # nothing beside the config either
    for result in (listed, rendered):
        assert result.exit_code in (0, 2), (result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert "Traceback" not in result.output + result.stderr
        assert result.exit_code == 0 or result.stderr.startswith("error: "), result.stderr
        for secret in (*SHAPED, PLAIN):
            assert secret not in result.output + result.stderr, (secret, result.stderr)
    assert listed.exit_code == rendered.exit_code, (listed.stderr, rendered.stderr)
    event(f"exit {rendered.exit_code}")
    if rendered.exit_code != 0:
        assert written == []
        return
    assert all(re.fullmatch(r"out(/vllm-[a-z0-9._-]+\.service)?", w) for w in written), written
    assert len(units) == len(written) - 1 >= 1
    for unit in units:
        assert secret_value_kind(unit) is None, unit
        assert PLAIN not in unit
        assert not any(secret_name(k) for k in env_keys(unit)), env_keys(unit)
