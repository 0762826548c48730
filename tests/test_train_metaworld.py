"""`cosmos3-gym train --env metaworld`: demos from Meta-World's scripted experts, checked
against the env and the expert run by hand; a small run writes a Meta-World head that the
evaluation drives; bad settings are refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import METAWORLD_TASK_DESCRIPTIONS, MetaWorldEnv, MetaWorldExpert
from cosmos3_gym.policy import MetaWorldAdapter
from cosmos3_gym.train import TrainConfig, train
from cosmos3_gym.train.demos import collect_demos

pytestmark = pytest.mark.metaworld

TASK = "button-press-topdown-v3"


def _by_hand(layout: int, steps: int) -> tuple[list[np.ndarray], np.ndarray, bool]:
    """The expert's episode on ``layout``, stepped here: its frames and raw actions."""
    env, expert = MetaWorldEnv(TASK, image_size=64, max_episode_steps=steps, shadows=False), \
        MetaWorldExpert(TASK)
    obs, _ = env.reset(options={"layout_id": layout})
    frames, actions, success = [obs["image"]], [], False
    for _ in range(steps):
        actions.append(np.clip(expert.act(env.raw_observation), -1, 1))
        obs, _, success, truncated, _ = env.step(actions[-1])
        frames.append(obs["image"])
        if success or truncated:
            break
    actions.append(np.clip(expert.act(env.raw_observation), -1, 1))
    env.close()
    return frames, MetaWorldAdapter.raw_actions(np.stack(actions)), success


def test_demos_are_the_experts_actions_and_the_frames_that_follow() -> None:
    """Without detours and every state kept, the demos of episodes 0 and 1 (tasks cycle; one
    task, so layouts 0 and 1) are the hand-run episodes: each image a frame, each chunk the
    expert's next H raw actions (gripper in [0, 1]) and each future the next H frames, the last
    action and frame repeated past the end."""
    cfg = TrainConfig(env="metaworld", tasks=[TASK], image_size=64, keep_prob=1.0,
                      detour_prob=0.0, max_episode_steps=120, action_horizon=4)
    demos = collect_demos(cfg, episodes=range(2))
    assert demos.prompts == (METAWORLD_TASK_DESCRIPTIONS[TASK],)
    start = 0
    for layout in (0, 1):
        frames, raw, success = _by_hand(layout, 120)
        assert success  # the expert presses the button within the limit
        n = len(frames) - 1  # states visited (the last frame is the end)
        part = demos[start:start + n]
        start += n
        np.testing.assert_array_equal(part.images, np.stack(frames[:-1]))
        assert part.prompt_ids.tolist() == [0] * n
        for t in (0, n // 2, n - 1):
            ahead = np.minimum(np.arange(t, t + 4), n)
            np.testing.assert_array_equal(part.chunks[t], raw[ahead].astype(np.float32))
            np.testing.assert_array_equal(
                part.futures[t], np.stack([frames[k] for k in np.minimum(ahead + 1, n)]))
        assert part.chunks[..., 3].min() >= 0.0 and part.chunks[..., 3].max() <= 1.0
    assert start == len(demos)


def test_detours_and_keeping_follow_the_seed() -> None:
    cfg = TrainConfig(env="metaworld", tasks=[TASK], image_size=64, keep_prob=0.5,
                      detour_prob=0.3, max_episode_steps=60, seed=4)
    first, second = (collect_demos(cfg, episodes=range(1)) for _ in range(2))
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.chunks, second.chunks)
    other = collect_demos(TrainConfig(**{**cfg.__dict__, "seed": 5}), episodes=range(1))
    assert other.images.shape != first.images.shape or not np.array_equal(
        other.images, first.images)


def test_a_small_run_writes_a_metaworld_head_that_the_evaluation_drives(tmp_path: Path) -> None:
    cfg = TrainConfig(
        out=str(tmp_path / "mw"), env="metaworld", tasks=[TASK], seed=3, episodes=2,
        keep_prob=0.3, max_episode_steps=40, hidden_size=64, head_dim=16, intermediate_size=64,
        steps=2, batch_size=4, warmup_steps=1, log_every=1, vae_steps=1, vae_batch_size=2,
        vae_warmup_steps=1, vae_holdout_episodes=1, stats_samples=8, vae_clips=4,
        eval_every=2, eval_trials=1,
    )
    log = train(cfg, progress=False)
    head = json.loads((tmp_path / "mw" / "action_policy.json").read_text())
    assert (head["domain_name"], head["raw_action_dim"], head["clip_actions"]) == (
        "metaworld", 4, True)
    assert [e["step"] for e in log["evaluations"]] == [2]
    assert log["evaluations"][0]["episodes"] == 1  # one task, one trial


@pytest.mark.parametrize("knobs, message", [
    ({"env": "metaworld"}, "name the tasks"),
    ({"env": "metaworld", "tasks": ["press-everything-v3"]}, "unknown Meta-World tasks"),
    ({"tasks": [TASK]}, "apply to --env metaworld"),
    ({"max_episode_steps": 50}, "apply to --env metaworld"),
    ({"env": "libero"}, "env: expected one of"),
])
def test_bad_demo_settings_are_refused_before_anything_is_written(
    tmp_path: Path, knobs: dict, message: str
) -> None:
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(out=str(out), **knobs), progress=False)
    assert not out.exists()


def test_every_family_with_a_policy_head_has_an_expert_and_no_other() -> None:
    from cosmos3_gym.train.config import DEMO_HEADS
    from cosmos3_gym.train.demos import COLLECTORS, collect_demos

    assert set(COLLECTORS) == set(DEMO_HEADS)
    with pytest.raises(ValueError, match="env: expected one of color_reach, metaworld"):
        collect_demos(TrainConfig(env="libero", episodes=1))
