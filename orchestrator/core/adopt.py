"""`orchestrator adopt`, the pure part: a vLLM engine found running on a box (a hand-written unit's text,
or a hand-run process's argv and environment) in, a deploy.toml model entry out, with everything the
entry cannot carry named (never guessed).

The entry maps what the renderer writes itself (core/render.engine_argv: model folder, served name,
port, layout, max_model_len, memory utilization, GPUs from CUDA_VISIBLE_DEVICES) to its keys; every
other flag stays verbatim, in its order and form, in ``args``. ``same_command`` then says whether the
unit rendered from the entry runs the same command: the same engine, the same flag/value pairs
(in the renderer's order) and the same ``args`` tail, token for token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.catalog_rules import ENV_KEY_RE, NAME_RE, ROUTABLE_RE
from orchestrator.errors import AdoptError
from orchestrator.secrets import secret_in_args, secret_name, secret_value_kind

API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"

# The flags the renderer writes from an entry's keys (core/render.engine_argv), with their short forms.
_KEYED = {"--model": "model", "--served-model-name": "served_name", "--host": "bind", "--port": "port",
          "--tensor-parallel-size": "tensor_parallel", "-tp": "tensor_parallel",
          "--pipeline-parallel-size": "pipeline_parallel", "-pp": "pipeline_parallel",
          "--data-parallel-size": "data_parallel", "-dp": "data_parallel",
          "--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
          "--gpu-memory-utilization": "gpu_memory_utilization"}
_LONG = {"tensor_parallel": "--tensor-parallel-size", "pipeline_parallel": "--pipeline-parallel-size",
         "data_parallel": "--data-parallel-size"}
_SWITCHES = {"--enable-expert-parallel": "expert_parallel", "-ep": "expert_parallel"}
# vLLM's boolean flags met on the seeds' and the docs' command lines: they never take the next word.
BOOLEAN_FLAGS = frozenset({
    "--trust-remote-code", "--enable-auto-tool-choice", "--enable-expert-parallel", "--enable-sleep-mode",
    "--enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-log-requests",
    "--disable-log-stats", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-custom-all-reduce",
    "--enable-lora", "--headless", "--disable-frontend-multiprocessing", "--enable-log-requests",
    "--async-scheduling", "--enable-dbo", "--enable-eplb", "--disable-fastapi-docs", "--enable-prompt-tokens-details",
    "--enable-server-load-tracking", "--disable-uvicorn-access-log", "--enable-request-id-headers",
    "--return-tokens-as-token-ids", "--enable-force-include-usage", "--skip-tokenizer-init",
    "--no-enable-log-requests", "--enable-tokenizer-info-endpoint"})
# Variables the renderer writes itself, or that an entry cannot hold.
_RENDERED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "VLLM_ENGINE_READY_TIMEOUT_S")
# A hand-run process's environment is a whole login's: only these belong to the engine.
ENGINE_ENV_PREFIXES = ("CUDA_", "NCCL_", "VLLM_", "HF_", "HUGGING_FACE_", "TORCH", "PYTORCH_", "OMP_", "MKL_",
                       "SAFETENSORS_", "TRANSFORMERS_", "TOKENIZERS_", "RAY_", "NVIDIA_", "TRITON_", "FLASHINFER_",
                       "UCX_", "GLOO_", "MASTER_", "PYTHONPATH", "LD_LIBRARY_PATH")
# [Service] keys of a hand-written unit that the rendered unit replaces with its own, without loss of
# what the engine runs; any other key is named.
_REPLACED_KEYS = frozenset({
    "Type", "User", "Group", "Environment", "EnvironmentFile", "ExecStart", "Restart", "RestartSec",
    "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec", "KillMode", "KillSignal", "SendSIGKILL", "LimitNOFILE",
    "LimitMEMLOCK", "NoNewPrivileges", "PrivateTmp", "SyslogIdentifier", "StandardOutput", "StandardError",
    "StateDirectory", "CacheDirectory", "RemainAfterExit", "StartLimitIntervalSec", "StartLimitBurst"})
_CONTROL = ("-", "@", "+", "!", ":")


@dataclass(frozen=True)
class UnitFields:
    """What a unit file says about its service, as systemd reads it (the later assignment wins)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    user: str | None
    environment_files: tuple[str, ...]
    unexpressed: tuple[str, ...]  # lines the entry cannot carry, named


