"""Recognise secrets that must not be written inline (pure).

Unit files are world-readable (0644) and the state store keeps every unit's text, so a secret may
only reach the engine through the model's EnvironmentFile (0600). Three signs give one away: the
name of an environment variable, the flag it follows on the command line, and the shape of the
value itself (well-known token prefixes only: a guess at "high entropy" would refuse hashes).
Messages name where the secret is and what kind it looks like, never the value.
"""

from __future__ import annotations

import re

# A word of a name (split on "_", "-", "."): *TOKEN, *KEY(S), PASS, anything with SECRET, PASSWORD,
# PASSWD or CREDENTIAL. TOKENIZER(S) and TOKENS (vLLM's --max-num-batched-tokens) are not secrets.
_SECRET_WORD = re.compile(r"^(?:.*token|.*keys?|pass|.*secret.*|.*passw(?:or)?d.*|.*credentials?.*)$",
                          re.IGNORECASE)
_WORD_SPLIT = re.compile(r"[_.\-]+")

# (kind, pattern): each anchored on a non-alphanumeric boundary so that a longer word is not a hit.
_VALUE_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")),
    ("an sk- API key (OpenAI, Anthropic)", re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}")),
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("a GitLab token", re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_\-]{20,}")),
    ("a Slack token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)


def secret_name(name: str) -> bool:
    """True when a variable or flag name says it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY...)."""
    return any(_SECRET_WORD.match(word) for word in _WORD_SPLIT.split(name.strip("-")) if word)


def secret_value_kind(value: str) -> str | None:
    """The kind of well-known secret ``value`` contains (anywhere in it), or None."""
    for kind, pattern in _VALUE_SHAPES:
        if pattern.search(value):
            return kind
    return None


def redact(text: str) -> str:
    """``text`` with every well-known secret in it replaced by a placeholder naming its kind."""
    for kind, pattern in _VALUE_SHAPES:
        text = pattern.sub(f"<{kind}, not shown>", text)
    return text


def secret_in_args(args: tuple[str, ...] | list[str]) -> tuple[int, str] | None:
    """(index, description) of the first argument that carries a secret, or None.

    A flag whose name says secret (``--api-key``, ``--hf-token``, ``--password``) with a value,
    as ``--flag=value`` or ``--flag value``; a bare flag (``--return-tokens-as-token-ids``) is none.
    """
    for i, arg in enumerate(args):
        kind = secret_value_kind(arg)
        if kind:
            return i, kind
        if not arg.startswith("-"):
            continue
        flag, eq, value = arg.partition("=")
        if not secret_name(flag):
            continue
        if eq and value:
            return i, f"the value of {flag}"
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            return i + 1, f"the value of {flag}"
    return None


def scan(tree: object, path: str = "") -> tuple[str, str] | None:
    """(key path, what) of the first inline secret in a catalog dump, or None.

    Every string and key is checked for a known value shape; the keys of an ``env`` table by name;
    the lists ``args`` and ``engine`` by flag.
    """
    if isinstance(tree, str):
        kind = secret_value_kind(tree)
        return (path, kind) if kind else None
    if isinstance(tree, dict):
        in_env = path.endswith(".env") or path == "env"
        for key, value in tree.items():
            sub = f"{path}.{key}" if path else str(key)
            kind = secret_value_kind(str(key))
            if kind:
                return path or "(top level)", f"a key shaped like {kind}"
            if in_env and secret_name(str(key)):
                return sub, f"a secret by its name ({key})"
            found = scan(value, sub)
            if found:
                return found
        return None
    if isinstance(tree, (list, tuple)):
        if path.rsplit(".", 1)[-1] in ("args", "engine") and all(isinstance(a, str) for a in tree):
            hit = secret_in_args(list(tree))
            if hit:
                return f"{path}[{hit[0]}]", hit[1]
        for i, item in enumerate(tree):
            found = scan(item, f"{path}[{i}]")
            if found:
                return found
    return None
