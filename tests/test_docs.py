"""The numbers docs/libero.md states, checked against the code that sets them."""

from __future__ import annotations

import re
from pathlib import Path

from cosmos3_gym.envs import libero_max_episode_steps

ROOT = Path(__file__).resolve().parent.parent
LIBERO_DOC = (ROOT / "docs" / "libero.md").read_text(encoding="utf-8")
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def test_the_step_budgets_in_the_docs_are_the_code_s() -> None:
    budgets = {tuple(libero_max_episode_steps(s, b) for s in SUITES)
               for b in ("cosmos3", "openpi")}
    four = {b[:4] for b in budgets}
    lists = re.findall(r"\b(\d{3}) / (\d{3}) / (\d{3}) / (\d{3})(?: / (\d{3}))?", LIBERO_DOC)
    assert len(lists) >= 4
    for found in lists:
        numbers = tuple(int(n) for n in found if n)
        assert numbers in (budgets if len(numbers) == 5 else four), numbers
    said = re.search(r"libero_10 episodes end after (\d+) policy steps, libero_spatial (\d+)",
                     LIBERO_DOC)
    assert said and (int(said[1]), int(said[2])) == (
        libero_max_episode_steps("libero_10"), libero_max_episode_steps("libero_spatial"))
    assert f"{libero_max_episode_steps('libero_10')} policy steps on libero_10" in LIBERO_DOC


# Claims the pages once made that stopped being true, each with what is true now: a page that
# says one again contradicts the others.
STALE_CLAIMS = {
    r"(?i)none is public|no LIBERO checkpoint is public|no public LIBERO":
        "LIBERO checkpoints are public (docs/libero.md, 'The public checkpoints')",
    r"(?i)A plain `pytest` runs":
        "a plain pytest needs the test extra, which make demo does not install (README)",
}


def test_the_pages_make_no_stale_claim() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{page.relative_to(ROOT)}: {re.search(claim, page.read_text())[0]!r} ({truth})"
             for page in pages for claim, truth in STALE_CLAIMS.items()
             if re.search(claim, page.read_text(encoding="utf-8"))]
    assert not found, found
    assert "### The public checkpoints" in LIBERO_DOC  # the section the others point at
