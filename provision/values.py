"""One way to parse and validate a value, for every flag, Make variable, environment variable
and config key. Each kind is a parser factory: `whole(1, 64)("nodes", raw)` returns the value or
raises UsageError with one line that names the value as the user typed it (NODES='abc') and
what is allowed. Pure (local_path reads only the working and home directories); the spec, the
job, `ftc plan`, `ftc bench` and the FTC_* tuning variables (`from_env`) all go through here.
"""

from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import UsageError

Parser = Callable[[str, Any], Any]


def label(key: str) -> str:
    """The name the user typed: the Make variable / env suffix in upper case."""
    return key.upper()


def whole(lo: int, hi: int) -> Parser:
    def parse(key: str, raw: Any) -> int:
        try:
            value = int(str(raw).strip())
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
            value = float(str(raw).strip())
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


def whole_list(lo: int, hi: int) -> Parser:
    """A comma list of whole numbers (NODES=1,2,4 for a sweep or a plan)."""
    def parse(key: str, raw: Any) -> list[int]:
        parts = [p for p in str(raw).replace(" ", "").split(",")]
        if not parts or "" in parts:
            raise UsageError(f"{label(key)}={raw!r} is not a comma list of whole numbers; allowed: each {lo}..{hi}")
        return [whole(lo, hi)(key, part) for part in parts]
    return parse


def local_path(key: str, raw: Any) -> str:
    """A path on this machine as the user typed it: `~` and `~user` expanded, made absolute (not
    resolved: a symlink stays the path the user named). '' stays ''."""
    value = str(raw).strip()
    if not value:
        return ""
    try:
        return str(Path(value).expanduser().absolute())
    except RuntimeError:  # ~user of no such user, or no home directory to expand ~ to
        head = value.split("/", 1)[0]
        raise UsageError(f"{label(key)}={raw!r}: {head!r} names no home directory on this machine; "
                         "give an absolute path, or one under ~/") from None


def from_env(env: Mapping[str, str], variable: str, parse: Parser, default: Any) -> Any:
    """A tuning variable (FTC_CONNECT_ATTEMPTS=...): parsed by `parse`, named as the user set it in
    a refusal; `default` when it is unset or empty."""
    raw = env.get(variable, "")
    return parse(variable.lower(), raw) if raw.strip() else default
