"""The pure weight rules: completeness against the index, space needed, cleanup choice, requests."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.safetensors_format import header_length_problem, safetensors_problems
from orchestrator.core.weights import (
    Manifest,
    PeerSpec,
    StagedRevision,
    StageRequest,
    check_file_name,
    check_space,
    plan_cleanup,
    protected_pairs,
    reclaim_for,
    revisions_named_in,
    space_needed,
    verify_listing,
)
from orchestrator.errors import WeightsError

INDEX = {"weight_map": {"a.w": "model-1-of-2.safetensors", "b.w": "model-2-of-2.safetensors"}}
LISTED = {
    "config.json": 10,
    "model.safetensors.index.json": 20,
    "model-1-of-2.safetensors": 100,
    "model-2-of-2.safetensors": 200,
}
SHA = "f" * 40


def test_complete_listing_verifies() -> None:
    """Every file present at its listed size passes."""
    verify_listing(LISTED, dict(LISTED), INDEX, where="m")


def test_missing_shard_names_file_and_sizes() -> None:
    """A shard absent on disk is named with its expected size and 'found none'."""
    present = {k: v for k, v in LISTED.items() if k != "model-2-of-2.safetensors"}
    with pytest.raises(WeightsError, match=r"model-2-of-2.safetensors is missing \(expected 200 bytes, found none\)"):
        verify_listing(LISTED, present, INDEX, where="m")


def test_wrong_size_names_file_expected_and_found() -> None:
    """A shard of another size is named with both sizes."""
    with pytest.raises(
        WeightsError, match=r"model-1-of-2.safetensors has the wrong size \(expected 100 bytes, found 99\)"
    ):
        verify_listing(LISTED, LISTED | {"model-1-of-2.safetensors": 99}, INDEX, where="m")


def test_index_shard_not_in_listing_is_reported() -> None:
    """A shard named by the index that the source does not list fails, even if nothing else is wrong."""
    listed = {k: v for k, v in LISTED.items() if k != "model-2-of-2.safetensors"}
    with pytest.raises(WeightsError, match="shard model-2-of-2.safetensors named in model.safetensors.index.json"):
        verify_listing(listed, listed, INDEX, where="m")


def test_config_is_required() -> None:
    """A listing without config.json is not a model."""
    listed = {k: v for k, v in LISTED.items() if k != "config.json"}
    with pytest.raises(WeightsError, match="config.json is not in the file list"):
        verify_listing(listed, listed, INDEX, where="m")


def test_single_file_model_needs_a_safetensors_file() -> None:
    """Without an index, at least one *.safetensors file must be listed."""
    verify_listing(
        {"config.json": 1, "model.safetensors": 5}, {"config.json": 1, "model.safetensors": 5}, None, where="m"
    )
    with pytest.raises(WeightsError, match="no model.safetensors.index.json and no"):
        verify_listing({"config.json": 1}, {"config.json": 1}, None, where="m")


def test_index_without_weight_map_is_rejected() -> None:
    """An index with no weight_map cannot say which shards are needed."""
    with pytest.raises(WeightsError, match="has no weight_map"):
        verify_listing(LISTED, LISTED, {"metadata": {}}, where="m")


def test_space_needed_counts_partial_and_complete_files() -> None:
    """Complete files need nothing, partial ones the rest, oversize ones all of it."""
    expected = {"a": 100, "b": 200, "c": 300, "d": 50}
    assert space_needed(expected, {"a": 100, "b": 150, "d": 70}) == 0 + 50 + 300 + 50


def test_check_space_error_names_needed_and_free() -> None:
    """Not enough room fails with both numbers and says nothing was written."""
    with pytest.raises(WeightsError, match=r"m: needs 2\.0 GiB more .* only 1\.0 GiB free .*nothing was written"):
        check_space(2 << 30, 1 << 30, where="m")
    check_space(1 << 30, 1 << 30, where="m")


def test_check_space_honours_the_reserve() -> None:
    """A reserve that would be eaten into counts as not enough space."""
    with pytest.raises(WeightsError, match="plus a reserve of 1.0 GiB"):
        check_space(1 << 30, (3 << 29), where="m", reserve=1 << 30)


def test_cleanup_keeps_newest_per_model_and_protected() -> None:
    """keep=1 keeps each model's newest revision and every protected one."""
    staged = [
        StagedRevision("a", "1", 1.0),
        StagedRevision("a", "2", 2.0),
        StagedRevision("a", "3", 3.0),
        StagedRevision("b", "9", 1.0),
    ]
    doomed = plan_cleanup(staged, keep=1, protected={("a", "1")})
    assert [(s.name, s.revision) for s in doomed] == [("a", "2")]


