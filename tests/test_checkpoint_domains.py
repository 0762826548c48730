"""Bare diffusers folders (the published nvidia/Cosmos3-* format): the embodiment table, loading
by domain, the LIBERO recipe, and the errors of a folder that does not say how it is used."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as diffusers_cosmos3
from safetensors.torch import load_file

from cosmos3_gym.checkpoint import DOMAINS, POLICY_CONFIG, RECIPES, PolicyConfig
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.tiny import tiny_action_stats, write_tiny_diffusers_folder

IMAGE = np.random.default_rng(0).integers(0, 256, size=(1, 64, 96, 3), dtype=np.uint8)
PROMPT = "pick up the black bowl"


def test_domain_table_is_the_one_diffusers_uses() -> None:
    ids = diffusers_cosmos3._EMBODIMENT_TO_DOMAIN_ID
    widths = diffusers_cosmos3._EMBODIMENT_TO_RAW_ACTION_DIM
    assert {name: d.embodiment_id for name, d in DOMAINS.items()} == ids
    assert {name: d.raw_action_dim for name, d in DOMAINS.items() if d.raw_action_dim} == widths


@pytest.fixture(scope="module")
def diffusers_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A folder written by diffusers' own Cosmos3OmniPipeline.save_pretrained, from tiny random
    components (the real classes: diffusers' transformer and VAE, a transformers tokenizer), and
    its transformer weights as saved."""
    root = write_tiny_diffusers_folder(tmp_path_factory.mktemp("diffusers_pipeline"))
    assert not (root / POLICY_CONFIG).exists()
    reference: dict[str, torch.Tensor] = {}
    for shard in sorted((root / "transformer").glob("*.safetensors")):
        reference.update(load_file(shard))  # the weights as written, read by safetensors alone
    return root, reference


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_diffusers_folder_loads_by_domain_with_identical_weights(diffusers_folder, caplog) -> None:
    root, reference = diffusers_folder
    with caplog.at_level(logging.WARNING):
        pipe = Cosmos3ActionPipeline.from_pretrained(root, domain="droid_lerobot")
    ours = pipe.transformer.state_dict()
    assert set(reference) - set(ours) == set(pipe.transformer.UNUSED_CHECKPOINT_KEYS)
    assert set(ours) <= set(reference)
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
    # The embodiment row and width are diffusers' for that name.
    assert pipe.policy.domain_id == diffusers_cosmos3._EMBODIMENT_TO_DOMAIN_ID["droid_lerobot"]
    assert pipe.action_dim == diffusers_cosmos3._EMBODIMENT_TO_RAW_ACTION_DIM["droid_lerobot"]
    # No statistics: one warning, and the actions are the normalised ones.
    [warning] = _warnings(caplog)
    assert "no action statistics" in warning and "normalised" in warning
    out = pipe(IMAGE, PROMPT, num_inference_steps=2, progress=False)
    assert out.actions.shape == (1, 16, 10)
    assert np.isfinite(out.actions).all() and np.abs(out.actions).max() > 0
    np.testing.assert_array_equal(out.actions, out.normalized_actions)


def test_the_domain_selects_its_embodiment_row(diffusers_folder) -> None:
    root, _ = diffusers_folder
    pipe = Cosmos3ActionPipeline.from_pretrained(root, domain="droid_lerobot")
    before = pipe(IMAGE, PROMPT, num_inference_steps=2, progress=False).actions
    heads = (pipe.transformer.action_proj_in, pipe.transformer.action_proj_out)
    with torch.no_grad():
        for head in heads:  # bridge_orig_lerobot's row: not this policy's
            head.fc.weight[DOMAINS["bridge_orig_lerobot"].embodiment_id].mul_(3.0)
    same = pipe(IMAGE, PROMPT, num_inference_steps=2, progress=False).actions
    np.testing.assert_array_equal(same, before)
    with torch.no_grad():
        for head in heads:  # droid_lerobot's row (8)
            head.fc.weight[8].mul_(3.0)
    changed = pipe(IMAGE, PROMPT, num_inference_steps=2, progress=False).actions
    assert np.abs(changed - before).max() > 1e-3


