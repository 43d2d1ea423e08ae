"""Render the Jinja templates in templates/ (every generated script and config lives there)."""

import functools
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
    return env


def render(name: str, **values) -> str:
    """StrictUndefined: a missing value is an error, never an empty string in a script."""
    return _environment().get_template(name).render(**values)
