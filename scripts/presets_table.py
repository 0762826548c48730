"""Write the presets table of docs/presets.md from the registry (``cosmos3_gym.envs.presets``);
run after changing a preset (tests/test_presets.py checks the page is current)."""

from __future__ import annotations

import sys
from pathlib import Path

from cosmos3_gym.envs.presets import presets_markdown
from cosmos3_gym.jsonio import write_text_atomic

PAGE = Path(__file__).resolve().parent.parent / "docs" / "presets.md"
BEGIN, END = "<!-- presets table: begin -->", "<!-- presets table: end -->"


def main() -> int:
    text = PAGE.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    write_text_atomic(PAGE, f"{head}{BEGIN}\n{presets_markdown()}\n{END}{tail}")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
