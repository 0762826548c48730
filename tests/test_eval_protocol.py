"""Reproducing published LIBERO tables: several suites and their average, the official protocol,
and no evaluation that runs on actions left in the model's normalised space."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cosmos3_gym.envs import ColorReachEval, canonical_suites
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import format_table, summarize
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.tiny import tiny_action_stats, write_tiny_checkpoint

FOUR = ["libero_spatial", "libero_object", "libero_goal", "libero_10"]


def _record(suite: str, task: str, trial: int, success: bool) -> dict:
    return {"task": task, "task_index": 0, "suite": suite, "trial": trial, "success": success,
            "invalid_action": None, "out_of_range_steps": 0, "restarts": 0}


def test_libero_4_names_the_four_standard_suites_and_each_suite_counts_once() -> None:
    assert canonical_suites("libero_4") == ",".join(FOUR)
    assert canonical_suites("libero_10, libero_goal") == "libero_10,libero_goal"
    assert EvalConfig(env="libero", suite="libero_4").resolved().suite == ",".join(FOUR)
    with pytest.raises(ValueError, match=r"each suite once; found \['libero_10'\]"):
        canonical_suites("libero_4,libero_10")


def test_the_suite_average_is_the_mean_of_suite_rates_with_an_interval(tmp_path: Path) -> None:
    # spatial 2/2, goal 1/4: the pooled rate is 3/6 = 50%, the suites' mean (1 + 0.25) / 2.
    records = [_record("libero_spatial", "libero_spatial/0", t, True) for t in range(2)]
    records += [_record("libero_goal", "libero_goal/0", t, t == 0) for t in range(4)]
    results = summarize(records, config={}, task_names=["libero_spatial/0", "libero_goal/0"],
                        expected_episodes=6)
    average = results["suite_average"]
    assert average["success_rate"] == pytest.approx(0.625) and results["success_rate"] == 0.5
    assert average["suites"] == ["libero_spatial", "libero_goal"] and average["episodes"] == 6
    assert average["effective_episodes"] == pytest.approx(4 / (1 / 2 + 1 / 4))
    low, high = average["interval"]
    assert 0.0 < low < 0.625 < high < 1.0
    assert "average of 2 suites   62.5%    6" in format_table(results)
    from cosmos3_gym.eval.report import format_comparison, plot_results

    paths = plot_results([("run", results)], Path(tmp_path) / "plot")
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert 'id="bar-average-4-run0"' in svg and "mean of 2 suites" in svg
    assert "average of the suites  62.5% (mean of 2 suites)" in format_comparison(
        [("a", results), ("b", results)])
    one_suite = summarize(records[:2], config={}, task_names=["libero_spatial/0"],
                          expected_episodes=2)
    assert one_suite["suite_average"] is None and "average" not in format_table(one_suite)


def test_the_official_protocol_refuses_options_that_change_its_rules() -> None:
    official = dict(env="libero", suite="libero_10", protocol="official")
    assert EvalConfig(**official).resolved().trials == 50
    assert EvalConfig(env="libero").resolved().trials == 10
    assert EvalConfig(**official, trials=3).resolved().trials == 3
    for option, message in (
        ({"n_action_steps": 4}, "--n-action-steps 4 (official: whole chunks)"),
        ({"sampling": SamplerConfig(num_inference_steps=10)},
         "--denoising-steps 10 (official: the checkpoint's"),
        ({"sampling": SamplerConfig(noise="per_chunk")}, "--noise per_chunk (official: fixed"),
        ({"step_budget": "openpi"}, "--step-budget openpi (official: cosmos3"),
        ({"shuffle_prompts": True}, "--shuffle-prompts"),
    ):
        with pytest.raises(ValueError, match="--protocol official fixes what") as err:
            EvalConfig(**official, **option)
        assert message in str(err.value)
    with pytest.raises(ValueError, match=r"--env color_reach \(the official protocol is LIBERO"):
        EvalConfig(protocol="official")


def test_official_protocol_samples_every_chunk_from_seed_0_and_records_its_rules(
    checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    seeds: dict[str, list[int]] = {}

    def recording(name):
        def call(images, prompts, **kwargs):
            seeds.setdefault(name, []).extend(kwargs["seed"])
            return pipeline(images, prompts, **kwargs)
        call.policy = pipeline.policy  # the sampler settings results.json records
        return call

    # The official rules on the built-in env (a LIBERO run is the slow test below): the config
    # names LIBERO, the env is injected.
    env = ColorReachEval(["red", "blue"], image_size=32, max_episode_steps=8)
    common = dict(checkpoint=str(checkpoint), trials=2, num_envs=2, progress=False)
    evaluate(EvalConfig(env="libero", protocol="official", **common), tmp_path / "official",
             pipeline=recording("official"), eval_env=env)
    evaluate(EvalConfig(**common), tmp_path / "default", pipeline=recording("default"),
             eval_env=env)
    assert len(seeds["official"]) > 4 and set(seeds["official"]) == {0}
    assert len(set(seeds["default"])) == len(seeds["default"])  # fresh noise per chunk
    results = json.loads((tmp_path / "official" / "results.json").read_text())
    assert results["config"]["protocol"] == "official"
    sampler = results["protocol"].pop("sampler")
    assert results["protocol"] == {
        "name": "official", "trials_per_task": 2, "init_state": None,
        "actions_per_chunk": "whole chunk", "noise": "every chunk from seed 0",
        "deviations": ["trials 2 per task (official: 50)"],
    }
    assert {k: sampler[k] for k in ("num_inference_steps", "guidance_scale", "flow_shift",
                                    "guidance_interval", "sampler_name", "recipe")} == {
        "num_inference_steps": 8, "guidance_scale": 1.0, "flow_shift": 5.0,
        "guidance_interval": None, "sampler_name": "flow_unipc", "recipe": None}
    assert set(sampler["sources"]) == {"num_inference_steps", "guidance_scale",
                                       "guidance_interval", "flow_shift"}
    default = json.loads((tmp_path / "default" / "results.json").read_text())["protocol"]
    assert default["name"] == "default" and default["deviations"] == []
    assert default["noise"] == "fresh per (task, trial, chunk), derived from seed 0"
    assert "deviations from the official protocol: trials 2 per task (official: 50)" in \
        format_table(results)


@pytest.fixture(scope="module")
def libero_without_stats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LIBERO-shaped checkpoint (10-D quantile_rot head) whose policy has no statistics."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("nostats"),
                                 policy_overrides={"stats": None})


@pytest.mark.libero
def test_a_libero_eval_without_action_statistics_is_refused_in_seconds(
    libero_without_stats: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def loaded(*args, **kwargs):
        raise RuntimeError("past the statistics check")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", loaded)
    command = ["eval", "--env", "libero", "--suite", "libero_4", "--protocol", "official",
               "--checkpoint", str(libero_without_stats), "--out", str(tmp_path / "out")]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and elapsed < 5.0, elapsed
    assert err.count("\n") == 1 and err.startswith("cosmos3-gym eval: error: --checkpoint ")
    assert "has no action statistics ('libero' head, normalization 'quantile_rot'), so its " \
           "actions would stay in the model's normalised space, which --env libero would take " \
           "as real units; pass --action-stats FILE" in err
    assert "--allow-normalized-actions to run anyway" in err
    assert not (tmp_path / "out").exists()

    # Statistics of the wrong width are refused as fast; the right ones, or the explicit
    # override, pass the check.
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(tiny_action_stats(7)))
    with pytest.raises(SystemExit):
        main([*command, "--action-stats", str(stats)])
    assert "holds 7-D statistics; the checkpoint's 'libero' head makes 10-D actions" in \
        capsys.readouterr().err
    stats.write_text(json.dumps({"global": tiny_action_stats(10)["global"]}))
    with pytest.raises(SystemExit):
        main([*command, "--action-stats", str(stats)])
    assert "expected a 'global_raw' stats block, found none (the checkpoint's 'libero' head)" \
        in capsys.readouterr().err
    stats.write_text(json.dumps(tiny_action_stats(10)))
    for extra in (["--action-stats", str(stats)], ["--allow-normalized-actions"]):
        with pytest.raises(RuntimeError, match="past the statistics check"):
            main([*command, *extra])


@pytest.mark.slow
@pytest.mark.libero
def test_the_documented_command_reports_four_suites_and_their_average(
    tmp_path: Path, capsys
) -> None:
    from cosmos3_gym.eval.cli import main

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")  # LIBERO-shaped, with statistics
    # docs/libero.md's command, made small: 1 trial of task 0 per suite, 2 policy steps.
    assert main(["eval", "--env", "libero", "--suite", "libero_4", "--protocol", "official",
                 "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"),
                 "--trials", "1", "--tasks", "0", "--max-episode-steps", "2",
                 "--image-size", "64", "--num-envs", "4", "--no-progress"]) == 0
    summary = capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["per_suite"]) == FOUR and results["episodes"] == 4
    assert results["suite_average"]["suites"] == FOUR
    assert results["protocol"]["name"] == "official"
    assert results["protocol"]["init_state"] == "trial % 50"
    assert results["protocol"]["deviations"] == [
        "trials 1 per task (official: 50)", "tasks 0 only (official: every task)",
        "max_episode_steps 2 (official: the client's per-suite budget)",
        "image_size 64 (official: 256)"]
    assert results["config"]["suite"] == ",".join(FOUR)
    for suite in FOUR:
        assert f"suite {suite}" in summary
    assert "average of 4 suites" in summary and "protocol official: 1 trial per task" in summary


def test_the_record_names_the_recipe_the_checkpoints_settings_came_from() -> None:
    """``domain="libero"`` (or a folder whose settings a recipe wrote) runs a recipe without
    ``--recipe``; results.json and the summary name it all the same."""
    from cosmos3_gym.checkpoint import SAMPLER_FIELDS, PolicyConfig
    from cosmos3_gym.eval import protocol

    # What from_pretrained(folder, domain="libero") resolves (cosmos3_gym.checkpoint).
    policy = PolicyConfig.for_domain("libero", sampler_sources={name: "recipe libero"
                                                                for name in SAMPLER_FIELDS})
    recorded = protocol.record(EvalConfig(), None, policy)["sampler"]
    assert recorded["recipe"] == "libero"
    assert "shift 5, recipe libero" in protocol.describe({**protocol.record(
        EvalConfig(), None, policy), "sampler": recorded})[0]
    given = PolicyConfig(sampler_sources={name: "action_policy.json" for name in SAMPLER_FIELDS})
    assert protocol.record(EvalConfig(), None, given)["sampler"]["recipe"] is None
    assert protocol.record(EvalConfig(recipe="libero"), None, given)["sampler"]["recipe"] == \
        "libero"
