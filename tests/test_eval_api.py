"""``cosmos3_gym.evaluate``: evaluation as one call from a training loop (eval/api.py).

The model in memory is evaluated as it is (nothing loaded or copied), in eval mode without
autograd, and the caller's modes, grad flags and random number generators are restored; a run
folder never answers for other weights; the call names the model it evaluated truthfully."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import cosmos3_gym
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.runner.folder import RunMismatch

# Small and fast: 2 tasks x 2 trials, 32 px frames, 6 steps, 2 denoising steps.
SMALL = dict(trials=2, tasks=["red", "green"], num_envs=2, image_size=32, max_episode_steps=6,
             num_inference_steps=2)
FIELDS = ("task", "trial", "seed", "obs_sha256", "steps", "return", "success")

# Files Python opens under a watched folder while ``_OPENED`` is a list (an audit hook cannot be
# removed, so one hook serves the module and records only while a test asks it to).
_WATCH: list[Path] = []
_OPENED: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _WATCH and isinstance(args[0], (str, bytes, os.PathLike)):
        try:
            path = Path(os.fsdecode(args[0])).resolve()
        except (TypeError, ValueError, OSError):
            return
        if any(path.is_relative_to(root) for root in _WATCH):
            _OPENED.append(str(path))


sys.addaudithook(_audit)


def lines(results: Any) -> list[list[Any]]:
    return [[r[k] for k in FIELDS] for r in results.episodes]


class NoisyModel:
    """A pipeline as a training loop may hold one: it draws from every global random number
    generator on each call (as dropout or a user's hook would) and notes the mode it ran in."""

    def __init__(self, pipe: Cosmos3ActionPipeline) -> None:
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.seen: list[tuple[bool, bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        torch.rand(3), np.random.rand(3), random.random()
        self.seen.append((self.transformer.training, torch.is_grad_enabled()))
        return self.pipe(*args, **kwargs)


def one_optimiser_step(pipe: Cosmos3ActionPipeline) -> None:
    """One SGD step of weight decay on every trainable weight: the same bits on any copy."""
    params = [p for p in pipe.transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.05)
    loss = sum(p.square().sum() for p in params)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def caller_state(model: torch.nn.Module) -> tuple[Any, ...]:
    return ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()],
            torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())


def assert_same_state(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert before[0] == after[0] and before[1] == after[1]
    assert torch.equal(before[2], after[2])
    assert np.array_equal(before[3], after[3]) and before[4] == after[4]


def test_a_training_loop_evaluates_its_weights_in_memory_and_gets_its_state_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos3_gym.formats import resolve_checkpoint

    pipe = Cosmos3ActionPipeline.from_pretrained("tiny", trainable=True)
    model = pipe.transformer
    model.layers[0].self_attn.to_q.weight.requires_grad_(False)  # a frozen part stays frozen
    model.layers[1].eval()  # and a submodule's own mode stays its own
    noisy = NoisyModel(pipe)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)

    before = caller_state(model)
    first = cosmos3_gym.evaluate(noisy, "color_reach", **SMALL)
    assert_same_state(before, caller_state(model))
    assert noisy.seen and set(noisy.seen) == {(False, False)}  # eval mode, no autograd inside
    assert first.complete and first.out is None and len(first.episodes) == 4

    one_optimiser_step(pipe)
    # The second call loads nothing: no file of the checkpoint folder is opened, and nothing
    # is built from one.
    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", _refuse)
    _WATCH.append(resolve_checkpoint("tiny").resolve())
    try:
        before = caller_state(model)
        second = cosmos3_gym.evaluate(noisy, "color_reach", **SMALL)
        opened = list(_OPENED)
    finally:
        _WATCH.clear()
        _OPENED.clear()
        monkeypatch.undo()
    assert opened == []
    assert_same_state(before, caller_state(model))

    # Its episodes are those of the changed weights: a fresh copy given the same step gives
    # the same records, and they are not the first call's.
    fresh = Cosmos3ActionPipeline.from_pretrained("tiny", trainable=True)
    one_optimiser_step(fresh)
    again = cosmos3_gym.evaluate(fresh, "color_reach", **SMALL)
    assert lines(second) == lines(again)
    assert [r[3] for r in lines(second)] != [r[3] for r in lines(first)]
    assert second.document["config"]["checkpoint"] == "tiny"  # the folder it was loaded from


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("evaluate() loaded a checkpoint")


@pytest.fixture(scope="module")
def tiny_pipe() -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained("tiny")


def test_a_run_folder_never_answers_for_other_weights(tmp_path: Path) -> None:
    """Refused with one line naming ``weights``, the folder unchanged; the same weights
    resume it (nothing runs again)."""
    pipe = Cosmos3ActionPipeline.from_pretrained("tiny")
    out = tmp_path / "run"
    small = {**SMALL, "tasks": ["red"], "trials": 1}
    first = cosmos3_gym.evaluate(pipe, "color_reach", out=out, **small)
    assert first.out == out and (out / "episodes.jsonl").is_file()
    assert cosmos3_gym.evaluate(pipe, "color_reach", out=out, **small).episodes == first.episodes
    stored = files(out)
    with torch.no_grad():
        pipe.transformer.proj_out.weight.add_(0.5)
    with pytest.raises(RunMismatch, match="weights") as refused:
        cosmos3_gym.evaluate(pipe, "color_reach", out=out, **small)
    assert "\n" not in str(refused.value)
    assert files(out) == stored


def files(folder: Path) -> dict[str, bytes]:
    """A run folder's files and their bytes (not the lock, which names its last holder)."""
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".")}


