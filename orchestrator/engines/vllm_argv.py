"""vLLM's API server command line, read (pure): where its engine words end (`python -m
vllm.entrypoints.openai.api_server`, `vllm serve`), its flags as written, and their flag/value pairs."""

from __future__ import annotations

from orchestrator.engines.base import Option
from orchestrator.errors import AdoptError

API_SERVER = "vllm.entrypoints.openai.api_server"
CLI_MAIN = "vllm.entrypoints.cli.main"

# The flags the renderer writes from an entry's keys (core/render.engine_argv), with their short forms.
KEYED = {
    "--model": "model",
    "--served-model-name": "served_name",
    "--host": "bind",
    "--port": "port",
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "-pp": "pipeline_parallel",
    "--data-parallel-size": "data_parallel",
    "-dp": "data_parallel",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--gpu-memory-utilization": "gpu_memory_utilization",
}
LONG = {
    "tensor_parallel": "--tensor-parallel-size",
    "pipeline_parallel": "--pipeline-parallel-size",
    "data_parallel": "--data-parallel-size",
}
SWITCHES = {"--enable-expert-parallel": "expert_parallel", "-ep": "expert_parallel"}
# vLLM's boolean flags met on the seeds' and the docs' command lines: they never take the next word.
BOOLEAN_FLAGS = frozenset(
    {
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--enable-expert-parallel",
        "--enable-sleep-mode",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--disable-custom-all-reduce",
        "--enable-lora",
        "--headless",
        "--disable-frontend-multiprocessing",
        "--enable-log-requests",
        "--async-scheduling",
        "--enable-dbo",
        "--enable-eplb",
        "--disable-fastapi-docs",
        "--enable-prompt-tokens-details",
        "--enable-server-load-tracking",
        "--disable-uvicorn-access-log",
        "--enable-request-id-headers",
        "--return-tokens-as-token-ids",
        "--enable-force-include-usage",
        "--skip-tokenizer-init",
        "--no-enable-log-requests",
        "--enable-tokenizer-info-endpoint",
    }
)


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
    if (
        len(words) == 3
        and words[2] == "serve"
        and words[1].rsplit("/", 1)[-1] == "vllm"
        and words[0].rsplit("/", 1)[-1].startswith("python")
    ):
        return words[1:]
    return words


def is_vllm(argv: tuple[str, ...] | list[str]) -> bool:
    return engine_length(argv) is not None


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
    long = {short: LONG[key] for short, key in KEYED.items() if short.startswith("-") and len(short) == 3}
    found += [(long.get(o.flag, o.flag), o.value) for o in opts]
    return sorted(found, key=lambda p: p[0])


class VllmCommandLine:
    """This module's reading of a vLLM command line, as the Engine's ``command_line``."""

    marker = "vllm"
    forms = f"`python -m {API_SERVER}` or `vllm serve`"

    engine_length = staticmethod(engine_length)
    engine_words = staticmethod(engine_words)
    options = staticmethod(options)
    pairs = staticmethod(pairs)
