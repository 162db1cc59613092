"""Secrets in text from outside the tool (journal lines, command output, HTTP bodies) are hidden where
that text enters an error, an event or history; secret names are recognised by what they say."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.errors import CommandFailed, HealthCheckFailed
from orchestrator.secrets import redact, secret_name, secret_value_kind

from .conftest import World, make_catalog

REPO = Path(__file__).resolve().parents[2]
HF = "hf_" + "Qw7" * 12
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXZhbHVl"
# Each secret below is a plain word, so only its name or its shape can give it away.
LEAKS = {
    "hf": f"huggingface_hub.errors.HfHubHTTPError: 401 for token {HF}",
    "vllm-args": "non-default args: {'model': '/m', 'api_key': ['plainword1'], 'max_num_batched_tokens': 8192}",
    "flag": "argv: vllm serve /m --api-key plainword2 --port 8000",
    "env": "AUTH_HEADER=plainword3 DATABASE_URL=plainword4 COOKIE=plainword5",
    "header": "request headers: {'authorization': 'Bearer plainword6xyz', 'cookie': 'plainword7'}",
    "url": "connecting to postgres://svc:plainword8@db.lan:5432/x",
    "jwt": f"JWT={JWT} rejected; session token {JWT}",
    "bearer": "curl -H 'Authorization: Bearer plainword9abc' http://x",
}
SECRETS = [HF, JWT] + [f"plainword{i}" for i in range(1, 10)]


def hidden(text: str) -> bool:
    return not any(s in text for s in SECRETS)


@pytest.mark.parametrize("line", list(LEAKS.values()), ids=list(LEAKS))
def test_redact_hides_each_secret_of_a_line(line: str) -> None:
    """Every secret of a journal-like line is replaced; the rest of the line stays readable."""
    out = redact(line)
    assert hidden(out) and "not shown>" in out


@pytest.mark.parametrize(
    "line",
    [
        "max_num_batched_tokens: 8192",
        "tokenizer: /models/m",
        "author: alice",
        "401 Unauthorized: check /etc/orchestrator/env/hf-token",
        "the token is expired",
        "KV cache: 2.1 GiB, key: value cache",
    ],
)
def test_redact_leaves_ordinary_text_alone(line: str) -> None:
    """Ordinary log text (tokens counts, tokenizer paths, an error naming a token file) is unchanged."""
    assert redact(line) == line.replace("key: value", "key: <a secret by its name, not shown>")


@pytest.mark.parametrize(
    "name",
    [
        "AUTHORIZATION",
        "AUTH_HEADER",
        "BEARER",
        "COOKIE",
        "JWT",
        "DATABASE_URL",
        "SESSION_COOKIE",
        "X_AUTH",
        "OAUTH2_CLIENT",
        "PROXY_AUTHORIZATION",
        "REDIS_URI",
        "SQLALCHEMY_DATABASE_URI",
        "PG_DSN",
        "MONGO_CONNECTION_STRING",
        "JWT_SIGNING_KEY",
        "--bearer",
        "webhook-signature",
        "PASSWORD_SALT",
        "BASIC_AUTH",
    ],
)
def test_secret_names_by_what_they_say(name: str) -> None:
    """Names about authorization, bearer tokens, cookies, JWTs and connection strings are secrets."""
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "AUTHOR",
        "HF_ENDPOINT",
        "VLLM_HOST_IP",
        "NCCL_SOCKET_IFNAME",
        "TOKENIZERS_PARALLELISM",
        "DATABASE_NAME",
        "VLLM_SERVER_URL",
        "PYTORCH_CUDA_ALLOC_CONF",
        "--ssl-keyfile",
    ],
)
def test_ordinary_names_stay_ordinary(name: str) -> None:
    """Endpoints, IPs, interfaces and a database's name are not secrets."""
    assert not secret_name(name)


@pytest.mark.parametrize(
    "value,kind",
    [
        (JWT, "JSON web token"),
        ("Bearer abcdefgh12345678", "bearer token"),
        ("https://u:p4ss@example.org/", "URL with a password"),
    ],
)
def test_new_value_shapes(value: str, kind: str) -> None:
    """JWTs, bearer headers and URLs with user:password@ are secrets by their shape."""
    assert kind in (secret_value_kind(value) or "")


def crashing_world(store: SqliteStore | None = None) -> World:
    world = World(make_catalog())
    if store is not None:
        world.store = store  # type: ignore[assignment]
        ports = world.host.ports(world.catalog.hosts["box"], world.weights)
        world.engine = Deployer(
            world.catalog, store, lambda name: ports, progress=lambda e, f: world.events.append((e, f))
        )
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "crash"
    world.host.journal["vllm-beta.service"] = list(LEAKS.values())
    return world


def test_journal_secrets_never_reach_the_error_or_events() -> None:
    """A crash whose journal quotes secrets records the error and events without any of them."""
    world = crashing_world()
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK and "journal" in (dep.error or "")
    assert "non-default args" in (dep.error or "") and hidden(dep.error or "")
    assert hidden(json.dumps(world.events)) and hidden(json.dumps(world.store.events(limit=1000)))


def test_history_json_shows_no_secret_from_the_journal(tmp_path: Path) -> None:
    """`history --json` over a state.db whose failed switch quoted a journal with secrets shows none."""
    state = tmp_path / "state"
    state.mkdir()
    store = SqliteStore(state / "state.db", group=None)
    crashing_world(store).switch("beta")
    store.close()
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(f'state_dir = "{state}"\n[hosts.box]\ngpus = 8\n')
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "history", "--json", "--local", "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "journal" in done.stdout and hidden(done.stdout)


