"""A simulator that renders first, then the model stack: both orders work in one process, and a
rendering run exits without a word on stderr (see cosmos3_gym/native_libs.py).

Each case runs in a fresh interpreter: this suite's own conftest imports the model stack first,
the order that always worked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

RENDER_FIRST = {
    "libero": """
        from cosmos3_gym.envs import LiberoEnv
        env = LiberoEnv("libero_spatial", 0, image_size=64)
        obs, _ = env.reset(seed=0)
    """,
    "metaworld": """
        from cosmos3_gym.envs import MetaWorldEnv
        env = MetaWorldEnv("reach-v3", image_size=64)
        obs, _ = env.reset(seed=0)
    """,
}
THEN_MODEL = """
    import numpy as np
    assert obs[next(k for k in obs if k != "state")].any(), "the env rendered a blank frame"
    from cosmos3_gym import Cosmos3ActionPipeline
    import triton
    print("pipeline", Cosmos3ActionPipeline.__name__, "triton", triton.__version__)
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    env.pop("TRITON_INTERPRET", None)  # as a user's process has it
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("sim", [
    pytest.param("libero", marks=pytest.mark.libero),
    pytest.param("metaworld", marks=pytest.mark.metaworld),
])
def test_model_stack_loads_after_a_simulator_rendered(sim: str) -> None:
    pytest.importorskip("triton")  # the crash was Triton's import; without it nothing to check
    result = _run(textwrap.dedent(RENDER_FIRST[sim]) + textwrap.dedent(THEN_MODEL))
    assert result.returncode == 0, (
        f"render-first process ended with {result.returncode} (-11: segfault)\n{result.stderr}")
    assert "pipeline Cosmos3ActionPipeline" in result.stdout
    assert result.stderr == "", f"stderr at exit:\n{result.stderr}"


def test_the_isolation_is_left_off_where_the_nvidia_driver_renders(monkeypatch) -> None:
    """With NVIDIA's driver loaded (or the switch at 0) Triton loads as usual, as in the
    measured device runs; the switch at 1 forces the isolation."""
    from cosmos3_gym import native_libs

    calls = []
    monkeypatch.setattr(native_libs.ctypes, "CDLL", lambda *a, **k: calls.append(a) or object())
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    for forced, driver, isolated in (("0", False, False), (None, True, False),
                                     ("1", True, True), (None, False, True)):
        monkeypatch.setattr(native_libs, "_done", False)
        monkeypatch.setattr(native_libs, "NVIDIA_DRIVER",
                            "/" if driver else "/nonexistent/nvidia/version")
        if forced is None:
            monkeypatch.delenv("COSMOS3_GYM_TRITON_DEEPBIND", raising=False)
        else:
            monkeypatch.setenv("COSMOS3_GYM_TRITON_DEEPBIND", forced)
        assert native_libs.isolate_triton_llvm() is isolated, (forced, driver)
    assert len(calls) == 2
