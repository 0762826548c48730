"""Real-time execution in the policy: per env, on a virtual clock, the env keeps executing its
queue while the next chunk is computed; the chunk's first d actions are dropped; a queue that
runs out first holds (stalls); with RTC the actions executed meanwhile are the next chunk's
first rows."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cosmos3_gym.pipeline.output import ActionOutput
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.policy.realtime import (
    DelayRule,
    HoldRule,
    Latency,
    RealTime,
    parse_latencies,
)

H = 8


class Numbered:
    """A stand-in pipeline whose chunks say where each action came from: row k of the c-th
    chunk planned for an env is ``[100 * c + k, env]``; committed rows come back as given (as
    Cosmos3ActionPipeline returns them). Records every call's committed rows."""

    takes_committed_actions = True
    action_horizon = H

    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep
        self.calls: list[list] = []
        self.count: dict[int, int] = {}

    def __call__(self, images, prompts, *, seed=None, committed_actions=None, **kwargs):
        if self.sleep:
            time.sleep(self.sleep)
        n = len(prompts)
        envs = [int(image[0, 0, 0]) for image in images]  # each env's image names it
        out = np.zeros((n, H, 2), np.float32)
        for i, env in enumerate(envs):
            c = self.count.get(env, 0)
            self.count[env] = c + 1
            out[i, :, 0] = 100 * c + np.arange(H)
            out[i, :, 1] = env
        self.calls.append(committed_actions)
        for i, rows in enumerate(committed_actions or []):
            if rows is not None:
                out[i, :len(rows)] = rows
        noise = np.zeros((n, H, 64), np.float32)
        return ActionOutput(out, out.copy(), noise, list(seed))


def obs_of(num_envs: int) -> np.ndarray:
    obs = np.zeros((num_envs, 8, 8, 3), np.uint8)
    for env in range(num_envs):
        obs[env] = env
    return obs


def realtime(latency: str, **kw) -> RealTime:
    lat = Latency.parse(latency)
    return RealTime(DelayRule(lat, kw.pop("control_hz", None), kw.pop("recorded", None)), **kw)


def run(policy: VectorPolicy, steps: int, num_envs: int = 1):
    """(actions [T, B, 2], held [T, B], records) over ``steps`` calls."""
    actions, held, records = [], [], []
    obs = obs_of(num_envs)
    for _ in range(steps):
        actions.append(policy.select_action(obs, "go"))
        held.append([s is None for s in policy.last_action_sources])
        if policy.last_chunk_record is not None:
            records.append(policy.last_chunk_record)
    return np.array(actions), np.array(held), records


def test_latency_values_parse_to_one_spelling_and_bad_ones_say_what_is_expected() -> None:
    assert [lat.text for lat in parse_latencies("0,2steps,1step,0.25s,250.5ms")] == [
        "0", "2steps", "1steps", "250ms", "250.5ms"]
    assert Latency.parse("0steps").kind == Latency.parse("0ms").kind == "none"
    assert Latency.parse("replay:runs/x").source == "runs/x"
    for bad in ("fast", "3", "-3ms", "1.5steps", "replay:", "3 sec", ""):
        with pytest.raises(ValueError, match="expected 0, a duration"):
            parse_latencies(bad)
    with pytest.raises(ValueError, match="given twice"):
        parse_latencies("100ms,0.1s")
    with pytest.raises(ValueError, match="cannot be an arm"):
        parse_latencies("0,replay:runs/x")
    with pytest.raises(ValueError, match="control rate"):
        DelayRule(Latency.parse("150ms"))


