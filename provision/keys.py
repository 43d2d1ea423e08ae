"""SSH key pairs made on the controller with OpenSSH's own ssh-keygen."""

import subprocess
from pathlib import Path


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key at `path` (0600) and `path`.pub; returns the public key line."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],  # noqa: S603,S607
                   check=True, stdout=subprocess.DEVNULL)
    path.chmod(0o600)
    return path.with_suffix(".pub").read_text().strip()
