"""Staging from a hub: the real stage worker, run through a local Shell, against a hub stub on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.weights import MANIFEST_NAME, Manifest, StageRequest
from orchestrator.errors import WeightsError
from tests.hosts.wait import wait_for
from tests.hubstub import HubStub, StubFile, StubRepo, sharded_model, single_file_model
from tests.hubstub.runner import LocalRunner

SHA = "0123456789abcdef0123456789abcdef01234567"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
TOKEN = "hf_stubSECRETtoken_5f2d9c"
MiB = 1 << 20

Events = list[tuple[str, dict[str, object]]]


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        yield stub


@pytest.fixture
def runner(tmp_path: Path) -> LocalRunner:
    return LocalRunner(env={"HF_HOME": str(tmp_path / "hf-home")})


@pytest.fixture
def store(runner: LocalRunner) -> HfWeightStore:
    return HfWeightStore(runner, python=sys.executable)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "models"


def request(hub: HubStub, root: Path, repo: str = "org/tiny", revision: str = SHA, **kw: object) -> StageRequest:
    return StageRequest(name="tiny", repo=repo, revision=revision, root=str(root), endpoint=hub.url, **kw)  # type: ignore[arg-type]


def stage(store: HfWeightStore, req: StageRequest, events: Events | None = None) -> Manifest:
    sink: Events = [] if events is None else events
    return store.stage(req, lambda e, f: sink.append((e, f)))


def shard_gets(hub: HubStub) -> list[str]:
    return [
        r.path
        for r in hub.requests
        if r.method == "GET" and "safetensors" in r.path and "/resolve/" in r.path and not r.path.endswith(".json")
    ]


def test_full_download_writes_verified_files_and_manifest(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A hub model lands in <root>/<name>/<sha>/ with every file at its listed size and a manifest."""
    files = sharded_model(SHARDS, 4096)
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    manifest = stage(store, request(hub, root))
    final = root / "tiny" / SHA
    assert manifest.path == str(final)
    assert {p.name for p in final.iterdir()} == set(files) | {MANIFEST_NAME}
    assert all((final / n).read_bytes() == data for n, data in files.items())
    assert json.loads((final / MANIFEST_NAME).read_text())["files"] == {n: len(d) for n, d in files.items()}
    assert os.listdir(root / "tiny") == [SHA]