def test_the_env_executes_the_old_chunk_while_the_next_is_computed_then_drops_d_actions() -> None:
    d = 3
    policy = VectorPolicy(Numbered(), adapter="generic", realtime=realtime(f"{d}steps"))
    actions, held, records = run(policy, 20)
    first = actions[:, 0, 0]
    # The first chunk is awaited at rest and runs from row 0; the next is asked for with d
    # actions left (step 5 of 8) and arrives at step 8, from its row d (the rows for steps
    # 5..7 are in the past); it runs rows 3..7, the next is asked for at step 10 ...
    np.testing.assert_array_equal(first[:8], np.arange(8))
    np.testing.assert_array_equal(first[8:13], 100 + np.arange(3, 8))
    np.testing.assert_array_equal(first[13:18], 200 + np.arange(3, 8))
    assert not held.any()
    timing = [r.timing for r in records]
    assert [int(t.request_step[0]) for t in timing] == [0, 5, 10, 15]
    assert [int(t.delay[0]) for t in timing] == [d] * 4
    assert [int(t.dropped[0]) for t in timing] == [0, d, d, d]
    assert [int(t.stalls[0]) + int(t.superseded[0]) for t in timing] == [0, 0, 0, 0]


def test_a_queue_that_runs_out_first_holds_and_counts_stalls() -> None:
    policy = VectorPolicy(Numbered(), adapter="generic",
                          realtime=realtime("4steps", replan_at=1, hold=HoldRule("still")))
    actions, held, records = run(policy, 16)
    # Asked for at step 7 (1 action left), arriving at 11: steps 8..10 hold a zero action.
    assert held[:, 0].tolist() == [False] * 8 + [True] * 3 + [False] * 4 + [True]
    np.testing.assert_array_equal(actions[8:11, 0], 0.0)
    np.testing.assert_array_equal(actions[11:15, 0, 0], 100 + np.arange(4, 8))
    assert int(records[1].timing.stalls[0]) == 3 and int(records[1].timing.request_step[0]) == 7


def test_a_late_request_supersedes_what_was_left() -> None:
    policy = VectorPolicy(Numbered(), adapter="generic",
                          realtime=realtime("2steps", replan_at=5, hold=HoldRule("repeat")))
    actions, _, records = run(policy, 8)
    # Asked for at step 3 (5 left), arriving at 5: the old rows 5..7 are superseded.
    np.testing.assert_array_equal(actions[:, 0, 0], [0, 1, 2, 3, 4, 102, 103, 104])
    assert int(records[1].timing.superseded[0]) == 3


def test_envs_of_one_batch_keep_their_own_clocks() -> None:
    policy = VectorPolicy(Numbered(), adapter="generic", realtime=realtime("2steps"),
                          n_action_steps=4)
    obs = obs_of(2)
    policy.select_action(obs, "go")
    policy.select_action(obs, "go")
    policy.reset(np.array([False, True]))  # env 1 starts over two steps later
    actions = np.array([policy.select_action(obs, "go") for _ in range(10)])
    # n = 4 per chunk: env 0 runs rows 0..3, then rows 2..5 of each next chunk, asked for with
    # 2 left; env 1 the same, two steps later (its chunks count on: the pipeline numbers them).
    np.testing.assert_array_equal(actions[:, 0, 0], [2, 3, 102, 103, 104, 105, 202, 203, 204,
                                                     205])
    np.testing.assert_array_equal(actions[:, 1, 0], [100, 101, 102, 103, 202, 203, 204, 205,
                                                     302, 303])


def test_rtc_commits_the_actions_executed_during_inference_as_the_next_chunks_first_rows(
        ) -> None:
    pipeline = Numbered()
    d = 3
    policy = VectorPolicy(pipeline, adapter="generic", realtime=realtime(f"{d}steps", rtc=True))
    actions, _, records = run(policy, 13)
    assert pipeline.calls[0] is None  # the first chunk: nothing executes before it
    second = records[1]
    np.testing.assert_array_equal(second.committed[0], actions[5:8, 0])  # what ran at 5..7
    np.testing.assert_array_equal(second.raw_actions[0, :d], actions[5:8, 0])
    assert int(second.timing.committed[0]) == d
    # Then the chunk goes on from its row d, the first row not committed.
    np.testing.assert_array_equal(actions[8:13, 0, 0], 100 + np.arange(3, 8))


