"""results.png / results.svg and ``cosmos3-gym report``: drawn as results come in, one bar per
task, the same numbers as results.json for finished and partial runs, two runs in one plot,
and evaluation still working (with a note) where matplotlib is absent."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from cosmos3_gym.eval import report
from cosmos3_gym.eval.cli import main
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import format_table
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.plotting import INSTALL_HINT

TASKS = ["red", "green", "blue"]


def config(checkpoint: Path, **overrides) -> EvalConfig:
    fields = dict(checkpoint=str(checkpoint), tasks=TASKS, trials=2, num_envs=2, seed=3,
                  image_size=32, max_episode_steps=6,
                  sampling=SamplerConfig(num_inference_steps=2), progress=False)
    return EvalConfig(**{**fields, **overrides})


class PipelineThatStops:
    """The real pipeline until ``calls`` calls have run; then it fails as a crash would."""

    def __init__(self, pipe, calls: int) -> None:
        self.pipe, self.left = pipe, calls

    def __call__(self, *args, **kwargs):
        if self.left == 0:
            raise RuntimeError("stopped by the test")
        self.left -= 1
        return self.pipe(*args, **kwargs)


def bar_ids(svg: Path) -> list[str]:
    ET.parse(svg)  # a well-formed SVG document
    return re.findall(r'id="(bar-[^"]+)"', svg.read_text())


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width >= 600 and image.height >= 200


@pytest.fixture(scope="module")
def finished(checkpoint: Path, pipeline, tmp_path_factory: pytest.TempPathFactory):
    """A complete run, and the episode counts of every plot drawn while it ran."""
    out = tmp_path_factory.mktemp("finished")
    drawn = []
    real = report.plot_results

    def recording(runs, stem):
        drawn.append(runs[0][1]["episodes"])
        return real(runs, stem)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "plot_results", recording)
        evaluate(config(checkpoint), out, pipeline=pipeline)
    return out, drawn


@pytest.fixture(scope="module")
def partial(checkpoint: Path, pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that stopped after some episodes finished (one env slot, 4-step chunks)."""
    out = tmp_path_factory.mktemp("partial")
    with pytest.raises(RuntimeError, match="stopped by the test"):
        evaluate(config(checkpoint, num_envs=1), out, pipeline=PipelineThatStops(pipeline, 5))
    return out


def test_results_plot_is_drawn_as_results_come_in_with_one_bar_per_task(finished) -> None:
    out, drawn = finished
    results = json.loads((out / "results.json").read_text())
    assert drawn[0] == 1 and drawn[-1] == results["episodes"] == 6  # first episode, and the end
    assert_png(out / "results.png")
    ids = bar_ids(out / "results.svg")
    assert ids == [f"bar-task-{i}-run0" for i in range(3)] + ["bar-all-3-run0"]


def test_report_on_a_partial_run_matches_results_json(partial: Path, capsys) -> None:
    stored = json.loads((partial / "results.json").read_text())
    assert not stored["complete"] and 0 < stored["episodes"] < 6
    (partial / "results.png").unlink()
    assert main(["report", str(partial)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(format_table(stored) + "\n")
    assert f"plot: {partial / 'results.png'}, {partial / 'results.svg'}" in printed
    assert report.load_run(partial) == stored
    assert_png(partial / "results.png")
    with_episodes = [i for i, t in enumerate(TASKS) if stored["per_task"][t]["episodes"]]
    assert len(with_episodes) < 3  # a task not reached yet has no bar...
    assert bar_ids(partial / "results.svg") == (
        [f"bar-task-{i}-run0" for i in with_episodes] + ["bar-all-3-run0"]
    )
    assert "no episodes yet" in (partial / "results.svg").read_text()  # ...but says so


def test_report_recounts_from_the_episode_logs_when_results_json_is_behind(
    finished, partial: Path, tmp_path: Path
) -> None:
    """The logs are the source of truth: a results.json that missed episodes (other ranks',
    or a crash between the append and the rewrite) is corrected in the report."""
    out, _ = finished
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes((partial / "config.json").read_bytes())
    (run / "results.json").write_bytes((partial / "results.json").read_bytes())  # stale
    (run / "episodes.jsonl").write_bytes((out / "episodes.jsonl").read_bytes())  # all six
    recounted = report.load_run(run)
    whole = json.loads((out / "results.json").read_text())
    for key in ("complete", "episodes", "successes", "per_task", "per_suite", "interval"):
        assert recounted[key] == whole[key]


def test_report_puts_two_runs_side_by_side(finished, partial: Path, tmp_path: Path,
                                           capsys) -> None:
    out, _ = finished
    stem = tmp_path / "compare"
    code = main(["report", str(out), str(partial), "--labels", "whole run,stopped run",
                 "--out", f"{stem}.png"])
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["task", "whole", "run", "stopped", "run"]
    whole = json.loads((out / "results.json").read_text())
    red = whole["per_task"]["red"]
    assert printed[2].startswith("red") and (
        f"{red['success_rate']:.1%} ({red['successes']}/{red['episodes']})" in printed[2]
    )
    assert_png(stem.with_suffix(".png"))
    ids = bar_ids(stem.with_suffix(".svg"))
    assert [i for i in ids if i.endswith("run0")] == (
        [f"bar-task-{i}-run0" for i in range(3)] + ["bar-all-3-run0"]
    )
    assert "bar-all-3-run1" in ids
    assert "whole run" in stem.with_suffix(".svg").read_text()  # the legend names the runs
    with pytest.raises(SystemExit):
        main(["report", str(out), str(partial)])
    assert "comparing 2 runs needs --out FILE.png" in capsys.readouterr().err


def test_report_on_a_folder_without_a_run_says_what_it_expected(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path)])
    assert exit_.value.code == 2
    assert "holds no evaluation: expected results.json or config.json" in capsys.readouterr().err


def test_eval_without_matplotlib_writes_results_and_says_how_to_get_plots(
    checkpoint: Path, pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    evaluate(config(checkpoint, tasks=["red"], trials=2), tmp_path, pipeline=pipeline)
    assert json.loads((tmp_path / "results.json").read_text())["episodes"] == 2
    assert not (tmp_path / "results.png").exists()
    err = capsys.readouterr().err
    assert err.count(INSTALL_HINT) == 1 and "pip install 'cosmos3-gym[plot]'" in err
    assert main(["report", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "red" in captured.out  # the table still prints
    assert captured.err.strip() == f"cosmos3-gym report: no plot drawn: {INSTALL_HINT}"
