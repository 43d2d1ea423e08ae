"""Compiled kernels that outlive the cluster: a compiled job's kernels (its node's kernel cache as an
archive, left by rank 0 in the job's HOME_KERNELS_DIR with their key and its node's note) come home
with its results into FTC_HOME/kernels, and a later job's note on the same kernels joins theirs; before
a job, the nodes that lack them get them, into SHIPPED_KERNELS_DIR of their own directory, where the
training program takes the one whose key is its own (runner/node/compile_policy.py), counts it warm
and weighs the note.
"""

import json
import os
import shlex
import shutil
from pathlib import Path

from provision import state as st
from provision.ssh import NodeConnections, interruptible, put_text, run
from provision.ui import console

from .node.protocol import HOME_KERNELS_DIR, KERNELS_ARCHIVE, SHIPPED_KERNELS_DIR, merged_note, write_whole

# Kernels kept at home at most: the newest, by when they came home (a model of DistilBERT's size keeps
# some tens of MB a key, 27 MB of it inductor's precompiled header); older ones are removed as new ones arrive.
KEPT_KEYS = 8
# Jobs whose notes a kept key's note names (`merged_from`), the newest: a job fetched again is not added twice.
KEPT_NOTES = 50


def home_kernels() -> Path:
    return st.ftc_home() / "kernels"


def kept(folder: Path) -> list[str]:
    """The keys held whole in `folder` (artifacts and key file), newest first."""
    whole = [meta for meta in folder.glob("*.json") if meta.with_suffix(KERNELS_ARCHIVE).is_file()] if folder.is_dir() else []
    return [meta.stem for meta in sorted(whole, key=lambda meta: meta.stat().st_mtime, reverse=True)]


def bring_home(results: Path) -> None:
    """The job's kernels and notes from its results into FTC_HOME/kernels (moved: the results keep none),
    each entry on its own: one that cannot be read or written is a line, and the others still come.
    Then only the KEPT_KEYS newest kernels stay."""
    came = results / HOME_KERNELS_DIR
    if not came.is_dir():
        return
    home = home_kernels()
    home.mkdir(parents=True, exist_ok=True)
    for key_file in sorted(came.glob("*.json")):
        try:
            keep_entry(key_file, home, str(results.resolve()))
        except (OSError, ValueError, TypeError, AttributeError, RecursionError) as exc:
            console.print(f"kernels: {key_file.name} of this job not kept at home ({type(exc).__name__}: {exc}); "
                          "the next cluster's job decides without it", markup=False, soft_wrap=True)
    shutil.rmtree(came, ignore_errors=True)
    for key in kept(home)[KEPT_KEYS:]:
        for suffix in (".json", KERNELS_ARCHIVE):
            (home / f"{key}{suffix}").unlink(missing_ok=True)


def keep_entry(key_file: Path, home: Path, results: str) -> None:
    """One key file of a job, with its kernels where it has them (the artifacts moved first and the key
    file last, so a key file at home always has its artifacts); its note joins the one kept at home for
    the same key (what a later job, warm from home or eager, measured of those kernels: `merged_from`
    names the jobs in it, so a job fetched again adds nothing twice). A note alone is dropped where home
    keeps no kernels of its key, and leaves their place in the newest-first order as it was."""
    record, kept_file = read_key_file(key_file), home / key_file.name
    archive = key_file.with_suffix(KERNELS_ARCHIVE)
    brings_kernels = archive.is_file()
    earlier = read_key_file(kept_file)
    same_kernels = earlier is not None and earlier["key"] == (record or {}).get("key")
    if record is None or not (brings_kernels or (same_kernels and kept_file.with_suffix(KERNELS_ARCHIVE).is_file())):
        return
    job = record.get("job") if isinstance(record.get("job"), str) else results  # the cluster and its job directory
    merged_from = earlier.get("merged_from", []) if same_kernels and isinstance(earlier.get("merged_from"), list) else []
    if job in merged_from:
        return
    if same_kernels:
        record["note"] = merged_note(earlier.get("note"), record.get("note"))
    record["merged_from"] = [*merged_from, job][-KEPT_NOTES:]
    if brings_kernels:
        kept_archive = home / f"{key_file.stem}{KERNELS_ARCHIVE}"
        archive.replace(kept_archive)
        try:
            write_whole(kept_file, record)
        except OSError:
            if not same_kernels:  # kernels without a key file: never shipped, never evicted
                kept_archive.unlink(missing_ok=True)
            raise
        return
    came_at = kept_file.stat()  # a note alone: the kernels keep their place in the newest-first order
    write_whole(kept_file, record)
    os.utime(kept_file, ns=(came_at.st_atime_ns, came_at.st_mtime_ns))


def read_key_file(path: Path) -> dict | None:
    """A kernels' key file ({"key", "note", "cluster", "job", "merged_from"}), or None where there is none or it
    is not one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
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
