"""The stack's installer (templates/installer.sh, in every node's install.sh and in `make setup`): uv
gets pip's own settings as flags, in pip's precedence; a setting uv cannot honour, or a uv that cannot
be fetched, leaves the install to pip; and a local node gets this machine's pip settings, which its own
home lacks. The real install with uv: test_bootstrap.py's fresh-venv test."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

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


@pytest.mark.slow
def test_a_node_that_sees_only_its_mirror_installs_though_an_extra_index_is_out_of_reach(tmp_path):
    """The node's own pip settings name its site's mirror (here a local PEP 503 index), and the install
    adds an extra index the node cannot reach (as PyTorch's CPU index is from behind a mirror): uv fails
    on it, so pip installs, saying why in one line, and takes the package from the mirror."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheel = _wheel(tmp_path / "wheels", "ftc_mirror_probe")
    project = tmp_path / "simple" / "ftc-mirror-probe"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    (tmp_path / "simple" / "index.html").write_text('<a href="ftc-mirror-probe/">ftc-mirror-probe</a>\n')
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = {(tmp_path / 'simple').as_uri()}\n")
    unreachable = "http://127.0.0.1:1/whl/cpu"  # nothing listens there: refused at once
    uv = REPO / ".venv" / "uv" / "bin" / "uv"
    proc = installer(f'UV="{uv}"; uv_flags_from_pip "{venv}/bin/pip" && '
                     f'venv_install "{venv}" --extra-index-url {unreachable} ftc-mirror-probe==1.0', tmp_path,
                     PIP_CONFIG_FILE=str(config), UV_CACHE_DIR=str(tmp_path / "uv-cache"), PIP_RETRIES="0")
    assert proc.returncode == 0, proc.stderr
    (said,) = [line for line in proc.stderr.splitlines() if line.startswith("uv failed")]
    assert said.endswith(": installing with pip, which goes on past an index it cannot reach"), said
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import ftc_mirror_probe"]).returncode == 0


def _wheel(folder: Path, name: str) -> Path:
    """A pure-Python wheel of module `name`, version 1.0, made by hand."""
    import base64
    import hashlib
    import zipfile
    dist = f"{name}-1.0"
    files = {f"{name}.py": "", f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ftc-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
            wheel.writestr(member, text)
    return path