def test_libero_domain_is_the_official_recipe_and_takes_statistics(diffusers_folder, caplog):
    root, _ = diffusers_folder
    recipe = PolicyConfig.for_domain("libero")
    assert (recipe.domain_id, recipe.raw_action_dim, recipe.action_horizon) == (5, 10, 16)
    assert (recipe.normalization, recipe.fps, recipe.resolution_tier) == ("quantile_rot", 20.0, 256)
    assert (recipe.view_point, recipe.num_inference_steps, recipe.flow_shift) == (
        "concat_view", 30, 5.0)
    assert recipe.stats is None and not recipe.denormalizes
    settings = RECIPES["libero"].settings
    assert {k: getattr(recipe, k) for k in settings} == settings

    with caplog.at_level(logging.WARNING):
        bare = Cosmos3ActionPipeline.from_pretrained(root, domain="libero")
    assert len(_warnings(caplog)) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        with_stats = Cosmos3ActionPipeline.from_pretrained(
            root, policy=PolicyConfig.for_domain("libero", stats=tiny_action_stats(10))
        )
    assert _warnings(caplog) == []
    a = bare(IMAGE, PROMPT, num_inference_steps=2, progress=False)
    b = with_stats(IMAGE, PROMPT, num_inference_steps=2, progress=False)
    np.testing.assert_array_equal(a.normalized_actions, b.normalized_actions)
    np.testing.assert_array_equal(a.actions, a.normalized_actions)
    assert np.abs(b.actions - b.normalized_actions).max() > 1e-3  # un-normalised


def test_a_bare_folder_without_a_domain_is_a_clear_error(diffusers_folder, tmp_path) -> None:
    root, _ = diffusers_folder
    with pytest.raises(FileNotFoundError, match=r"no action_policy.json.*--domain.*droid_lerobot"):
        Cosmos3ActionPipeline.from_pretrained(root)
    with pytest.raises(ValueError, match=r"unknown domain 'droid'.*'droid_lerobot'"):
        Cosmos3ActionPipeline.from_pretrained(root, domain="droid")
    with pytest.raises(ValueError, match="either policy or domain"):
        Cosmos3ActionPipeline.from_pretrained(root, domain="libero", policy=PolicyConfig())
    with pytest.raises(ValueError, match="'no_action' has no fixed action width"):
        PolicyConfig.for_domain("no_action")


def test_cli_evaluates_a_bare_diffusers_folder_by_domain(diffusers_folder, tmp_path, capsys):
    from cosmos3_gym.eval.cli import main

    root, _ = diffusers_folder
    common = ["eval", "--checkpoint", str(root), "--tasks", "red", "--trials", "1",
              "--num-envs", "1", "--image-size", "32", "--max-episode-steps", "3",
              "--denoising-steps", "1", "--no-progress"]
    # Without --domain: one error line that lists the choices, before any episode runs.
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--out", str(tmp_path / "no_domain")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "--domain NAME" in err and "'pusht'" in err
    # pusht's 2-D actions drive ColorReach's 2-D velocity: the folder runs end to end.
    out = tmp_path / "pusht"
    assert main([*common, "--domain", "pusht", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "suite color_reach" in printed.out
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 1 and results["config"]["domain"] == "pusht"


def test_a_domain_of_another_width_is_refused_before_the_model_loads(
    diffusers_folder, tmp_path, capsys, monkeypatch
) -> None:
    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def refused(*args, **kwargs):
        raise AssertionError("--domain's width is known without loading the model")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", refused)
    root, _ = diffusers_folder
    out = tmp_path / "droid"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(root), "--domain", "droid_lerobot", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "makes 10-D actions (domain 'droid_lerobot')" in err and "(2,)" in err
    assert not out.exists()


def test_action_stats_file_replaces_the_policys_statistics(diffusers_folder, tmp_path) -> None:

    root, _ = diffusers_folder
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(tiny_action_stats(10)))
    pipe = Cosmos3ActionPipeline.from_pretrained(str(root), domain="droid_lerobot",
                                                action_stats=str(stats))
    assert pipe.policy.domain_id == 8 and pipe.policy.stats == tiny_action_stats(10)
    out = pipe(IMAGE, PROMPT, num_inference_steps=1, progress=False)
    assert np.abs(out.actions - out.normalized_actions).max() > 1e-3
    with pytest.raises(FileNotFoundError, match="no action statistics file at"):
        Cosmos3ActionPipeline.from_pretrained(str(root), domain="droid_lerobot",
                                              action_stats=str(tmp_path / "missing.json"))
