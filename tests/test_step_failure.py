"""A bootstrap step that fails on a node is reported as the node's own words, as text."""

from pathlib import Path

import pytest
from conftest import ftc

from provision import state as st

pytestmark = pytest.mark.slow


def test_a_failed_bootstrap_step_shows_the_nodes_message_as_text(ftc_home):
    ftc("up", "--name", "fails", "--nodes", "1", "--no-bootstrap", check=True)
    try:
        workdir = Path(st.load("fails").head.workdir)
        (workdir / "install.log").mkdir()  # the install step cannot write its log: it fails, saying where
        boot = ftc("bootstrap", "--name", "fails", env={"FTC_LOCAL_REUSE_STACK": "1"})
        assert boot.returncode == 1 and "Traceback" not in boot.stderr, boot.stderr
        assert f"step 'install' failed: (whole log: {workdir}/install.log on the node)" in boot.stderr, boot.stderr
        assert "b'" not in boot.stderr and "\\n" not in boot.stderr
    finally:
        ftc("down", "--name", "fails", check=True)
