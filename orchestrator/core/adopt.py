"""`orchestrator adopt`, the pure part: an engine found running on a box (a hand-written unit's text,
or a hand-run process's argv and environment) in, a deploy.toml model entry out, with everything the
entry cannot carry named (never guessed).

Which engine it is, its command line's reading and the flags its units write are the engine's
(``engines.engine_running``, ``Engine.command_line``, ``Engine.rendered_flags``). The entry maps what the
renderer writes itself (core/render.engine_argv: model folder, served name, port, layout, max_model_len,
memory utilization, GPUs from CUDA_VISIBLE_DEVICES) to its keys; every other flag stays verbatim, in its
order and form, in ``args``. ``same_command`` then says whether the unit rendered from the entry runs the
same command: the same engine, the same flag/value pairs (in the renderer's order) and the same ``args``
tail, token for token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.catalog_rules import NAME_RE, ROUTABLE_RE
from orchestrator.engines import ENGINE, Engine, Option, engine_running
from orchestrator.errors import AdoptError
from orchestrator.secrets import secret_in_args, secret_name, secret_value_kind


@dataclass(frozen=True)
class Found:
    """One engine running on the box: a unit's (``unit``) or a hand-run process's (``pid``)."""

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
    explicit: tuple[str, ...] = ()  # the engine's defaults the rendered unit states: ("--port", "8000", ...)
    notes: tuple[str, ...] = ()
    blockers: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        f = self.found
        return {
            "name": self.name,
            "unit": f.unit,
            "pid": f.pid,
            "argv": shown_argv(f.argv),
            "entry": self.entry,
            "engine": list(self.engine),
            "explicit": list(self.explicit),
            "notes": list(self.notes),
            "blockers": list(self.blockers),
        }


LAYOUT = ("tensor_parallel", "pipeline_parallel", "data_parallel")
# Variables the renderer writes itself (the engine's deadline variable too), or that an entry cannot hold.
_RENDERED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def engine_of(argv: tuple[str, ...] | list[str], label: str) -> Engine:
    """The engine whose server ``argv`` runs, else AdoptError naming what it is."""
    engine = engine_running(argv)
    if engine is None:
        raise AdoptError(f"{label}: not an engine's API server command line: {' '.join(argv)[:200]!r}")
    return engine


def shown_argv(argv: tuple[str, ...]) -> list[str]:
    """``argv`` with every word that carries a secret (``--api-key``'s value) replaced, for printing."""
    out = list(argv)
    for i, word in enumerate(argv):
        flag, eq, _ = word.partition("=")
        named = word.startswith("-") and secret_name(flag) and eq
        after = (
            i > 0
            and argv[i - 1].startswith("-")
            and "=" not in argv[i - 1]
            and secret_name(argv[i - 1])
            and not word.startswith("-")
        )
        if secret_value_kind(word) or named:
            out[i] = f"{flag}=<not shown>" if named else "<not shown>"
        elif after:
            out[i] = "<not shown>"
    return out


# -- systemd's reading of a unit file ----------------------------------------------------------------------
# -- the entry ---------------------------------------------------------------------------------------------
def _int(value: str | None, flag: str, label: str) -> int:
    if value is None or not value.isdigit():
        raise AdoptError(f"{label}: {flag} {value!r} is not a whole number")
    return int(value)


def _another_node(engine: Engine, opt: Option) -> bool:
    """Whether an option places the engine on one node of several: a headless rank, a rank past the first,
    more than one node."""
    carries = engine.rendered_flags.node.get(opt.flag)
    if carries == "nodes":
        return opt.value != "1"
    return carries == "rank" and opt.value != "0"  # --headless has no value: a rank past the first


def model_name(found: Found, served: str | None, model: str, engine: Engine = ENGINE) -> str:
    """The entry's name: the unit's (without what the engine's unit names add around a model's name),
    else the served name, else the folder."""
    if found.unit is not None:
        prefix, _, suffix = engine.unit_name("\0").partition("\0")
        base = found.unit.removesuffix(suffix).removeprefix(prefix)
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
    kind = engine_of(found.argv, label)
    flags, read, title = kind.rendered_flags, kind.command_line, kind.title
    start = read.engine_length(found.argv) or 0
    engine = read.engine_words(found.argv)
    positional, opts, stray = read.options(found.argv[start:])
    notes += [
        f"{w!r} is neither a --flag nor a flag's value (after a flag {title} reads as a switch?): kept in "
        "args where it stands"
        for w in stray
    ]
    keyed: dict[str, str] = {}
    switches: set[str] = set()
    args: list[str] = []
    if positional is not None:
        keyed["model"] = positional
    for opt in opts:
        key = flags.keyed.get(opt.flag)
        if key is not None and opt.value is not None:
            if key in keyed:
                blockers.append(f"{opt.flag} is given twice ({keyed[key]!r}, then {opt.value!r}): say it once")
            keyed[key] = opt.value
        elif opt.flag in flags.switches and opt.value is None:
            switches.add(flags.switches[opt.flag])
        elif opt.flag in kind.sleep_flags:
            notes.append(
                f'{opt.flag}: not carried; sleep mode is the entry\'s `sleep` ("level1" keeps the weights '
                'in host RAM, "level2" drops them): set it to keep warm switches'
            )
        else:
            if _another_node(kind, opt):
                blockers.append(
                    f"{' '.join(opt.words)}: this engine is one node's rank of a model spanning several "
                    "boxes, and an adopted entry runs on one: write the model's `nodes` by hand"
                )
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
        reads = f"{title} reads its API key from {kind.api_key_env}: " if kind.api_key_env else ""
        blockers.append(
            f"{flag} carries {hit[1]} on the command line (value not shown): it is not copied into "
            f"deploy.toml; {reads}put it in {target.env_dir}/<name>.env and drop it from the command line"
        )
        args = [a for j, a in enumerate(args) if j not in drop]
        hit = secret_in_args(args)
    model = keyed.get("model")
    if model is None:
        raise AdoptError(
            f"{label}: no {flags.long('model')} (nor a model after {' '.join(engine[-2:])}): {title} would "
            "serve its default model, which an entry cannot name"
        )
    served = keyed.get("served_name")
    name = model_name(found, served, model, kind)
    model_flag, served_flag = flags.long("model"), flags.long("served_name")
    entry: dict[str, Any] = {} if kind.name == ENGINE.name else {"engine_name": kind.name}
    explicit: list[str] = []
    if model.startswith("/"):
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-._") or "model"
        entry["repo"] = f"local/{base}"
        entry["source"] = f"local:{model.rstrip('/') or '/'}"
        notes.append(
            f"repo {entry['repo']!r} only names the local folder {model} (source local:): set the hub "
            "id there to stage other revisions"
        )
    else:
        entry["repo"] = model
        entry["source"] = "hub"
        notes.append(
            f"{model_flag} {model}: a hub id {title} downloads itself; the entry stages it into the host's "
            f"models_dir and runs {title} on that folder ({model_flag} changes to it)"
        )
    if served is not None:
        entry["served_name"] = served
        if not ROUTABLE_RE.fullmatch(served):
            blockers.append(f"{served_flag} {served!r} cannot be routed nor written in a unit")
    elif ROUTABLE_RE.fullmatch(model):
        entry["served_name"] = model  # the engine serves it under its model argument
        explicit += [served_flag, model]
    else:
        blockers.append(
            f"no {served_flag}: {title} serves it as {model!r}, a name the front proxy cannot route nor a unit hold"
        )
    # What the engine takes when its flag is left out: the rendered unit states it.
    default = flags.defaults
    entry["port"] = _int(keyed.get("port", default["port"]), flags.long("port"), label)
    if "port" not in keyed:
        explicit += [flags.long("port"), default["port"]]
    layout = {k: _int(keyed[k], flags.long(k), label) if k in keyed else 1 for k in LAYOUT}
    world = layout["tensor_parallel"] * layout["pipeline_parallel"] * layout["data_parallel"]
    if "tensor_parallel" not in keyed:
        explicit += [flags.long("tensor_parallel"), default["tensor_parallel"]]
    visible = dict(found.env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        gpus = list(range(world))
        notes.append(
            f"no CUDA_VISIBLE_DEVICES: {title} takes GPUs 0-{world - 1} for its {world} rank(s), so gpus says so"
        )
    elif not re.fullmatch(r"\d+(,\d+)*", visible.replace(" ", "")):
        gpus = []
        blockers.append(
            f"CUDA_VISIBLE_DEVICES={visible!r}: gpus are indices (nvidia-smi's), not UUIDs or "
            "MIG names: write the indices"
        )
    else:
        gpus = [int(g) for g in visible.replace(" ", "").split(",")]
        if len(gpus) != world:
            blockers.append(
                f"CUDA_VISIBLE_DEVICES={visible} lists {len(gpus)} GPU(s) for a layout of {world} "
                "(tensor x pipeline x data parallel): an entry's gpus are exactly its layout's"
            )
    entry["gpus"] = gpus
    entry.update({k: v for k, v in layout.items() if k in keyed or k == "tensor_parallel"})
    if "expert_parallel" in switches:
        entry["expert_parallel"] = True
    if "max_model_len" in keyed:
        if keyed["max_model_len"].isdigit():
            entry["max_model_len"] = int(keyed["max_model_len"])
        else:
            args += [flags.long("max_model_len"), keyed["max_model_len"]]
    if "max_num_seqs" in keyed:
        entry["max_num_seqs"] = _int(keyed["max_num_seqs"], flags.long("max_num_seqs"), label)
    util = keyed.get("gpu_memory_utilization")
    util_flag = flags.long("gpu_memory_utilization")
    try:
        entry["gpu_memory_utilization"] = float(util if util is not None else default["gpu_memory_utilization"])
    except ValueError:
        raise AdoptError(f"{label}: {util_flag} {util!r} is not a number") from None
    if util is None:
        explicit += [util_flag, default["gpu_memory_utilization"]]
    env = dict(found.env)
    deadline = env.get(kind.deadline_env) if kind.deadline_env else None
    if deadline is not None and deadline.isdigit() and int(deadline) >= 1:
        entry["load_deadline_s"] = int(deadline)
    if args:
        entry["args"] = args
    kept: dict[str, str] = {}
    for key, value in env.items():
        if key in _RENDERED_ENV or key == kind.deadline_env:
            continue
        if key in kind.dev_mode_env:
            notes.append(f"{key}: not carried; the entry's `sleep` turns it on with the proxy's guards")
        elif secret_name(key) or secret_value_kind(value):
            notes.append(
                f"{key}: a secret (value not shown), not copied: it goes in {target.env_dir}/{name}.env (mode 0600)"
            )
        else:
            kept[key] = value
    if kept:
        entry["env"] = kept
    if env.get("CUDA_DEVICE_ORDER", "") != "PCI_BUS_ID" and visible is not None:
        notes.append(
            "CUDA_DEVICE_ORDER is not PCI_BUS_ID here: CUDA may number the GPUs fastest first; the "
            "rendered unit sets PCI_BUS_ID (nvidia-smi's order): check gpus against nvidia-smi"
        )
    for file in found.environment_files:
        notes.append(
            f"EnvironmentFile={file} stays where it is, not copied (it may hold secrets): the rendered "
            f"unit reads {target.env_dir}/{name}.env; move or link it there before the first switch "
            "to this entry"
        )
    if "bind" in keyed and keyed["bind"] != target.bind:
        notes.append(
            f"{flags.long('bind')} {keyed['bind']}: the entry binds the host's address {target.bind} (bind of "
            f"[hosts.{target.host}] or [defaults]): set it there to keep {keyed['bind']}"
        )
    if "bind" not in keyed:
        explicit += [flags.long("bind"), target.bind]
    if kind.name != ENGINE.name:
        if engine != kind.default_command:
            notes.append(
                f"engine {list(engine)}: a unit rendered from this entry runs {title}'s own command "
                f"{list(kind.default_command)} (engine_name = {kind.name!r})"
            )
    elif engine != target.engine:
        # Not a blocker: the adopted revision keeps this unit's own command (a rollback runs it as it is);
        # only a unit rendered from the entry runs the host's engine (the seeds' /root engine moved to /opt).
        notes.append(
            f"engine {list(engine)} is not host {target.host}'s engine {list(target.engine)} (the engine "
            f"is the host's, one for all its models): a unit rendered from this entry runs the host's; "
            f"to keep this one set [hosts.{target.host}] engine = {_toml_list(list(engine))}"
        )
    if found.user is not None and found.user != target.user:
        notes.append(
            f"runs as user {found.user}; the rendered unit runs it as {target.user} (defaults.user): "
            "`orchestrator doctor` checks that user can reach the engine and the weights"
        )
    if name in target.taken:
        blockers.append(f"model {name!r} is already in deploy.toml: rename the unit's entry")
    if entry["port"] in target.ports:
        blockers.append(f"port {entry['port']} is already a model's port on host {target.host} in deploy.toml")
    return Adoption(name, found, entry, engine, tuple(explicit), tuple(notes), tuple(blockers))


def same_command(
    original: tuple[str, ...] | list[str],
    rendered: tuple[str, ...] | list[str],
    explicit: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
) -> list[str]:
    """What differs between the command a found engine runs and the one its entry's unit runs (empty:
    the same): the engine words, the flag/value pairs (``explicit``, the engine's defaults the rendered
    unit states, added to the original's) and the ``args`` tail, token for token."""
    diffs: list[str] = []
    kind, other = engine_running(original), engine_running(rendered)
    if kind is None or other is None or kind.name != other.name:
        return ["not both command lines of one engine"]
    read = kind.command_line
    if read.engine_words(original) != read.engine_words(rendered):
        diffs.append(f"engine {list(read.engine_words(original))} != {list(read.engine_words(rendered))}")
    want = sorted(read.pairs(original) + _explicit_pairs(explicit), key=lambda p: p[0])
    have = read.pairs(rendered)
    if want != have:
        missing = [p for p in want if p not in have]
        extra = [p for p in have if p not in want]
        diffs.append(f"flags only in the original {missing}, only in the rendered unit {extra}")
    if args and list(rendered[-len(args) :]) != list(args):
        diffs.append(f"args tail {list(rendered[-len(args) :])} != {list(args)}")
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
    escaped = "".join(
        c if c not in '"\\' and 0x20 <= ord(c) != 0x7F else ("\\" + c if c in '"\\' else f"\\u{ord(c):04x}")
        for c in text
    )
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
