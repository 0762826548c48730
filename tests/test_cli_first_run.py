"""The command line as a new user meets it: failed starts that do not block the fix, Ctrl-C and
reruns of finished runs that end cleanly, bad paths and values as one ``error:`` line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_gym.eval.cli import main
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import format_table, read_episode_records
from cosmos3_gym.pipeline import SamplerConfig

TASKS = ["red", "green", "blue"]


def eval_args(checkpoint: Path | str, out: Path, *extra: str) -> list[str]:
    return ["eval", "--checkpoint", str(checkpoint), "--tasks", ",".join(TASKS), "--trials", "2",
            "--num-envs", "1", "--seed", "7", "--image-size", "32", "--max-episode-steps", "6",
            "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra]


def one_error_line(capsys: pytest.CaptureFixture, exit_info: pytest.ExceptionInfo) -> str:
    """The error a command ended with, checked to be one line, exit status 2, no traceback."""
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len([line for line in lines if "error:" in line]) == 1, err
    return lines[-1]


def test_a_failed_start_does_not_block_the_corrected_rerun(checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:  # a wrong checkpoint path
        main(eval_args(tmp_path / "no_such_checkpoint", out))
    assert "no checkpoint folder at" in one_error_line(capsys, exit_info)
    assert not (out / "config.json").exists()  # refused before the folder was written
    # An attempt that failed later, after binding the folder but before recording an episode
    # (its envs would not build, say), left its config and an incident: both go.
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text(json.dumps({"identity": {"checkpoint": "elsewhere"}}))
    (out / "incidents.jsonl").write_text(json.dumps({"time": 0, "kind": "crash"}) + "\n")

    assert main(eval_args(checkpoint, out)) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["episodes"] == 6 and results["incidents"] == []
    assert json.loads((out / "config.json").read_text())["identity"]["checkpoint"] == str(
        checkpoint)

    # Once an episode is recorded the folder's identity binds: another evaluation is refused.
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(eval_args(checkpoint, out, "--trials", "3"))
    assert "holds a different evaluation" in one_error_line(capsys, exit_info)


def test_rerunning_a_finished_eval_prints_its_stored_results(checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(eval_args(checkpoint, out)) == 0
    first = capsys.readouterr().out
    stored = json.loads((out / "results.json").read_text())
    throughput_file = (out / "throughput.json").read_text()
    assert stored["throughput"]["episodes"] == 6 and stored["throughput"]["wall_s"] > 0

    assert main(eval_args(checkpoint, out)) == 0
    again = capsys.readouterr().out
    assert again.startswith(f"{out} is complete: its 6 episodes were recorded before")
    assert format_table(stored) in again and format_table(stored) in first
    assert "0.000 episodes/s" not in again
    assert json.loads((out / "results.json").read_text())["throughput"] == stored["throughput"]
    assert (out / "throughput.json").read_text() == throughput_file


# The `cosmos3-gym` CLI, except that the pipeline's call after the episode log reached two
# records says "blocked" on stdout and waits: the test interrupts it there, with an episode in
# flight. It waits on the word, not on a clock.
_CLI_THAT_BLOCKS_AFTER_TWO_EPISODES = """
import signal, sys, threading
from pathlib import Path
# A Python started with SIGINT ignored (a background job, nohup) never turns it into
# KeyboardInterrupt: restore the handler a terminal's Ctrl-C reaches, which this test imitates.
signal.signal(signal.SIGINT, signal.default_int_handler)
from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline

log = Path(sys.argv[1])
original = Cosmos3ActionPipeline.__call__

def call(self, *args, **kwargs):
    if log.exists() and len(log.read_text().splitlines()) >= 2:
        print("blocked", flush=True)
        threading.Event().wait()
    return original(self, *args, **kwargs)

