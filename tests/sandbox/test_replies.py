"""The keeper's first message: every isolation field it can report, all at once (each layer on, with CUDA), passes the
owner's check. With CUDA on the H200 the read-only /proc's field made 17 where the check took 16: every grade with the
network namespace on failed as 'a malformed reply', so the probe left that layer off."""

import re
from pathlib import Path

import pytest

from gemmlab.sandbox import replies

KEEPER = Path(replies.__file__).with_name("keeper.py")


def keeper_fields() -> set[str]:
    """Every name the keeper's ``main`` can give a field of its isolation, read from its source."""
    text = KEEPER.read_text()
    first = re.search(r"isolation = \{([^}]*)\}", text)
    assert first, "the keeper's isolation starts as a literal"
    return set(re.findall(r'"(\w+)":', first.group(1))) | set(re.findall(r'isolation\["(\w+)"\]\s*\+?=', text))


def test_every_field_the_keeper_can_report_at_once_passes_the_check():
    names = keeper_fields()
    assert {"session", "proc", "network", "seccomp", "landlock", "host_files"} <= names, names
    assert len(names) > 16  # the H200's case: with CUDA and every layer on
    assert len(names) + 8 <= replies.KEEPER_FIELDS_MOST, "room for the next layers"
    reply = {"isolation": {name: "x" * 2000 for name in names}}
    assert replies.checked("keeper", reply, {})["isolation"] == reply["isolation"]


@pytest.mark.parametrize(
    "isolation, why",
    [
        ({f"f{i}": "on" for i in range(replies.KEEPER_FIELDS_MOST + 1)}, "at most 32 strings"),
        ({"seccomp": {"on": "yes"}}, "at most 32 strings"),
        ({"seccomp": "x" * 2001}, "values of at most 2000"),
        ("on", "is str"),
    ],
)
def test_a_keeper_reply_out_of_bounds_is_refused_with_what_it_must_be(isolation, why):
    with pytest.raises(ValueError, match=why):
        replies.checked("keeper", {"isolation": isolation}, {})
