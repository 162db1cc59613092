"""Models on demand behind an HAProxy that drops privileges (`[proxy] user = "haproxy"`, rendered as
`user`/`group` in its global section, as Debian's stock config has): a real HAProxy whose workers
run as the haproxy account reaches the agent's demand socket in the directory the agent makes for it,
not one in a directory closed to that account (the old default, inside the 0750 state dir), and
the agent's start check refuses that layout naming the socket, the user and the missing permission."""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.demand_server import DemandServer, check_reachable
from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import DEMAND_LUA, DemandRoute, render_config
from orchestrator.errors import ConfigError
from orchestrator.resources import template_text
from tests.builders.as_account import run_as
from tests.hosts.wait import wait_for

from .conftest import make_catalog
from .test_demand_broker import DemandWorld

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every account may pass through (pytest's own tmp is 0700: the proxy could not)."""
    path = Path(tempfile.mkdtemp(prefix="demand-user-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def serving(path: Path, world: DemandWorld) -> Iterator[DemandServer]:
    server = DemandServer(str(path), world.broker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def haproxy_as_haproxy(sock: Path, work: Path) -> Iterator[int]:
    """A real HAProxy from the rendered config with [proxy] user = "haproxy", holding requests for
    "ghost" (on demand, a name the agent does not know) on ``sock``; yields its port."""
    port = _free_port()
    lua = template_text(DEMAND_LUA)
    (work / DEMAND_LUA).write_text(lua)
    config = render_config(
        Proxy(enabled=True, port=port, user="haproxy"),
        "127.0.0.1",
        [],
        template_text("haproxy.cfg.j2"),
        demand=[DemandRoute("ghost", "127.0.0.1", _free_port(), 5.0)],
        demand_socket=str(sock),
        lua=lua,
    )
    assert '\n    user "haproxy"\n    group "haproxy"\n' in config
    cfg = work / "haproxy.cfg"
    cfg.write_text(
        config.replace('"/run/orchestrator-proxy/admin.sock"', f'"{work}/admin.sock"').replace(
            f'"/etc/orchestrator/{DEMAND_LUA}"', f'"{work}/{DEMAND_LUA}"'
        )
    )
    master = subprocess.Popen(
        [HAPROXY, "-W", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            assert master.poll() is None, "HAProxy exited"
            return False

    try:
        wait_for(listening, what="HAProxy listening")
        workers = subprocess.run(
            ["pgrep", "-P", str(master.pid)], check=False, capture_output=True, text=True
        ).stdout.split()
        assert workers and all(_uid_of(int(w)) == pwd.getpwnam("haproxy").pw_uid for w in workers), workers
        yield port
    finally:
        master.terminate()
        master.wait(10)


def _uid_of(pid: int) -> int:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
    return int(line.split()[1])


def ask_ghost(port: int) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps({"model": "ghost", "prompt": "hi"}),
        headers={"Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    out = answer.status, json.loads(answer.read())["error"]
    conn.close()
    return out


def test_haproxy_as_its_own_user_reaches_the_socket_in_the_directory_the_agent_makes(
    base: Path, tmp_path: Path
) -> None:
    """The agent creates the socket's directory 0750 root:haproxy and the socket 0660 root:haproxy: the
    proxy's worker (uid haproxy) connects, and the agent's own 404 comes back through it."""
    sock = base / "orchestrator" / "demand.sock"
    with serving(sock, DemandWorld(tmp_path)):
        st = sock.parent.stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o750, grp.getgrnam("haproxy").gr_gid)
        check_reachable(str(sock), "haproxy", "haproxy")  # the start check agrees
        with haproxy_as_haproxy(sock, tmp_path) as port:
            status, error = ask_ghost(port)
    assert (status, error["message"]) == (404, "The model `ghost` does not exist."), error


def test_a_socket_in_a_directory_closed_to_haproxy_is_refused_at_start_as_haproxy_itself_would_fail(
    base: Path, tmp_path: Path
) -> None:
    """The old layout, the socket inside a 0750 root:root state dir: the start check names the socket,
    the user and the missing search permission; the real proxy, as haproxy, indeed cannot connect (503)."""
    state = base / "state"
    state.mkdir(mode=0o750)
    sock = state / "demand.sock"
    with serving(sock, DemandWorld(tmp_path)):
        with pytest.raises(ConfigError) as exc:
            check_reachable(str(sock), "haproxy", "haproxy")
        with haproxy_as_haproxy(sock, tmp_path) as port:
            status, error = ask_ghost(port)
    message = str(exc.value)
    assert exc.value.exit_code == 2 and str(sock) in message and "HAProxy's user haproxy" in message
    assert f"search (x) on directory {state} (drwxr-x--- root:root; haproxy is among its others)" in message
    assert status == 503 and "does not answer" in error["message"], error


def test_a_socket_haproxy_may_not_write_is_refused(base: Path, tmp_path: Path) -> None:
    """Directories open, the socket 0600 root:root: the check names write (w) on the socket."""
    sock = base / "open" / "demand.sock"
    sock.parent.mkdir(mode=0o755)
    with serving(sock, DemandWorld(tmp_path)):
        os.chown(sock, 0, 0)
        sock.chmod(0o600)
        with pytest.raises(ConfigError, match=r"lacks write \(w\) on socket .*demand\.sock \(srw------- root:root"):
            check_reachable(str(sock), "haproxy", "haproxy")


def test_a_proxy_group_without_a_user_is_refused() -> None:
    """[proxy] group alone would not drop anything: exit 2 naming the key."""
    with pytest.raises(ValueError, match=r"group 'haproxy' without user"):
        make_catalog(proxy={"enabled": True, "group": "haproxy"})


def test_the_agent_refuses_to_open_a_socket_its_proxy_user_cannot_reach_and_leaves_none(
    base: Path, tmp_path: Path
) -> None:
    """The agent's start (and a push's sync) with [proxy] user = "haproxy" and the socket in a closed
    directory: ConfigError (exit 2) naming it; no socket file and no loops are left behind."""
    from orchestrator.agent.daemon import Agent

    from .conftest import OpsWorld

    closed = base / "closed"
    closed.mkdir(mode=0o700)
    sock = closed / "demand.sock"
    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000, "user": "haproxy", "demand_socket": str(sock)},
        models={"a": {"repo": "org/a", "gpus": [0], "port": 8001, "on_demand": True}},
    )
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    with pytest.raises(ConfigError, match=rf"cannot reach the demand socket {sock}: it lacks search \(x\)") as exc:
        agent.demand.sync()
    assert exc.value.exit_code == 2
    assert not sock.exists() and agent.demand.server is None and agent.demand.loops == []


def test_a_config_with_models_on_demand_loads_without_an_alert(tmp_path: Path) -> None:
    """HAProxy checks the rendered config with a model on demand without an ALERT or WARNING (the
    stick table's backend once took the frontend's defaults implicitly: an ALERT at every reload)."""
    lua = template_text(DEMAND_LUA)
    (tmp_path / DEMAND_LUA).write_text(lua)
    config = render_config(
        Proxy(enabled=True, port=_free_port()),
        "127.0.0.1",
        [],
        template_text("haproxy.cfg.j2"),
        demand=[DemandRoute("ghost", "127.0.0.1", _free_port(), 5.0)],
        demand_socket=str(tmp_path / "demand.sock"),
        lua=lua,
    )
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        config.replace('"/run/orchestrator-proxy/admin.sock"', f'"{tmp_path}/admin.sock"').replace(
            f'"/etc/orchestrator/{DEMAND_LUA}"', f'"{tmp_path}/{DEMAND_LUA}"'
        )
    )
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], check=False, capture_output=True, text=True)
    said = check.stdout + check.stderr
    assert check.returncode == 0 and "[ALERT]" not in said and "[WARNING]" not in said, said


def test_a_push_whose_proxy_user_could_not_reach_the_socket_changes_nothing(base: Path, tmp_path: Path) -> None:
    """A push (as root: proxy.user is root-only) adding on demand with [proxy] user = "haproxy" and the
    socket under pytest's 0700 tmp: exit 2 naming the socket, the user and the directory; the file,
    the catalog and the socket stay as they were. The same push with the socket under an open
    directory goes through, and the socket it opens is one haproxy reaches."""
    from .test_demand_push import Pushed

    world = Pushed(tmp_path, on_demand=False)
    world.agent.demand.sync()
    before = world.path.read_text()
    closed = world.text(on_demand=True).replace("[proxy]\n", '[proxy]\nuser = "haproxy"\n', 1)
    try:
        shut = next(str(d) for d in [*reversed(tmp_path.parents), tmp_path] if not d.stat().st_mode & 0o001)
        with pytest.raises(
            ConfigError,
            match=rf"cannot reach the demand socket {world.sock}: it lacks search "
            rf"\(x\) on directory {shut} \(",
        ) as exc:
            world.push(closed, uid=0)
        assert exc.value.exit_code == 2 and world.path.read_text() == before
        assert world.agent.catalog.proxy.user is None and not world.sock.exists()
        sock = base / "run" / "demand.sock"
        world.push(closed.replace(str(world.sock), str(sock)), uid=0)
        assert world.agent.demand.path == str(sock) and world.loops() == {"demand", "demand_idle"}
        check_reachable(str(sock), "haproxy", "haproxy")
    finally:
        world.agent.stop()
        world.agent.demand.stop()


def test_proxy_user_and_group_render_into_haproxys_global_section() -> None:
    """[proxy] user alone: `user` and `group` of that name; with [proxy] group: that group; neither: no drop."""

    def global_of(proxy: Proxy) -> str:
        text = render_config(proxy, "127.0.0.1", [], template_text("haproxy.cfg.j2"))
        return text.split("\ndefaults ", 1)[0]

    assert '\n    user "haproxy"\n    group "haproxy"\n' in global_of(Proxy(enabled=True, port=9000, user="haproxy"))
    assert '\n    user "haproxy"\n    group "nogroup"\n' in global_of(
        Proxy(enabled=True, port=9000, user="haproxy", group="nogroup")
    )
    plain = global_of(Proxy(enabled=True, port=9000))
    assert "\n    user " not in plain and "\n    group " not in plain


def _first_line_as(user: str, group: str, sock: Path, model: str) -> str:
    """What an account's connection to the demand socket gets first: its first line, or the OSError's name
    (a child process that drops to ``user``/``group`` for good, as HAProxy's workers do)."""

    def first_line() -> str:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(10)
            conn.connect(str(sock))
            conn.sendall(json.dumps({"model": model}).encode() + b"\n")
            return conn.makefile("rb").readline().decode()
        except OSError as exc:
            return type(exc).__name__

    return run_as(pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid, first_line)


def test_a_push_that_changes_the_proxy_user_reopens_the_socket_for_that_account(base: Path, tmp_path: Path) -> None:
    """A model on demand, the proxy as root; a push (as root) making [proxy] user = "nobody" (group nogroup):
    the socket is made again for that account, whose held request is served, not refused (EACCES or
    "uid 65534 may not use the demand socket")."""
    from .test_demand_push import Pushed

    sock = base / "demand.sock"  # in a directory open to every account: the socket's own mode decides
    world = Pushed(tmp_path, on_demand=False)
    try:
        world.push(world.text(on_demand=True, sock=sock), uid=0)
        assert world.agent.demand.path == str(sock)
        pushed = world.text(on_demand=True, sock=sock).replace(
            "[proxy]\n", '[proxy]\nuser = "nobody"\ngroup = "nogroup"\n', 1
        )
        world.push(pushed, uid=0)
        first = _first_line_as("nobody", "nogroup", sock, "a")
        assert '"waiting"' in first or '"ready"' in first, first
        check_reachable(str(sock), "nobody", "nogroup")
    finally:
        world.agent.stop()
        world.agent.demand.stop()


def _on_demand_as(world: Any, sock: Path, user: str, group: str) -> str:
    return world.text(on_demand=True, sock=sock).replace(
        "[proxy]\n", f'[proxy]\nuser = "{user}"\ngroup = "{group}"\n', 1
    )


def test_a_directory_the_agent_made_is_made_again_for_a_new_proxy_account(base: Path, tmp_path: Path) -> None:
    """A directory the agent made root:haproxy becomes root:nogroup on a push to nobody:nogroup, which is served."""
    from .test_demand_push import Pushed

    sock = base / "made" / "demand.sock"
    world = Pushed(tmp_path, on_demand=False)
    try:
        world.push(_on_demand_as(world, sock, "haproxy", "haproxy"), uid=0)
        assert sock.parent.stat().st_gid == grp.getgrnam("haproxy").gr_gid
        world.push(_on_demand_as(world, sock, "nobody", "nogroup"), uid=0)
        st = sock.parent.stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o750, grp.getgrnam("nogroup").gr_gid)
        first = _first_line_as("nobody", "nogroup", sock, "a")
        assert '"waiting"' in first or '"ready"' in first, first
    finally:
        world.agent.stop()
        world.agent.demand.stop()


