"""One way to parse and validate a value, for every flag, Make variable, environment variable
and config key. Each kind is a parser factory: `whole(1, 64)("nodes", raw)` returns the value or
raises UsageError with one line that names the value as the user typed it (--nodes='abc', or
NODES='abc' through make) and what is allowed. Pure, but for local_path (it reads the working and
home directories) and writable_dir (it tries a file in the directory); the spec, the job, `ftc plan`, `ftc bench` and
the FTC_* tuning variables (`from_env`) all go through here.
"""

import math
import os
import re
import tempfile
import types
from pathlib import Path
from typing import Any, Callable, Mapping, Union, get_args, get_origin

from .errors import UsageError, option

Parser = Callable[[str, Any], Any]


def label(key: str) -> str:
    """The name the user typed: `--text-columns` at the ftc command, `TEXT_COLUMNS` through make."""
    return option(key)


def ascii_digits(text: str) -> str:
    """The text, if a number in it is written as typed on a command line: ASCII digits, no `_` between
    them (Python's int() and float() read `1_6` as 16 and other scripts' digits as these). Pure."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def whole(lo: int, hi: int) -> Parser:
    def parse(key: str, raw: Any) -> int:
        try:
            value = int(ascii_digits(str(raw).strip()))
        except ValueError:
            raise UsageError(f"{label(key)}={raw!r} is not a whole number; allowed: {lo}..{hi}") from None
        if not lo <= value <= hi:
            raise UsageError(f"{label(key)}={raw!r} is out of range; allowed: {lo}..{hi}")
        return value
    return parse


def number(lo: float, hi: float, lo_included: bool = False, hi_included: bool = True) -> Parser:
    """A real number between lo and hi; the bounds are open or closed as said."""
    allowed = f"{'from' if lo_included else 'more than'} {lo:g} {'up to' if hi_included else 'below'} {hi:g}"

    def parse(key: str, raw: Any) -> float:
        try:
            value = float(ascii_digits(str(raw).strip()))
        except ValueError:
            raise UsageError(f"{label(key)}={raw!r} is not a number; allowed: {allowed}") from None
        above = value >= lo if lo_included else value > lo
        below = value <= hi if hi_included else value < hi
        if not (above and below):  # NaN fails both
            raise UsageError(f"{label(key)}={raw!r} is out of range; allowed: {allowed}")
        return value
    return parse


def boolean(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise UsageError(f"{label(key)}={raw!r} is not a boolean; allowed: 1/0, true/false, yes/no")


def one_of(choices: tuple[str, ...] | list[str]) -> Parser:
    def parse(key: str, raw: Any) -> str:
        value = str(raw).strip()
        if value not in choices:
            shown = ", ".join(choices) if len(choices) <= 20 else f"{', '.join(choices[:12])}, ... ({len(choices)} in all)"
            raise UsageError(f"{label(key)}={raw!r} is not known; allowed: {shown}")
        return value
    return parse


def whole_list(lo: int, hi: int, distinct: bool = False) -> Parser:
    """A comma list of whole numbers (NODES=1,2,4 for a sweep or a plan); `distinct`: each at most once
    (a cluster size is one row of a plan, one cluster of a sweep)."""
    def parse(key: str, raw: Any) -> list[int]:
        parts = [p for p in str(raw).replace(" ", "").split(",")]
        if not parts or "" in parts:
            raise UsageError(f"{label(key)}={raw!r} is not a comma list of whole numbers; allowed: each {lo}..{hi}")
        values = [whole(lo, hi)(key, part) for part in parts]
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None) if distinct else None
        if twice is not None:
            raise UsageError(f"{label(key)}={raw!r} names {twice} twice; give each once")
        return values
    return parse


def name_list(allowed: tuple[str, ...] | list[str], noun: str, all_word: str = "") -> Parser:
    """A comma list of `allowed` names, each once, in the order given (`--levers flows,ceiling`); a
    name not allowed is one line calling it no `noun`. `all_word` (when given) stands for every name."""
    def parse(key: str, raw: Any) -> list[str]:
        if all_word and raw == all_word:
            return list(allowed)
        names = [name.strip() for name in str(raw).split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            every = ", ".join(allowed)
            raise UsageError(f"{label(key)}={','.join(unknown)!r} is not a {noun}; allowed: "
                             + (f"{all_word}, or a comma list of {every}" if all_word else every))
        return list(dict.fromkeys(names))
    return parse


# user@host:port, [user@][v6]:port; a host never starts with '-' (ssh would read it as an option).
HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})@)?"
                     r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?$")


def parse_host(text: str) -> tuple[str, str, int]:
    """'[user@]host[:port]' -> (user, host, port); user '' means yours. Raises ValueError. Pure."""
    match = HOST_RE.match(text.strip())
    if not match or not 1 <= int(match["port"] or 22) <= 65535:
        raise ValueError(f"{text!r} is not user@host[:port]")
    return match["user"] or "", match["host"].strip("[]"), int(match["port"] or 22)


def host_label(user: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{user + '@' if user else ''}{shown}:{port}"


def local_path(key: str, raw: Any) -> str:
    """A path on this machine as the user typed it: `~` and `~user` expanded, made absolute (not
    resolved: a symlink stays the path the user named). '' stays ''."""
    value = str(raw).strip()
    if not value:
        return ""
    try:
        path = Path(value).expanduser().absolute()
    except RuntimeError:  # ~user of no such user, or no home directory to expand ~ to
        head = value.split("/", 1)[0]
        raise UsageError(f"{label(key)}={raw!r}: {head!r} names no home directory on this machine; "
                         "give an absolute path, or one under ~/") from None
    # Longer, and every look at it fails with "File name too long" (Linux's NAME_MAX and PATH_MAX).
    if len(os.fsencode(path)) >= 4096 or any(len(os.fsencode(part)) > 255 for part in path.parts):
        raise UsageError(f"{label(key)}={value[:40] + '...'!r} is longer than a path can be (255 bytes a name, "
                         "4096 in all); give the path of a file or folder that can exist")
    return str(path)


def control_character(text: str) -> str:
    """The first control character in `text` (a newline, a tab, DEL, ...), '' when none. Pure."""
    return next((c for c in text if ord(c) < 32 or ord(c) == 127), "")


def refuse_control_character(key: str, raw: str) -> None:
    """A value holding a control character is refused, naming it: a newline would end a line of a
    script, a log or the runs history, and make the rest of the value a line of its own."""
    if control_character(raw):
        raise UsageError(f"{label(key)}={raw!r} holds a control character (a newline, a tab, ...); "
                         "give a value without one")


def refuse_not_utf8(key: str, raw: str) -> None:
    """A value that is not UTF-8 (bytes Python kept as surrogates) is refused, naming it: the nodes'
    scripts, logs and the runs history are UTF-8."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{label(key)}={os.fsencode(raw)!r} is not UTF-8; give a value that is") from None