Cosmos3ActionPipeline.__call__ = call
sys.exit(main(sys.argv[2:]))
"""


def test_ctrl_c_ends_with_one_line_and_the_same_command_resumes(checkpoint, tmp_path) -> None:
    out = tmp_path / "run"
    args = eval_args(checkpoint, out)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI_THAT_BLOCKS_AFTER_TWO_EPISODES, str(out / "episodes.jsonl"),
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = proc.stdout.readline()  # returns at the word, or at the run's end (EOF)
        assert said == "blocked\n", f"the run ended before it could be interrupted: {said!r}"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)  # a run deaf to SIGINT fails, not hangs
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    saved = len(read_episode_records(out))
    assert saved == 2
    assert stderr.splitlines() == [
        f"cosmos3-gym eval: interrupted; {out} holds 2 finished episodes; rerun the same "
        "command to resume (finished episodes are not run again)"
    ]
    # Rerunning the same command finishes the run without repeating an episode.
    assert main(args) == 0
    assert len(read_episode_records(out)) == 6
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 6


def test_out_naming_a_file_is_one_error_line(checkpoint, tmp_path, capsys) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("not a folder")
    for out in (taken, taken / "run"):
        rollout = ["rollout", "--env-steps", "2", "--out", str(out)]
        for command in (eval_args(checkpoint, out), rollout):
            with pytest.raises(SystemExit) as exit_info:
                main(command)
            line = one_error_line(capsys, exit_info)
            assert f"{taken} is a file; expected a folder" in line
    assert taken.read_text() == "not a folder"


def test_rollout_into_a_folder_with_rollouts_is_refused_before_loading(tmp_path, capsys,
                                                                        monkeypatch) -> None:
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def no_loading(*args, **kwargs):
        raise AssertionError("the model must not load for a folder that is refused")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", no_loading)
    for held in ("meta.json", "shard-00000.npz"):  # a finished, or an interrupted, collection
        out = tmp_path / held.split(".")[0]
        out.mkdir()
        (out / held).write_bytes(b"{}")
        with pytest.raises(SystemExit) as exit_info:
            main(["rollout", "--env-steps", "2", "--out", str(out)])
        line = one_error_line(capsys, exit_info)
        assert f"{out} already holds rollouts ({held}); expected a new or empty folder" in line


@pytest.mark.parametrize("value", ["0", "-5", "two"])
def test_step_limits_below_one_are_refused_up_front(checkpoint, tmp_path, capsys, value) -> None:
    out = tmp_path / "run"
    args = eval_args(checkpoint, out)
    args[args.index("--max-episode-steps") + 1] = value
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    line = one_error_line(capsys, exit_info)
    assert line.endswith(f"argument --max-episode-steps: expected an integer >= 1; found "
                         f"{value if value != 'two' else repr(value)}")
    assert not out.exists()
    with pytest.raises(ValueError, match="max_episode_steps must be an integer >= 1; found 0"):
        EvalConfig(max_episode_steps=0)


def test_summary_table_shows_out_of_range_and_invalid_actions(checkpoint, tmp_path,
                                                              capsys) -> None:
    config = EvalConfig(checkpoint=str(checkpoint), tasks=TASKS, trials=2, num_envs=3, seed=7,
                        image_size=32, max_episode_steps=6,
                        sampling=SamplerConfig(num_inference_steps=2), progress=False)
    results = evaluate(config, tmp_path)
    assert capsys.readouterr().out == format_table(results) + "\n"  # Python prints it too
    assert evaluate(config, tmp_path, summary=False) == results  # complete: nothing reran
    assert capsys.readouterr().out == ""
    # The tiny random checkpoint steps outside the [-1, 1] box (the env clips): counted.
    assert results["out_of_range_episodes"] > 0
    table = format_table(results)
    assert (f"out-of-range actions: {results['out_of_range_episodes']} of 6 episodes sent an "
            "action outside the action space") in table
    clean = {**results, "out_of_range_episodes": 0, "invalid_action_episodes": 2}
    table = format_table(clean)
    assert "out-of-range" not in table
    assert "invalid actions: 2 of 6 episodes failed on an invalid action" in table
    assert "invalid" not in format_table({**clean, "invalid_action_episodes": 0})


def test_the_time_line_tells_model_env_and_the_loop_apart() -> None:
    """A one-episode LIBERO run printed "the loop adds 35172.7% to its call time": the env's
    time counted as the loop's. Two processes' sessions, merged as results.json merges them."""
    from cosmos3_gym.eval.results import merge_throughput, summarize

    sessions = [{"episodes": 1, "env_steps": 300, "chunks": 20, "wall_s": 21.0,
                 "pipeline_s": 0.5, "env_s": 20.3, "device": "cpu", "dtype": "float32"},
                {"episodes": 1, "env_steps": 280, "chunks": 19, "wall_s": 20.9,
                 "pipeline_s": 0.7, "env_s": 20.0, "device": "cpu", "dtype": "float32"}]
    throughput = merge_throughput(sessions)
    results = summarize([], config={}, task_names=["t"], expected_episodes=2,
                        throughput=throughput)
    lines = [line for line in format_table(results).splitlines() if line.startswith("time:")]
    assert lines == ["time: model 1.2 s, env 40.3 s, loop 0.4 s (1.0% of the run); "
                     "343 episodes/hour"]  # 2 episodes in 21 s
    # A session from before the time split has no line.
    old = merge_throughput([{k: v for k, v in s.items() if k not in ("pipeline_s", "env_s")}
                            for s in sessions])
    assert "time:" not in format_table({**results, "throughput": old})


def test_help_reads_as_text_and_every_train_option_says_what_it_does(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and "cosmos3-gym eval --trials 10" in text

    from cosmos3_gym.eval.cli import parsers

    options = [a for a in parsers()["train"]._actions if a.option_strings and a.dest != "help"]
    assert len(options) > 20
    assert [a.option_strings[0] for a in options if not (a.help or "").strip()] == []
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for action in options:
        assert action.option_strings[0] in text


def test_the_interrupted_line_of_every_command_says_how_to_go_on(tmp_path) -> None:
    from cosmos3_gym.eval.cli import build_parser, interrupted_line

    def said(argv: list[str]) -> str:
        args = build_parser().parse_args(argv)
        return interrupted_line(argv[0], args)

    assert said(["report", str(tmp_path)]) == "it only reads runs; rerun the same command"
    out = tmp_path / "b.json"
    assert said(["bench", "--out", str(out)]) == f"nothing written ({out} is written at the end)"
    assert "are kept; rerun the same command to collect the remaining steps" in said(
        ["rollout", "--env-steps", "8", "--out", str(tmp_path / "r")]
    )
    assert "holds 0 finished episodes; rerun the same command to resume" in said(
        ["eval", "--out", str(tmp_path / "e")]
    )
