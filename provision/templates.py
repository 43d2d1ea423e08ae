"""Render the Jinja templates in templates/ (every generated script and config lives there)."""

import shlex
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"

_env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), undefined=StrictUndefined,
                   keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
_env.filters["quote"] = shlex.quote


def render(name: str, **values) -> str:
    """StrictUndefined: a missing value is an error, never an empty string in a script."""
    return _env.get_template(name).render(**values)