def test_a_pipeline_is_named_by_its_own_folder_never_the_default(tmp_path: Path) -> None:
    """A pipeline loaded from another folder is named by that folder (results.json said
    ``tiny``, the settings' default); one made in memory is ``in memory``."""
    from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

    folder = write_tiny_checkpoint(tmp_path / "mine", policy_overrides=COLOR_REACH_POLICY)
    pipe = Cosmos3ActionPipeline.from_pretrained(folder)
    small = {**SMALL, "tasks": ["red"], "trials": 1}
    named = cosmos3_gym.evaluate(pipe, "color_reach", out=tmp_path / "a", **small)
    assert named.document["config"]["checkpoint"] == str(folder)
    stored = json.loads((tmp_path / "a" / "config.json").read_text())["identity"]
    assert stored["checkpoint"] == str(folder) and len(stored["weights"]) == 16
    loose = Cosmos3ActionPipeline(pipe.transformer, pipe.vae, pipe.tokenizer, pipe.policy)
    assert cosmos3_gym.evaluate(loose, "color_reach", **small).document["config"][
        "checkpoint"] == "in memory"


def test_a_vector_policy_keeps_its_adapter_steps_and_sampler(
        tiny_pipe: Cosmos3ActionPipeline) -> None:
    from cosmos3_gym.policy import VectorPolicy

    small = {**{k: v for k, v in SMALL.items() if k != "num_inference_steps"}, "tasks": ["red"]}
    policy = VectorPolicy(tiny_pipe, adapter="generic", n_action_steps=2, num_inference_steps=2)
    through_policy = cosmos3_gym.evaluate(policy, "color_reach", **small)
    direct = cosmos3_gym.evaluate(tiny_pipe, "color_reach", n_action_steps=2,
                                  num_inference_steps=2, **small)
    assert lines(through_policy) == lines(direct)
    assert through_policy.document["protocol"]["actions_per_chunk"] == 2
    with pytest.raises(ValueError, match="holds its own"):
        cosmos3_gym.evaluate(policy, "color_reach", n_action_steps=3, **small)


def test_the_results_object_reads_the_results_document(tiny_pipe: Cosmos3ActionPipeline,
                                                       tmp_path: Path) -> None:
    results = cosmos3_gym.evaluate(tiny_pipe, "color_reach", out=tmp_path / "run", **SMALL)
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results.to_dict() == document
    assert results.success_rate == document["success_rate"]
    assert list(results.interval) == document["interval"]
    assert results.per_task["green"] == document["per_task"]["green"]
    assert results.returns == [r["return"] for r in results.episodes]
    assert [(r["task"], r["trial"]) for r in results.episodes] == [
        ("red", 0), ("red", 1), ("green", 0), ("green", 1)]
    assert results.table().splitlines()[0].split() == ["task", "success", "n", "95%", "interval"]
    results.to_dict()["success_rate"] = -1.0  # a copy
    assert results.success_rate == document["success_rate"]


