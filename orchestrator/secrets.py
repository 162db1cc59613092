"""Recognise secrets that must not be written inline (pure).

Unit files are world-readable (0644) and the state store keeps every unit's text, so a secret may
only reach the engine through the model's EnvironmentFile (0600). Three signs give one away: the
name of an environment variable, the flag it follows on the command line, and the shape of the
value itself (well-known token prefixes only: a guess at "high entropy" would refuse hashes).
Messages name where the secret is and what kind it looks like, never the value.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# A name is a secret by what it names, and a compound name names its last word: HF_TOKEN, api_key,
# DB_PASS hold one; num_key_value_heads, key_value_dim, bos_token_id, past_key_values (model-config
# fields, an engine's argument dump) hold heads, a dim, an id, where key/token is only a qualifier. So these words
# count last (or before only a form word: HF_TOKEN_VALUE, AUTH_HEADER, API_KEY_2): *TOKEN, *KEY(S),
# PASS, *AUTH, BEARER, COOKIE, JWT, SESSIONID, SIGNATURE, SALT, DSN. TOKENIZER(S) and TOKENS
# (--max-num-batched-tokens) are none, nor KEYFILE (a path), nor a vocabulary token (bos_token, pad_token).
_HEAD_WORD = re.compile(
    r"^(?:.*token|.*keys?|pass|.*auth\d*|authn|authz|auth[a-z]*header|.*bearer|.*cookies?"
    r"|.*jwts?|sessionid|sessid|.*signature|dsn|.*salt)$",
    re.IGNORECASE,
)
# Words that say secret wherever they stand (SECRET_KEY_BASE, PASSWORD_FILE, OAUTH2_CLIENT): none of
# them names a part of a model.
_ANY_WORD = re.compile(
    r"^(?:.*secrets?.*|.*passw(?:or)?d.*|.*passphrase.*|.*credentials?.*|.*oauth\d*"
    r"|.*authori[sz]ation|authentication)$",
    re.IGNORECASE,
)
# After a head word, words that say how the secret is written or which one it is, not what the name
# holds: API_KEY_B64, HF_TOKEN_2, OPENAI_API_KEY_PROD.
_FORM_WORD = re.compile(
    r"^(?:value|header|str|string|b64|base64|raw|hex|\d+|v\d+|prod|production|dev|devel"
    r"|development|staging|stage|test|live|primary|secondary|old|new|main|backup|default)$",
    re.IGNORECASE,
)
# A tokenizer's special tokens: the text of a vocabulary entry, never a credential.
_VOCAB_WORD = re.compile(r"^(?:bos|eos|pad|unk|sep|cls|mask|image|video|audio|boi|eoi|boa|eoa|special)$", re.IGNORECASE)
# Names of connection strings, which carry their password: DATABASE_URL, REDIS_URI, PG_CONN...
_STORE_WORD = re.compile(
    r"^(?:database|db|postgres(?:ql)?|pg|mysql|mariadb|redis|mongo(?:db)?|amqp|rabbitmq"
    r"|broker|sql|sqlalchemy|celery|kafka|connection|conn)$",
    re.IGNORECASE,
)
_LOCATOR_WORD = re.compile(r"^(?:url|uri|dsn|string|str|conn|connection)$", re.IGNORECASE)
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
    ("a JSON web token", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("a bearer token", re.compile(r"(?i)(?<![A-Za-z0-9])(?:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}")),
    ("a URL with a password", re.compile(r"(?i)(?<![A-Za-z0-9+.-])[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:[^\s/@'\"]+@")),
)
# ``name=value``, ``name: value``, ``'name': 'value'``, ``--name value`` in free text (a journal line,
# an engine's "non-default args: {...}" log line, a command's stderr): the value goes when the name says secret.
_NAME_SEP = re.compile(
    r"""(?<![/\w.-])(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)(?P<q>['"]?)"""
    r"""(?P<sep>\s*[=:]\s*|\s+(?=\S))"""
)
_VALUE = re.compile(
    r"""(?![<])(?:(?i:bearer|basic|token)\s+[^\s,;}\])'"]+|\[[^\]]*\]|"""
    r"""'[^']*'|"[^"]*"|[^\s,;}\])'"]+)"""
)
_NAMED = "<a secret by its name, not shown>"


@functools.lru_cache(maxsize=4096)  # redact() asks for the same few names over and over
def secret_name(name: str) -> bool:
    """True when a variable or flag name says it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
    AUTHORIZATION, SESSION_COOKIE, DATABASE_URL...)."""
    words = [w for w in _WORD_SPLIT.split(name.strip("-")) if w]
    if any(_ANY_WORD.match(word) for word in words):
        return True
    head = len(words)
    while head > 1 and _FORM_WORD.match(words[head - 1]):
        head -= 1
    if head and _HEAD_WORD.match(words[head - 1]) and not (head > 1 and _VOCAB_WORD.match(words[head - 2])):
        return True
    return any(_STORE_WORD.match(w) for w in words) and any(_LOCATOR_WORD.match(w) for w in words)


def secret_value_kind(value: str) -> str | None:
    """The kind of well-known secret ``value`` contains (anywhere in it), or None."""
    for kind, pattern in _VALUE_SHAPES:
        if pattern.search(value):
            return kind
    return None


def _hide_named(text: str) -> str:
    """``text`` with the value after every secret-named ``name=``/``name:``/``--name`` replaced; one
    left-to-right pass (a value inside a quoted non-secret value is still found: the scan goes on
    right after each name, not after its value)."""
    out, pos = [], 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < pos:
            continue  # inside a value already hidden
        # "--flag value" only for flags; "word word" in prose is not a name and its value.
        if not secret_name(m["name"]) or (not m["sep"].strip() and not m["name"].startswith("-")):
            continue
        value = _VALUE.match(text, m.end())
        if value is None:
            continue
        out += [text[pos : m.end()], _NAMED]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def redact_values(text: str) -> str:
    """``text`` with every well-known secret shape in it replaced by a placeholder naming its kind;
    safe on the tool's own messages (which quote key paths, never a secret-named key's value)."""
    for kind, pattern in _VALUE_SHAPES:
        text = pattern.sub(f"<{kind}, not shown>", text)
    return text


def redact(text: str) -> str:
    """Text from outside the tool (engine, journal, command output, HTTP bodies) with every secret
    hidden: well-known value shapes anywhere, and the value of any name that says secret. The one
    function such text passes through where it enters an error, an event or history."""
    return _hide_named(redact_values(text))


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


def redact_tree(tree: Any) -> Any:
    """``tree`` (an event's fields, a JSON-like value) with :func:`redact` applied to every string."""
    if isinstance(tree, str):
        return redact(tree)
    if isinstance(tree, dict):
        return {k: redact_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(redact_tree(v) for v in tree)
    return tree
