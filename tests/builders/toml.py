"""A deploy.toml template with {holes}: loaded filled in, or the ConfigError (exit 2) it is refused with."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.core.catalog import Catalog
from orchestrator.errors import ConfigError


@dataclass(frozen=True)
class Template:
    """``text`` with format holes; a hole left out is filled with ``defaults`` or else nothing."""

    text: str
    defaults: dict[str, str] = field(default_factory=dict)

    def write(self, tmp_path: Path, **parts: str) -> Path:
        holes = {name for _, name, _, _ in string.Formatter().parse(self.text) if name}
        path = tmp_path / "deploy.toml"
        path.write_text(self.text.format(**{h: "" for h in holes} | self.defaults | parts))
        return path

    def load(self, tmp_path: Path, **parts: str) -> Catalog:
        return settings.load(self.write(tmp_path, **parts))

    def refused(self, tmp_path: Path, **parts: str) -> str:
        """The message of the load's ConfigError, which must exit 2."""
        with pytest.raises(ConfigError) as info:
            self.load(tmp_path, **parts)
        assert info.value.exit_code == 2
        return str(info.value)


# One local box behind the front proxy with alpha and beta on 2 GPUs each (`render --proxy` tests, the
# on-demand ones): give ``state``; ``defaults``, ``proxy`` (its keys), ``beta`` (its keys) and ``rest``.
LOCAL_PROXY_BOX = Template(
    """state_dir = "{state}"
socket_group = "root"
[defaults]
engine = ["/opt/vllm/bin/vllm", "serve"]
{defaults}
[hosts.box]
transport = "local"
address = "127.0.0.1"
gpus = 8
gpu_memory_gib = 96
[proxy]
enabled = {enabled}
{proxy}
[models.alpha]
repo = "org/alpha"
gpus = [0, 1]
tensor_parallel = 2
port = 8010
[models.beta]
repo = "org/beta"
gpus = {beta_gpus}
tensor_parallel = 2
port = 8020
{beta}
{rest}""",
    {"enabled": "true", "beta_gpus": "[2, 3]"},
)