def test_rtc_needs_a_pipeline_that_takes_committed_rows() -> None:
    class Plain(Numbered):
        takes_committed_actions = False

    with pytest.raises(ValueError, match="takes no committed action rows"):
        VectorPolicy(Plain(), adapter="generic", realtime=realtime("2steps", rtc=True))


def test_measured_delays_are_each_calls_wall_time_in_steps() -> None:
    hz = 100.0
    policy = VectorPolicy(Numbered(sleep=0.03), adapter="generic",
                          realtime=realtime("measured", control_hz=hz))
    _, _, records = run(policy, 24)
    assert len(records) >= 3
    for record in records:
        t = record.timing
        assert t.delay[0] == int(np.ceil(t.latency_s[0] * hz - 1e-9)) >= 3
    # A request expects the previous chunk's delay: it is asked for when that many actions are
    # left of the previous chunk once it arrived (an episode's first arrives at once).
    for before, after in zip(records, records[1:], strict=False):
        t = before.timing
        d = int(t.delay[0])
        arrival = int(t.request_step[0]) + (d if before.chunk_indices[0] else 0)
        installed = H - int(t.dropped[0])
        assert int(after.timing.request_step[0]) == arrival + max(0, installed - d)


def test_a_replay_takes_each_chunks_recorded_delay_and_refuses_a_chunk_it_lacks() -> None:
    recorded = {0: [5, 2, 4]}
    policy = VectorPolicy(Numbered(), adapter="generic",
                          realtime=realtime("replay:somewhere", recorded=recorded))
    _, _, records = run(policy, 13)
    assert [int(r.timing.delay[0]) for r in records] == [5, 2, 4]
    # Each asked for as the recorded run did: when the queue held the previous chunk's delay.
    assert [int(r.timing.request_step[0]) for r in records] == [0, 3, 9]
    with pytest.raises(ValueError, match="asks for its chunk 3.*holds 3 chunks"):
        run(policy, 10)


def test_a_replay_asks_for_its_chunks_where_the_recorded_run_did() -> None:
    """A replay expects each chunk's delay to be the previous chunk's, as the measured run it
    repeats did: after a short last delay the env runs on, asking (replans_next, as the runner
    does every step) only about the replanning point, never for a delay the run lacks."""
    policy = VectorPolicy(Numbered(), adapter="generic",
                          realtime=realtime("replay:somewhere", recorded={0: [2, 1]}))
    obs, delays = obs_of(1), []
    for _ in range(30):
        policy.select_action(obs, "go")
        if policy.last_chunk_record is not None:
            delays.append(int(policy.last_chunk_record.timing.delay[0]))
        if policy.replans_next().any():
            if len(delays) == 2:
                break
    assert delays == [2, 1]
    assert policy.queue_lengths[0] == 1  # asks at the previous delay (1), not before
    with pytest.raises(ValueError, match="asks for its chunk 2.*holds 2 chunks"):
        policy.select_action(obs, "go")


def test_an_ended_episode_forgets_its_chunk_in_flight() -> None:
    policy = VectorPolicy(Numbered(), adapter="generic", realtime=realtime("3steps"))
    run(policy, 6)  # the second chunk is in flight
    policy.end_episodes(np.array([True]))
    assert not policy.replans_next().any()
    policy.reset(np.array([True]))
    assert policy.replans_next().all()
    actions, _, records = run(policy, 2)
    np.testing.assert_array_equal(actions[:, 0, 0], [200, 201])  # a fresh first chunk, row 0


def test_hold_rules() -> None:
    last = np.array([0.3, -0.1, -1.0], np.float32)
    np.testing.assert_array_equal(HoldRule("repeat").action(last), last)
    np.testing.assert_array_equal(HoldRule("still").action(last), [0, 0, 0])
    np.testing.assert_array_equal(HoldRule("still-gripper").action(last), [0, 0, -1])
    with pytest.raises(ValueError, match="hold must be one of"):
        HoldRule("freeze")
