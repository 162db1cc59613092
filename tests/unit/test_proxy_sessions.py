"""The proxy's sessions per engine through HAProxy's master CLI (adapters/haproxy.py `sessions`): a
real HAProxy in master-worker mode on loopback, from the rendered config, in front of a loopback HTTP
server that holds a request until told. What the idle loop of models on demand reads."""

from __future__ import annotations

import signal
import socketserver
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.proxy import Route
from tests.builders.haproxy import Engine, free_port, haproxy, post, render_front
from tests.hosts.wait import wait_for


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Engine, Engine, HaproxyProxy]]:
    busy, quiet = Engine().start(), Engine().start()
    busy.release.clear()  # the busy engine holds each request until the test lets it go
    port = free_port()
    tmp = tmp_path_factory.mktemp("haproxy")
    routes = [Route("busy", "127.0.0.1", busy.port), Route("quiet", "127.0.0.1", quiet.port)]
    (tmp / "haproxy.cfg").write_text(render_front(tmp, Proxy(enabled=True, port=port), routes))
    with haproxy(tmp / "haproxy.cfg", port, master_sock=tmp / "master.sock"):
        # the shipped socket paths are the box's; this run's own (not a valid deploy.toml value) keeps runs apart
        proxy = Proxy.model_construct(
            **{**Proxy().model_dump(), "enabled": True, "port": port, "stats_socket": f"{tmp}/admin.sock"}
        )
        adapter = HaproxyProxy(LocalShell(), None, proxy, "127.0.0.1", "", python=sys.executable)  # type: ignore[arg-type]
        yield port, busy, quiet, adapter
        busy.release.set()
    busy.close()
    quiet.close()


def test_a_request_in_flight_counts_and_an_engine_never_asked_has_no_last_session(
    front: tuple[int, Engine, Engine, HaproxyProxy],
) -> None:
    """One request held by the busy engine: 1 session there; the quiet one: 0 and no last session."""
    port, busy, quiet, adapter = front
    engines = [("127.0.0.1", busy.port), ("127.0.0.1", quiet.port)]
    results: list[int] = []
    client = threading.Thread(target=lambda: results.append(post(port, "busy")[0]))
    client.start()
    seen = wait_for(
        lambda: adapter.sessions(engines),
        lambda s: s.get(engines[0], Sessions(0, None)).current == 1,
        timeout=20,
        what="the held request counted by HAProxy",
    )
    assert seen[engines[1]] == Sessions(0, None, 0)
    busy.release.set()
    client.join(30)
    assert results == [200]
    after = wait_for(
        lambda: adapter.sessions(engines),
        lambda s: s[engines[0]].current == 0,
        timeout=20,
        what="the finished request no longer counted",
    )
    idle = after[engines[0]].idle_s
    assert idle is not None and idle >= 0 and after[engines[0]].total == 1


def test_sessions_asked_while_the_master_reloads_answer(tmp_path: Path) -> None:
    """A reload re-executes the master, whose CLI then answers nothing for a moment: sessions() asked
    right after each of 10 reloads still answers (it asks again), never "gave no `show stat`"."""
    engine = Engine().start()
    port = free_port()
    routes = [Route("chat", "127.0.0.1", engine.port)]
    (tmp_path / "haproxy.cfg").write_text(render_front(tmp_path, Proxy(enabled=True, port=port), routes))
    proxy = Proxy.model_construct(
        **{**Proxy().model_dump(), "enabled": True, "port": port, "stats_socket": f"{tmp_path}/admin.sock"}
    )
    adapter = HaproxyProxy(LocalShell(), None, proxy, "127.0.0.1", "", python=sys.executable)  # type: ignore[arg-type]
    with haproxy(tmp_path / "haproxy.cfg", port, master_sock=tmp_path / "master.sock") as master:
        for _ in range(10):
            master.send_signal(signal.SIGUSR2)
            assert ("127.0.0.1", engine.port) in adapter.sessions([("127.0.0.1", engine.port)])
    engine.close()


SHOW_PROC = """#<PID>          <type>          <reloads>       <uptime>        <version>
100             master          1 [failed: 0]   0d00h00m09s     2.6.12-1+deb12u4
# workers
201             worker          0               0d00h00m01s     2.6.12-1+deb12u4
# old workers
200             worker          1               0d00h00m09s     2.6.12-1+deb12u4
# programs

"""
STAT_HEAD = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,addr,lastsess\n"
ANSWERS = {
    "show proc": SHOW_PROC,
    "@!201 show stat": STAT_HEAD + "be_chat,chat,0,0,1,1,,5,127.0.0.1:8001,0\n",
    "@!200 show stat": STAT_HEAD + "be_chat,chat,0,0,2,2,,40,127.0.0.1:8001,3\n",
}


class FakeMaster(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """HAProxy 2.6's master CLI as the adapter asks it, on a unix socket: `show proc` (a current worker
    and an old one still holding 2 sessions on the engine; old workers are listed with type "worker")
    and `@!PID show stat` of each."""

    daemon_threads = True


class _Answer(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        cmd = self.rfile.readline().decode().strip()
        self.wfile.write(ANSWERS.get(cmd, "Unknown command.\n").encode())


def test_sessions_in_process_and_as_a_script_count_the_same_workers_old_ones_included(tmp_path: Path) -> None:
    """The agent's own box asks the master CLI in its process (local), another host through a script: from
    the same master both count the current worker's session and the old worker's two (3 in flight), the
    least idle time and the sessions of both."""
    sock = str(tmp_path / "master.sock")
    proxy = Proxy.model_construct(**{**Proxy().model_dump(), "enabled": True, "stats_socket": f"{tmp_path}/admin.sock"})
    with FakeMaster(sock, _Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            answers = [
                HaproxyProxy(
                    LocalShell(),
                    None,
                    proxy,
                    "127.0.0.1",
                    "",
                    python=sys.executable,  # type: ignore[arg-type]
                    local=local,
                ).sessions([("127.0.0.1", 8001)])
                for local in (True, False)
            ]
        finally:
            server.shutdown()
    assert answers[0] == answers[1] == {("127.0.0.1", 8001): Sessions(current=3, idle_s=0.0, total=45)}
