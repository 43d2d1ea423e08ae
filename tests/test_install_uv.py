"""The stack's installer (templates/installer.sh, in every node's install.sh and in `make setup`): uv
gets pip's own settings as flags, in pip's precedence; a setting uv cannot honour, or a uv that cannot
be fetched, leaves the install to pip; and a local node gets this machine's pip settings, which its own
home lacks. The real install with uv: test_bootstrap.py's fresh-venv test."""

import subprocess
import sys
from pathlib import Path

from provision.bootstrap import pip_variables

INSTALLER = Path(__file__).resolve().parent.parent / "templates" / "installer.sh"
PIP = str(Path(sys.executable).parent / "pip")


def installer(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`script` run by bash after the installer's functions, with a home and pip variables of its own."""
    return subprocess.run(["bash", "-c", f'source "{INSTALLER}"; {script}'], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})


def test_pip_settings_reach_uv_as_flags_in_pips_precedence(tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /from/global\n[install]\nfind-links = /from/install\n"
                      "extra-index-url = file:///one\n  file:///two\n[freeze]\nexclude = nothing\n")
    proc = installer(f'uv_flags_from_pip "{PIP}" && printf "%s\\n" "${{UV_FLAGS[@]}}"', tmp_path,
                     PIP_CONFIG_FILE=str(config), PIP_CONSTRAINT="/from/env")
    assert proc.returncode == 0, proc.stderr
    flags = proc.stdout.split("\n")
    pairs = set(zip(flags, flags[1:]))
    assert {("--index-strategy", "unsafe-best-match"), ("--find-links", "/from/install"),
            ("--extra-index-url", "file:///one"), ("--extra-index-url", "file:///two"),
            ("--constraint", "/from/env")} <= pairs
    assert "/from/global" not in flags and "nothing" not in flags  # [install] over [global]; [freeze] is not an install's
    assert flags.count("--constraint") == 1  # PIP_CONSTRAINT over any configured one


def test_a_pip_setting_uv_cannot_honour_leaves_the_install_to_pip(tmp_path):
    proc = installer(f'uv_flags_from_pip "{PIP}"', tmp_path, PIP_CONFIG_FILE="/dev/null", PIP_NO_BINARY=":all:")
    assert proc.returncode == 1
    assert "pip's setting no-binary has no uv equivalent here: installing with pip" in proc.stderr


def test_pip_installs_where_uv_cannot_be_fetched(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (tmp_path / "wheels").mkdir()  # the only place pip may look: nothing to fetch uv from
    proc = installer(f'choose_installer "{venv}" 0.13.9 && echo "UV=[$UV]"', tmp_path, PIP_CONFIG_FILE="/dev/null",
                     PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "wheels"))
    assert proc.returncode == 0, proc.stderr
    assert "uv 0.13.9 could not be fetched: installing with pip instead" in proc.stderr
    assert proc.stdout.splitlines() == ["installing with pip", "UV=[]"]
    assert not (venv / "uv").exists()


def test_a_local_node_gets_the_pip_settings_an_install_on_this_machine_reads():
    listed = ("global.find-links='/opt/wheels'\nglobal.timeout='60'\ninstall.timeout='90'\n"
              "freeze.exclude='x'\n:env:.timeout='120'\n:env:.cache-dir='/home/me/.cache/pip'\n"
              "global.extra-index-url=\"file:///it's here\"\n")
    assert pip_variables(listed) == {"PIP_FIND_LINKS": "/opt/wheels", "PIP_TIMEOUT": "120",
                                     "PIP_EXTRA_INDEX_URL": "file:///it's here"}