@dataclass(frozen=True)
class Found:
    """One vLLM engine running on the box: a unit's (``unit``) or a hand-run process's (``pid``)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    user: str | None = None
    environment_files: tuple[str, ...] = ()
    unit: str | None = None
    unit_text: str = ""
    pid: int | None = None
    unexpressed: tuple[str, ...] = ()
    pid_start: int | None = None  # a process's start time (/proc/PID/stat): the PID is that process's

    @property
    def label(self) -> str:
        return f"unit {self.unit}" if self.unit is not None else f"pid {self.pid}"


@dataclass(frozen=True)
class Target:
    """What deploy.toml already says about the box the engine runs on."""

    host: str
    engine: tuple[str, ...]
    bind: str
    user: str
    env_dir: str
    taken: frozenset[str] = frozenset()  # model names deploy.toml has
    ports: frozenset[int] = frozenset()  # engine ports of its models on this host


@dataclass(frozen=True)
class Adoption:
    """The entry for one found engine; ``notes`` name what it does not carry (or states anew),
    ``blockers`` why it cannot be applied as it is."""

    name: str
    found: Found
    entry: dict[str, Any]
    engine: tuple[str, ...]
    explicit: tuple[str, ...] = ()  # vLLM's defaults the rendered unit states: ("--port", "8000", ...)
    notes: tuple[str, ...] = ()
    blockers: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        f = self.found
        return {"name": self.name, "unit": f.unit, "pid": f.pid, "argv": shown_argv(f.argv), "entry": self.entry,
                "engine": list(self.engine), "explicit": list(self.explicit), "notes": list(self.notes),
                "blockers": list(self.blockers)}


def shown_argv(argv: tuple[str, ...]) -> list[str]:
    """``argv`` with every word that carries a secret (``--api-key``'s value) replaced, for printing."""
    out = list(argv)
    for i, word in enumerate(argv):
        flag, eq, _ = word.partition("=")
        named = word.startswith("-") and secret_name(flag) and eq
        after = i > 0 and argv[i - 1].startswith("-") and "=" not in argv[i - 1] and secret_name(argv[i - 1]) \
            and not word.startswith("-")
        if secret_value_kind(word) or named:
            out[i] = f"{flag}=<not shown>" if named else "<not shown>"
        elif after:
            out[i] = "<not shown>"
    return out


# -- systemd's reading of a unit file ----------------------------------------------------------------------
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
            "'": "'", "s": " "}


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
                    raise AdoptError(f"{what}: a quoted word runs into {value[i:i + 10]!r} without a space")
                break
            if not quote and c in " \t":
                break
            if c == "\\" and i + 1 < n:
                e = value[i + 1]
                if e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", value[i + 2:i + 4]):
                    word.append(chr(int(value[i + 2:i + 4], 16)))
                    i += 4
                    continue
                if e not in _ESCAPES:
                    raise AdoptError(f"{what}: escape \\{e} is not one systemd reads as a character")
                word.append(_ESCAPES[e])
                i += 2
                continue
            if c == "%":
                if value[i + 1:i + 2] != "%":
                    raise AdoptError(f"{what}: specifier {value[i:i + 2]!r} is resolved by systemd per unit; "
                                     "an entry cannot say it (write the value it stands for)")
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
                raise AdoptError(f"unit {unit}: more than one ExecStart= (only a Type=oneshot unit may): "
                                 "an entry runs one engine command")
            prefix = ""
            while value and value[0] in _CONTROL:
                prefix, value = prefix + value[0], value[1:]
            if prefix:
                unexpressed.append(f"ExecStart={prefix}...: the prefix {prefix!r} (systemd's) is not carried into "
                                   "the entry")
            if "$" in value.replace("$$", ""):
                raise AdoptError(f"unit {unit}: ExecStart= uses an environment variable "
                                 f"({re.search(r'[$][{]?[A-Za-z_][A-Za-z0-9_]*', value) or '$'}): systemd "
                                 "substitutes it at start; an entry cannot say it (write its value)")
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
            unexpressed.append(f"{line}: not carried into the entry (the adopted unit keeps it; a unit rendered "
                               "from the entry has no such line)")
    if argv is None:
        raise AdoptError(f"unit {unit}: no ExecStart= in its [Service] section")
    return UnitFields(argv, tuple(env.items()), user, tuple(files), tuple(unexpressed))