def test_cleanup_with_keep_zero_still_spares_protected() -> None:
    """Even keep=0 never removes the active or rollback model."""
    staged = [StagedRevision("a", "1", 1.0), StagedRevision("a", "2", 2.0)]
    assert [s.revision for s in plan_cleanup(staged, keep=0, protected={("a", "2")})] == ["1"]


def test_request_round_trips_through_json_dict() -> None:
    """A StageRequest survives to_dict/from_dict (the worker's argv)."""
    req = StageRequest(
        name="m",
        repo="o/m",
        revision="main",
        root="/models",
        allow_patterns=("*.json",),
        token_file="/etc/orchestrator/hf-token",
        endpoint="http://127.0.0.1:1",
    )
    assert StageRequest.from_dict(req.to_dict()) == req


def test_empty_revision_means_the_default_branch() -> None:
    """A request without a revision asks for "main" (the worker resolves and records its SHA)."""
    assert StageRequest(name="m", repo="o/m", revision="", root="/models").revision == "main"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"name": "../etc"}, "not a plain directory name"),
        ({"root": "models"}, "not an absolute path"),
        ({"source": "ftp:x"}, "is not hub, local:/dir or host:NAME"),
        ({"source": "local:/x", "revision": "main"}, "needs a commit SHA revision"),
        ({"source": "host:gpu2", "revision": SHA}, "needs peer connection details"),
    ],
)
def test_bad_requests_are_rejected_with_the_value(kw: dict[str, str], message: str) -> None:
    """Requests that cannot work fail at construction, naming the bad value."""
    args = {"name": "m", "repo": "o/m", "revision": "main", "root": "/models"} | kw
    with pytest.raises(WeightsError, match=message):
        StageRequest(**args)  # type: ignore[arg-type]


def test_manifest_round_trips_and_rejects_garbage() -> None:
    """A manifest reads back equal; a malformed one raises WeightsError."""
    m = Manifest(
        name="m",
        repo="o/m",
        revision=SHA,
        files={"config.json": 3},
        source="hub",
        staged_at=1.5,
        path="/models/m/" + SHA,
        index_sha256=None,
        requested_revision="main",
    )
    assert Manifest.from_dict(m.to_dict()) == m
    with pytest.raises(WeightsError, match="manifest is malformed"):
        Manifest.from_dict({"name": "m"})


@pytest.mark.parametrize(
    "name", ["/etc/cron.d/x", "../x", "a/../../x", "a/./b", "a//b", "./x", "x/", "..", "a\\..\\b", "a\nb", ""]
)
def test_file_names_outside_the_model_directory_are_refused(name: str) -> None:
    """Absolute, dot-dot, dot, empty-part, backslash and control-character names are refused, naming
    the file and the repo."""
    with pytest.raises(WeightsError, match=r"file name .* listed for org/m is not a plain relative path"):
        check_file_name(name, repo="org/m", where="model m")


@pytest.mark.parametrize("name", ["config.json", "original/consolidated.00.pth", "a..b", ".gitattributes"])
def test_plain_relative_file_names_are_accepted(name: str) -> None:
    """Nested and dotted names that stay inside the directory pass."""
    check_file_name(name, repo="org/m", where="model m")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"user": "-oProxyCommand=touch /tmp/pwned"}, "ssh user '-oProxyCommand=touch /tmp/pwned' is not"),
        ({"address": "-oProxyCommand=touch /tmp/pwned"}, "peer address '-oProxyCommand=touch /tmp/pwned' is not"),
        ({"address": "gpu2 -v"}, "peer address 'gpu2 -v' is not"),
        ({"root": "models"}, "weight root 'models' is not a plain absolute path"),
        ({"root": "/models/../etc"}, "weight root '/models/../etc' is not"),
    ],
)
def test_peer_values_that_ssh_would_read_as_options_are_refused(kw: dict[str, str], message: str) -> None:
    """A peer user/address that starts with "-" or holds spaces, or a relative root, never reaches ssh."""
    with pytest.raises(WeightsError, match=message):
        PeerSpec(**({"address": "10.0.0.2", "root": "/models"} | kw))  # type: ignore[arg-type]


def test_check_space_counts_what_cleanup_may_free() -> None:
    """Room that removing old revisions would free counts, and the error says how much it is."""
    check_space(3 << 30, 1 << 30, where="m", reclaimable=2 << 30)
    with pytest.raises(
        WeightsError,
        match=r"only 1\.0 GiB free .* and 1\.0 GiB .* that removing old "
        "revisions would free",
    ):
        check_space(3 << 30, 1 << 30, where="m", reclaimable=1 << 30)


