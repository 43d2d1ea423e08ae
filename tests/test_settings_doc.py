"""docs/settings.md is what tests/settings_doc.py writes from the Makefile and ftc's parser today."""

import subprocess
import sys

from helpers import REPO


def test_the_settings_table_is_current_and_names_every_make_variable(tmp_path):
    out = tmp_path / "settings.md"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "settings_doc.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == (REPO / "docs" / "settings.md").read_text(), "run `make settings-doc`"
    for var in ("NODES", "ALLREDUCE", "SCRIPT", "PARTITION", "ENA_EXPRESS"):
        assert f"| `{var}` |" in out.read_text()
