"""adopt's pure part (core/adopt.py): a found engine's unit text or argv in, a deploy.toml entry out whose
rendered unit runs the same command, token for token; what it cannot carry named."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.core import adopt as a
from orchestrator.core import adopt_found as u
from orchestrator.core.render import render_unit
from orchestrator.deploy.planning import default_template
from orchestrator.engines import vllm_argv as v
from orchestrator.errors import AdoptError

ROOT_PY = ("/root/ml-env/bin/python3", "-m", "vllm.entrypoints.openai.api_server")
SERVE = ("/opt/ml-env/bin/vllm", "serve")
BASE = """state_dir = "{state}"
[defaults]
user = "vllm"
group = "vllm"
engine = {engine}
[hosts.box]
transport = "ssh"
address = "10.0.0.9"
bind = "0.0.0.0"
gpus = 8
gpu_memory_gib = 96
"""


def target(engine: tuple[str, ...] = ROOT_PY, **kw: object) -> a.Target:
    return a.Target(host="box", engine=engine, bind="0.0.0.0", user="vllm", env_dir="/etc/orchestrator/env", **kw)  # type: ignore[arg-type]


def exec_start(unit_text: str) -> list[str]:
    [line] = [ln for ln in unit_text.splitlines() if ln.startswith("ExecStart=")]
    return u.split_words(line.removeprefix("ExecStart="))


def rendered(tmp_path: Path, adoption: a.Adoption, engine: tuple[str, ...]) -> list[str]:
    """The ExecStart argv of the unit deploy.toml renders for the adopted entry (the file loaded as at start)."""
    base = BASE.format(state=tmp_path / "state", engine=a._toml_list(list(engine)))
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(a.merged(base, [adoption], "box"))
    catalog = settings.load(cfg)
    model = catalog.models[adoption.name]
    return exec_start(render_unit(catalog, model, default_template()).text)


SEED_UNIT = """[Unit]
Description=Kimi K2.5 INT4
After=network-online.target

[Service]
Type=simple
User=root
Environment="CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" NCCL_IB_DISABLE=1
Environment=SAFETENSORS_FAST_GPU=1
Environment=HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789
EnvironmentFile=-/etc/vllm/kimi.env
ExecStartPre=/usr/bin/nvidia-smi -pm 1
ExecStart=/root/ml-env/bin/python3 -m vllm.entrypoints.openai.api_server \\
    --model /shared/models/Kimi-K2.5 --served-model-name kimi-k2.5 \\
    --tensor-parallel-size 8 --port 8003 --host 0.0.0.0 --max-model-len 131072 \\
    --gpu-memory-utilization 0.92 --trust-remote-code --enable-auto-tool-choice \\
    --tool-call-parser kimi_k2 --reasoning-parser kimi_k2
Restart=always

[Install]
WantedBy=multi-user.target
"""

# (what, engine, the words after it, environment): the shapes the seeds and the docs write by hand.
SHAPES = [
    (
        "api_server, --flag value",
        ROOT_PY,
        [
            "--model",
            "/shared/models/MiniMax-M2.5",
            "--served-model-name",
            "minimax-m2.5",
            "--tensor-parallel-size",
            "4",
            "--port",
            "8001",
            "--host",
            "0.0.0.0",
            "--max-model-len",
            "196608",
            "--trust-remote-code",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "minimax_m2",
            "--reasoning-parser",
            "minimax_m2_append_think",
        ],
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_IB_DISABLE": "1"},
    ),
    (
        "vllm serve MODEL, short -tp",
        SERVE,
        ["/shared/models/Qwen3-8B", "--port", "8004", "-tp", "2", "--served-model-name", "qwen3-8b", "--enforce-eager"],
        {"CUDA_VISIBLE_DEVICES": "6,7"},
    ),
    (
        "--flag=value forms",
        ROOT_PY,
        [
            "--model=/shared/models/Llama-3.1-8B",
            "--served-model-name=llama",
            "--port=8005",
            "--max-model-len=8192",
            "--gpu-memory-utilization=0.85",
            "--tool-call-parser=llama3_json",
            "--enable-auto-tool-choice",
        ],
        {"CUDA_VISIBLE_DEVICES": "5"},
    ),
    (
        "boolean flags anywhere, defaults left out",
        SERVE,
        [
            "/shared/models/tiny",
            "--served-model-name",
            "tiny",
            "--trust-remote-code",
            "--enable-prefix-caching",
            "--kv-cache-dtype",
            "fp8",
            "--enable-expert-parallel",
            "--tensor-parallel-size",
            "2",
            "--disable-log-requests",
        ],
        {"CUDA_VISIBLE_DEVICES": "0,1"},
    ),
    (
        "quoted words with spaces and quotes",
        ROOT_PY,
        [
            "--model",
            "/shared/models/GLM-4.6",
            "--served-model-name",
            "glm",
            "--port",
            "8006",
            "--override-generation-config",
            '{"temperature": 0.6, "top_p": 0.95}',
            "--chat-template",
            "/etc/vllm/chat template.jinja",
        ],
        {"CUDA_VISIBLE_DEVICES": "3"},
    ),
]


@pytest.mark.parametrize(("what", "engine", "words", "env"), SHAPES, ids=[s[0] for s in SHAPES])
def test_entry_renders_the_same_command(
    tmp_path: Path, what: str, engine: tuple[str, ...], words: list[str], env: dict[str, str]
) -> None:
    """Each shape's entry renders an ExecStart with the same engine, flag/value pairs and args tail, token for token."""
    argv = (*engine, *words)
    adoption = a.adopt(a.Found(argv=argv, env=tuple(env.items()), unit="vllm-x.service"), target(engine))
    assert adoption.blockers == ()
    out = rendered(tmp_path, adoption, engine)
    assert out[: len(engine)] == list(engine)
    args = tuple(adoption.entry.get("args", ()))
    assert a.same_command(argv, out, adoption.explicit, args) == []
    assert sorted(v.pairs(out)) == sorted(v.pairs(argv) + a._explicit_pairs(adoption.explicit))
    if args:
        assert out[-len(args) :] == list(args)