def test_the_operators_own_directory_stays_refused_and_unchanged(base: Path, tmp_path: Path) -> None:
    """The operator's root:haproxy directory: a push to nobody exits 2 naming it, and it stays as it was."""
    from .test_demand_push import Pushed

    mine = base / "operators"
    mine.mkdir(mode=0o750)
    os.chown(mine, 0, grp.getgrnam("haproxy").gr_gid)
    sock = mine / "demand.sock"
    world = Pushed(tmp_path, on_demand=False)
    try:
        world.push(_on_demand_as(world, sock, "haproxy", "haproxy"), uid=0)
        with pytest.raises(ConfigError, match=rf"lacks search \(x\) on directory {mine} ") as exc:
            world.push(_on_demand_as(world, sock, "nobody", "nogroup"), uid=0)
        assert exc.value.exit_code == 2
        st = mine.stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o750, grp.getgrnam("haproxy").gr_gid)
    finally:
        world.agent.stop()
        world.agent.demand.stop()


def test_a_mark_someone_else_owns_does_not_make_a_directory_the_agents(base: Path) -> None:
    """The agent's mark, but owned by another user (who could write it there): the directory is not the agent's."""
    from orchestrator.agent.demand_server import MARK, made_here

    there = base / "theirs"
    there.mkdir()
    (there / MARK).write_text("")
    assert made_here(there)
    os.chown(there / MARK, pwd.getpwnam("nobody").pw_uid, -1)
    assert not made_here(there)
