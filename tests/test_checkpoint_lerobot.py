"""LeRobot policy folders load as downloaded and give the actions LeRobot's own policy gives.

The folders in ``tests/fixtures/lerobot_cosmos3/`` were written by LeRobot's Cosmos3 code (the
draft of huggingface/lerobot PR #3745 at 68ff20d2, run by ``make_fixtures.py`` in a venv of its
own), and ``reference.npz`` holds its inputs and outputs: the independent reference here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.formats import read_checkpoint
from cosmos3_gym.policy import SeedRule

FIXTURES = Path(__file__).parent / "fixtures" / "lerobot_cosmos3"
CASES = ("libero", "state")


def reference(case: str) -> tuple[dict[str, np.ndarray], dict]:
    folder = FIXTURES / case
    with np.load(folder / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, json.loads((folder / "reference.json").read_text())


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[str, Cosmos3ActionPipeline]:
    return request.param, Cosmos3ActionPipeline.from_pretrained(FIXTURES / request.param)


def _state(pipe: Cosmos3ActionPipeline, ref: dict[str, np.ndarray]) -> dict:
    return {"state": ref["state"][:, None, :]} if pipe.history_length else {}


@pytest.mark.parametrize("settings", [{}, {"guidance_scale": 3.0, "num_inference_steps": 4}],
                         ids=["folder_sampler", "guidance3_steps4"])
def test_a_lerobot_folder_gives_lerobots_actions_for_lerobots_noise(case, settings) -> None:
    name, pipe = case
    ref, meta = reference(name)
    expected = ref["actions_folder" if not settings else "actions_g3_n4"]
    seeds = [int(s) for s in ref["seeds"]]
    out = pipe(ref["canvas"], meta["tasks"], seed=seeds, action_noise=ref["action_noise"],
               video_noise=ref["video_noise"], progress=False, **_state(pipe, ref), **settings)
    np.testing.assert_allclose(out.actions, expected, atol=1e-4, rtol=0)
    # The seeds alone draw that same noise (LeRobot's RandomState(seed) per sample).
    seeded = pipe(ref["canvas"], meta["tasks"], seed=seeds, progress=False,
                  **_state(pipe, ref), **settings)
    np.testing.assert_allclose(seeded.actions, expected, atol=1e-4, rtol=0)
    assert np.abs(expected).max() > 0.5  # not a trivially small output


def test_the_folder_sampler_is_lerobots_and_is_recorded(case) -> None:
    name, pipe = case
    _, meta = reference(name)
    folder = meta["folder_sampler"]
    assert pipe.policy.num_inference_steps == folder["num_inference_steps"]
    assert pipe.policy.guidance_scale == folder["guidance_scale"]
    record = pipe.sampler_record
    assert record["scheduler"]["name"] == "diffusers_unipc"
    assert record["num_inference_steps"]["source"] == "config.json"
    assert record["flow_shift"]["source"] == "config.json scheduler_config"
    assert "diffusers UniPCMultistepScheduler" in pipe.describe_sampler()


def test_the_policys_default_adapter_composes_lerobots_canvas(case) -> None:
    name, pipe = case
    ref, meta = reference(name)
    policy = VectorPolicy(pipe)
    assert policy.adapter.name == "lerobot"
    obs = {key: ref[f"view_{i}"] for i, key in enumerate(meta["image_keys"])}
    np.testing.assert_array_equal(policy.adapter.images(obs), ref["canvas"])
    assert policy.n_action_steps == pipe.action_horizon  # the folder's n_action_steps


def test_the_captions_and_token_ids_are_lerobots(case) -> None:
    from cosmos3_gym.pipeline.prompt import build_lerobot_caption

    name, pipe = case
    ref, meta = reference(name)
    p = pipe.policy
    for i, task in enumerate(meta["tasks"]):
        caption = build_lerobot_caption(task, view_point=p.view_point, num_frames=p.num_frames,
                                        fps=p.fps, canvas_h=256, canvas_w=256,
                                        view_description=p.view_description)
        assert caption == meta["captions"][i]
    from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams

    plan = pipe._micro_batches(list(ref["canvas"]), meta["tasks"], [0, 0, 0])[0].plan
    batch = MicroBatch(indices=[0, 1, 2], images=list(ref["canvas"]), prompts=meta["tasks"],
                       seeds=[0, 0, 0], plan=plan)
    ids, mask = pipe.prompt.tokenize(batch, SamplingParams(4, 3.0, 5.0, False))
    tail = [p.eos_token_id, p.vision_start_token_id]
    for i in range(3):
        cond = ids[i][mask[i]].tolist()
        uncond = ids[3 + i][mask[3 + i]].tolist()
        assert cond == ref[f"cond_ids_{i}"].tolist() + tail
        assert uncond == ref[f"uncond_ids_{i}"].tolist() + tail


def test_lerobots_seed_rule_draws_lerobots_seeds() -> None:
    ref, _ = reference("libero")
    rule = SeedRule.lerobot(0, num_envs=3)
    drawn = [rule.seed_of(env, 0, chunk) for chunk in range(3) for env in range(3)]
    assert drawn == ref["lerobot_seeds"].tolist()
    assert rule.seed_of(2, 9, 1) == drawn[5]  # every episode restarts the stream
    assert SeedRule.lerobot(4, 3, deterministic=True).seed_of(1, 0, 2) == 4
    with pytest.raises(ValueError, match="made for 3 envs; env 3"):
        rule.seed_of(3, 0, 0)


def test_this_projects_libero_cameras_become_lerobots_views() -> None:
    """LeRobot's LIBERO env maps agentview -> image, wrist -> image2 and its processor rotates
    both 180 degrees: an observation of this project's LIBERO env gives the same canvas."""
    ref, meta = reference("libero")
    pipe_contract = read_checkpoint(FIXTURES / "libero").contract
    from cosmos3_gym.policy.adapters import adapter_for_contract

    adapter = adapter_for_contract(pipe_contract)
    ours = {"agentview_image": np.ascontiguousarray(ref["view_0"][:, ::-1, ::-1]),
            "wrist_image": np.ascontiguousarray(ref["view_1"][:, ::-1, ::-1])}
    np.testing.assert_array_equal(adapter.images(ours), ref["canvas"])
    raw = np.zeros((1, 16, 10), np.float32)
    raw[..., 3], raw[..., 7], raw[..., 9] = 1.0, 1.0, 1.0  # identity rot6d, gripper open (1)
    actions = adapter.actions(raw)
    assert actions.shape == (1, 16, 7) and np.allclose(actions[..., 3:6], 0, atol=1e-6)
    assert np.all(actions[..., 6] == -1.0)
    with pytest.raises(ValueError, match="observation.images.image2' is not in the observation"):
        adapter.images({"observation.images.image": ref["view_0"]})


def test_the_tokenizer_is_found_beside_the_folder_or_given(tmp_path: Path) -> None:
    models = tmp_path / "models"
    folder = models / "policy"
    shutil.copytree(FIXTURES / "libero", folder)
    shutil.move(folder / "tokenizer", models / "tokenizer")
    found = read_checkpoint(folder)
    assert found.tokenizer == models / "tokenizer"
    assert "beside the folder" in found.tokenizer_source
    shutil.move(models / "tokenizer", tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="does not resolve.*--tokenizer PATH"):
        read_checkpoint(folder)
    given = read_checkpoint(folder, tokenizer=tmp_path / "elsewhere")
    assert given.tokenizer_source == "given"