def test_progress_streams_bytes_up_to_the_total(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """The caller sees the plan, one event per file and byte progress that ends at the total."""
    files = sharded_model(SHARDS, 4096)
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    events: Events = []
    stage(store, request(hub, root), events)
    total = sum(len(d) for d in files.values())
    progress = [f for e, f in events if e == "stage_progress"]
    assert progress[-1]["bytes"] == progress[-1]["total"] == total
    assert {f["file"] for e, f in events if e == "stage_file"} == set(files)
    assert [f["needed"] for e, f in events if e == "stage_plan"] == [total]


def test_project_local_shell_stages_and_reports(hub: HubStub, root: Path) -> None:
    """The project's own LocalShell stages a model and its progress reaches the total."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    events: Events = []
    manifest = stage(HfWeightStore(LocalShell(), python=sys.executable), request(hub, root), events)
    progress = [f for e, f in events if e == "stage_progress"]
    assert progress[-1]["bytes"] == manifest.total_bytes


def test_branch_is_pinned_to_its_commit(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """Staging "main" stores and records the commit SHA it resolved to, and the branch asked for."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    manifest = stage(store, request(hub, root, revision="main"))
    assert (manifest.revision, manifest.requested_revision) == (SHA, "main")
    assert (root / "tiny" / SHA / MANIFEST_NAME).is_file()


def test_staged_model_is_not_downloaded_again(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A second stage of an intact model makes no file request at all."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    first = stage(store, request(hub, root))
    hub.requests.clear()
    assert stage(store, request(hub, root)) == first
    assert hub.requests == []


def test_shards_are_taken_from_the_index_not_a_numbering_pattern(
    hub: HubStub, store: HfWeightStore, root: Path
) -> None:
    """Shards named freely in the index (no %05d numbering) stage and verify."""
    names = ["model-1-of-3.safetensors", "weights_b.safetensors", "model-00003-of-00009.safetensors"]
    hub.add(StubRepo.of("org/tiny", sharded_model(names, 64), sha=SHA))
    assert set(names) <= set(stage(store, request(hub, root)).files)


def test_single_file_model_without_index_stages(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A model with one model.safetensors and no index counts as complete."""
    hub.add(StubRepo.of("org/tiny", single_file_model(1024), sha=SHA))
    assert set(stage(store, request(hub, root)).files) == {"config.json", "model.safetensors"}


def test_ignore_patterns_skip_files(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """Files matched by ignore_patterns are neither downloaded nor required."""
    files = sharded_model(SHARDS, 64) | {"original/consolidated.pth": b"x" * 1000}
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    manifest = stage(store, request(hub, root, ignore_patterns=("original/*",)))
    assert "original/consolidated.pth" not in manifest.files
    assert not any("original" in r.path for r in hub.requests if "/resolve/" in r.path)


def test_shard_named_in_index_but_not_listed_fails_before_big_downloads(
    hub: HubStub, store: HfWeightStore, root: Path
) -> None:
    """An index naming a shard the hub does not list fails, names the shard, and fetches no shard."""
    files = sharded_model(SHARDS, 64)
    del files[SHARDS[1]]
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    with pytest.raises(WeightsError, match=f"shard {SHARDS[1]} named in model.safetensors.index.json"):
        stage(store, request(hub, root))
    assert shard_gets(hub) == []
    assert store.verify(str(root), "tiny", SHA) is None


def test_listed_shard_that_is_not_served_is_reported_missing(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A shard the hub lists but answers 404 for fails with its name and expected size."""
    repo = hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    size = repo.files[SHARDS[1]].size
    repo.files[SHARDS[1]] = StubFile(None, listed_size=size)
    with pytest.raises(WeightsError, match=rf"{SHARDS[1]} is missing \(expected {size} bytes, found none\)"):
        stage(store, request(hub, root))
    assert not (root / "tiny" / SHA).exists()


def test_wrong_size_is_reported_with_expected_and_found(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A shard served at another size than listed fails, naming the file and both sizes."""
    repo = hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    data = repo.files[SHARDS[0]].data or b""
    repo.files[SHARDS[0]] = StubFile(data, listed_size=len(data) + 100)
    with pytest.raises(
        WeightsError,
        match=rf"{SHARDS[0]} has the wrong size.*expected {len(data) + 100} "
        rf"bytes.*found {len(data)}",
    ):
        stage(store, request(hub, root))
    assert store.verify(str(root), "tiny", SHA) is None


def test_verify_reports_a_shard_that_shrank_after_staging(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """verify() names a staged shard whose size no longer matches, with both sizes."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    manifest = stage(store, request(hub, root))
    shard = root / "tiny" / SHA / SHARDS[1]
    os.truncate(shard, 10)
    with pytest.raises(
        WeightsError,
        match=rf"{SHARDS[1]} has the wrong size \(expected "
        rf"{manifest.files[SHARDS[1]]} bytes, found 10\)",
    ):
        store.verify(str(root), "tiny", SHA)


def test_broken_staged_model_is_restaged_fetching_only_the_bad_file(
    hub: HubStub, store: HfWeightStore, root: Path
) -> None:
    """Staging over a damaged model downloads only the file whose size is wrong."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    stage(store, request(hub, root))
    os.truncate(root / "tiny" / SHA / SHARDS[1], 10)
    hub.requests.clear()
    stage(store, request(hub, root))
    assert [p.rsplit("/", 1)[1] for p in shard_gets(hub)] == [SHARDS[1]]
    assert store.verify(str(root), "tiny", SHA) is not None


def test_not_staged_model_verifies_as_none(store: HfWeightStore, root: Path) -> None:
    """verify() of a model that was never staged returns None."""
    assert store.verify(str(root), "tiny", SHA) is None


def _start_stalled_stage(
    hub: HubStub, store: HfWeightStore, runner: LocalRunner, root: Path, errors: list[BaseException]
) -> tuple[threading.Thread, Path]:
    files = sharded_model(SHARDS, 6 * MiB // 4 * 4)  # first shard ~24 MiB
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    hub.stall(SHARDS[0], 12 * MiB)

    def run() -> None:
        try:
            stage(store, request(hub, root))
        except WeightsError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    part = root / "tiny" / f".staging-{SHA}" / (SHARDS[0] + ".part")
    assert hub.stalled.wait(30)
    wait_for(lambda: part.exists() and part.stat().st_size >= 10 * MiB, what="10 MiB in the .part file")
    return thread, part


def test_resume_after_killed_worker_fetches_only_the_rest(
    hub: HubStub, store: HfWeightStore, runner: LocalRunner, root: Path
) -> None:
    """After the worker is killed mid-file, the rerun asks for the rest with a Range header."""
    errors: list[BaseException] = []
    thread, part = _start_stalled_stage(hub, store, runner, root, errors)
    runner.procs[-1].send_signal(signal.SIGKILL)
    thread.join()
    hub.release()
    kept = part.stat().st_size
    size = hub.repos["org/tiny"].files[SHARDS[0]].size
    assert "exited -9" in str(errors[0])
    manifest = stage(store, request(hub, root))
    gets = hub.gets(SHARDS[0])
    assert [g.range for g in gets] == [None, f"bytes={kept}-"]
    assert gets[-1].status == 206
    assert manifest.files[SHARDS[0]] == size
    assert (root / "tiny" / SHA / SHARDS[0]).read_bytes() == hub.repos["org/tiny"].files[SHARDS[0]].data


def test_killed_download_is_never_taken_as_staged(
    hub: HubStub, store: HfWeightStore, runner: LocalRunner, root: Path
) -> None:
    """A download killed mid-file leaves only the staging directory; verify() says not staged."""
    errors: list[BaseException] = []
    thread, _ = _start_stalled_stage(hub, store, runner, root, errors)
    runner.procs[-1].send_signal(signal.SIGKILL)
    thread.join()
    hub.release()
    assert store.verify(str(root), "tiny", SHA) is None
    assert os.listdir(root / "tiny") == [f".staging-{SHA}"]


def test_model_larger_than_the_disk_fails_before_writing(hub: HubStub, store: HfWeightStore, small_disk: Path) -> None:
    """A 32 MiB model on a 20 MiB volume fails with needed and free bytes, leaving nothing behind."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 4 * MiB), sha=SHA))
    root = small_disk / "models"
    with pytest.raises(WeightsError, match=r"needs 32\.0 MiB more .* only 20\.0 MiB free"):
        stage(store, request(hub, root))
    assert os.listdir(root) == []
    assert [r for r in hub.requests if "/resolve/" in r.path] == []


def _stage_in_thread(store: HfWeightStore, req: StageRequest, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            stage(store, req)
        except WeightsError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _fill(path: Path, *, leave_pages: int = 0) -> None:
    """Take every free page of the (tmpfs) volume under path but ``leave_pages`` of 4 KiB, as someone
    else's big write would."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
        os.ftruncate(fd, os.fstat(fd).st_size - leave_pages * 4096)
    finally:
        os.close(fd)


def test_disk_filling_up_during_download_keeps_the_partial_model_and_says_why(
    hub: HubStub, store: HfWeightStore, runner: LocalRunner, small_disk: Path
) -> None:
    """When the disk fills mid-download, the error names the path, needed and free bytes, the files
    fetched so far stay, and a rerun with room again completes."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS[:1], 3 * MiB), sha=SHA))  # 12 MiB
    hub.stall(SHARDS[0], 0)
    root = small_disk / "models"
    errors: list[BaseException] = []
    thread = _stage_in_thread(store, request(hub, root), errors)
    assert hub.stalled.wait(30)
    (small_disk / "filler").write_bytes(b"\0" * 12 * MiB)  # someone else takes the space meanwhile
    hub.release()
    thread.join()
    staging = root / "tiny" / f".staging-{SHA}"
    assert re.search(
        rf"disk full under {staging} while staging: needs .* \(\d+ bytes\), .* free "
        rf"\(\d+ bytes\); the partial download is kept",
        str(errors[0]),
    )
    assert (staging / "config.json").is_file()
    (small_disk / "filler").unlink()
    hub.requests.clear()
    assert stage(store, request(hub, root)).revision == SHA
    assert hub.gets("config.json") == []


def test_disk_full_while_finalizing_is_a_clear_error(hub: HubStub, store: HfWeightStore, small_disk: Path) -> None:
    """A disk that fills after the last byte arrived fails the manifest write with a WeightsError
    naming the path and the free bytes, not a traceback; the fetched files stay."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64 * 1024), sha=SHA))
    hub.stall("tokenizer_config.json", 1)  # the last file fetched (2 bytes: one page on tmpfs)
    root = small_disk / "models"
    errors: list[BaseException] = []
    thread = _stage_in_thread(store, request(hub, root), errors)
    assert hub.stalled.wait(30)
    _fill(small_disk / "filler", leave_pages=1)  # room for that file, none for the manifest
    hub.release()
    thread.join()
    staging = root / "tiny" / f".staging-{SHA}"
    assert re.search(
        rf"disk full under {staging} while staging: every file is fetched but the manifest "
        r"cannot be written, .* free \(\d+ bytes\); the partial download is kept",
        str(errors[0]),
    )
    assert (staging / SHARDS[1]).is_file()
    assert store.verify(str(root), "tiny", SHA) is None


def test_gated_repo_without_token_is_refused_with_401(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A gated repo and no token fails with HTTP 401 and a hint about the token."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA, token=TOKEN))
    with pytest.raises(WeightsError, match="HTTP 401: the repo is gated or private"):
        stage(store, request(hub, root))


def _token_file(tmp_path: Path, token: str, mode: int = 0o600) -> str:
    path = tmp_path / "hf-token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return str(path)


def test_gated_repo_with_wrong_token_is_refused_without_echoing_it(
    hub: HubStub, store: HfWeightStore, runner: LocalRunner, root: Path, tmp_path: Path
) -> None:
    """A wrong token gets 401, names the token file, and never shows the token."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA, token=TOKEN))
    wrong = "hf_wrongWRONGwrong_77"
    token_file = _token_file(tmp_path, wrong)
    with pytest.raises(WeightsError, match=f"HTTP 401.*token file {token_file}") as err:
        stage(store, request(hub, root, token_file=token_file))
    assert wrong not in str(err.value) and wrong not in "".join(runner.output)


def test_missing_token_file_means_anonymous_access(
    hub: HubStub, store: HfWeightStore, root: Path, tmp_path: Path
) -> None:
    """A token file that does not exist is no token: a public repo stages without Authorization."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA))
    stage(store, request(hub, root, token_file=str(tmp_path / "absent-token")))
    assert {r.authorization for r in hub.requests} == {None}


def test_token_file_readable_by_others_is_refused(
    hub: HubStub, store: HfWeightStore, root: Path, tmp_path: Path
) -> None:
    """A token file with group/other permissions is refused, naming the file and its mode."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA, token=TOKEN))
    token_file = _token_file(tmp_path, TOKEN, 0o644)
    with pytest.raises(WeightsError, match=f"token file {token_file} has mode 644"):
        stage(store, request(hub, root, token_file=token_file))


def _all_written_bytes(*dirs: Path) -> bytes:
    return b"".join(p.read_bytes() for d in dirs if d.exists() for p in d.rglob("*") if p.is_file())


def test_token_from_file_never_appears_in_output_manifest_or_files(
    hub: HubStub,
    store: HfWeightStore,
    runner: LocalRunner,
    root: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the right token the gated model stages, and the token is in no output, event or file."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA, token=TOKEN))
    events: Events = []
    manifest = stage(store, request(hub, root, token_file=_token_file(tmp_path, TOKEN)), events)
    assert all(r.authorization == f"Bearer {TOKEN}" for r in hub.requests)
    seen = "".join(runner.output) + repr(events) + caplog.text + json.dumps(manifest.to_dict())
    assert TOKEN not in seen
    assert TOKEN.encode() not in _all_written_bytes(root, tmp_path / "hf-home")


def test_token_from_environment_is_used_and_never_printed(hub: HubStub, root: Path, tmp_path: Path) -> None:
    """HF_TOKEN in the worker's environment opens a gated repo and is not printed."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64), sha=SHA, token=TOKEN))
    runner = LocalRunner(env={"HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home")})
    manifest = stage(HfWeightStore(runner, python=sys.executable), request(hub, root))
    assert manifest.revision == SHA
    assert TOKEN not in "".join(runner.output)
    assert TOKEN.encode() not in _all_written_bytes(root, tmp_path / "hf-home")


def test_second_stage_under_the_same_root_is_refused(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """While one stage runs under a root, another is refused at once; the first still completes."""
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 1024), sha=SHA))
    hub.stall(SHARDS[0], 100)
    results: list[Manifest] = []
    thread = threading.Thread(target=lambda: results.append(stage(store, request(hub, root))))
    thread.start()
    assert hub.stalled.wait(30)
    try:
        with pytest.raises(WeightsError, match=f"{root}: another stage is running"):
            stage(store, request(hub, root))
    finally:
        hub.release()
        thread.join()
    assert results[0].revision == SHA


HOSTILE = ["/{outside}/abs.bin", "../../escaped.bin", "a/../../../escaped2.bin"]


@pytest.mark.parametrize("pattern", HOSTILE)
def test_hub_listing_with_a_name_outside_the_model_dir_is_refused(
    hub: HubStub, store: HfWeightStore, root: Path, tmp_path: Path, pattern: str
) -> None:
    """A hub listing an absolute or ../ file name fails before any download, naming the file and the
    repo; nothing is written outside the model directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    name = pattern.format(outside=str(outside).lstrip("/"))
    files = sharded_model(SHARDS, 64) | {name: b"pwned"}
    hub.add(StubRepo.of("org/tiny", files, sha=SHA))
    with pytest.raises(
        WeightsError,
        match=rf"file name '{re.escape(name)}' listed for org/tiny is not a "
        "plain relative path",
    ):
        stage(store, request(hub, root))
    assert not any(p.name.startswith(("abs", "escaped")) for p in tmp_path.rglob("*"))
    assert [r for r in hub.requests if "/resolve/" in r.path] == []


def test_symlink_under_the_staging_dir_is_not_followed(
    hub: HubStub, store: HfWeightStore, root: Path, tmp_path: Path
) -> None:
    """A listed name whose directory is a symlink out of the staging dir is refused before writing."""
    outside = tmp_path / "outside"
    outside.mkdir()
    staging = root / "tiny" / f".staging-{SHA}"
    staging.mkdir(parents=True)
    (staging / "sub").symlink_to(outside)
    hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 64) | {"sub/evil.bin": b"pwned"}, sha=SHA))
    with pytest.raises(
        WeightsError,
        match=r"file name 'sub/evil.bin' listed for org/tiny resolves to "
        rf"{outside}/evil.bin, outside",
    ):
        stage(store, request(hub, root))
    assert os.listdir(outside) == []


def test_corrupted_bytes_served_once_are_fetched_again_and_verified(
    hub: HubStub, store: HfWeightStore, root: Path
) -> None:
    """A shard whose sha256 does not match is fetched once more; the staged bytes are the right ones."""
    repo = hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 4096), sha=SHA))
    hub.corrupt(SHARDS[1], times=1)
    events: Events = []
    manifest = stage(store, request(hub, root), events)
    assert (Path(manifest.path) / SHARDS[1]).read_bytes() == repo.files[SHARDS[1]].data
    assert len(hub.gets(SHARDS[1])) == 2
    mismatch = [f for e, f in events if e == "stage_sha256_mismatch"]
    assert [m["file"] for m in mismatch] == [SHARDS[1]]