# -- vLLM's command line -----------------------------------------------------------------------------------
def engine_length(argv: tuple[str, ...] | list[str]) -> int | None:
    """How many leading words of ``argv`` start vLLM's API server (the engine of an entry: the
    interpreter and ``-m vllm.entrypoints.openai.api_server``, or ``vllm serve``); None: not vLLM's."""
    for i, word in enumerate(argv[:-1]):
        if word == "-m" and argv[i + 1] == API_SERVER:
            return i + 2
        if word == "-m" and argv[i + 1] == CLI_MAIN and i + 2 < len(argv) and argv[i + 2] == "serve":
            return i + 3
    for i, word in enumerate(argv[:3]):
        if word.rsplit("/", 1)[-1] == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return i + 2
    return None


def engine_words(argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The engine of a vLLM command line as its entry names it: a console script the kernel ran through its
    ``#!`` interpreter (/proc shows ``python3 /opt/venv/bin/vllm serve``) is the script (``vllm serve``)."""
    start = engine_length(argv) or 0
    words = tuple(argv[:start])
    if len(words) == 3 and words[2] == "serve" and words[1].rsplit("/", 1)[-1] == "vllm" \
            and words[0].rsplit("/", 1)[-1].startswith("python"):
        return words[1:]
    return words


def is_vllm(argv: tuple[str, ...] | list[str]) -> bool:
    return engine_length(argv) is not None


@dataclass(frozen=True)
class Option:
    flag: str
    value: str | None  # None: a boolean flag
    words: tuple[str, ...]  # as written: ("--port", "8000"), ("--port=8000",) or ("--enforce-eager",)


def options(words: tuple[str, ...] | list[str]) -> tuple[str | None, list[Option], list[str]]:
    """(the positional model of `vllm serve`, the flags in order each as written, the words that are
    neither a flag nor a flag's value: kept in order, named)."""
    positional: str | None = None
    out: list[Option] = []
    stray: list[str] = []
    i = 0
    if words and not words[0].startswith("-"):
        positional, i = words[0], 1
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "-":
            out.append(Option("", word, (word,)))
            stray.append(word)
            i += 1
            continue
        flag, eq, value = word.partition("=")
        if eq:
            out.append(Option(flag, value, (word,)))
            i += 1
        elif flag in BOOLEAN_FLAGS or flag == "-ep" or i + 1 >= len(words) or words[i + 1].startswith("-"):
            out.append(Option(flag, None, (word,)))
            i += 1
        else:
            out.append(Option(flag, words[i + 1], (word, words[i + 1])))
            i += 2
    return positional, out, stray


def pairs(argv: tuple[str, ...] | list[str], label: str = "argv") -> list[tuple[str, str | None]]:
    """The flag/value pairs of a vLLM command line (`vllm serve MODEL` read as --model MODEL), sorted by
    flag (the order of one flag's repeats kept): what two command lines that mean the same share."""
    start = engine_length(argv)
    if start is None:
        raise AdoptError(f"{label}: not a vLLM API server command line: {' '.join(argv)[:200]!r}")
    model, opts, _ = options(tuple(argv[start:]))
    found: list[tuple[str, str | None]] = [("--model", model)] if model is not None else []
    long = {short: _LONG[key] for short, key in _KEYED.items() if short.startswith("-") and len(short) == 3}
    found += [(long.get(o.flag, o.flag), o.value) for o in opts]
    return sorted(found, key=lambda p: p[0])


# -- the entry ---------------------------------------------------------------------------------------------
def _int(value: str | None, flag: str, label: str) -> int:
    if value is None or not value.isdigit():
        raise AdoptError(f"{label}: {flag} {value!r} is not a whole number")
    return int(value)


def model_name(found: Found, served: str | None, model: str) -> str:
    """The entry's name: the unit's (without vllm- and .service), else the served name, else the folder."""
    if found.unit is not None:
        base = found.unit.removesuffix(".service").removeprefix("vllm-")
    else:
        base = served or model.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._")[:63]
    return name if NAME_RE.fullmatch(name) else "adopted"


def adopt(found: Found, target: Target) -> Adoption:
    """The deploy.toml entry for ``found`` on ``target``'s box; AdoptError when its command line
    cannot be read at all."""
    label = found.label
    notes = list(found.unexpressed)
    blockers: list[str] = []
    start = engine_length(found.argv)
    if start is None:
        raise AdoptError(f"{label}: not a vLLM API server command line: {' '.join(found.argv)[:200]!r}")
    engine = engine_words(found.argv)
    positional, opts, stray = options(found.argv[start:])
    notes += [f"{w!r} is neither a --flag nor a flag's value (after a flag vLLM reads as a switch?): kept in "
              "args where it stands" for w in stray]
    keyed: dict[str, str] = {}
    switches: set[str] = set()
    args: list[str] = []
    if positional is not None:
        keyed["model"] = positional
    for opt in opts:
        key = _KEYED.get(opt.flag)
        if key is not None and opt.value is not None:
            if key in keyed:
                blockers.append(f"{opt.flag} is given twice ({keyed[key]!r}, then {opt.value!r}): say it once")
            keyed[key] = opt.value
        elif opt.flag in _SWITCHES and opt.value is None:
            switches.add(_SWITCHES[opt.flag])
        elif opt.flag in ("--enable-sleep-mode", "--no-enable-sleep-mode"):
            notes.append(f"{opt.flag}: not carried; sleep mode is the entry's `sleep` (\"level1\" keeps the weights "
                         "in host RAM, \"level2\" drops them): set it to keep warm switches")
        else:
            args += opt.words
    hit = secret_in_args(args)
    while hit is not None:
        i = hit[0]
        if args[i].startswith("--"):
            flag, drop = args[i].split("=", 1)[0], {i}
        elif i and args[i - 1].startswith("--"):
            flag, drop = args[i - 1], {i - 1, i}
        else:
            flag, drop = f"word {args[i][:4]}...", {i}
        blockers.append(f"{flag} carries {hit[1]} on the command line (value not shown): it is not copied into "
                        f"deploy.toml; vLLM reads its API key from VLLM_API_KEY: put it in "
                        f"{target.env_dir}/<name>.env and drop it from the command line")
        args = [a for j, a in enumerate(args) if j not in drop]
        hit = secret_in_args(args)
    model = keyed.get("model")
    if model is None:
        raise AdoptError(f"{label}: no --model (nor `vllm serve MODEL`): vLLM would serve its default model, "
                         "which an entry cannot name")
    served = keyed.get("served_name")
    name = model_name(found, served, model)
    entry: dict[str, Any] = {}
    explicit: list[str] = []
    if model.startswith("/"):
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-._") or "model"
        entry["repo"] = f"local/{base}"
        entry["source"] = f"local:{model.rstrip('/') or '/'}"
        notes.append(f"repo {entry['repo']!r} only names the local folder {model} (source local:): set the hub "
                     "id there to stage other revisions")
    else:
        entry["repo"] = model
        entry["source"] = "hub"
        notes.append(f"--model {model}: a hub id vLLM downloads itself; the entry stages it into the host's "
                     "models_dir and runs vLLM on that folder (--model changes to it)")
    if served is not None:
        entry["served_name"] = served
        if not ROUTABLE_RE.fullmatch(served):
            blockers.append(f"--served-model-name {served!r} cannot be routed nor written in a unit")
    elif ROUTABLE_RE.fullmatch(model):
        entry["served_name"] = model  # vLLM serves it under its --model value
        explicit += ["--served-model-name", model]
    else:
        blockers.append(f"no --served-model-name: vLLM serves it as {model!r}, a name the front proxy cannot "
                        "route nor a unit hold")
    entry["port"] = _int(keyed.get("port", "8000"), "--port", label)
    if "port" not in keyed:
        explicit += ["--port", "8000"]
    layout = {k: _int(keyed[k], _LONG[k], label) if k in keyed else 1 for k in _LONG}
    world = layout["tensor_parallel"] * layout["pipeline_parallel"] * layout["data_parallel"]
    if "tensor_parallel" not in keyed:
        explicit += ["--tensor-parallel-size", "1"]
    visible = dict(found.env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        gpus = list(range(world))
        notes.append(f"no CUDA_VISIBLE_DEVICES: vLLM takes GPUs 0-{world - 1} for its {world} rank(s), "
                     "so gpus says so")
    elif not re.fullmatch(r"\d+(,\d+)*", visible.replace(" ", "")):
        gpus = []
        blockers.append(f"CUDA_VISIBLE_DEVICES={visible!r}: gpus are indices (nvidia-smi's), not UUIDs or "
                        "MIG names: write the indices")
    else:
        gpus = [int(g) for g in visible.replace(" ", "").split(",")]
        if len(gpus) != world:
            blockers.append(f"CUDA_VISIBLE_DEVICES={visible} lists {len(gpus)} GPU(s) for a layout of {world} "
                            "(tensor x pipeline x data parallel): an entry's gpus are exactly its layout's")
    entry["gpus"] = gpus
    entry.update({k: v for k, v in layout.items() if k in keyed or k == "tensor_parallel"})
    if "expert_parallel" in switches:
        entry["expert_parallel"] = True
    if "max_model_len" in keyed:
        if keyed["max_model_len"].isdigit():
            entry["max_model_len"] = int(keyed["max_model_len"])
        else:
            args += ["--max-model-len", keyed["max_model_len"]]
    if "max_num_seqs" in keyed:
        entry["max_num_seqs"] = _int(keyed["max_num_seqs"], "--max-num-seqs", label)
    util = keyed.get("gpu_memory_utilization")
    try:
        entry["gpu_memory_utilization"] = float(util) if util is not None else 0.9
    except ValueError:
        raise AdoptError(f"{label}: --gpu-memory-utilization {util!r} is not a number") from None
    if util is None:
        explicit += ["--gpu-memory-utilization", "0.9"]
    env = dict(found.env)
    deadline = env.get("VLLM_ENGINE_READY_TIMEOUT_S")
    if deadline is not None and deadline.isdigit() and int(deadline) >= 1:
        entry["load_deadline_s"] = int(deadline)
    if args:
        entry["args"] = args
    kept: dict[str, str] = {}
    for key, value in env.items():
        if key in _RENDERED_ENV:
            continue
        if key == "VLLM_SERVER_DEV_MODE":
            notes.append("VLLM_SERVER_DEV_MODE: not carried; the entry's `sleep` turns it on with the proxy's guards")
        elif secret_name(key) or secret_value_kind(value):
            notes.append(f"{key}: a secret (value not shown), not copied: it goes in {target.env_dir}/{name}.env "
                         "(mode 0600)")
        else:
            kept[key] = value
    if kept:
        entry["env"] = kept
    if env.get("CUDA_DEVICE_ORDER", "") != "PCI_BUS_ID" and visible is not None:
        notes.append("CUDA_DEVICE_ORDER is not PCI_BUS_ID here: CUDA may number the GPUs fastest first; the "
                     "rendered unit sets PCI_BUS_ID (nvidia-smi's order): check gpus against nvidia-smi")
    for file in found.environment_files:
        notes.append(f"EnvironmentFile={file} stays where it is, not copied (it may hold secrets): the rendered "
                     f"unit reads {target.env_dir}/{name}.env; move or link it there before the first switch "
                     "to this entry")
    if "bind" in keyed and keyed["bind"] != target.bind:
        notes.append(f"--host {keyed['bind']}: the entry binds the host's address {target.bind} (bind of "
                     f"[hosts.{target.host}] or [defaults]): set it there to keep {keyed['bind']}")
    if "bind" not in keyed:
        explicit += ["--host", target.bind]
    if engine != target.engine:
        # Not a blocker: the adopted revision keeps this unit's own command (a rollback runs it as it is);
        # only a unit rendered from the entry runs the host's engine (the seeds' /root engine moved to /opt).
        notes.append(f"engine {list(engine)} is not host {target.host}'s engine {list(target.engine)} (the engine "
                     f"is the host's, one for all its models): a unit rendered from this entry runs the host's; "
                     f"to keep this one set [hosts.{target.host}] engine = {_toml_list(list(engine))}")
    if found.user is not None and found.user != target.user:
        notes.append(f"runs as user {found.user}; the rendered unit runs it as {target.user} (defaults.user): "
                     "`orchestrator doctor` checks that user can reach the engine and the weights")
    if name in target.taken:
        blockers.append(f"model {name!r} is already in deploy.toml: rename the unit's entry")
    if entry["port"] in target.ports:
        blockers.append(f"port {entry['port']} is already a model's port on host {target.host} in deploy.toml")
    return Adoption(name, found, entry, engine, tuple(explicit), tuple(notes), tuple(blockers))


def same_command(original: tuple[str, ...] | list[str], rendered: tuple[str, ...] | list[str],
                 explicit: tuple[str, ...] = (), args: tuple[str, ...] = ()) -> list[str]:
    """What differs between the command a found engine runs and the one its entry's unit runs (empty:
    the same): the engine words, the flag/value pairs (``explicit``, vLLM's defaults the rendered unit
    states, added to the original's) and the ``args`` tail, token for token."""
    diffs: list[str] = []
    a, b = engine_length(original), engine_length(rendered)
    if a is None or b is None:
        return ["not both vLLM command lines"]
    if engine_words(original) != engine_words(rendered):
        diffs.append(f"engine {list(engine_words(original))} != {list(engine_words(rendered))}")
    want = sorted(pairs(original) + _explicit_pairs(explicit), key=lambda p: p[0])
    have = pairs(rendered)
    if want != have:
        missing = [p for p in want if p not in have]
        extra = [p for p in have if p not in want]
        diffs.append(f"flags only in the original {missing}, only in the rendered unit {extra}")
    if args and list(rendered[-len(args):]) != list(args):
        diffs.append(f"args tail {list(rendered[-len(args):])} != {list(args)}")
    return diffs


def _explicit_pairs(explicit: tuple[str, ...]) -> list[tuple[str, str | None]]:
    return [(explicit[i], explicit[i + 1]) for i in range(0, len(explicit) - 1, 2)]


# -- deploy.toml text --------------------------------------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return _toml_list(list(value))
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    text = str(value)
    escaped = "".join(c if c not in '"\\' and 0x20 <= ord(c) != 0x7F else
                      ("\\" + c if c in '"\\' else f"\\u{ord(c):04x}") for c in text)
    return f'"{escaped}"'


def _toml_list(values: list[Any]) -> str:
    return "[" + ", ".join(_toml_value(v) for v in values) + "]"


def entry_toml(adoption: Adoption, host: str) -> str:
    """The ``[models.NAME]`` table of ``adoption``, with what it does not carry as comments above it."""
    src = adoption.found
    head = [f"# adopted from {src.label} on host {host}"]
    head += [f"# note: {n}" for n in adoption.notes]
    head += [f"# CANNOT APPLY: {b}" for b in adoption.blockers]
    body = [f"[models.{adoption.name}]", f'host = "{host}"']
    body += [f"{k} = {_toml_value(v)}" for k, v in adoption.entry.items()]
    return "\n".join(head + body) + "\n"


def merged(config_text: str, adoptions: list[Adoption], host: str) -> str:
    """deploy.toml's text with the adopted entries appended (its own text, comments included, unchanged)."""
    text = config_text if config_text.endswith("\n") or not config_text else config_text + "\n"
    return text + "".join("\n" + entry_toml(a, host) for a in adoptions)


# -- processes -------------------------------------------------------------------------------------------
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


def engine_env(environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of a hand-run process's environment that is the engine's (not the login's)."""
    return tuple((k, v) for k, v in environ.items() if k.startswith(ENGINE_ENV_PREFIXES))
