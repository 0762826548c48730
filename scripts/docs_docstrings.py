"""A griffe extension for the API reference (mkdocs.yml): the project's docstrings are written
for a terminal (``help()``, doctest), in reStructuredText's inline markup; this turns that markup
into Markdown as the site loads each docstring. Doctest examples become Python code blocks,
double-backtick literals single ones, and Sphinx roles (:class:`~a.B`) their target's name as
code. The source stays as it is."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc):`~?([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def _role(match: re.Match[str]) -> str:
    target = match[1]
    shown = target.rsplit(".", 1)[-1] if match[0].find("`~") >= 0 else target
    return f"`{shown}`"


def markdown(text: str) -> str:
    """``text`` (one docstring) with its reST inline markup and doctests as Markdown."""
    out, in_example = [], False
    for line in text.splitlines():
        stripped = line.lstrip()
        starts = stripped.startswith(">>>") or (in_example and stripped.startswith("..."))
        if starts and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not stripped:
            out.append("```")
            in_example = False
        if not in_example:
            line = LITERAL.sub(r"`\1`", ROLE.sub(_role, line))
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class RestToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
