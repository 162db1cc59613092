"""Inline secrets: refused by variable name, by flag and by value shape, never echoed; units stay clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.secrets import secret_in_args, secret_name, secret_value_kind

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
BASE = '[hosts.box]\ngpus = 2\n[models.a]\nrepo = "org/a"\ngpus = [0]\n'
HF = "hf_" + "Ab1" * 12
SK = "sk-proj-" + "x9Y" * 10
AKIA = "AKIA" + "ABCDEFGHIJKLMNOP"
GHP = "ghp_" + "a1B2" * 9


def orchestrator(*args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, cwd=REPO)


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN_VALUE",
        "VLLM_API_KEY",
        "db_password",
        "OPENAI_APIKEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "MY_PASSWD",
        "DB_PASS",
        "hftoken",
    ],
)
def test_secret_names_are_recognised(name: str) -> None:
    """A variable name with token, secret, password, key or credential in it is a secret."""
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "NCCL_IB_DISABLE",
        "SAFETENSORS_FAST_GPU",
        "CUDA_VISIBLE_DEVICES",
        "--max-num-batched-tokens",
        "--ssl-keyfile",
        "--tokenizer",
    ],
)
def test_ordinary_names_are_not_secrets(name: str) -> None:
    """vLLM's own settings (tokenizer, batched tokens, key files) are not taken for secrets."""
    assert not secret_name(name)


@pytest.mark.parametrize(
    "value,kind",
    [
        (HF, "Hugging Face"),
        (SK, "sk- API key"),
        (AKIA, "AWS access key"),
        (GHP, "GitHub"),
        (f"https://user:{HF}@example.org/x", "Hugging Face"),
        ("-----BEGIN RSA PRIVATE KEY-----", "private key"),
    ],
)
def test_secret_values_are_recognised_by_shape(value: str, kind: str) -> None:
    """Well-known token prefixes are recognised anywhere in a value."""
    assert kind in (secret_value_kind(value) or "")


@pytest.mark.parametrize("value", ["hf_transfer", "sk-short", "org/model", "0" * 40, "AKIA", "main"])
def test_ordinary_values_are_not_secrets(value: str) -> None:
    """Short or ordinary values that share a prefix are not taken for secrets."""
    assert secret_value_kind(value) is None


@pytest.mark.parametrize(
    "args,index",
    [
        (["--api-key", "abc"], 1),
        (["--hf-token=abc"], 0),
        (["--x", "1", "--password", "p"], 3),
        (["--token", "t"], 1),
        (["--return-tokens-as-token-ids", "--api-key"], None),
        (["--max-num-batched-tokens", "8192", "--ssl-keyfile", "/etc/k.pem"], None),
    ],
)
def test_secret_flags_with_values_are_found(args: list[str], index: int | None) -> None:
    """A secret-named flag with a value (--flag value or --flag=value) is found; a bare flag is not."""
    hit = secret_in_args(args)
    assert (hit[0] if hit else None) == index


@pytest.mark.parametrize(
    "extra,key,secret",
    [
        ('env = { AWS_SECRET_ACCESS_KEY = "wJalrXUtnFEMI" }', "models.a.env.AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI"),
        ('env = { HF_TOKEN_VALUE = "v4lue" }', "models.a.env.HF_TOKEN_VALUE", "v4lue"),
        ('args = ["--api-key", "s3cr3t-value"]', "models.a.args[1]", "s3cr3t-value"),
        ('args = ["--hf-token=s3cr3t-value"]', "models.a.args[0]", "s3cr3t-value"),
        (f'args = ["--x", "{SK}"]', "models.a.args[1]", SK),
        (f'env = {{ FOO = "{AKIA}" }}', "models.a.env.FOO", AKIA),
        (f'served_name = "{GHP}"', "models.a.served_name", GHP),
        (f'args = "{HF}"', "models.a.args", HF),  # a type error must not quote it either
        (f'args = ["a\\u202e{HF}"]', "models.a.args[0]", HF),  # nor a refused character
        ('env = { AUTHORIZATION = "plainvalue1" }', "models.a.env.AUTHORIZATION", "plainvalue1"),
        ('env = { AUTH_HEADER = "plainvalue2" }', "models.a.env.AUTH_HEADER", "plainvalue2"),
        ('env = { SESSION_COOKIE = "plainvalue3" }', "models.a.env.SESSION_COOKIE", "plainvalue3"),
        ('env = { DATABASE_URL = "plainvalue4" }', "models.a.env.DATABASE_URL", "plainvalue4"),
        ('args = ["--bearer", "plainvalue5"]', "models.a.args[1]", "plainvalue5"),
        ('args = ["--jwt=plainvalue6"]', "models.a.args[0]", "plainvalue6"),
        ('env = { X = "postgres://svc:plainvalue7@db/x" }', "models.a.env.X", "plainvalue7"),
    ],
)
def test_inline_secret_is_refused_without_echoing_it(tmp_path: Path, extra: str, key: str, secret: str) -> None:
    """render exits 2 naming the file and key path of an inline secret, never its value; no unit is written."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(BASE + extra + "\n")
    out = tmp_path / "units"
    result = orchestrator("render", "--config", str(cfg), "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {cfg}: {key}: "), result.stderr
    assert secret not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert not out.exists()
