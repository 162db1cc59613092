"""What a box shows of an engine it runs outside the product, read (pure): a unit file as systemd reads
it (ExecStart's words, Environment=, User=, EnvironmentFile=; drop-ins), and /proc's stat and cgroup."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.core.catalog_rules import ENV_KEY_RE
from orchestrator.engines import ENGINE, Engine
from orchestrator.errors import AdoptError

# A hand-run process's environment is a whole login's: only these (and the engine's own, its
# Engine.env_prefixes) belong to the engine.
ENGINE_ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "HF_",
    "HUGGING_FACE_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "SAFETENSORS_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "RAY_",
    "NVIDIA_",
    "TRITON_",
    "FLASHINFER_",
    "UCX_",
    "GLOO_",
    "MASTER_",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
)
# [Service] keys of a hand-written unit that the rendered unit replaces with its own, without loss of
# what the engine runs; any other key is named.
_REPLACED_KEYS = frozenset(
    {
        "Type",
        "User",
        "Group",
        "Environment",
        "EnvironmentFile",
        "ExecStart",
        "Restart",
        "RestartSec",
        "TimeoutStartSec",
        "TimeoutStopSec",
        "TimeoutSec",
        "KillMode",
        "KillSignal",
        "SendSIGKILL",
        "LimitNOFILE",
        "LimitMEMLOCK",
        "NoNewPrivileges",
        "PrivateTmp",
        "SyslogIdentifier",
        "StandardOutput",
        "StandardError",
        "StateDirectory",
        "CacheDirectory",
        "RemainAfterExit",
        "StartLimitIntervalSec",
        "StartLimitBurst",
    }
)
_CONTROL = ("-", "@", "+", "!", ":")


@dataclass(frozen=True)
class UnitFields:
    """What a unit file says about its service, as systemd reads it (the later assignment wins)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    user: str | None
    environment_files: tuple[str, ...]
    unexpressed: tuple[str, ...]  # lines the entry cannot carry, named


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def split_words(value: str, what: str = "line") -> list[str]:
    """``value`` split into words as systemd splits ExecStart= and Environment=: whitespace between
    words, "..." or '...' quoting, C escapes; ``%%`` is one ``%``. AdoptError on anything else (an
    unterminated quote, a specifier such as %i that only systemd can resolve)."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote = value[i] if value[i] in "\"'" else ""
        i += 1 if quote else 0
        while i < n:
            c = value[i]
            if quote and c == quote:
                i += 1
                if i < n and value[i] not in " \t":
                    raise AdoptError(f"{what}: a quoted word runs into {value[i : i + 10]!r} without a space")
                break
            if not quote and c in " \t":
                break
            if c == "\\" and i + 1 < n:
                e = value[i + 1]
                if e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", value[i + 2 : i + 4]):
                    word.append(chr(int(value[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                if e not in _ESCAPES:
                    raise AdoptError(f"{what}: escape \\{e} is not one systemd reads as a character")
                word.append(_ESCAPES[e])
                i += 2
                continue
            if c == "%":
                if value[i + 1 : i + 2] != "%":
                    raise AdoptError(
                        f"{what}: specifier {value[i : i + 2]!r} is resolved by systemd per unit; "
                        "an entry cannot say it (write the value it stands for)"
                    )
                word.append("%")
                i += 2
                continue
            word.append(c)
            i += 1
        else:
            if quote:
                raise AdoptError(f"{what}: quote {quote} is never closed")
        words.append("".join(word))
    return words


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def parse_unit(text: str, unit: str) -> UnitFields:
    """The [Service] section of ``text`` (a unit file, then its drop-ins, as `systemctl cat` prints
    them): ExecStart's argv, Environment=, User=, EnvironmentFile=, and the lines an entry cannot carry."""
    section = ""
    argv: tuple[str, ...] | None = None
    env: dict[str, str] = {}
    files: list[str] = []
    user: str | None = None
    unexpressed: list[str] = []
    for line in _logical_lines(text):
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if section != "Service" or not sep:
            continue
        if key == "ExecStart":
            if not value:
                argv = None  # a drop-in's empty assignment resets the list
                continue
            if argv is not None:
                raise AdoptError(
                    f"unit {unit}: more than one ExecStart= (only a Type=oneshot unit may): "
                    "an entry runs one engine command"
                )
            prefix = ""
            while value and value[0] in _CONTROL:
                prefix, value = prefix + value[0], value[1:]
            if prefix:
                unexpressed.append(
                    f"ExecStart={prefix}...: the prefix {prefix!r} (systemd's) is not carried into the entry"
                )
            if "$" in value.replace("$$", ""):
                raise AdoptError(
                    f"unit {unit}: ExecStart= uses an environment variable "
                    f"({re.search(r'[$][{]?[A-Za-z_][A-Za-z0-9_]*', value) or '$'}): systemd "
                    "substitutes it at start; an entry cannot say it (write its value)"
                )
            argv = tuple(w.replace("$$", "$") for w in split_words(value, f"unit {unit}: ExecStart="))
        elif key == "Environment":
            if not value:
                env.clear()
                continue
            for word in split_words(value, f"unit {unit}: Environment="):
                k, eq, v = word.partition("=")
                if eq and ENV_KEY_RE.fullmatch(k):
                    env[k] = v
        elif key == "EnvironmentFile":
            if not value:
                files.clear()
            else:
                files.append(value.lstrip("-"))
        elif key == "User":
            user = value or None
        elif key == "WorkingDirectory" and value in ("/", "-/"):
            continue
        elif key not in _REPLACED_KEYS:
            line = f"{key}={value}" if len(value) <= 120 else f"{key}={value[:120]}..."
            unexpressed.append(
                f"{line}: not carried into the entry (the adopted unit keeps it; a unit rendered "
                "from the entry has no such line)"
            )
    if argv is None:
        raise AdoptError(f"unit {unit}: no ExecStart= in its [Service] section")
    return UnitFields(argv, tuple(env.items()), user, tuple(files), tuple(unexpressed))


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    start: int  # clock ticks after boot: with the PID, one process for good


def proc_stat(pid: int, raw: bytes | None) -> ProcStat | None:
    """/proc/PID/stat read (its command name may hold spaces and parentheses); None: no such process."""
    if not raw:
        return None
    rest = raw.decode(errors="replace").rsplit(")", 1)[-1].split()
    if len(rest) < 20 or not all(f.lstrip("-").isdigit() for f in (rest[1], rest[2], rest[19])):
        return None
    return ProcStat(pid, int(rest[1]), int(rest[2]), int(rest[19]))


def in_system_unit(cgroup: str) -> str | None:
    """The system service a process runs in, from /proc/PID/cgroup; None: outside one (a login's
    session scope, a user manager)."""
    for line in cgroup.splitlines():
        path = line.rsplit(":", 1)[-1]
        if path.startswith("/user.slice"):
            return None
        found = re.search(r"/([^/]+\.service)(?:/|$)", path)
        if found:
            return found.group(1)
    return None


def engine_env(environ: dict[str, str], engine: Engine = ENGINE) -> tuple[tuple[str, str], ...]:
    """The part of a hand-run process's environment that is ``engine``'s (not the login's)."""
    prefixes = ENGINE_ENV_PREFIXES + engine.env_prefixes
    return tuple((k, v) for k, v in environ.items() if k.startswith(prefixes))