def test_seed_unit_maps_to_an_entry(tmp_path: Path) -> None:
    """The seeds' hand-written unit: layout, served name, port, GPUs, env;
    secrets and ExecStartPre named, not copied."""
    fields = u.parse_unit(SEED_UNIT, "vllm-kimi-k25-int4.service")
    found = a.Found(
        argv=fields.argv,
        env=fields.env,
        user=fields.user,
        environment_files=fields.environment_files,
        unit="vllm-kimi-k25-int4.service",
        unit_text=SEED_UNIT,
        unexpressed=fields.unexpressed,
    )
    adoption = a.adopt(found, target())
    assert adoption.name == "kimi-k25-int4"
    assert adoption.entry == {
        "repo": "local/Kimi-K2.5",
        "source": "local:/shared/models/Kimi-K2.5",
        "served_name": "kimi-k2.5",
        "port": 8003,
        "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
        "tensor_parallel": 8,
        "max_model_len": 131072,
        "gpu_memory_utilization": 0.92,
        "args": [
            "--trust-remote-code",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "kimi_k2",
            "--reasoning-parser",
            "kimi_k2",
        ],
        "env": {"NCCL_IB_DISABLE": "1", "SAFETENSORS_FAST_GPU": "1"},
    }
    notes = "\n".join(adoption.notes)
    assert "ExecStartPre=/usr/bin/nvidia-smi -pm 1" in notes
    assert "HF_TOKEN: a secret (value not shown), not copied" in notes and "hf_abc" not in notes
    assert "EnvironmentFile=/etc/vllm/kimi.env stays where it is" in notes
    assert "runs as user root; the rendered unit runs it as vllm" in notes
    assert "hf_abc" not in a.entry_toml(adoption, "box")
    assert a.same_command(fields.argv, rendered(tmp_path, adoption, ROOT_PY), adoption.explicit) == []


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('a "b c" \'d "e"\' f\\x41 g%%h', ["a", "b c", 'd "e"', "fA", "g%h"]),
        ('"--override-generation-config" "{\\"t\\": 1}"', ["--override-generation-config", '{"t": 1}']),
        ("  spaced\t words  ", ["spaced", "words"]),
    ],
)
def test_split_words_reads_as_systemd(line: str, words: list[str]) -> None:
    """Quotes, C escapes and %% as systemd reads an ExecStart= line."""
    assert u.split_words(line) == words


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[Service]\nExecStart=/usr/bin/vllm serve /m --port %i\n", "specifier '%i'"),
        ("[Service]\nExecStart=/usr/bin/vllm serve /m --port $PORT\n", "uses an environment variable"),
        ('[Service]\nExecStart=/usr/bin/vllm serve "/m\n', 'quote " is never closed'),
        ("[Service]\nType=simple\n", "no ExecStart="),
    ],
)
def test_unit_forms_an_entry_cannot_say(text: str, named: str) -> None:
    """Specifiers, $VARIABLES, a broken quote, no ExecStart: AdoptError (exit 2) naming the unit and the value."""
    with pytest.raises(AdoptError) as exc:
        u.parse_unit(text, "odd.service")
    assert exc.value.exit_code == 2 and "unit odd.service" in str(exc.value) and named in str(exc.value)


def test_drop_in_resets_exec_start() -> None:
    """`systemctl cat` output: a drop-in's empty ExecStart= resets, its own one wins; Environment= adds up."""
    text = (
        "# /etc/systemd/system/x.service\n[Service]\nExecStart=/usr/bin/vllm serve /a\nEnvironment=A=1\n"
        "# /etc/systemd/system/x.service.d/override.conf\n[Service]\nExecStart=\n"
        "ExecStart=/usr/bin/vllm serve /b --port 9\nEnvironment=B=2\n"
    )
    fields = u.parse_unit(text, "x.service")
    assert fields.argv == ("/usr/bin/vllm", "serve", "/b", "--port", "9") and dict(fields.env) == {"A": "1", "B": "2"}


