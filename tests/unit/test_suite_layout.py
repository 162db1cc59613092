"""Where a test file lives says what it needs (CONTRIBUTING.md, "Tests"): a top-level tests/ file boots
systemd test hosts exactly when it is named *_hosts.py (and then carries the hosts mark); tests/unit
boots none."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# tests/hosts/fixtures.py's fixtures (re-exported by tests/conftest.py), each of which boots or needs a host.
HOST_FIXTURES = {"host", "hosts", "host_set", "adapters", "inside_adapters", "netns_fleet", "netns_pair"}
HARNESS_TYPES = {"Host", "HostSet", "Adapters", "InsideAdapters"}


def is_test_or_fixture(node: ast.FunctionDef) -> bool:
    """A test function or a fixture: their parameters are fixtures (a helper's `host` is any value)."""
    return node.name.startswith("test_") or any("fixture" in ast.unparse(d) for d in node.decorator_list)


def params(node: ast.FunctionDef) -> set[str]:
    """Parameters typed with the harness's classes (a parametrized `host: str` or a local fixture's
    `host: FakeHost` is no test host)."""
    return {a.arg for a in node.args.args if a.annotation is not None and HARNESS_TYPES & words(a.annotation)}


def words(annotation: ast.expr) -> set[str]:
    return set(re.findall(r"\w+", ast.unparse(annotation)))


def boots_hosts(path: Path) -> bool:
    """Whether a test file asks for a host fixture, calls boot_hosts or marks itself `hosts`."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and is_test_or_fixture(node) and HOST_FIXTURES & params(node):
            return True
        if isinstance(node, ast.Name) and node.id == "boot_hosts":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "hosts" and ast.unparse(node) == "pytest.mark.hosts":
            return True
    return False


def test_top_level_files_boot_hosts_exactly_when_named_hosts() -> None:
    """tests/test_*.py boots a test host if and only if its name ends in _hosts.py."""
    wrong = [p.name for p in sorted(TESTS.glob("test_*.py")) if boots_hosts(p) != p.name.endswith("_hosts.py")]
    assert wrong == [], f"rename (booting hosts <=> *_hosts.py): {wrong}"


def test_host_files_carry_the_hosts_mark() -> None:
    """Every tests/*_hosts.py marks its tests `hosts` at module level (pytestmark)."""
    unmarked = [
        p.name for p in sorted(TESTS.glob("test_*_hosts.py")) if "pytestmark = pytest.mark.hosts" not in p.read_text()
    ]
    assert unmarked == []


def test_unit_files_boot_no_host() -> None:
    """No file under tests/unit asks for a host fixture, boots hosts or carries the hosts mark."""
    booting = [p.name for p in sorted((TESTS / "unit").glob("test_*.py")) if boots_hosts(p)]
    assert booting == []
