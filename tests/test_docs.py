"""The numbers the README and docs/libero.md state, checked against the code that sets them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cosmos3_gym.envs import libero_max_episode_steps

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
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
                     README)
    assert said and (int(said[1]), int(said[2])) == (
        libero_max_episode_steps("libero_10"), libero_max_episode_steps("libero_spatial"))
    assert f"{libero_max_episode_steps('libero_10')} policy steps on libero_10" in README


def test_the_readme_states_the_suites_size(request: pytest.FixtureRequest) -> None:
    config = request.config
    whole = (config.args_source == pytest.Config.ArgsSource.TESTPATHS
             and not config.option.keyword and not config.option.markexpr
             and not config.option.deselect)
    if not whole:
        pytest.skip("counts only a plain run of the whole suite (`pytest`, no -k/-m/paths)")
    stated = int(re.search(r"about (\d+) tests", README)[1])
    collected = len(request.session.items)
    # A rounded figure: within 5% (at least 10 tests) of what was collected.
    assert abs(stated - collected) <= max(10, collected // 20), (stated, collected)
