"""Files and folders outside the workdir that your script reads (`ftc launch --data PATH`): each travels
in the nodes' copy of the workdir under its own name, on every provider, so a script run from that copy
reads `NAME/...` wherever it runs (your servers and EC2 see none of this machine's files)."""

import os
from pathlib import Path, PurePosixPath

from provision.errors import UsageError
from provision.values import label, local_path, refuse_control_character, refuse_not_utf8


def checked(raw: list[str], workdir: Path, output: str, private: dict[Path, str]) -> list[Path]:
    """Each --data value (repeatable, or a comma list) as an absolute path, checked before anything
    starts: a file or folder that exists, neither inside the workdir (its copy holds it already) nor
    holding it, nor a folder never copied (`private`: name -> why); its name free in the copy (no entry
    of the workdir, no other --data, not the output folder). One UsageError naming the value."""
    paths: list[Path] = []
    try:
        names = {entry.name: entry for entry in workdir.iterdir()} if raw else {}
    except OSError as exc:
        raise UsageError(f"{label('workdir')}={str(workdir)!r} cannot be read ({exc.strerror}); make it readable") from None
    for given in raw:
        for item in given.split(","):
            refuse_not_utf8("data", item)
            refuse_control_character("data", item)
            if not item or item != item.strip():
                raise UsageError(f"{label('data')}={given!r} has an empty entry or one with a space around it; "
                                 "give files or folders separated by commas")
            path = Path(local_path("data", item))
            _refuse_unfit(item, path, workdir.resolve(), private)
            taken = (f"{label('output')}={output!r}" if path.name == output.split("/")[0] else
                     str(names[path.name]) if path.name in names else "")
            if taken:
                raise UsageError(f"{label('data')}={item!r} would be copied as {path.name!r}, the name of {taken} in "
                                 "the workdir's copy; rename one of them (a link of another name works)")
            names[path.name] = path
            paths.append(path)
    return paths


def _exists(path: Path) -> bool:
    """Path.exists(), False for a name no file can have (over the length limit, say)."""
    try:
        return path.exists()
    except OSError:
        return False


def _refuse_unfit(item: str, path: Path, workdir: Path, private: dict[Path, str]) -> None:
    if not _exists(path):
        raise UsageError(f"{label('data')}={item!r} is not a file or folder ({path}); give one your script reads")
    if not (path.is_file() or path.is_dir()):  # a FIFO or a device: read without end, or never
        raise UsageError(f"{label('data')}={item!r} is not a regular file or folder; give one your script reads")
    real = path.resolve()
    if real == workdir or workdir.is_relative_to(real):
        raise UsageError(f"{label('data')}={item!r} holds the workdir ({workdir}); give the data's own folder")
    if real.is_relative_to(workdir):
        raise UsageError(f"{label('data')}={item!r} lies inside the workdir, whose copy holds it already; drop it "
                         f"from {label('data')} and give your script its path inside the workdir")
    why = next((why for folder, why in private.items() if real == folder or real.is_relative_to(folder)), None)
    if why:
        raise UsageError(f"{label('data')}={item!r} is never copied to the nodes ({why}); give your data's folder")


def unseen_paths(args: list[str], copy: dict[str, Path], workdir: Path, here: Path, shared: bool) -> list[str]:
    """A warning for each of the script's arguments (or an `--option=value`'s value) that names a file
    or folder on this machine the ranks will not find at that path: relative to your current folder
    but not in the workdir's copy (each rank runs from that copy), or, on nodes that are not this
    machine, an absolute path outside the workdir. Warnings, never refusals: a path may name what the
    script makes, or a file system every node mounts. Pure but for looking the paths up here."""
    copied = {PurePosixPath(name) for name in copy} | {parent for name in copy for parent in PurePosixPath(name).parents}
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("-") else arg
        if not value or value.startswith("-"):
            continue
        path = Path(value)
        if not path.is_absolute():
            if _exists(here / path) and PurePosixPath(os.path.normpath(value)) not in copied:
                found.append(f"argument {value!r} names {here / path} from your current folder, but each rank runs "
                             f"from its copy of the workdir ({workdir}), where it names nothing; give it relative to "
                             f"the workdir, or send it with {label('data')}")
        elif not shared and _exists(path) and not path.resolve().is_relative_to(workdir.resolve()):
            sent = next((name for name, local in copy.items() if local.resolve() == path.resolve()), None)
            fix = (f"it is sent as {sent!r}: name it so" if sent else
                   f"send it with {label('data')}={value} and name it {path.name!r}")
            found.append(f"argument {value!r} is a path on this machine, which the nodes do not see (unless they "
                         f"mount it too); {fix}")
    return found
