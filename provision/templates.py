"""Render the Jinja templates in templates/ (every generated script and config lives there)."""

import functools
import re
import shlex
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


@functools.cache
def _environment():
    """Made on first use: jinja2 takes a tenth of a second to import, and most ftc commands render nothing."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["quote"] = shlex.quote
    env.filters["comment"] = comment
    return env


def comment(text: str) -> str:
    """A value inside a `#` comment line: its control characters written as escapes (a newline would
    end the comment and make the rest of the value a command). Pure."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: m.group().encode("unicode_escape").decode(), str(text))


def render(name: str, **values) -> str:
    """StrictUndefined: a missing value is an error, never an empty string in a script."""
    return _environment().get_template(name).render(**values)
