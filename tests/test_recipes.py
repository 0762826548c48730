"""Released checkpoints' recipes with sources, and where the sampler defaults come from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.checkpoint import (
    DEFAULT_SOURCE,
    GIVEN_SOURCE,
    POLICY_CONFIG,
    SAMPLER_FIELDS,
    SCHEDULER_SOURCE,
    PolicyConfig,
    resolve_policy,
)
from cosmos3_gym.formats import resolve_checkpoint
from cosmos3_gym.recipes import COLUMNS, RECIPES, SOURCES, recipe_table
from cosmos3_gym.tiny import write_tiny_checkpoint, write_tiny_diffusers_folder

DOCS = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
IMAGE = np.random.default_rng(0).integers(0, 256, size=(1, 64, 96, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def bare_folder(tmp_path_factory) -> Path:
    return write_tiny_diffusers_folder(tmp_path_factory.mktemp("bare"))


def _with_scheduler(bare_folder: Path, tmp_path: Path, **config) -> Path:
    root = tmp_path / "folder"
    shutil.copytree(bare_folder, root)
    path = root / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return root


def test_every_value_of_every_recipe_has_a_source() -> None:
    for recipe in RECIPES.values():
        for key, source in recipe.sources.items():
            assert key in recipe.settings or key == "representation", (recipe.name, key)
            if source.startswith("not sourced"):
                continue
            for part in source.split("; "):
                assert part.split(" (")[0] in SOURCES, (recipe.name, key, part)
        for key, _ in COLUMNS:  # every table column is stated by every recipe (or its folder)
            assert key == "representation" or key in recipe.settings or (
                key in recipe.from_folder), (recipe.name, key)
        for result in recipe.published:
            assert result.source in SOURCES, (recipe.name, result)
        PolicyConfig(**recipe.settings)  # and makes a valid policy head


def test_the_released_policy_recipes_are_nvidias() -> None:
    nano, edge = RECIPES["nano-policy-droid"].settings, RECIPES["edge-policy-droid"].settings
    # cosmos-framework action_policy_server_robolab.py defaults.
    assert (nano["num_inference_steps"], nano["guidance_scale"], nano["flow_shift"]) == (4, 3.0,
                                                                                         5.0)
    assert (nano["action_horizon"], nano["raw_action_dim"], nano["history_length"]) == (32, 8, 1)
    assert (nano["fps"], nano["resolution_tier"], nano["view_point"]) == (15.0, 480,
                                                                          "concat_view")
    assert nano["guidance_interval"] is None and not nano["idle_frame"]
    # docs/action_policy_droid_server.md: the Edge launch adds --guidance-interval 960 1001.
    assert edge["guidance_interval"] == (960.0, 1001.0)
    assert {k: v for k, v in edge.items() if k != "guidance_interval"} == {
        k: v for k, v in nano.items() if k != "guidance_interval"}
    assert RECIPES["libero"].settings["num_inference_steps"] == 30
    assert any("sglang" in d for d in RECIPES["nano-policy-droid"].disagreements)


def test_the_docs_page_is_the_table() -> None:
    assert recipe_table() in DOCS.read_text(), "regenerate docs/recipes.md from recipe_table()"


def test_a_bare_folders_scheduler_shift_is_the_sampler_default(bare_folder, tmp_path) -> None:
    root = _with_scheduler(bare_folder, tmp_path, flow_shift=10.0, num_inference_steps=3)
    pipe = Cosmos3ActionPipeline.from_pretrained(root, domain="droid_lerobot")
    assert (pipe.policy.flow_shift, pipe.policy.num_inference_steps) == (10.0, 3)
    assert pipe.sampler_source == {
        "num_inference_steps": SCHEDULER_SOURCE, "guidance_scale": DEFAULT_SOURCE,
        "guidance_interval": DEFAULT_SOURCE, "flow_shift": SCHEDULER_SOURCE,
    }
    assert pipe.recipe is None and "shift 10" in pipe.describe_sampler()
    # The shift reaches the sampler: the same as asking for it in the call.
    default = Cosmos3ActionPipeline.from_pretrained(bare_folder, domain="droid_lerobot")
    assert default.policy.flow_shift == 5.0  # the folder's own scheduler says 5
    np.testing.assert_array_equal(
        pipe(IMAGE, "pick", progress=False).actions,
        default(IMAGE, "pick", flow_shift=10.0, num_inference_steps=3, progress=False).actions,
    )


def test_a_flowunipc_scheduler_config_gives_its_shift(bare_folder, tmp_path) -> None:
    root = _with_scheduler(bare_folder, tmp_path, _class_name="FlowUniPCMultistepScheduler",
                           shift=7.0)
    policy = resolve_policy(root, domain="pusht")
    assert policy.flow_shift == 7.0 and policy.sampler_sources["flow_shift"] == SCHEDULER_SOURCE


def test_karras_sigma_scheduler_configs_state_no_shift(bare_folder, tmp_path) -> None:
    """diffusers' conversion script writes Karras sigmas approximating FlowUniPC (its
    flow_shift key keeps diffusers' default 1.0, which is not the schedule)."""
    root = _with_scheduler(bare_folder, tmp_path, use_karras_sigmas=True, flow_shift=1.0,
                           sigma_min=0.147, sigma_max=200.0)
    policy = resolve_policy(root, domain="droid_lerobot")
    assert policy.flow_shift == 5.0 and policy.sampler_sources["flow_shift"] == DEFAULT_SOURCE


