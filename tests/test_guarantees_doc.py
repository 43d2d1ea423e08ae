"""docs/guarantees.md says which test proves each guarantee: every test it names exists, in the file it
names (a `::name` after a file is in that file; one opening a row, in some test file)."""

import re

from conftest import REPO

TESTS = REPO / "tests"


def named_tests(line: str) -> list[tuple[str | None, str]]:
    """The (file, test) pairs a row names, a `::name` taking the file named before it in the row."""
    pairs, current = [], None
    for file, name in re.findall(r"`(tests/[\w/]+\.py)?(?:::(test_\w+))?", line):
        current = file or current
        if name:
            pairs.append((current, name))
    return pairs


def test_every_test_the_guarantees_name_exists_where_they_say():
    sources = {path.relative_to(REPO).as_posix(): path.read_text() for path in TESTS.glob("*.py")}
    missing = [(row, file, name)
               for row, line in enumerate((REPO / "docs" / "guarantees.md").read_text().splitlines(), 1)
               for file, name in named_tests(line)
               if not any(f"def {name}(" in text for path, text in sources.items() if file in (None, path))]
    assert missing == []
    assert ("tests/test_a.py", "test_x") in named_tests("`tests/test_a.py::test_x`, `::test_y`")
    assert named_tests("`::test_y` and `tests/b.py::test_z`") == [(None, "test_y"), ("tests/b.py", "test_z")]
