"""HAProxy's master CLI answers, parsed: when a reload's worker serves, and whether an old worker
can still reach an engine. Fixtures are real answers of HAProxy 2.6.12 (tests/fixtures/haproxy)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.core.haproxy_cli import (
    OldWorker,
    Procs,
    draining,
    mark_commands,
    may_reach,
    new_worker,
    parse_show_proc,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures/haproxy"
CHAT = ("127.0.0.1", 18951)  # m1's server in the fixtures' config; m2's is 18952


def proc(name: str) -> Procs:
    parsed = parse_show_proc((FIX / name).read_text())
    assert parsed is not None
    return parsed


def worker(info: str, stat: str) -> OldWorker:
    return OldWorker(23676, (FIX / info).read_text(), (FIX / stat).read_text())


def test_show_proc_lists_the_master_reloads_and_current_and_old_workers() -> None:
    """A reload with a stream in flight: one new worker, the previous one among the old."""
    assert proc("show_proc_old_worker.txt") == Procs(reloads=5, failed=0, workers=(23815,), old_workers=(23676,))


def test_an_answer_that_is_not_show_proc_is_unknown() -> None:
    """An empty or garbled answer (the master re-executing) parses to None, never to 'no workers'."""
    assert parse_show_proc("") is None
    assert parse_show_proc("Unknown command.\n") is None


def test_the_new_worker_is_the_one_listed_after_the_reload_count_rose() -> None:
    """Before the master re-executed (same count, same worker) there is no new worker yet."""
    before = proc("show_proc_one_worker.txt")
    assert new_worker(before, before) is None
    assert new_worker(before, proc("show_proc_old_worker.txt")) == 23815


def test_a_failed_reload_forks_no_worker_and_counts_the_failure() -> None:
    """A config the master cannot load: the count rises, the old worker stays, failed goes up."""
    before, after = proc("show_proc_after_drain.txt"), proc("show_proc_failed_reload.txt")
    assert new_worker(before, after) is None
    assert after.failed == before.failed + 1


def test_an_old_worker_streaming_from_the_engine_can_reach_it() -> None:
    """A session on the engine's server: the engine must not stop."""
    assert may_reach(worker("old_info_streaming.txt", "old_stat_streaming.txt"), [CHAT])


def marked(w: OldWorker, *backends: str) -> OldWorker:
    """``w`` with these backends marked, as `get var` answers it."""
    return replace(w, marks="".join(f"proc.drained_{b}: type=bool value=<1>\n" for b in backends))


def test_an_unmarked_old_worker_holding_an_idle_client_connection_can_reach_the_engine() -> None:
    """No session to the engine, but a keep-alive client it would answer once more by its old routes."""
    assert may_reach(worker("old_info_idle_client.txt", "old_stat_idle_client.txt"), [CHAT])


def test_a_client_connection_without_a_request_at_the_engine_holds_no_drain_once_marked() -> None:
    """Idle or slow client, no session at the engine, its backend marked: what it sends goes to the
    current worker, so the engine may stop."""
    assert not may_reach(marked(worker("old_info_idle_client.txt", "old_stat_idle_client.txt"), "m1"), [CHAT])


def test_a_request_in_flight_to_the_engine_holds_the_drain_though_marked() -> None:
    """A session on the engine's server (a stream): the engine must not stop, marked or not."""
    assert may_reach(marked(worker("old_info_streaming.txt", "old_stat_streaming.txt"), "m1", "m2"), [CHAT])


def test_only_the_backends_at_the_engines_count_as_marked() -> None:
    """m2 marked, the engine is m1's: not drained."""
    assert may_reach(marked(worker("old_info_idle_client.txt", "old_stat_idle_client.txt"), "m2"), [CHAT])


