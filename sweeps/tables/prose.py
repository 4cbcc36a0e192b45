"""The prose around a sweep's tables: how each is computed, what a column means.

It lives in sweeps/templates/NAME.md, one `string.Template` a file (`${field}` placeholders; the file's final
newline is not part of the text): the code formats the numbers and fills the fields (`fill`), the text reads as
text. The templates are read from the checkout beside this package (sweeps/ is not in the wheel, which holds
`attention` alone).
"""

from __future__ import annotations

import functools
import string
from pathlib import Path

TEMPLATES = Path(__file__).parents[1] / "templates"


@functools.cache
def template(name: str) -> string.Template:
    """sweeps/templates/NAME.md as a template, less the newline that ends the file."""
    return string.Template((TEMPLATES / f"{name}.md").read_text(encoding="utf-8").removesuffix("\n"))


def fill(name: str, **fields: object) -> str:
    """The text of template `name` with its `fields` filled in (a field it names but is not given: KeyError)."""
    return template(name).substitute(fields)
