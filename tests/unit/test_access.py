"""The path walk with a user's uid and groups (core/access.py): the first directory it cannot enter is named."""

from __future__ import annotations

from orchestrator.core.access import Account, PathStat, Walk, denial, parse_probe

VLLM = Account("vllm", 999, frozenset({995}))
ROOT = Account("root", 0, frozenset({0}))
DIR, FILE = 0o040000, 0o100000


def walk(target: str, modes: dict[str, int], resolved: str | None = None) -> Walk:
    return Walk(target, {p: PathStat(p, m, 0, 0) for p, m in modes.items()}, resolved)


ROOT_ENGINE = walk(
    "/root/ml-env/bin/python3",
    {
        "/": DIR | 0o755,
        "/root": DIR | 0o700,
        "/root/ml-env": DIR | 0o755,
        "/root/ml-env/bin": DIR | 0o755,
        "/root/ml-env/bin/python3": FILE | 0o755,
    },
)


def test_root_home_is_named_for_the_user() -> None:
    """An engine under /root (0700) for user vllm: /root and the user are named, with the missing x."""
    why = denial(ROOT_ENGINE, VLLM, "exec")
    assert why is not None and "user vllm cannot enter /root " in why and "search (x)" in why


def test_root_passes_the_same_walk() -> None:
    """root enters any directory: the same engine is fine for user root."""
    assert denial(ROOT_ENGINE, ROOT, "exec") is None


def test_a_missing_directory_of_the_engine_is_named() -> None:
    """An engine path that stops existing half-way names the missing directory."""
    why = denial(walk("/opt/venv/bin/python", {"/": DIR | 0o755, "/opt": DIR | 0o755}), VLLM, "exec")
    assert why == "/opt/venv/bin/python does not exist (/opt/venv is missing)"


def test_a_folder_staging_will_make_is_not_refused() -> None:
    """must_exist=False: a model folder not there yet, under enterable directories, is fine."""
    assert (
        denial(walk("/models/x/main", {"/": DIR | 0o755, "/models": DIR | 0o755}), VLLM, "dir", must_exist=False)
        is None
    )


def test_the_symlink_target_path_is_walked_too() -> None:
    """A venv python linking into /root/.pyenv: /root stops the user even though the venv is open."""
    stats = {
        "/": DIR | 0o755,
        "/srv": DIR | 0o755,
        "/srv/venv": DIR | 0o755,
        "/srv/venv/bin": DIR | 0o755,
        "/srv/venv/bin/python": FILE | 0o755,
        "/root": DIR | 0o700,
    }
    why = denial(walk("/srv/venv/bin/python", stats, resolved="/root/.pyenv/bin/python3.11"), VLLM, "exec")
    assert why is not None and "cannot enter /root " in why


def test_group_bits_apply_to_a_member() -> None:
    """A folder 0750 of the user's group is readable; 0700 of the same group is not."""
    stats = {"/": PathStat("/", DIR | 0o755, 0, 0), "/m": PathStat("/m", DIR | 0o750, 0, 995)}
    assert denial(Walk("/m", stats), VLLM, "dir") is None
    stats["/m"] = PathStat("/m", DIR | 0o700, 0, 995)
    assert "cannot read and enter (r-x) /m" in (denial(Walk("/m", stats), VLLM, "dir") or "")


def test_a_file_without_x_is_not_executable() -> None:
    """An engine 0644: the user may not execute it, and the message says so."""
    why = denial(walk("/e", {"/": DIR | 0o755, "/e": FILE | 0o644}), VLLM, "exec")
    assert why is not None and "cannot execute (x) /e" in why


def test_parse_probe_reads_the_account_and_walks() -> None:
    """The probe script's lines become the account and one walk per target, its resolved path kept."""
    text = "uid 999\ngids 995 44\ntarget /a/b\nstat 41ed 0 0 /a\nstat 41ed 0 0 /\nresolved /c d\nstat 81ed 0 0 /c d\n"
    account, walks = parse_probe("vllm", text)
    assert account == Account("vllm", 999, frozenset({995, 44}))
    assert walks["/a/b"].resolved == "/c d" and set(walks["/a/b"].stats) == {"/a", "/", "/c d"}


def test_parse_probe_knows_a_missing_user() -> None:
    """`nouser`: the host has no such account."""
    assert parse_probe("vllm", "nouser\n") == (None, {})