@pytest.mark.parametrize(("policy", "env", "given", "error", "match"), [
    ("tiny", "color_reach", {"trails": 2}, TypeError, r"unknown settings \['trails'\]"),
    ("PIPE", "color_reach", {"checkpoint": "tiny"}, ValueError, "one in memory"),
    ("PIPE", "color_reach", {"device": "cuda"}, ValueError, r"\['device'\] choose"),
    ("tiny", "colour_reach", {}, ValueError, "unknown env 'colour_reach'"),
    (3, "color_reach", {}, TypeError, "policy must be"),
    ("tiny", 3, {}, TypeError, "env must be"),
    ("tiny", "libero:libero_10", {"suite": "libero_goal"}, ValueError, "give one"),
    ("tiny", "color_reach", {"trials": 0}, ValueError, "trials must be an integer >= 1"),
    ("tiny", "color_reach", {"shard": "2/2"}, ValueError, "shard must be 'I/N'"),
    ("tiny", "color_reach", {"repeats": 2}, ValueError, "repeats would run arms"),
    ("tiny", "color_reach", {"latency": "0,2steps"}, ValueError,
     "latency 0,2steps would run arms"),
])
def test_bad_arguments_are_one_error_before_anything_is_written(
        tiny_pipe: Cosmos3ActionPipeline, tmp_path: Path, policy: Any, env: Any,
        given: dict[str, Any], error: type[Exception], match: str) -> None:
    out = tmp_path / "out"
    policy = tiny_pipe if policy == "PIPE" else policy
    with pytest.raises(error, match=match) as raised:
        cosmos3_gym.evaluate(policy, env, out=out, **given)
    assert "\n" not in str(raised.value)
    assert not out.exists()


def test_the_config_level_call_refuses_no_folder_in_one_line() -> None:
    from cosmos3_gym.eval.evaluate import EvalConfig, evaluate

    with pytest.raises(ValueError, match=r"cosmos3_gym\.evaluate\(policy, env, out=None\)"):
        evaluate(EvalConfig(trials=1), None)  # type: ignore[arg-type]


# Each rank of a torchrun launch evaluates a checkpoint without a folder and prints what it got.
_RANK = r"""
import json, os, sys
import cosmos3_gym

results = cosmos3_gym.evaluate(sys.argv[1], "color_reach", tasks=["red", "blue"], trials=2,
                               num_envs=2, image_size=32, max_episode_steps=5,
                               num_inference_steps=2, seed=5)
print("RESULT " + json.dumps({
    "rank": int(os.environ.get("RANK", "0")), "out": results.out,
    "lines": [[r[k] for k in ("task", "trial", "seed", "obs_sha256", "success")]
              for r in results.episodes],
    "ran_on": sorted({r["rank"] for r in results.episodes}),
    "interval": list(results.interval), "complete": results.complete}))
"""


@pytest.mark.slow
def test_under_torchrun_every_rank_gets_the_whole_run(tmp_path: Path) -> None:
    import socket
    import subprocess

    from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", policy_overrides=COLOR_REACH_POLICY)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def results(*launch: str) -> list[dict[str, Any]]:
        done = subprocess.run([sys.executable, *launch, "-c", _RANK, str(checkpoint)],
                              env=env, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        return sorted((json.loads(line.removeprefix("RESULT "))
                       for line in done.stdout.splitlines() if line.startswith("RESULT ")),
                      key=lambda r: r["rank"])

    alone = results()
    ranks = results("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                    "127.0.0.1", "--master_port", str(port), "--no-python",
                    sys.executable)
    assert [r["rank"] for r in ranks] == [0, 1]
    for got in ranks:
        assert got["ran_on"] == [0, 1] and got["complete"] and got["out"] is None
        assert got["lines"] == alone[0]["lines"] and got["interval"] == alone[0]["interval"]
