"""Push: the blessing gate, increasing versions, and atomic publication."""

import json
import os
import re

import pytest

from components import serving
from components.push import executor
from contracts.artifacts import MODEL_COMPLETE, RETIRED_FILE
from contracts.errors import UserError
from tests.tiny import UNLINKED_TF_TEXT_OP, saved_model_graph


def make_model(tmp_path, name="model"):
    saved = tmp_path / name / "Format-Serving"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(saved_model_graph("graph"))
    (saved / "variables" / "variables.index").write_bytes(b"index")
    (tmp_path / name / MODEL_COMPLETE).write_text("")
    return str(tmp_path / name)


def make_blessing(tmp_path, blessed, name="blessing"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / ("BLESSED" if blessed else "NOT_BLESSED")).write_text("")
    (folder / "blessing.json").write_text(json.dumps({"reason": "because"}))
    return str(folder)


def make_model_with(tmp_path, name, label, ops=("NoOp",)):
    """A model whose graph is `saved_model_graph(label, ops)`."""
    model = make_model(tmp_path, name)
    graph = saved_model_graph(label, ops)
    (tmp_path / name / "Format-Serving" / "saved_model.pb").write_bytes(graph)
    return model


def test_blessed_model_is_pushed_as_next_version(tmp_path):
    dest = tmp_path / "serving" / "gpt"
    first = executor.run(
        make_model(tmp_path), make_blessing(tmp_path, True), str(dest), str(tmp_path / "p1")
    )
    second = executor.run(
        make_model_with(tmp_path, "newer", "graph 2"),
        make_blessing(tmp_path, True, "b2"),
        str(dest),
        str(tmp_path / "p2"),
    )
    assert (first.pushed, first.pushed_version) == (1, "1")
    assert (second.pushed, second.pushed_version) == (1, "2")
    assert (dest / "2" / "saved_model.pb").read_bytes() == saved_model_graph("graph 2")
    assert (dest / "2" / "variables" / "variables.index").is_file()
    assert (tmp_path / "p2" / "PUSHED").is_file()
    assert serving.serving_versions(dest) == [1, 2]
    assert executor.pushed_uri(second) == f"{dest}/2"


def test_a_retried_push_of_the_same_model_publishes_no_second_copy(tmp_path):
    model, dest = make_model(tmp_path), tmp_path / "serving"
    executor.run(model, make_blessing(tmp_path, True), str(dest), str(tmp_path / "p1"))
    again = executor.run(
        model, make_blessing(tmp_path, True, "b2"), str(dest), str(tmp_path / "p2")
    )
    assert (again.pushed, again.pushed_version) == (1, "1")
    assert serving.serving_versions(dest) == [1]


def test_unblessed_model_is_not_pushed_and_step_succeeds(tmp_path):
    dest = tmp_path / "serving"
    result = executor.run(
        make_model(tmp_path), make_blessing(tmp_path, False), str(dest), str(tmp_path / "pushed")
    )
    assert result.pushed == 0 and result.pushed_version == ""
    assert result.reason == "not blessed: because"
    assert not dest.exists()
    assert (tmp_path / "pushed" / "NOT_PUSHED").is_file()


def test_incomplete_versions_are_skipped_and_never_reused(tmp_path):
    dest = tmp_path / "serving"
    (dest / "7").mkdir(parents=True)  # half-written: no saved_model.pb
    (dest / ".8.tmp-dead").mkdir()
    assert serving.serving_versions(dest) == []
    result = executor.run(
        make_model(tmp_path), make_blessing(tmp_path, True), str(dest), str(tmp_path / "pushed")
    )
    assert result.pushed_version == "8"


def test_failed_copy_leaves_no_version_and_no_temporary(tmp_path, monkeypatch):
    dest = tmp_path / "serving"

    def broken_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "rename", broken_rename)
    with pytest.raises(OSError, match="disk full"):
        executor.run(
            make_model(tmp_path), make_blessing(tmp_path, True), str(dest), str(tmp_path / "pushed")
        )
    assert [p.name for p in dest.iterdir()] == [".claims"]  # the version was released
    assert list((dest / ".claims").iterdir()) == []
    assert not (tmp_path / "pushed").exists()


@pytest.mark.bad_input("a blessed model whose graph uses an op TF Serving does not have")
@pytest.mark.parametrize(
    "made",
    [
        pytest.param("graph", id="a-graph-naming-an-unlinked-op"),
        pytest.param("saved", id="a-saved-tf-module-running-one", marks=pytest.mark.slow),
    ],
)
def test_a_model_tf_serving_could_not_load_is_refused_before_anything_is_written(
    tmp_path, request, made
):
    """A model TF Serving could not load is refused, naming the op, before anything is written."""
    dest = tmp_path / "serving"
    executor.run(
        make_model(tmp_path), make_blessing(tmp_path, True), str(dest), str(tmp_path / "p1")
    )
    before = sorted(p.relative_to(dest) for p in dest.rglob("*"))
    if made == "graph":
        op = "TFText>RoundRobinTrim"
        model = make_model_with(tmp_path, "trimmer", "trimmer", ops=("Const", op))
    else:
        op, model = UNLINKED_TF_TEXT_OP, str(request.getfixturevalue("unlinked_op_model"))

    with pytest.raises(UserError, match=f"TF Serving 2.19.1 does not have: {re.escape(op)} "):
        executor.run(model, make_blessing(tmp_path, True, "b2"), str(dest), str(tmp_path / "p2"))
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == before  # no version, no claim
    assert not (tmp_path / "p2").exists()


