"""The layering check `make lint` runs (tests/layering.py), on small trees of provision/ and runner/
written here: each breach it exists for is named, and a tree without one passes."""

from pathlib import Path

import layering

# The smallest tree the checker reads: both packages and the node side, each importing what it may.
BASE = {
    "provision/__init__.py": "",
    "provision/cluster.py": "from runner.node import protocol\n",
    "runner/__init__.py": "",
    "runner/cli.py": "from provision import cluster\nfrom .node import protocol\n",
    "runner/node/__init__.py": "",
    "runner/node/protocol.py": "import json\n",
    "runner/node/train.py": "import torch\nfrom . import protocol\n",
}


def tree(root: Path, **changed: str) -> Path:
    """BASE under `root`, with each file named in `changed` (a/b.py written a__b) given that text."""
    files = {**BASE, **{name.replace("__", "/") + ".py": text for name, text in changed.items()}}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def found(root: Path) -> list[str]:
    return layering.problems(root, [], set())


def test_a_tree_whose_imports_point_one_way_passes(tmp_path):
    assert found(tree(tmp_path)) == []


def test_the_command_names_a_node_program_that_imports_the_cluster_side_and_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(layering, "KNOWN_CYCLES", [])
    monkeypatch.setattr(layering, "LONG_FILES", set())
    root = tree(tmp_path, runner__node__train="import torch\n\ndef main():\n    from provision import cluster\n")
    assert layering.main([str(root)]) == 1
    assert capsys.readouterr().err == ("layering: runner.node.train imports provision.cluster: runner.node may "
                                       "import only runner.node\n")
    assert layering.main([str(tree(tmp_path, runner__node__train="import torch\n"))]) == 0


def test_the_cluster_side_may_import_the_protocol_but_not_the_job_side(tmp_path):
    root = tree(tmp_path, runner__job="", provision__cluster="from runner.node import protocol\nfrom runner import job\n")
    assert found(root) == ["provision.cluster imports runner.job: provision may import only provision, runner.node"]


def test_a_node_program_importing_a_library_only_the_controller_has_is_named(tmp_path):
    root = tree(tmp_path, runner__node__spot="import os\nimport boto3.session\n")
    assert found(root) == ["runner.node.spot imports boto3, which nodes do not have: runner.node runs on them"]


def test_a_cycle_closed_by_a_function_level_import_is_named_and_a_known_one_only_while_it_lasts(tmp_path):
    root = tree(tmp_path, runner__job="from . import script_job\n",
                runner__script_job="def launch():\n    from . import job\n")
    assert found(root) == ["import cycle between runner.job, runner.script_job: make one of them stop importing the other"]
    assert layering.problems(root, [{"runner.job", "runner.script_job"}], set()) == []
    (root / "runner" / "script_job.py").write_text("def launch():\n    pass\n")
    assert layering.problems(root, [{"runner.job", "runner.script_job"}], set()) == [
        "KNOWN_CYCLES lists runner.job, runner.script_job, no longer a cycle: remove it from tests/layering.py"]


def test_a_function_over_80_lines_is_named_wherever_it_is_and_one_of_80_is_not(tmp_path):
    def function(name: str, lines: int) -> str:
        return f"def {name}():\n" + "    pass\n" * (lines - 1)

    root = tree(tmp_path, runner__cli=function("main", 80) + function("build", 81))
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(function("test_long", 90))
    assert found(root) == ["runner/cli.py:build (line 81) is 81 lines, over 80: split it",
                           "tests/test_x.py:test_long (line 1) is 90 lines, over 80: split it"]
    allowed = {"runner/cli.py:build", "tests/test_x.py:test_long", "runner/cli.py:main"}
    assert layering.problems(root, [], allowed) == [
        "LONG_FUNCTIONS lists runner/cli.py:main, no longer over 80 lines: remove it from tests/layering.py"]


def test_a_module_over_600_lines_is_named_and_a_known_one_only_while_it_lasts(tmp_path):
    root = tree(tmp_path, runner__job="x = 1\n" * 600, runner__bench="x = 1\n" * 601)
    assert found(root) == ["runner/bench.py is 601 lines, over 600: split it"]
    assert layering.problems(root, [], set(), frozenset({"runner/bench.py"})) == []
    assert layering.problems(root, [], set(), frozenset({"runner/bench.py", "runner/job.py"})) == [
        "LONG_FILES lists runner/job.py, no longer over 600 lines: remove it from tests/layering.py"]