def test_seed_unit_on_a_host_whose_engine_moved() -> None:
    """The seeds' /root engine on a host whose engine is /opt's: a note naming both, not a blocker;
    the render differs there only."""
    fields = u.parse_unit(SEED_UNIT, "vllm-kimi-k25-int4.service")
    found = a.Found(argv=fields.argv, env=fields.env, unit="vllm-kimi-k25-int4.service", unit_text=SEED_UNIT)
    opt = ("/opt/ml-env/bin/python3", *ROOT_PY[1:])
    b = a.adopt(found, target(opt))
    assert b.blockers == () and any("'/root/ml-env/bin/python3'" in n and "/opt/ml-env" in n for n in b.notes)
    rendered = [*opt, *fields.argv[len(ROOT_PY) :]]
    assert a.same_command(fields.argv, rendered) == [f"engine {list(ROOT_PY)} != {list(opt)}"]


def test_not_vllm() -> None:
    """Only vLLM's API server counts: `-m ...api_server`, `vllm serve`, `-m vllm.entrypoints.cli.main serve`."""
    assert v.is_vllm(["/usr/bin/python3", "-m", v.API_SERVER, "--model", "/m"])
    assert v.is_vllm(["/opt/venv/bin/vllm", "serve", "/m"])
    assert v.is_vllm(["python", "-m", v.CLI_MAIN, "serve", "/m"])
    assert not v.is_vllm(["/usr/bin/python3", "-m", "http.server"])
    assert not v.is_vllm(["/usr/bin/vllm", "bench", "serve"])


def test_blockers_name_the_bad_value() -> None:
    """GPU count against the layout, UUID devices, another engine, a taken name or port, --api-key:
    named, not guessed."""
    argv = (
        *ROOT_PY,
        "--model",
        "/m/x",
        "--served-model-name",
        "x",
        "--tensor-parallel-size",
        "2",
        "--port",
        "8000",
        "--api-key",
        "sk-abcdefghijklmnopqrstuvwxyz0123456789abcd",
    )
    found = a.Found(argv=argv, env=(("CUDA_VISIBLE_DEVICES", "0,1,2"),), pid=4242)
    b = a.adopt(found, target(SERVE, taken=frozenset({"x"}), ports=frozenset({8000})))
    text = "\n".join(b.blockers)
    assert "CUDA_VISIBLE_DEVICES=0,1,2 lists 3 GPU(s) for a layout of 2" in text
    assert "is not host box's engine ['/opt/ml-env/bin/vllm', 'serve']" in "\n".join(b.notes)
    assert "model 'x' is already in deploy.toml" in text and "port 8000 is already a model's port" in text
    assert "--api-key carries" in text and "sk-abc" not in text + str(b.entry)
    unnamed = a.adopt(a.Found(argv=(*SERVE, "/shared/models/tiny"), pid=5), target(SERVE))
    assert any("vLLM serves it as '/shared/models/tiny'" in x for x in unnamed.blockers)
    uuid = a.adopt(a.Found(argv=argv[:-2], env=(("CUDA_VISIBLE_DEVICES", "GPU-1a2b,GPU-3c4d"),), pid=1), target())
    assert any("not UUIDs" in x for x in uuid.blockers)


def test_hand_run_process_without_devices() -> None:
    """No CUDA_VISIBLE_DEVICES: vLLM takes GPUs 0..world-1, and the entry says so (a note);
    named after the served name."""
    found = a.Found(argv=(*SERVE, "/m/Qwen", "--served-model-name", "qwen", "-tp", "2"), pid=77, user="vllm")
    b = a.adopt(found, target(SERVE))
    assert b.name == "qwen" and b.entry["gpus"] == [0, 1] and b.blockers == ()
    assert any("no CUDA_VISIBLE_DEVICES" in n for n in b.notes)
    assert b.explicit == ("--port", "8000", "--gpu-memory-utilization", "0.9", "--host", "0.0.0.0")


def test_console_script_through_its_interpreter() -> None:
    """/proc shows `python3 /opt/venv/bin/vllm serve ...` for a `vllm serve` started by hand:
    the engine is the script."""
    argv = ("/opt/ml-env/bin/python3", *SERVE, "/m/q", "--served-model-name", "q")
    b = a.adopt(a.Found(argv=argv, pid=8), target(SERVE))
    assert b.engine == SERVE and b.blockers == ()
    assert a.same_command(argv, [*SERVE, "--model", "/m/q", "--served-model-name", "q"]) == []


def test_no_model_is_an_error() -> None:
    """A command line with no --model and no positional: AdoptError naming the pid."""
    with pytest.raises(AdoptError, match="pid 9: no --model"):
        a.adopt(a.Found(argv=(*ROOT_PY, "--port", "8000"), pid=9), target())


def test_stray_word_is_kept_in_place_and_named() -> None:
    """A word after an unknown boolean flag stays where it was in args, and the note names it."""
    b = a.adopt(a.Found(argv=(*SERVE, "/m", "--my-switch", "--x", "1", "oops"), pid=3), target(SERVE))
    assert b.entry["args"] == ["--my-switch", "--x", "1", "oops"] and any("'oops'" in n for n in b.notes)