def test_destination_that_is_a_file_is_a_clear_error(tmp_path):
    dest = tmp_path / "serving"
    dest.write_text("not a folder")
    with pytest.raises(UserError, match="not a folder"):
        executor.run(
            make_model(tmp_path), make_blessing(tmp_path, True), str(dest), str(tmp_path / "pushed")
        )


def test_blessing_folder_without_marker_is_rejected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a ModelBlessing"):
        executor.run(
            make_model(tmp_path),
            str(tmp_path / "empty"),
            str(tmp_path / "s"),
            str(tmp_path / "pushed"),
        )


def pushed_two(tmp_path, dest, first: str, second: str) -> tuple[str, str]:
    """Two models pushed to `dest` as versions 1 and 2, each named by its graph."""
    models = [make_model_with(tmp_path, name, f"{name} graph") for name in (first, second)]
    for i, model in enumerate(models, 1):
        blessing = make_blessing(tmp_path, True, f"b{i}")
        executor.run(model, blessing, str(dest), str(tmp_path / f"p{i}"))
    return models[0], models[1]


def test_a_rollback_retires_the_models_it_takes_out_of_service(tmp_path):
    dest = tmp_path / "serving"
    good, bad = pushed_two(tmp_path, dest, "good", "bad")
    assert serving.rollback(str(dest), 1) == 3  # v3 serves the good model again

    # A later run on unchanged data gets the bad model back (from KFP's cache): not re-published.
    again = executor.run(bad, make_blessing(tmp_path, True, "b3"), str(dest), str(tmp_path / "p3"))
    assert again.pushed == 0 and "rolled back from version 2" in again.reason
    assert (tmp_path / "p3" / "NOT_PUSHED").is_file()
    assert serving.serving_versions(dest) == [1, 2, 3]

    newer = make_model_with(tmp_path, "newer", "newer graph")
    fresh = executor.run(
        newer, make_blessing(tmp_path, True, "b4"), str(dest), str(tmp_path / "p4")
    )
    assert (fresh.pushed, fresh.pushed_version) == (1, "4")

    # Rolling back *to* the retired version is a deliberate choice: it serves it again.
    assert serving.rollback(str(dest), 2) == 5
    back = executor.run(bad, make_blessing(tmp_path, True, "b5"), str(dest), str(tmp_path / "p5"))
    assert (back.pushed, back.pushed_version) == (1, "5") and "already served" in back.reason


def test_rolling_back_to_a_model_unretires_it_under_every_number(tmp_path):
    dest = tmp_path / "serving"
    x, _ = pushed_two(tmp_path, dest, "x", "y")
    assert serving.rollback(str(dest), 1) == 3  # x again; y (2) retired
    assert serving.rollback(str(dest), 2) == 4  # y again; x's copy (3) retired
    assert serving.rollback(str(dest), 1) == 5  # x again: retired as 3 no more
    retired = json.loads((dest / RETIRED_FILE).read_text())
    assert sorted(retired) == ["2", "4"]  # y, under both its numbers
    assert serving.retired_as(f"{x}/Format-Serving", str(dest)) is None
    again = executor.run(x, make_blessing(tmp_path, True, "b3"), str(dest), str(tmp_path / "p3"))
    assert again.pushed == 1 and "already served" in again.reason


def test_a_model_served_already_is_credited_to_the_push_that_published_it(tmp_path):
    dest = tmp_path / "serving"
    model = make_model_with(tmp_path, "m", "graph")
    first = executor.run(
        model, make_blessing(tmp_path, True, "b1"), str(dest), str(tmp_path / "p1")
    )
    assert (first.pushed, first.pushed_version) == (1, "1")
    asked = []

    def recorded(uri: str) -> bool:  # lineage holds the first run's push of that version
        asked.append(uri)
        return True

    again = executor.run(
        model, make_blessing(tmp_path, True, "b2"), str(dest), str(tmp_path / "p2"), recorded
    )
    assert asked == [str(dest / "1")]
    assert (again.pushed, again.pushed_version) == (0, "")
    assert "already served as version 1, pushed by an earlier run" in again.reason
    assert (tmp_path / "p2" / "NOT_PUSHED").is_file()
    assert serving.serving_versions(dest) == [1]