def test_a_bad_scheduler_shift_is_refused(bare_folder, tmp_path) -> None:
    root = _with_scheduler(bare_folder, tmp_path, flow_shift=-2.0)
    with pytest.raises(ValueError, match="flow_shift must be a number > 0, found -2.0"):
        resolve_policy(root, domain="droid_lerobot")


def test_action_policy_json_wins_over_the_scheduler_config() -> None:
    root = resolve_checkpoint("tiny")  # scheduler flow_shift 5.0, action_policy.json 1.0
    assert json.loads((root / "scheduler" / "scheduler_config.json").read_text())[
        "flow_shift"] == 5.0
    policy = resolve_policy(root)
    assert policy.flow_shift == 1.0 and policy.num_inference_steps == 8
    assert policy.sampler_sources["flow_shift"] == POLICY_CONFIG
    # A setting older files do not state keeps the default, and says so.
    assert policy.sampler_sources["guidance_interval"] == DEFAULT_SOURCE


def test_a_recipe_wins_over_action_policy_json_and_keeps_its_statistics(tmp_path) -> None:
    root = write_tiny_checkpoint(tmp_path, seed=0)  # a LIBERO-like head with 8 steps
    folder = PolicyConfig.from_json_file(root / POLICY_CONFIG)
    policy = resolve_policy(root, recipe="libero")
    assert folder.num_inference_steps == 8 and policy.num_inference_steps == 30
    assert policy.action_horizon == 16 and policy.stats == folder.stats
    assert set(policy.sampler_sources.values()) == {"recipe libero"}


def test_recipes_for_another_head_are_refused(tmp_path, bare_folder) -> None:
    root = write_tiny_checkpoint(tmp_path, seed=0)
    with pytest.raises(ValueError, match=r"recipe 'nano-policy-droid' is for 'droid_lerobot'.*"
                                         r"'libero'"):
        resolve_policy(root, recipe="nano-policy-droid")
    with pytest.raises(ValueError, match="is for 'droid_lerobot' action heads, but the domain"):
        resolve_policy(bare_folder, domain="pusht", recipe="nano-policy-droid")
    with pytest.raises(ValueError, match="either policy or domain"):
        resolve_policy(bare_folder, policy=PolicyConfig(), recipe="libero")
    with pytest.raises(ValueError, match=r"unknown recipe 'droid'; expected one of \["):
        resolve_policy(bare_folder, recipe="droid")


def test_a_given_policy_says_so() -> None:
    policy = resolve_policy(Path("."), policy=PolicyConfig(num_inference_steps=4))
    assert set(policy.sampler_sources.values()) == {GIVEN_SOURCE}
    assert set(policy.sampler) == set(SAMPLER_FIELDS)
    assert policy.sampler["num_inference_steps"] == {"value": 4, "source": GIVEN_SOURCE}


def test_a_released_policy_folder_runs_at_its_recipe(bare_folder) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(bare_folder, recipe="nano-policy-droid")
    assert pipe.recipe == "nano-policy-droid"
    assert pipe.describe_sampler() == (
        "recipe nano-policy-droid: sampler 4 steps, guidance 3, shift 5 "
        "(all: recipe nano-policy-droid)")
    record = pipe.sampler_record
    assert record["recipe"] == "nano-policy-droid"
    assert record["guidance_scale"] == {"value": 3.0, "source": "recipe nano-policy-droid"}
    assert (pipe.action_horizon, pipe.action_dim, pipe.history_length) == (32, 8, 1)
    state = np.zeros((1, 1, 8), np.float32)
    out = pipe(IMAGE, "put the marker in the cup", state=state, progress=False)
    assert out.actions.shape == (1, 32, 8) and np.isfinite(out.actions).all()
    # The saved head does not carry where its settings came from.
    saved = pipe.policy.save(Path(pipe.policy.extra.get("tmp", "/tmp")) / "policy_i36.json")
    assert "sampler_sources" not in json.loads(saved.read_text())
    assert PolicyConfig.from_json_file(saved).guidance_scale == 3.0