def test_the_drain_marks_each_stopping_old_workers_backends_at_the_engines_once() -> None:
    """One command per backend with a server at the engines, none once it is marked."""
    idle = worker("old_info_idle_client.txt", "old_stat_idle_client.txt")
    assert mark_commands({23676: idle}, [CHAT]) == ["experimental-mode on; @!23676 set var proc.drained_m1 bool(1)"]
    assert mark_commands({23676: marked(idle, "m1")}, [CHAT]) == []
    assert mark_commands({23676: idle}, [("127.0.0.1", 18953)]) == []


def test_an_old_worker_still_listening_is_not_marked() -> None:
    """Not stopping yet: what it sent to the current worker could come back to itself."""
    info = (FIX / "old_info_idle_client.txt").read_text().replace("Stopping: 1", "Stopping: 0")
    assert mark_commands({23676: OldWorker(23676, info, (FIX / "old_stat_idle_client.txt").read_text())}, [CHAT]) == []


def test_an_old_worker_whose_config_has_no_server_at_the_engine_cannot_reach_it() -> None:
    """Its clients can only be routed where its own config points: another engine may stop."""
    assert not may_reach(worker("old_info_streaming.txt", "old_stat_streaming.txt"), [("127.0.0.1", 18953)])


def test_an_old_worker_that_did_not_answer_counts_as_draining() -> None:
    """No stat or info (it was busy, or the master lost it): ask again, never assume drained."""
    assert may_reach(OldWorker(23676, "", ""), [CHAT])
    assert draining(proc("show_proc_old_worker.txt"), {}, [CHAT]) == 1


def test_no_old_worker_means_drained() -> None:
    """Only the current worker: the engines may stop."""
    assert draining(proc("show_proc_after_drain.txt"), {}, [CHAT]) == 0


def test_sessions_count_each_engines_current_sessions_and_idle_seconds() -> None:
    """Real `show stat`: m1's engine has 1 session (last 0 s ago, 1 in all); m2's never had one; others left out."""
    from orchestrator.core.haproxy_cli import Sessions, sessions

    stat = (FIX / "old_stat_streaming.txt").read_text()
    found = sessions([stat], [CHAT, ("127.0.0.1", 18952), ("127.0.0.1", 9999)])
    assert found == {CHAT: Sessions(1, 0.0, 1), ("127.0.0.1", 18952): Sessions(0, None, 0)}


def test_sessions_add_up_over_workers_and_take_the_most_recent() -> None:
    """Two workers (a reload's old one still draining): scur summed, the least lastsess."""
    from orchestrator.core.haproxy_cli import Sessions, sessions

    stat = (FIX / "old_stat_streaming.txt").read_text()
    idle = (FIX / "old_stat_idle_client.txt").read_text()
    busier = stat.replace("m1,engine,0,0,1,", "m1,engine,0,0,3,")
    assert sessions([stat, busier], [CHAT])[CHAT] == Sessions(4, 0.0, 2)
    assert sessions([idle, stat], [CHAT])[CHAT].idle_s == 0.0
    assert sessions([], [CHAT]) == {} and sessions(["garbage"], [CHAT]) == {}


def test_the_engine_servers_of_a_rendered_config_are_found_by_address() -> None:
    """Each backend's `server engine` at one of the engines (quoted as rendered); `current` never."""
    from orchestrator.core.haproxy_cli import engine_servers, withdraw_commands, withdrawn

    config = (
        'backend m1 from base\n    server engine "127.0.0.1:8001"\n    server current "127.0.0.1:9000" weight 0\n'
        'backend m2 from base\n    server engine "127.0.0.1:8002" disabled\n'
    )
    assert engine_servers(config, [("127.0.0.1", 8002), ("127.0.0.1", 9000)]) == [("m2", "engine")]
    assert withdraw_commands([("m2", "engine")]) == ["@1 set server m2/engine state maint", "@1 show stat"]
    stat = "# pxname,svname,qcur,scur,status\nm2,engine,0,1,MAINT\nm1,engine,0,0,UP\n"
    assert withdrawn(stat, [("m2", "engine")]) and not withdrawn(stat, [("m1", "engine")])
