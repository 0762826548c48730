"""Write docs/cli.md, the command line's reference, from the parsers, and docs/settings.md, the
settings classes' tables (run after changing a setting; tests/test_cli.py checks both pages are
current)."""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from pathlib import Path

from cosmos3_gym.eval.cli import (
    build_parser,
    default_of,
    flag_name,
    is_dataclass_type,
    parsers,
    settings_classes,
    shown,
)
from cosmos3_gym.jsonio import write_text_atomic

DOCS = Path(__file__).resolve().parent.parent / "docs"


def cli_reference() -> str:
    """The command line's reference page (``docs/cli.md``), generated from the parsers: every
    command's ``--help``, as the command prints it."""
    parser = build_parser()
    width = {"COLUMNS": "100"}
    old = {k: os.environ.get(k) for k in width}
    os.environ.update(width)  # argparse wraps help to $COLUMNS: the same page on any terminal
    try:
        pages = [("cosmos3-gym", parser.format_help())]
        pages += [(f"cosmos3-gym {name}", child.format_help())
                  for name, child in parsers(parser).items()]
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    lines = ["# Command-line reference", "",
             "Generated from the parsers (`python scripts/cli_reference.py`; a test checks it is "
             "current). Every option is a field of the command's settings class "
             "(`cosmos3_gym/settings.py`, `SamplerConfig`, and each command's config), so its "
             "default and help live in one place.", ""]
    for title, text in pages:
        lines += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def settings_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(field, flag, default, meaning)`` of every setting of ``cls``, nested ones dotted
    (``sampling.flow_shift``); a field without a flag shows ``-``."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if is_dataclass_type(hints[f.name]):
            rows += settings_rows(hints[f.name], f"{prefix}{f.name}.")
            continue
        if "help" not in f.metadata:
            continue
        flag = f"--{flag_name(f)}" if f.metadata.get("cli", True) else "-"
        rows.append((prefix + f.name, flag, shown(default_of(f)), f.metadata["help"]))
    return rows


def settings_reference() -> str:
    """The settings classes' reference page (``docs/settings.md``): each command's settings as
    a table of field, flag, default and meaning, generated from the same fields as the options.
    """
    lines = ["# Settings reference", "",
             "Generated from the settings classes (`python scripts/cli_reference.py`; a test "
             "checks it is current). Each command runs one settings dataclass; its fields are the "
             "command's options (docs/cli.md) and the keywords of the class in Python "
             "(`EvalConfig(env=\"libero\", suite=\"libero_10\", trials=50)`). A run folder's "
             "`config.json` holds them under `session`, and `--config FILE` takes them back.", ""]
    for command, cls in settings_classes().items():
        lines += [f"## `{cls.__name__}`", "",
                  f"`{cls.__module__}.{cls.__name__}`: `cosmos3-gym {command}`.", "",
                  "| field | flag | default | meaning |", "|---|---|---|---|"]
        for name, flag, default, text in settings_rows(cls):
            cell = text.replace("|", "\\|")
            lines.append(f"| `{name}` | `{flag}` | `{default}` | {cell} |")
        lines.append("")
    return "\n".join(lines)


PAGES = {"cli.md": cli_reference, "settings.md": settings_reference}


def main() -> int:
    for name, page in PAGES.items():
        write_text_atomic(DOCS / name, page() + "\n")
        print(f"wrote {DOCS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
