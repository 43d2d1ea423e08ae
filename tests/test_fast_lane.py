"""The fast lane stays fast: conftest.py fails a test not marked slow that starts a local node or asks
for a fixture that starts processes, and lets one that ends in a refusal run. Checked on a pytest run of
its own, with this conftest.py and three such tests."""

import shutil
import subprocess
import sys

from conftest import REPO

TESTS = '''
from conftest import ftc


def test_up(ftc_home):
    ftc("up", "--name", "x", "--nodes", "1")


def test_moto(aws):
    pass


def test_refusal(ftc_home):
    assert ftc("up", "--name", "Bad!").returncode == 2
'''


def test_a_test_not_marked_slow_that_starts_a_node_or_a_process_fixture_fails_naming_the_mark(tmp_path):
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path)
    (tmp_path / "test_unmarked.py").write_text(TESTS)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:xdist", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'base'}", str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "test_unmarked.py::test_up starts local nodes (sshd): mark it @pytest.mark.slow" in proc.stdout
    assert "test_unmarked.py::test_moto starts real processes (aws, moto_server): mark it @pytest.mark.slow" \
        in proc.stdout
    errors = [line.split(" - ")[0] for line in proc.stdout.splitlines() if line.startswith(("ERROR", "FAILED"))]
    assert errors == ["ERROR test_unmarked.py::test_up", "ERROR test_unmarked.py::test_moto"]  # test_refusal passed
