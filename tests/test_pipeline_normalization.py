"""Action stats loading and the four (un)normalisation modes, against hand-written formulas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_gym.pipeline.normalization import ActionStats, denormalize_actions, normalize_actions

D = 4


def _block(offset: float) -> dict[str, list[float]]:
    return {
        "mean": [0.1 + offset, -0.2, 0.3, 0.0],
        "std": [0.5, 2.0, 0.25, 0.0],  # a zero std, clamped to 1e-8
        "min": [-1.0 + offset, -3.0, 0.0, 0.5],
        "max": [1.0 + offset, 5.0, 2.0, 0.5],  # a constant dim: range clamped to 1e-6
        "q01": [-0.5 + offset, -2.0, 0.2, 0.0],
        "q99": [0.5 + offset, 4.0, 1.8, 1.0],
    }


@pytest.fixture()
def stats_file(tmp_path: Path) -> Path:
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"metadata": {"n": 3}, "global": _block(0.0),
                                "global_raw": _block(10.0)}))
    return path


def test_loads_the_cosmos_framework_layout(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    assert stats.raw_action_dim == D
    assert stats.global_.q01.dtype == np.float32
    np.testing.assert_array_equal(stats.global_.q99, np.float32(_block(0.0)["q99"]))
    np.testing.assert_array_equal(stats.global_raw.q01, np.float32(_block(10.0)["q01"]))


def test_hand_computed_values_per_mode(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    x = np.array([[[-1.0, 0.0, 1.0, 0.5]]], np.float32)  # [1, 1, D]
    q = denormalize_actions(x, stats, "quantile")[0, 0]
    # (x + 1)/2·(q99 − q01) + q01, by hand: dims 0..3
    np.testing.assert_allclose(q, [-0.5, 1.0, 1.8, 0.75], rtol=1e-6)
    qr = denormalize_actions(x, stats, "quantile_rot")[0, 0]
    np.testing.assert_allclose(qr, [9.5, 1.0, 1.8, 0.75], rtol=1e-6)  # global_raw: q01 + 10
    ms = denormalize_actions(x, stats, "meanstd")[0, 0]
    np.testing.assert_allclose(ms, [0.1 - 0.5, -0.2, 0.3 + 0.25, 0.5e-8], rtol=1e-6)
    mm = denormalize_actions(x, stats, "minmax")[0, 0]
    np.testing.assert_allclose(mm, [-1.0, 1.0, 2.0, 0.5 + 0.75e-6], rtol=1e-6)


def test_quantile_rot_reads_global_raw_and_quantile_reads_global(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    assert stats.block_for("quantile_rot") is stats.global_raw
    for mode in ("quantile", "meanstd", "minmax"):
        assert stats.block_for(mode) is stats.global_
    zeros = np.zeros((1, D), np.float32)
    diff = denormalize_actions(zeros, stats, "quantile_rot") - denormalize_actions(
        zeros, stats, "quantile"
    )
    np.testing.assert_allclose(diff[0, 0], 10.0, rtol=1e-6)


@pytest.mark.parametrize("mode", ["quantile", "quantile_rot", "meanstd", "minmax"])
def test_round_trip_numpy_and_torch(stats_file: Path, mode: str) -> None:
    stats = ActionStats.from_json(stats_file)
    rng = np.random.default_rng(0)
    normalized = rng.uniform(-1, 1, size=(3, 16, D)).astype(np.float32)
    normalized[..., 3] = 0.0  # the degenerate dim carries no information
    raw = denormalize_actions(normalized, stats, mode)
    assert isinstance(raw, np.ndarray) and raw.dtype == np.float32 and raw.shape == (3, 16, D)
    back = normalize_actions(raw, stats, mode)
    np.testing.assert_allclose(back[..., :3], normalized[..., :3], atol=2e-5)
    raw_t = denormalize_actions(torch.from_numpy(normalized), stats, mode)
    assert isinstance(raw_t, torch.Tensor) and raw_t.dtype == torch.float32
    np.testing.assert_allclose(raw_t.numpy(), raw, rtol=1e-6, atol=1e-7)


def test_inputs_are_not_modified(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    x = np.full((2, D), 0.5, np.float32)
    t = torch.full((2, D), 0.5)
    denormalize_actions(x, stats, "quantile")
    normalize_actions(t, stats, "minmax", clip=True)
    assert (x == 0.5).all() and (t == 0.5).all()


def test_clip_is_opt_in(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    raw = np.array([[5.0, 10.0, -3.0, 0.0]], np.float32)  # outside [q01, q99]
    free = normalize_actions(raw, stats, "quantile")
    assert free[0, 0] == pytest.approx(2 * (5.0 + 0.5) / 1.0 - 1)
    clipped = normalize_actions(raw, stats, "quantile", clip=True)
    np.testing.assert_array_equal(clipped[0, :3], [1.0, 1.0, -1.0])


def test_dimension_mismatch_names_expected_and_found(stats_file: Path) -> None:
    stats = ActionStats.from_json(stats_file)
    with pytest.raises(ValueError, match=r"raw_action_dim=4, got shape \(2, 16, 64\)"):
        denormalize_actions(np.zeros((2, 16, 64), np.float32), stats, "quantile")
    with pytest.raises(ValueError, match="expected a floating dtype, got int64"):
        denormalize_actions(np.zeros((2, D), np.int64), stats, "quantile")
    with pytest.raises(ValueError, match="mode: expected one of .* got 'zscore'"):
        denormalize_actions(np.zeros((2, D), np.float32), stats, "zscore")  # type: ignore[arg-type]


def test_bad_stats_files_are_rejected() -> None:
    # A block needs the vectors its mode reads (LeRobot's processor state may hold only some).
    partial = ActionStats.from_dict({"global": {k: [0.0] for k in ("mean", "std", "min", "max")}})
    with pytest.raises(ValueError, match=r"mode 'quantile' reads q01 and q99 .* no q01, q99"):
        partial.block_for("quantile")
    with pytest.raises(ValueError, match=r"expected statistics vectors among"):
        ActionStats.from_dict({"global": {"count": [3]}})
    bad = _block(0.0)
    bad["q99"] = [1.0, 2.0]
    with pytest.raises(ValueError, match="1-D vectors of one length"):
        ActionStats.from_dict({"global": bad})
    with pytest.raises(ValueError, match="'global' and 'global_raw' of one length, got 4 and 2"):
        ActionStats.from_dict({"global": _block(0.0), "global_raw": {k: [0.0, 1.0] for k in
                                                                     _block(0.0)}})
    only_global = ActionStats.from_dict({"global": _block(0.0)})
    with pytest.raises(ValueError, match="expected a 'global_raw' stats block"):
        denormalize_actions(np.zeros((1, D), np.float32), only_global, "quantile_rot")
    flat = ActionStats.from_dict(_block(0.0))  # a flat block is read as "global"
    assert flat.raw_action_dim == D


# cosmos-framework's LIBERO statistics (libero_native_frame_wise_relative_rot6d.json, the
# quantiles its reference notes give: shared/reference/checkpoint-formats.md B.4): dpos(3),
# rot6d(6), gripper. The rot6d dims' q01 lie close to their q99 and the gripper's are 0 and 1.
LIBERO_Q01 = [-0.723214, -0.808929, -0.9375, 0.934955, -0.223431, -0.189878, -0.334735,
              0.938516, -0.107736, 0.0]
LIBERO_Q99 = [0.9375, 0.870536, 0.9375, 1.0, 0.331, 0.163153, 0.226216, 1.0, 0.127158, 1.0]


def _libero_like() -> dict:
    q01, q99 = np.array(LIBERO_Q01), np.array(LIBERO_Q99)
    raw = {"q01": q01.tolist(), "q99": q99.tolist(), "min": (q01 - 0.05).tolist(),
           "max": np.minimum(q99 + 0.05, [1.0] * 9 + [1.0]).tolist(),
           "mean": ((q01 + q99) / 2).tolist(), "std": ((q99 - q01) / 4).tolist()}
    # The block quantile_rot does not read, with placeholders for the rot6d dims it passes
    # through: held to nothing but finiteness.
    placeholder = {k: [0.0] * 10 for k in ("mean", "std", "min", "max", "q01", "q99")}
    return {"global": placeholder, "global_raw": raw}


def test_a_libero_statistics_file_loads_for_its_mode() -> None:
    stats = ActionStats.from_dict(_libero_like())
    assert stats.block_for("quantile_rot") is stats.global_raw
    gripper = denormalize_actions(np.array([[-1.0] * 9 + [1.0]], np.float32), stats,
                                  "quantile_rot")[0, -1]
    assert gripper == pytest.approx(1.0)
    # Its placeholder block is refused only by a mode that would read it.
    with pytest.raises(ValueError, match=r"stats\['global'\]: q99 - q01 is 0 in every dim"):
        stats.block_for("quantile")


def _with(**changes: list[float]) -> dict:
    block = {"mean": [0.0, 0.0, 0.3], "std": [0.5, 0.5, 0.0], "min": [-1.0, -1.0, 0.3],
             "max": [1.0, 1.0, 0.3], "q01": [-0.9, -0.9, 0.3], "q99": [0.9, 0.9, 0.3]}
    return {"global": {**block, **changes}}


@pytest.mark.parametrize(("mode", "changes", "message"), [
    ("meanstd", {"std": [0.0, 0.0, 0.0]},
     r"stats\['global'\]: std is 0 in every dim, so mode 'meanstd' would make every vector it "
     r"maps \(an action, or a state\) the same one"),
    ("meanstd", {"std": [0.5, 0.0, 0.0]},
     r"std is 0 in dims \[1\], whose actions vary \(min \[-1.0\], max \[1.0\]\)"),
    ("meanstd", {"std": [0.5, -0.5, 0.0]}, r"std < 0 in dims \[1\]"),
    ("quantile", {"q99": [0.9, -0.95, 0.3]}, r"q99 < q01 in dims \[1\]"),
    ("quantile", {"q01": [0.9, 0.9, 0.3]}, r"q99 - q01 is 0 in every dim"),
    ("quantile_rot", {}, r"expected a 'global_raw' stats block"),
    ("minmax", {"max": [1.0, -2.0, 0.3]}, r"max < min in dims \[1\]"),
    ("minmax", {"max": [-1.0, -1.0, 0.3]}, r"max - min is 0 in every dim"),
])
def test_statistics_no_data_has_are_refused_for_the_mode_that_reads_them(
    mode: str, changes: dict, message: str
) -> None:
    stats = ActionStats.from_dict(_with(**changes))
    with pytest.raises(ValueError, match=message):
        stats.block_for(mode)
    with pytest.raises(ValueError, match=message):
        denormalize_actions(np.zeros((1, 3), np.float32), stats, mode)


def test_a_constant_dim_is_data_and_loads() -> None:
    # Dim 2 never moved in the training data: zero spread everywhere, clamped (the official
    # server's rule), in every mode.
    stats = ActionStats.from_dict(_with())
    for mode in ("quantile", "meanstd", "minmax"):
        out = denormalize_actions(np.zeros((1, 3), np.float32), stats, mode)
        assert out[0, 2] == pytest.approx(0.3, abs=1e-5)  # + half the clamped range
    with pytest.raises(ValueError, match="finite"):
        ActionStats.from_dict(_with(std=[0.5, float("inf"), 0.0]))
