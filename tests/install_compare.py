"""By hand: the stock stack into fresh venvs with pip and with uv, in one run, and whether both
installed the same versions (`pip freeze` of each). Writes docs/install.json.

Each install is the node's own install.sh (templates/install.sh.j2), rendered as a local node gets it
(this machine's pip settings, no PyTorch index) once with uv and once without (pip). pip runs with
this machine's pip cache as it is (warm after `make setup`: pip's best case); uv first with an empty
cache of its own (a fresh node's first bootstrap: uv's worst case), then again with that cache warm.
Each time includes making the venv and, for uv, fetching uv itself. One run on shared cores.

    .venv/bin/python tests/install_compare.py [--out docs/install.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from provision.stacks import STACKS, UV_VERSION
from provision.templates import render

STACK = "stock"


def install(venv: Path, uv_version: str, env: dict[str, str]) -> float:
    """Seconds the rendered install.sh took to install the stack into the fresh venv `venv`."""
    script = venv.parent / f"install-{venv.name}.sh"
    script.write_text(render("install.sh.j2", stack=STACK, venv=str(venv), pins=STACKS[STACK], reuse_only=False,
                             torch_index="", extra_index="", uv_version=uv_version))
    started = time.monotonic()
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    print(proc.stdout + proc.stderr, file=sys.stderr, end="")
    if proc.returncode != 0:
        raise SystemExit(f"install into {venv} failed (exit {proc.returncode}); its output is above")
    return round(seconds, 1)


def freeze(venv: Path) -> dict[str, str]:
    """`pip freeze --all` of the venv as package -> version, but pip: the venv's own installer, which
    the pip install brings up to date first and uv leaves as the venv made it."""
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
    return {name: version for name, version in pairs if name != "pip"}


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Packages whose version differs or that one side lacks, as `name: a vs b`. Pure."""
    return [f"{name}: {a.get(name, 'absent')} vs {b.get(name, 'absent')}"
            for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name)]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/install.json")
    out = Path(parser.parse_args().out)
    with tempfile.TemporaryDirectory(prefix="install-compare-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "UV_CACHE_DIR": str(root / "uv-cache")}  # empty: uv's first run is cold
        load = os.getloadavg()[0]
        pip_s = install(root / "pip", "", env)
        uv_s = install(root / "uv", UV_VERSION, env)
        uv_warm_s = install(root / "uv-warm", UV_VERSION, env)
        by_pip, by_uv, by_uv_warm = freeze(root / "pip"), freeze(root / "uv"), freeze(root / "uv-warm")
    differ = differences(by_pip, by_uv) + differences(by_pip, by_uv_warm)
    result = {
        "date": date.today().isoformat(), "machine": f"{cpu_model()}, {os.cpu_count()} cores, shared "
        f"(load average {load:.2f} at the start)", "stack": STACK, "pins": STACKS[STACK],
        "pip_s": pip_s, "uv_s": uv_s, "uv_warm_s": uv_warm_s, "speedup": round(pip_s / uv_s, 2),
        "speedup_warm": round(pip_s / uv_warm_s, 2), "same_versions": not differ, "differences": differ,
        "uv_version": UV_VERSION,
        "method": "install.sh of a local node into a fresh venv, in one run: pip with this machine's pip cache "
                  "(warm), uv with an empty cache (uv_s) then warm (uv_warm_s); uv fetched by pip within uv's time; "
                  "same_versions compares `pip freeze` of the three venvs",
        "versions": by_pip}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("pip_s", "uv_s", "uv_warm_s", "speedup", "same_versions")}))
    if differ:
        raise SystemExit(f"pip and uv installed different versions: {differ}")


if __name__ == "__main__":
    main()
