"""Everything that can be known before the model runs is checked before it runs, each one
``error:`` line that points at the fix: someone else's folder as ``--out``, a missing extra, a
renderer that cannot start, a flag that would be ignored; and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos3_gym.eval.cli import main

DOCS = Path(__file__).resolve().parent.parent / "docs"


def refused(capsys, argv: list[str], *, code: int = 2) -> str:
    """The one error line ``argv`` ends with (exit ``code``, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b""
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("command", [
    ["eval", "--trials", "1", "--no-progress"],
    ["rollout", "--env-steps", "2", "--no-progress"],
    ["rl", "grpo", "--iterations", "1", "--no-progress"],
    ["train"],
])
def test_a_folder_that_holds_no_run_is_refused_and_left_as_it_was(command, tmp_path,
                                                                  capsys) -> None:
    """``--out docs``: the project's own docs are not empty and hold no run; nothing is written
    into them (eval used to run there, writing its files among the pages)."""
    import shutil

    docs = Path(shutil.copytree(DOCS, tmp_path / "docs"))
    before = listing(docs)
    line = refused(capsys, [*command, "--out", str(docs)])
    assert "is not empty (" in line and "holds no run of cosmos3-gym" in line, line
    assert "Give a new folder" in line
    assert listing(docs) == before


def test_an_empty_folder_and_a_folder_of_ours_are_taken(tmp_path) -> None:
    from cosmos3_gym.runner import RunFolder

    empty = tmp_path / "empty"
    empty.mkdir()
    RunFolder(empty, kind="evaluation").check_free()
    with RunFolder(empty, kind="evaluation"):
        pass
    (empty / "notes.txt").write_text("mine")  # the folder holds its lock: it is a run's
    RunFolder(empty, kind="evaluation").check_free()


def test_rollout_as_a_lerobot_dataset_without_lerobot_is_refused_before_it_runs(
    tmp_path, capsys, monkeypatch
) -> None:
    import sys

    for name in ("lerobot", "lerobot.datasets", "lerobot.datasets.lerobot_dataset"):
        monkeypatch.setitem(sys.modules, name, None)  # LeRobot not installed
    out = tmp_path / "rollouts"
    line = refused(capsys, ["rollout", "--env-steps", "2", "--format", "lerobot",
                            "--no-progress", "--out", str(out)])
    assert "--format lerobot writes a LeRobot dataset, and LeRobot is not importable" in line
    assert "docs/lerobot.md" in line and "--format npz" in line
    assert not out.exists()  # nothing ran, nothing written


MANISKILL = ["eval", "--synthetic", "tiny", "--env", "maniskill", "--trials", "1",
             "--max-episode-steps", "3", "--no-progress"]


def test_maniskill_without_a_vulkan_driver_is_one_line_with_the_fix(tmp_path, capsys,
                                                                    monkeypatch) -> None:
    """SAPIEN's ``vk::createInstanceUnique: ErrorIncompatibleDriver`` (a missing or too old
    Vulkan driver) was a 40-line traceback; it is one error line naming the driver to install,
    before the model loads. Where ManiSkill3 is installed, on the real simulator with the Vulkan
    loader pointed at no driver (a process of its own: the loader reads its variables once);
    everywhere, with SAPIEN's error raised where it is raised."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("mani_skill") is not None:
        out = tmp_path / "real"
        done = subprocess.run(
            [sys.executable, "-m", "cosmos3_gym.eval.cli", *MANISKILL, "--out", str(out)],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "VK_ICD_FILENAMES": str(tmp_path / "no-driver.json")})
        errors = [line for line in done.stderr.splitlines() if ": error: " in line]
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(errors) == 1 and "ErrorIncompatibleDriver" in errors[0], done.stderr
        assert "mesa-vulkan-drivers" in errors[0] and not out.exists()
    from cosmos3_gym.envs.gym_eval import GymEval

    def no_driver(self, *args, **kwargs):
        raise RuntimeError("vk::createInstanceUnique: ErrorIncompatibleDriver")

    monkeypatch.setattr(GymEval, "single_action_space", no_driver)
    line = refused(capsys, [*MANISKILL, "--out", str(tmp_path / "patched")])
    assert line.startswith("cosmos3-gym eval: error: --env maniskill: ManiSkill3 renders "
                           "through Vulkan and found no driver it can use")
    assert "apt-get install mesa-vulkan-drivers" in line and "VK_ICD_FILENAMES" in line
    assert not (tmp_path / "patched").exists()


SYNTHETIC = ["eval", "--synthetic", "tiny", "--trials", "1", "--max-episode-steps", "3",
             "--no-progress"]
SIMULATORS = {"libero": ["--env", "libero", "--suite", "libero_10", "--tasks", "0"],
              "metaworld": ["--env", "metaworld", "--tasks", "reach-v3"]}


@pytest.mark.parametrize("env", list(SIMULATORS))
def test_a_missing_simulator_extra_is_one_line_naming_it(env, tmp_path, capsys,
                                                         monkeypatch) -> None:
    """Without the extra, LIBERO was a traceback from the first task lookup and Meta-World six
    env faults in a row before the run gave up; both are refused before the model loads."""
    import sys

    monkeypatch.setitem(sys.modules, env, None)  # not installed
    out = tmp_path / "run"
    line = refused(capsys, [*SYNTHETIC, *SIMULATORS[env], "--out", str(out)])
    assert f"--env {env} needs the {env} package, which is not installed: pip install -e " \
           f"'.[{env}]'" in line
    assert not out.exists()


@pytest.mark.parametrize("env", list(SIMULATORS))
def test_a_mujoco_that_cannot_render_is_one_line_naming_the_fix(env, tmp_path, capsys,
                                                                monkeypatch) -> None:
    """A machine whose EGL library does not load (here: a stand-in that is no library, found
    first on the loader's path) faulted in every env worker; the renderer is tried once, in a
    child process, before the model loads."""
    from cosmos3_gym.envs import requirements

    broken = tmp_path / "lib"
    broken.mkdir()
    for name in ("libEGL.so.1", "libEGL.so", "libGL.so.1", "libOpenGL.so.0"):
        (broken / name).write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(broken))
    monkeypatch.setenv("MUJOCO_GL", "egl")
    requirements._render_problem.cache_clear()
    try:
        out = tmp_path / "run"
        line = refused(capsys, [*SYNTHETIC, *SIMULATORS[env], "--out", str(out)])
    finally:
        requirements._render_problem.cache_clear()
    assert f"--env {env}: MuJoCo cannot render here (" in line
    assert "set MUJOCO_GL=egl (it needs the EGL library: apt-get install libegl1" in line
    assert not out.exists()
