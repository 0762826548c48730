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