def writable_dir(key: str, raw: str) -> str:
    """A directory ftc can write results into, now or once made, as an absolute path: found before
    launch, not after the training. Tried for real (a probe file made and removed in the nearest
    existing directory), since root passes every access() test yet cannot write under /proc;
    nothing is left behind. A control character is refused: the runs history lists directories
    one per line."""
    refuse_control_character(key, raw)
    path = Path(local_path(key, raw))
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{label(key)}={raw!r} is not writable: {existing} is not a directory; "
                         "give a directory you can write")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".ftc-probe-")
    except OSError as exc:
        raise UsageError(f"{label(key)}={raw!r} is not writable: no file can be made in {existing} "
                         f"({exc.strerror}); give a directory you can write") from None
    os.close(fd)
    os.unlink(probe)
    return str(path)


def from_env(env: Mapping[str, str], variable: str, parse: Parser, default: Any) -> Any:
    """A tuning variable (FTC_CONNECT_ATTEMPTS=...): parsed by `parse`, named as the user set it in
    a refusal; `default` when it is unset or empty."""
    raw = env.get(variable, "")
    return parse(variable, raw) if raw.strip() else default  # upper case: named as it is


# ---- JSON that ftc wrote and reads back (state.json, run.json, results.json): any bytes may be on
# disk by the time it is read, so each value is checked against the type it was written as ----

KIND_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false", list: "a list",
              dict: "an object", type(None): "null"}


def conforms(value: Any, kind: Any, finite: bool = True) -> bool:
    """Whether a JSON value has the declared type (str, int, float, bool, list[X], dict[str, X],
    X | None, Any): a float takes an int, no number takes a bool (JSON's true is Python's 1), and
    numbers are finite unless `finite` is off (a JSON file may hold NaN or 1e999; a diverged run's
    loss is NaN for real). Pure."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(conforms(value, option, finite) for option in args)
    if kind in (int, float):
        number = isinstance(value, int) or (kind is float and isinstance(value, float)
                                            and (math.isfinite(value) or not finite))
        return number and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0], finite) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) and conforms(v, args[1], finite)
                                               for k, v in value.items())
    return isinstance(value, kind)


def kind_name(kind: Any) -> str:
    """A declared type in words: 'a whole number', 'a list', ... Pure."""
    if get_origin(kind) in (Union, types.UnionType):
        return " or ".join(kind_name(option) for option in get_args(kind))
    return KIND_NAMES.get(get_origin(kind) or kind, "an object")


def value_kind(value: Any) -> str:
    """What a JSON value is, in the same words. Pure."""
    return KIND_NAMES.get(type(value), type(value).__name__)