def test_bytes_corrupted_on_every_fetch_fail_naming_file_expected_and_actual(
    hub: HubStub, store: HfWeightStore, root: Path
) -> None:
    """A shard served corrupted every time fails after one re-fetch, naming the file and both hashes."""
    repo = hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 4096), sha=SHA))
    hub.corrupt(SHARDS[0], times=None)
    expected = repo.files[SHARDS[0]].sha256
    with pytest.raises(
        WeightsError,
        match=rf"{SHARDS[0]} failed its sha256 check twice \(expected "
        rf"{expected}, actual [0-9a-f]{{64}}\)",
    ):
        stage(store, request(hub, root))
    assert len(hub.gets(SHARDS[0])) == 2
    assert store.verify(str(root), "tiny", SHA) is None


def test_torn_part_file_is_detected_on_resume(hub: HubStub, store: HfWeightStore, root: Path) -> None:
    """A .part of plausible length but wrong bytes (a torn write) is resumed, fails the hash, and is
    fetched again whole; the staged shard is the hub's."""
    repo = hub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 4096), sha=SHA))
    data = repo.files[SHARDS[0]].data or b""
    staging = root / "tiny" / f".staging-{SHA}"
    staging.mkdir(parents=True)
    torn = data[:1000] + b"\0" * 3000 + data[4000:8000]  # a hole where a write never landed
    (staging / (SHARDS[0] + ".part")).write_bytes(torn)
    manifest = stage(store, request(hub, root))
    assert [g.range for g in hub.gets(SHARDS[0])] == ["bytes=8000-", None]
    assert (Path(manifest.path) / SHARDS[0]).read_bytes() == data


def test_unreachable_hub_is_one_clear_error(store: HfWeightStore, root: Path) -> None:
    """A hub endpoint nobody listens on fails with the endpoint and the network error, no traceback."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    req = StageRequest(name="tiny", repo="org/tiny", revision=SHA, root=str(root), endpoint=url)
    try:
        with pytest.raises(WeightsError, match=rf"the hub at {url} cannot be reached: ConnectError"):
            stage(store, req)
    finally:
        closed.close()


def test_pyproject_declares_the_hub_major_version_the_code_uses() -> None:
    """The huggingface_hub requirement's floor is the installed major version (the code uses 2.x APIs)."""
    import huggingface_hub

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    floor = re.search(r'"huggingface_hub>=(\d+)\.(\d+)(?:,<(\d+))?"', text)
    assert floor is not None
    major = int(huggingface_hub.__version__.split(".")[0])
    assert int(floor.group(1)) == major and floor.group(3) == str(major + 1)
