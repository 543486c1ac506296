"""The recorded device profile (``~/.gemmlab/device-<gpu>.json``), which ``bench gemm`` and ``probe`` read on a GPU:
a damaged, deep, swapped (a FIFO) or foreign file is one ValueError naming it (the CLI's one line), not a
traceback or a hang (issue 34, second round)."""

import os

import pytest

from gemmlab.bench import probe


@pytest.mark.parametrize(
    "content,says",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than the 64 levels"),
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON list, not a profile"),
        (None, "a FIFO, not a regular file"),
    ],
    ids=["deep", "not-json", "list", "fifo"],
)
def test_a_bad_recorded_profile_is_one_valueerror(tmp_path, monkeypatch, content, says):
    monkeypatch.setenv("GEMMLAB_HOME", str(tmp_path))
    path = probe.profile_path("Some GPU")
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    with pytest.raises(ValueError) as e:
        probe.load("Some GPU")
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_no_recorded_profile_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMLAB_HOME", str(tmp_path))
    assert probe.load("Some GPU") is None
