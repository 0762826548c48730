"""Write docs/cli.md, the command line's reference, from the parsers, and docs/settings.md, the
settings classes' tables (run after changing a setting; tests/test_cli.py checks both pages are
current)."""

from __future__ import annotations

import sys
from pathlib import Path

from cosmos3_gym.eval.cli import cli_reference, settings_reference
from cosmos3_gym.jsonio import write_text_atomic

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = {"cli.md": cli_reference, "settings.md": settings_reference}


def main() -> int:
    for name, page in PAGES.items():
        write_text_atomic(DOCS / name, page() + "\n")
        print(f"wrote {DOCS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