def test_protected_pairs_are_the_staged_directories_under_the_root() -> None:
    """Serving and previous model dirs under the root become (name, revision); others protect nothing."""
    dirs = ["/models/org--a/" + SHA, "/models/org--b/" + SHA + "/", "/srv/local/model", "/models/x"]
    assert protected_pairs(dirs, "/models/") == {("org--a", SHA), ("org--b", SHA)}


def test_reclaim_takes_only_what_cleanup_would_remove_and_no_more_than_needed() -> None:
    """Before staging c, keep=2 may drop a's oldest unprotected revisions, oldest first, until it fits."""
    staged = [
        StagedRevision("a", "1", 1.0, 100),
        StagedRevision("a", "2", 2.0, 100),
        StagedRevision("a", "3", 3.0, 100),
        StagedRevision("b", "1", 1.0, 500),
    ]
    incoming = StagedRevision("a", "4", float("inf"))
    got = reclaim_for(staged, keep=2, protected={("a", "1")}, incoming=incoming, needed=50)
    assert [(s.name, s.revision) for s in got] == [("a", "2")]
    assert reclaim_for(staged, keep=2, protected=set(), incoming=incoming, needed=0) == []


_revs = st.lists(
    st.builds(
        StagedRevision,
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from("0123456"),
        st.floats(0, 100),
        st.integers(0, 1000),
    ),
    unique_by=lambda s: (s.name, s.revision),
    max_size=15,
)


@given(
    staged=_revs,
    keep=st.integers(0, 4),
    protected=st.sets(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from("0123456"))),
    needed=st.integers(0, 5000),
)
def test_cleanup_and_reclaim_never_remove_a_protected_revision(
    staged: list[StagedRevision], keep: int, protected: set[tuple[str, str]], needed: int
) -> None:
    """For any staged set, keep and protected set: neither cleanup nor the pre-staging reclaim picks a
    protected revision or the revision being staged, and each model keeps at least its ``keep`` newest
    (the one being staged takes one of model a's places)."""
    incoming = StagedRevision("a", "new", float("inf"))
    cleanup = plan_cleanup(staged, keep=keep, protected=protected)
    reclaim = reclaim_for(staged, keep=keep, protected=protected, incoming=incoming, needed=needed)
    for doomed, slots in ((cleanup, {"a": keep}), (reclaim, {"a": max(keep - 1, 0)})):
        picked = {(s.name, s.revision) for s in doomed}
        assert not picked & protected
        assert ("a", "new") not in picked
        for name in "abc":
            total = sum(s.name == name for s in staged)
            left = total - sum(n == name for n, _ in picked)
            assert left >= min(slots.get(name, keep), total)


def test_revisions_named_in_a_unit_are_found_under_the_root_only() -> None:
    """The --model directory of a unit under the root yields (name, revision); other paths do not."""
    text = (
        f"ExecStart=/opt/vllm/bin/vllm serve --model /models/org--a/{SHA} --port 8000\n"
        "ExecStartPre=/bin/true /srv/models/org--b/x\n"
    )
    assert revisions_named_in(text, "/models/") == {("org--a", SHA)}


def _header(tensors: dict[str, object]) -> bytes:
    return json.dumps(tensors).encode()


def test_safetensors_header_whose_tensors_tile_the_data_is_whole() -> None:
    """Two F32 tensors back to back covering every data byte: no problem."""
    header = _header(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
        }
    )
    assert safetensors_problems("m.safetensors", 8 + len(header) + 16, header, ["a", "b"]) == []


@pytest.mark.parametrize(
    "tensors,why",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            "tensor b starts at byte 4 of the data, not at 8",
        ),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, "tensor a (F32 [3]) needs 12 bytes"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, "tensor a has no valid data_offsets"),
        ([1, 2], "header is a JSON list, not an object"),
    ],
)
def test_safetensors_header_problems_name_the_tensor(tensors: object, why: str) -> None:
    """Overlapping tensors, a shape the span does not hold, reversed offsets, a non-object header."""
    header = json.dumps(tensors).encode()
    problems = safetensors_problems("m.safetensors", 8 + len(header) + 12, header)
    assert any(why in p and p.startswith("m.safetensors: ") for p in problems), problems


def test_safetensors_header_length_must_fit_the_file() -> None:
    """The 8-byte length may not run past the file, nor past the format's limit."""
    assert "larger than the file" in str(header_length_problem("m.safetensors", 100, 93))
    assert header_length_problem("m.safetensors", 100, 92) is None
    assert "too short" in str(header_length_problem("m.safetensors", 5, 0))
