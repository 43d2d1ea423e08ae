"""Compiled kernels that outlive the cluster: a compiled job's kernels (its node's kernel cache as an
archive, left by rank 0 in the job's HOME_KERNELS_DIR with their key and its node's note) come home
with its results into FTC_HOME/kernels, and a later job's note on the same kernels joins theirs; before
a job, the nodes that lack them get them, into SHIPPED_KERNELS_DIR of their own directory, where the
training program takes the one whose key is its own (runner/node/compile_policy.py), counts it warm
and weighs the note.
"""

import json
import shlex
import shutil
from pathlib import Path

from provision import state as st
from provision.ssh import NodeConnections, interruptible, put_text, run
from provision.ui import console

from .node.protocol import HOME_KERNELS_DIR, KERNELS_ARCHIVE, SHIPPED_KERNELS_DIR, merged_note

# Kernels kept at home at most: the newest, by when they came home (a model of DistilBERT's size keeps
# some tens of MB a key); older ones are removed as new ones arrive.
KEPT_KEYS = 8


def home_kernels() -> Path:
    return st.ftc_home() / "kernels"


def kept(folder: Path) -> list[str]:
    """The keys held whole in `folder` (artifacts and key file), newest first."""
    whole = [meta for meta in folder.glob("*.json") if meta.with_suffix(KERNELS_ARCHIVE).is_file()] if folder.is_dir() else []
    return [meta.stem for meta in sorted(whole, key=lambda meta: meta.stat().st_mtime, reverse=True)]


def bring_home(results: Path) -> None:
    """The job's kernels and notes from its results into FTC_HOME/kernels (moved: the results keep none).
    Kernels come with their key file, the artifacts first and the key file last, so a key file there
    always has its artifacts. A note is added to the note kept at home for the same kernels (what a job
    warm from home or an eager one measured of them), and dropped where none are kept. Then only the
    KEPT_KEYS newest stay."""
    came = results / HOME_KERNELS_DIR
    if not came.is_dir():
        return
    home = home_kernels()
    home.mkdir(parents=True, exist_ok=True)
    for meta in sorted(came.glob("*.json")):
        key, kept_meta = meta.stem, home / meta.name
        with_kernels = meta.with_suffix(KERNELS_ARCHIVE).is_file()
        if not (with_kernels or kept_meta.with_suffix(KERNELS_ARCHIVE).is_file()):
            continue
        record = read_key_file(meta)
        if record is None:
            continue
        if (earlier := read_key_file(kept_meta)) is not None and earlier.get("key") == record.get("key"):
            record["note"] = merged_note(earlier.get("note") or {}, record.get("note") or {})
        if with_kernels:
            meta.with_suffix(KERNELS_ARCHIVE).replace(home / f"{key}{KERNELS_ARCHIVE}")
        partial = kept_meta.with_name(f"{meta.name}.partial")
        partial.write_text(json.dumps(record, indent=1))
        partial.replace(kept_meta)
    shutil.rmtree(came)
    for key in kept(home)[KEPT_KEYS:]:
        for suffix in (".json", KERNELS_ARCHIVE):
            (home / f"{key}{suffix}").unlink(missing_ok=True)


def read_key_file(path: Path) -> dict | None:
    """A kernels' key file ({"key", "note", "cluster"}), or None where there is none or it is not one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("key"), dict) else None


def ship(state: st.ClusterState, connections: NodeConnections) -> None:
    """Every kernel kept at home to each node that lacks it: a new cluster's first job starts warm where
    an earlier cluster compiled the same kernels. Artifacts first, key file last (the node reads a key
    file's artifacts only), each written beside and moved into place."""
    keys = kept(home_kernels())
    for node in state.nodes if keys else []:
        folder = f"{node.workdir}/{SHIPPED_KERNELS_DIR}"
        conn = connections.to(state, node)
        held = run(conn, node, "ship kernels", f"mkdir -p {shlex.quote(folder)} && ls {shlex.quote(folder)}").split()
        missing = [key for key in keys if f"{key}.json" not in held]
        if missing:
            console.print(f"kernels: copying {len(missing)} kept in {home_kernels()} (compiled on earlier "
                          f"clusters) to {node.name}", markup=False, soft_wrap=True)
        for key in missing:
            archive, meta = home_kernels() / f"{key}{KERNELS_ARCHIVE}", home_kernels() / f"{key}.json"
            partial = f"{folder}/{key}{KERNELS_ARCHIVE}.partial"
            interruptible(conn.client.get_transport(), conn.put, str(archive), partial)
            run(conn, node, "ship kernels", f"mv {shlex.quote(partial)} {shlex.quote(f'{folder}/{key}{KERNELS_ARCHIVE}')}")
            put_text(conn, meta.read_text(), f"{folder}/{key}.json")
