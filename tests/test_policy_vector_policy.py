"""VectorPolicy: per-env prompts, per-env queues under every autoreset mode, seeds, RL records."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from test_policy_standins import (
    ENV,
    EPISODE,
    NOISE,
    PROMPT,
    STEP,
    TASKS,
    CountdownEnv,
    StandInPipeline,
    countdown_fns,
    prompt_code,
    task_of,
)

from cosmos3_gym import VectorPolicy
from cosmos3_gym.policy import Adapter, chunk_seed

LENGTHS = (4, 6, 2)  # episodes end at different steps; env 1 truncates, the others terminate
N_ACTION_STEPS = 3
HORIZON = 4
SEED = 7


def images(batch: int, value: int = 0) -> np.ndarray:
    obs = np.full((batch, 4, 4, 3), value, np.uint8)
    obs[:, 0, 0, 2] = np.arange(batch)  # env id marker
    return obs


def test_call_and_predict_action_chunk_return_float32_chunks_per_env():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, adapter="generic", seed=SEED)
    obs = images(3)
    prompts = ["a", "b", "c"]
    chunks = policy(obs, prompts)
    assert chunks.shape == (3, HORIZON, 6) and chunks.dtype == np.float32
    codes = [[prompt_code(p)] * HORIZON for p in prompts]
    np.testing.assert_array_equal(chunks[:, :, PROMPT], codes)
    again = policy.predict_action_chunk(obs, prompts)
    assert [c["batch"] for c in pipe.calls] == [3, 3]
    # Stochastic: the second call is each env's next chunk, so it draws different noise.
    assert not np.array_equal(chunks[:, :, NOISE], again[:, :, NOISE])


# ---------------------------------------------------------------------------- prompts


def test_swapping_two_envs_prompts_swaps_their_chunks():
    obs = np.full((2, 4, 4, 3), 5, np.uint8)  # identical observations
    a = VectorPolicy(StandInPipeline(), noise="fixed")(obs, ["open the drawer", "push it"])
    b = VectorPolicy(StandInPipeline(), noise="fixed")(obs, ["push it", "open the drawer"])
    np.testing.assert_array_equal(a[0], b[1])
    np.testing.assert_array_equal(a[1], b[0])
    assert not np.array_equal(a[0], a[1])


def test_mixed_task_batch_gives_each_env_its_own_prompts_chunk():
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 255, (3, 8, 8, 3), dtype=np.uint8)
    prompts = ["pick up the cube", "open the drawer", "turn on the stove"]
    pipe = StandInPipeline()
    batched = VectorPolicy(pipe, noise="fixed")(obs, prompts)
    assert pipe.calls[0]["prompts"] == prompts
    for i in range(3):
        single = VectorPolicy(StandInPipeline(), noise="fixed")(obs[i : i + 1], [prompts[i]])
        np.testing.assert_array_equal(batched[i], single[0])


@pytest.mark.parametrize(
    "prompts, message",
    [
        (None, "no prompts"),
        (["a", "b"], "expected 3 prompts"),
        (["a", "", "c"], "prompt for env 1 is ''"),
        (["a", "b", None], "prompt for env 2 is None"),
        (["a", "   ", "c"], "expected a non-empty string"),
    ],
)
def test_missing_or_bad_prompts_raise_and_change_nothing(prompts, message):
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe)
    with pytest.raises(ValueError, match=message):
        policy.select_action(images(3), prompts)
    assert pipe.calls == [] and policy.num_envs is None


def test_a_single_string_prompt_is_used_for_every_env_explicitly():
    pipe = StandInPipeline()
    VectorPolicy(pipe).select_action(images(3), "wipe the table")
    assert pipe.calls[0]["prompts"] == ["wipe the table"] * 3


# ---------------------------------------------------------------------------- bad observations


@pytest.mark.parametrize(
    "obs, message",
    [
        (np.zeros((3, 4, 4, 3), np.float32), "expected uint8 images"),
        (np.zeros((3, 4, 5), np.uint8), "expected rank 4"),  # [B, H, W]: no channel axis
        (np.zeros((2, 4, 4, 3), np.uint8), "has 2 envs; this policy serves 3"),
        ({"a": np.zeros((3, 4, 4, 3), np.uint8), "b": np.zeros((2, 5))}, "share their leading"),
        ("not an observation", "expected an observation array"),
        (np.zeros((0, 4, 4, 3), np.uint8), "observation batch is empty"),
    ],
)
def test_bad_observations_raise_clear_errors_and_change_nothing(obs, message):
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, n_action_steps=2)
    policy.select_action(images(3), ["a", "b", "c"])  # queues: 1 action left per env
    before = policy.queue_lengths
    original = obs.copy() if isinstance(obs, np.ndarray) else obs
    with pytest.raises(ValueError, match=message):
        policy.select_action(obs, ["a", "b", "c"])
    np.testing.assert_array_equal(policy.queue_lengths, before)
    assert len(pipe.calls) == 1
    if isinstance(obs, np.ndarray):
        np.testing.assert_array_equal(obs, original)


def test_batch_size_of_observation_vs_prompts_is_checked():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe)
    message = r"expected 2 prompts, one per env .*\[2, 4, 4, 3\]; found 3"
    with pytest.raises(ValueError, match=message):
        policy.select_action(images(2), ["a", "b", "c"])
    # One image [H, W, C] is one env's observation (B = 1, as the pipeline reads it): its H
    # is not a batch of 64 envs.
    with pytest.raises(ValueError, match=r"expected 1 prompts, one per env .*\[1, 64, 64, 3\]"):
        policy.predict_action_chunk(np.zeros((64, 64, 3), np.uint8), ["a", "b"])
    assert pipe.calls == [] and policy.num_envs is None


def test_one_image_and_one_prompt_are_one_env() -> None:
    image = np.random.default_rng(0).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    chunks = []
    for obs, prompts in ((image, "go"), (image[None], ["go"])):
        pipe = StandInPipeline()
        chunks.append(VectorPolicy(pipe, seed=3).predict_action_chunk(obs, prompts))
        assert len(pipe.calls) == 1 and len(pipe.calls[0]["prompts"]) == 1  # one env planned
    assert chunks[0].shape[0] == 1
    np.testing.assert_array_equal(chunks[0], chunks[1])


def test_a_bad_first_observation_is_caught_before_the_pipeline_is_called():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe)
    with pytest.raises(ValueError, match="expected uint8 images"):
        policy.select_action(np.zeros((3, 4, 4, 3), np.float64), ["a", "b", "c"])
    assert pipe.calls == [] and policy.num_envs is None


def test_a_different_number_of_envs_is_refused():
    policy = VectorPolicy(StandInPipeline())
    policy.select_action(images(3), "a")
    with pytest.raises(ValueError, match="has 2 envs; this policy serves 3"):
        policy.select_action(images(2), "a")


# ---------------------------------------------------------------------------- queues and horizon


def test_select_action_replans_only_envs_whose_queue_is_empty():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, n_action_steps=N_ACTION_STEPS, seed=SEED)
    prompts = ["a", "b", "c"]
    first = policy.select_action(images(3), prompts)
    np.testing.assert_array_equal(first[:, STEP], [0, 0, 0])
    second = policy.select_action(images(3, value=1), prompts)  # popped, not replanned
    np.testing.assert_array_equal(second[:, STEP], [1, 1, 1])
    assert len(pipe.calls) == 1
    policy.reset(mask=np.array([False, True, False]))
    third = policy.select_action(images(3), prompts)
    assert [c["batch"] for c in pipe.calls] == [3, 1]
    np.testing.assert_array_equal(pipe.calls[1]["markers"][:, 2], [1])  # env 1's observation
    np.testing.assert_array_equal(third[:, STEP], [2, 0, 2])
    fourth = policy.select_action(images(3), prompts)  # envs 0, 2 exhausted n_action_steps=3
    assert [c["batch"] for c in pipe.calls] == [3, 1, 2]
    np.testing.assert_array_equal(fourth[:, STEP], [0, 1, 0])
    np.testing.assert_array_equal(policy.last_chunk_record.env_indices, [0, 2])


def test_predict_action_chunk_does_not_touch_the_queues():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, n_action_steps=3)
    policy.select_action(images(3), "a")
    policy.predict_action_chunk(images(3), "a")
    np.testing.assert_array_equal(policy.queue_lengths, [2, 2, 2])
    np.testing.assert_array_equal(policy.select_action(images(3), "a")[:, STEP], [1, 1, 1])
    assert len(pipe.calls) == 2


def test_action_horizon_comes_from_the_pipeline_or_the_first_call():
    assert VectorPolicy(StandInPipeline(horizon=8)).action_horizon == 8
    policy = VectorPolicy(StandInPipeline(horizon=8, expose_horizon=False))
    assert policy.action_horizon is None and policy.n_action_steps is None
    policy.select_action(images(2), "a")
    assert policy.action_horizon == 8 and policy.n_action_steps == 8
    np.testing.assert_array_equal(policy.queue_lengths, [7, 7])


def test_n_action_steps_beyond_the_horizon_is_refused():
    message = "n_action_steps must be <= the action horizon H=4; found 5"
    with pytest.raises(ValueError, match=message):
        VectorPolicy(StandInPipeline(horizon=4), n_action_steps=5)
    pipe = StandInPipeline(horizon=4, expose_horizon=False)
    policy = VectorPolicy(pipe, n_action_steps=5)
    with pytest.raises(ValueError, match="H=4; found 5"):
        policy.select_action(images(2), "a")
    assert policy.num_envs is None and policy.action_horizon is None
    with pytest.raises(ValueError, match="positive int"):
        VectorPolicy(pipe, n_action_steps=0)


def test_sampler_settings_reach_the_pipeline():
    pipe = StandInPipeline()
    VectorPolicy(pipe, num_inference_steps=12, progress=True)(images(1), "a")
    assert pipe.calls[0]["num_inference_steps"] == 12 and pipe.calls[0]["progress"] is True


# ---------------------------------------------------------------------------- autoreset


def run_episodes(vector_cls, mode, *, attach=True, steps=12):
    """Roll the countdown envs with the policy; returns (pipeline calls, executed, actions)."""
    envs = vector_cls(countdown_fns(LENGTHS), autoreset_mode=mode)
    pipe = StandInPipeline(horizon=HORIZON)
    policy = VectorPolicy(pipe, n_action_steps=N_ACTION_STEPS, seed=SEED)
    if attach:
        envs = policy.attach(envs)
    obs, _ = envs.reset(seed=0)
    sent = []
    for _ in range(steps):
        prompts = None if attach else [task_of(i, int(obs[i, 0, 0, 0])) for i in range(3)]
        action = policy.select_action(obs, prompts)
        sent.append(action)
        obs, _, terminated, truncated, _ = envs.step(action)
        done = terminated | truncated
        if mode == AutoresetMode.DISABLED and done.any():
            obs, _ = envs.reset(options={"reset_mask": done})
            if not attach:
                policy.reset(done)
    executed = envs.call("executed")
    envs.close()
    return pipe.calls, executed, np.stack(sent)


# Derived by hand from LENGTHS and N_ACTION_STEPS = 3: an env replans at steps 0 and 3 of its
# episodes. NEXT_STEP adds one reset step per episode (periods 5, 7, 3 calls), during which the
# env is not planned for; SAME_STEP and DISABLED (reset at once) do not (periods 4, 6, 2).
EXPECTED_PLANS = {
    AutoresetMode.NEXT_STEP: [
        (0, [0, 1, 2]), (3, [0, 1, 2]), (5, [0]), (6, [2]), (7, [1]), (8, [0]), (9, [2]),
        (10, [0, 1]),
    ],
    AutoresetMode.SAME_STEP: [
        (0, [0, 1, 2]), (2, [2]), (3, [0, 1]), (4, [0, 2]), (6, [1, 2]), (7, [0]), (8, [0, 2]),
        (9, [1]), (10, [2]), (11, [0]),
    ],
}
EXPECTED_PLANS[AutoresetMode.DISABLED] = EXPECTED_PLANS[AutoresetMode.SAME_STEP]


def check_rollout(calls, executed, sent, mode):
    expected = EXPECTED_PLANS[mode]
    assert [c["batch"] for c in calls] == [len(envs) for _, envs in expected]
    for call, (_, envs) in zip(calls, expected, strict=True):
        episode, step, env = call["markers"].astype(int).T
        np.testing.assert_array_equal(env, envs)
        # Never planned from a final observation (step == episode length) ...
        assert all(s < LENGTHS[e] for e, s in zip(env, step, strict=True))
        # ... only at chunk boundaries, with the prompt of the episode the observation is from,
        # and with the seed of exactly (seed, env, episode, chunk).
        assert all(s % N_ACTION_STEPS == 0 for s in step)
        assert call["prompts"] == [task_of(e, ep) for e, ep in zip(env, episode, strict=True)]
        assert call["seeds"] == [
            chunk_seed(SEED, e, ep, s // N_ACTION_STEPS)
            for e, ep, s in zip(env, episode, step, strict=True)
        ]
    for env_id, history in enumerate(executed):
        assert len(history) > 0
        for episode, step, action in history:
            # Every executed action was planned in this env's current episode for this step.
            assert action[ENV] == env_id and action[EPISODE] == episode and action[STEP] == step
            assert action[PROMPT] == prompt_code(task_of(env_id, episode))
    if mode == AutoresetMode.NEXT_STEP:
        # The reset steps (ignored by the env) got the zero placeholder.
        placeholders = {0: [4, 9], 1: [6], 2: [2, 5, 8, 11]}
        for env_id, calls_at in placeholders.items():
            np.testing.assert_array_equal(sent[calls_at, env_id], 0.0)
            assert len(executed[env_id]) == 12 - len(calls_at)


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_queues_follow_autoreset_under_sync_vector_env(mode):
    check_rollout(*run_episodes(SyncVectorEnv, mode), mode)


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_async_vector_env_gives_the_same_plans_as_sync(mode):
    async_run = run_episodes(AsyncVectorEnv, mode)
    check_rollout(*async_run, mode)
    sync_calls = run_episodes(SyncVectorEnv, mode)[0]
    assert [(c["prompts"], c["seeds"]) for c in async_run[0]] == [
        (c["prompts"], c["seeds"]) for c in sync_calls
    ]


def test_disabled_autoreset_without_attach_uses_reset_mask():
    check_rollout(*run_episodes(SyncVectorEnv, AutoresetMode.DISABLED, attach=False),
                  AutoresetMode.DISABLED)


def test_a_done_env_is_not_replanned_before_the_caller_resets_it_under_disabled():
    envs = SyncVectorEnv(countdown_fns(LENGTHS), autoreset_mode=AutoresetMode.DISABLED)
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, n_action_steps=1)
    envs = policy.attach(envs)
    obs, _ = envs.reset(seed=0)
    for _ in range(2):  # env 2 (length 2) is done after the second step
        obs, *_ = envs.step(policy.select_action(obs))
    action = policy.select_action(obs)
    np.testing.assert_array_equal(action[2], 0.0)
    np.testing.assert_array_equal(pipe.calls[-1]["markers"][:, 2], [0, 1])
    envs.close()


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_an_episode_end_clears_that_envs_queue_and_nothing_else(mode):
    envs = SyncVectorEnv(countdown_fns(LENGTHS), autoreset_mode=mode)
    policy = VectorPolicy(StandInPipeline(horizon=HORIZON), n_action_steps=HORIZON)
    envs = policy.attach(envs)
    obs, _ = envs.reset(seed=0)
    for _ in range(2):  # env 2 (length 2) ends at the second step, envs 0 and 1 run on
        obs, *_ = envs.step(policy.select_action(obs))
    np.testing.assert_array_equal(policy.queue_lengths, [HORIZON - 2, HORIZON - 2, 0])
    envs.close()


def test_attach_reads_prompts_and_explicit_prompts_override_them():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe)
    envs = policy.attach(SyncVectorEnv(countdown_fns(LENGTHS)))
    with pytest.raises(ValueError, match="prompt for env 0 is None|attached env for env 0"):
        policy.select_action(images(3))  # not reset through the wrapper: no prompts yet
    obs, _ = envs.reset(seed=0)
    policy.select_action(obs)
    assert pipe.calls[-1]["prompts"] == [t[0] for t in TASKS]
    policy.reset()
    policy.select_action(obs, ["x", "y", "z"])
    assert pipe.calls[-1]["prompts"] == ["x", "y", "z"]
    envs.close()


class TaskOnlyEnv(CountdownEnv):
    """Names its prompt `task`, as some benchmarks do."""

    task_description = None  # shadows the property; has_wrapper_attr is still True

    @property
    def task(self) -> str:
        return "fold the towel"


class NoTaskEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)
    action_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)


def test_attach_refuses_a_checkpoint_whose_actions_do_not_fit_the_envs():
    from types import SimpleNamespace

    envs = SyncVectorEnv(countdown_fns(LENGTHS))  # Box (6,) actions
    pipe = StandInPipeline(action_dim=10)
    pipe.policy = SimpleNamespace(domain_name="libero")  # as Cosmos3ActionPipeline describes it
    message = (r"the pipeline's checkpoint makes 10-D actions \(domain 'libero'\), which the "
               r"'generic' adapter passes on as 10-D env actions, but the attached envs' action "
               r"space is Box\(-inf, inf, \(6,\), float32\), 6-D\. Fix: .*adapter='libero' is "
               r"the one made for domain 'libero' checkpoints")
    with pytest.raises(ValueError, match=message):
        VectorPolicy(pipe).attach(envs)
    # Through the LIBERO adapter the 10-D actions become 7-D ones: still not 6-D.
    with pytest.raises(ValueError, match="passes on as 7-D env actions, but"):
        VectorPolicy(pipe, adapter="libero").attach(envs)
    narrow = StandInPipeline(action_dim=2)  # the LIBERO adapter takes 10-D actions only
    with pytest.raises(ValueError, match=r"makes 2-D actions \(domain None\), which the 'libero' "
                                         r"adapter cannot take \(libero adapter: expected raw"):
        VectorPolicy(narrow, adapter="libero").attach(envs)
    assert pipe.calls == narrow.calls == []  # refused before any model call
    assert all(env.episode == -1 for env in envs.envs)  # and before any env reset
    envs.close()


def test_attach_needs_a_task_attribute_on_every_env():
    envs = SyncVectorEnv([lambda: CountdownEnv(0, 3, ("a",)), NoTaskEnv])
    with pytest.raises(ValueError, match=r"task_description: \[0\], with task: \[\], of 2"):
        VectorPolicy(StandInPipeline()).attach(envs)


def test_attach_refuses_an_empty_task_description():
    envs = SyncVectorEnv([lambda: TaskOnlyEnv(0, 3, ("a",))])
    policy = VectorPolicy(StandInPipeline())
    envs = policy.attach(envs)
    assert envs.task_attribute == "task_description"
    with pytest.raises(ValueError, match="env 0's task_description is None"):
        envs.reset()


# ---------------------------------------------------------------------------- seeds and RL


def test_an_envs_chunk_does_not_depend_on_which_envs_replan_with_it():
    obs = images(3)
    together = VectorPolicy(pipe_a := StandInPipeline(), seed=SEED)
    together.select_action(obs, "a")
    together.reset()  # all three start episode 1 and replan together
    together.select_action(obs, "a")
    alone = VectorPolicy(pipe_b := StandInPipeline(), seed=SEED)
    alone.select_action(obs, "a")
    alone.reset(np.array([False, True, False]))  # only env 1 starts episode 1
    alone.select_action(obs, "a")
    assert [c["batch"] for c in pipe_a.calls] == [3, 3]
    assert [c["batch"] for c in pipe_b.calls] == [3, 1]
    rec_a, rec_b = together.last_chunk_record, alone.last_chunk_record
    np.testing.assert_array_equal(rec_a.actions[1], rec_b.actions[0])
    np.testing.assert_array_equal(rec_a.action_noise[1], rec_b.action_noise[0])
    assert rec_b.seeds == [chunk_seed(SEED, 1, 1, 0)]


def test_stochastic_seeds_differ_per_env_and_chunk_and_deterministic_ones_do_not():
    policy = VectorPolicy(StandInPipeline(), seed=SEED)
    first = policy(images(3), "a")
    second = policy(images(3), "a")
    seeds = policy.last_chunk_record.seeds
    assert len(set(seeds)) == 3 and seeds == [chunk_seed(SEED, e, 0, 1) for e in range(3)]
    first_noise = {first[e, 0, NOISE] for e in range(3)}
    assert len(first_noise | {second[e, 0, NOISE] for e in range(3)}) == 6
    policy.sampling = policy.sampling.with_changes(noise="fixed")
    third = policy(images(3), "a")
    fourth = policy(images(3), "a")
    assert policy.last_chunk_record.seeds == [SEED] * 3 and not policy.last_chunk_record.fresh_noise
    np.testing.assert_array_equal(third[:, :, NOISE], fourth[:, :, NOISE])
    np.testing.assert_array_equal(third[0, :, NOISE], third[2, :, NOISE])


def test_reset_with_a_seed_restarts_the_noise_schedule():
    policy = VectorPolicy(StandInPipeline(), seed=SEED)
    first = policy(images(2), "a")
    policy(images(2), "a")
    policy.reset(seed=SEED)
    np.testing.assert_array_equal(policy(images(2), "a"), first)
    with pytest.raises(ValueError, match="mask=None"):
        policy.reset(np.array([True, False]), seed=1)


class ScaleAdapter(Adapter):
    """Env actions are the first two raw dims, times ten; prompts get a prefix."""

    name = "scale"

    def prompt(self, task: str) -> str:
        return f"robot: {task}"

    def actions(self, raw: np.ndarray) -> np.ndarray:
        return raw[..., :2] * 10


def test_chunk_record_holds_what_a_learner_needs_and_replays():
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, adapter=ScaleAdapter(), n_action_steps=2, seed=SEED)
    obs = images(3)
    action = policy.select_action(obs, ["a", "b", "c"])
    record = policy.last_chunk_record
    assert len(record) == 3 and action.shape == (3, 2)
    np.testing.assert_array_equal(record.env_indices, [0, 1, 2])
    np.testing.assert_array_equal(record.episode_indices, [0, 0, 0])
    np.testing.assert_array_equal(record.chunk_indices, [0, 0, 0])
    assert record.tasks == ["a", "b", "c"]
    assert record.prompts == ["robot: a", "robot: b", "robot: c"]
    assert record.seeds == pipe.calls[0]["seeds"] == [chunk_seed(SEED, e, 0, 0) for e in range(3)]
    expected_noise = np.random.default_rng(record.seeds[2]).standard_normal((HORIZON, 64))
    np.testing.assert_allclose(record.action_noise[2], expected_noise, rtol=1e-6)
    assert record.raw_actions.shape == (3, HORIZON, 6) and record.actions.shape == (3, HORIZON, 2)
    np.testing.assert_array_equal(record.actions, record.raw_actions[..., :2] * 10)
    np.testing.assert_array_equal(record.normalized_actions, record.raw_actions / 2)
    np.testing.assert_array_equal(action, record.actions[:, 0])
    policy.select_action(obs, ["a", "b", "c"])
    assert policy.last_chunk_record is None  # this step popped; nothing was planned
    replayed = policy.predict_action_chunk(obs, ["a", "b", "c"], action_noise=record.action_noise,
                                           seeds=record.seeds)
    np.testing.assert_array_equal(replayed, record.actions)
    # The recorded seeds reach the pipeline (they draw the video noise) alongside the noise.
    assert pipe.calls[-1]["seeds"] == policy.last_chunk_record.seeds == record.seeds
    assert not policy.last_chunk_record.fresh_noise
    with pytest.raises(ValueError, match="expected 3 seeds, one per planned env; found 2"):
        policy.predict_action_chunk(obs, "a", seeds=record.seeds[:2])
    message = r"action_noise must be \[B=3, 4, 64\]; found \[2, 4, 64\]"
    with pytest.raises(ValueError, match=message):
        policy.predict_action_chunk(obs, "a", action_noise=record.action_noise[:2])
