"""Write docs/cli.md, the command line's reference, from the parsers (run after changing a
setting; tests/test_cli.py checks the page is current)."""

from __future__ import annotations

import sys
from pathlib import Path

from cosmos3_gym.eval.cli import cli_reference

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def main() -> int:
    PAGE.write_text(cli_reference() + "\n", encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