def test_command_output_is_redacted_in_its_error() -> None:
    """A failed command's quoted output hides the secrets in it."""
    exc = CommandFailed("hf download org/m", 1, "\n".join(LEAKS.values()))
    assert hidden(str(exc)) and hidden(exc.output)


@pytest.fixture
def leaky_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.dumps({"error": LEAKS["header"] + " " + LEAKS["hf"]}).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_engine_http_answer_is_redacted_in_the_health_error(leaky_server: str) -> None:
    """An engine whose error body quotes a token fails the check without the token in the message."""
    with pytest.raises(HealthCheckFailed) as info:
        HttpHealthProbe().complete(leaky_server, "m")
    assert "HTTP 500" in str(info.value) and hidden(str(info.value))


@pytest.mark.parametrize("text", ["a:" * 5000, "x=" * 5000 + "HF_TOKEN=plainword1", "--k " * 5000, "'a': " * 5000])
def test_redact_handles_long_chains_of_names(text: str) -> None:
    """Thousands of name:value pairs in one line are scanned in one pass (no recursion limit), secrets still hidden."""
    out = redact(text)
    assert hidden(out) and out.replace("<a secret by its name, not shown>", "plainword1") == text


# Model-config fields (config.json, vLLM's arg dump, tokenizer_config.json) whose names hold "key" or
# "token" as a qualifier: what the value is comes last (heads, dim, rank, id), and none is a secret.
MODEL_FIELDS = [
    "num_key_value_heads",
    "key_value_dim",
    "num_key_value_groups",
    "past_key_values",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "keys_to_ignore_at_inference",
    "bos_token_id",
    "eos_token",
    "pad_token",
    "unk_token",
    "image_token_index",
    "key_layernorm_eps",
    "use_qk_norm",
    "--max-num-batched-tokens",
]
# Secret names by their last word (the thing they name), or by a word that says secret anywhere.
SECRET_NAMES = [
    "api_key",
    "hf_token",
    "HF_TOKEN_VALUE",
    "db_password",
    "client_secret",
    "X-Api-Key",
    "Authorization",
    "PROXY_AUTHORIZATION",
    "AWS_SECRET_ACCESS_KEY",
    "SECRET_KEY_BASE",
    "MYSQL_ROOT_PASSWORD",
    "HUGGING_FACE_HUB_TOKEN",
    "access_token",
    "refresh-token",
    "--api-key",
    "openai_api_keys",
    "SIGNING_KEY",
    "private_key",
    "PGPASSWORD",
    "smtp_pass",
    "OPENAI_API_KEY_PROD",
    "HF_TOKEN_2",
    "API_KEY_V2",
    "GITHUB_TOKEN_OLD",
    "auth_header",
    "X-Auth-Token",
    "Set-Cookie",
]


@pytest.mark.parametrize("name", MODEL_FIELDS)
def test_model_config_fields_are_not_secret_names(name: str) -> None:
    """A model-config field naming heads, dims or a vocabulary token by a key/token qualifier is no secret."""
    assert not secret_name(name)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_key_names_stay_secret(name: str) -> None:
    """API keys, tokens, passwords, secrets and Authorization are secrets by their name."""
    assert secret_name(name)


@pytest.mark.parametrize(
    "line",
    [
        "num_key_value_heads: 8",
        "config: {'num_key_value_heads': 8, 'key_value_dim': 128, 'kv_lora_rank': 512}",
        "hf_overrides={\"num_key_value_heads\": 2} bos_token_id=1 eos_token='</s>' pad_token: <pad>",
        "ValueError: num_key_value_heads (3) must divide num_attention_heads (32)",
    ],
)
def test_redact_shows_model_config_fields(line: str) -> None:
    """A journal line quoting model-config fields passes unchanged: the head count is shown."""
    assert redact(line) == line


@pytest.mark.parametrize(
    "template,shown",
    [
        ("{}: plainword1, num_key_value_heads: 8", "num_key_value_heads: 8"),
        ("{}=plainword1 num_key_value_heads=8", "num_key_value_heads=8"),
        ("{{'{}': 'plainword1', 'num_key_value_heads': 8}}", "'num_key_value_heads': 8"),
    ],
)
@pytest.mark.parametrize("name", SECRET_NAMES)
def test_redact_hides_every_secret_named_value(name: str, template: str, shown: str) -> None:
    """The value after each secret name is hidden; the model field beside it is shown."""
    out = redact(template.format(name))
    assert hidden(out) and "not shown>" in out and shown in out


def test_crash_journal_shows_the_head_count_and_hides_the_key() -> None:
    """An engine crash quoting its head count and its API key records the count and hides the key."""
    world = World(make_catalog())
    world.switch("alpha")
    world.host.behaviours["vllm-beta.service"] = "crash"
    world.host.journal["vllm-beta.service"] = [
        "non-default args: {'api_key': ['plainword1'], 'hf_overrides': {'num_key_value_heads': 3}}",
        "ValueError: num_key_value_heads: 3 does not divide num_attention_heads: 32",
    ]
    dep = world.switch("beta")
    assert dep.phase is Phase.ROLLED_BACK
    assert "'num_key_value_heads': 3" in (dep.error or "") and "num_key_value_heads: 3 does" in (dep.error or "")
    assert hidden(dep.error or "") and hidden(json.dumps(world.store.events(limit=1000)))


def test_command_output_shows_model_fields_and_hides_secrets() -> None:
    """A failed command quoting a config's fields and a token: the fields are in its error, the token is not."""
    exc = CommandFailed("vllm serve /m", 1, "num_key_value_heads: 3, key_value_dim=96\nHF_TOKEN=plainword1")
    assert "num_key_value_heads: 3, key_value_dim=96" in str(exc) and hidden(str(exc)) and hidden(exc.output)
