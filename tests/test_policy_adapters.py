"""Benchmark adapters: LIBERO's conventions, the generic adapter, and writing your own."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation
from test_policy_standins import StandInPipeline

import cosmos3_gym.policy.adapters as adapters_module
from cosmos3_gym.policy import (
    Adapter,
    GenericAdapter,
    LiberoAdapter,
    VectorPolicy,
    get_adapter,
)
from cosmos3_gym.policy.rotations import project_to_so3, rot6d_to_axis_angle, rot6d_to_matrix

# ---------------------------------------------------------------------------- LIBERO images


def libero_obs(batch: int = 2, size: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "agentview_image": rng.integers(0, 255, (batch, size, size, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (batch, size, size, 3), dtype=np.uint8),
        "state": rng.standard_normal((batch, 8)).astype(np.float32),
    }


def test_libero_images_are_rotated_180_and_agentview_sits_left():
    obs = libero_obs()
    original = {k: v.copy() for k, v in obs.items()}
    images = LiberoAdapter(view_size=None).images(obs)
    assert images.shape == (2, 6, 12, 3) and images.dtype == np.uint8
    for b in range(2):
        # np.rot90 twice in the image plane is an independent spelling of a 180-degree rotation.
        np.testing.assert_array_equal(images[b, :, :6], np.rot90(obs["agentview_image"][b], 2))
        np.testing.assert_array_equal(images[b, :, 6:], np.rot90(obs["wrist_image"][b], 2))
    for key in obs:
        np.testing.assert_array_equal(obs[key], original[key])  # the caller's arrays are untouched


def test_libero_rotation_moves_the_top_left_pixel_to_the_bottom_right():
    obs = {k: np.zeros((1, 4, 4, 3), np.uint8) for k in ("agentview_image", "wrist_image")}
    obs["agentview_image"][0, 0, 0] = (255, 0, 0)
    obs["wrist_image"][0, 0, 0] = (0, 255, 0)
    images = LiberoAdapter(view_size=None).images(obs)
    assert tuple(images[0, 3, 3]) == (255, 0, 0)  # agentview corner: bottom right of left half
    assert tuple(images[0, 3, 7]) == (0, 255, 0)  # wrist corner: bottom right of right half
    assert images.sum() == 510


def test_libero_views_are_resized_to_the_trained_256_square():
    from PIL import Image

    obs = libero_obs(batch=2, size=128)
    images = LiberoAdapter().images(obs)
    assert images.shape == (2, 256, 512, 3) and images.dtype == np.uint8
    for b in range(2):
        for key, half in (("agentview_image", slice(0, 256)), ("wrist_image", slice(256, 512))):
            rotated = np.ascontiguousarray(np.rot90(obs[key][b], 2))
            expected = np.asarray(Image.fromarray(rotated).resize((256, 256), Image.BILINEAR))
            np.testing.assert_array_equal(images[b, :, half], expected)
    same = libero_obs(batch=1, size=256)  # already 256: no resampling at all
    np.testing.assert_array_equal(LiberoAdapter().images(same)[0, :, :256],
                                  np.rot90(same["agentview_image"][0], 2))


@pytest.mark.parametrize(
    "obs, message",
    [
        ({"state": np.zeros((2, 8), np.float32)}, r"lacks \['agentview_image', 'wrist_image'\]"),
        (np.zeros((2, 4, 4, 3), np.uint8), "expected a dict observation"),
        (
            {"agentview_image": np.zeros((2, 4, 4, 3)), "wrist_image": np.zeros((2, 4, 4, 3))},
            r"observation\['agentview_image'\]: expected uint8",
        ),
        (
            {
                "agentview_image": np.zeros((2, 4, 4, 3), np.uint8),
                "wrist_image": np.zeros((2, 5, 5, 3), np.uint8),
            },
            r"share \[B, H, :, C\]",
        ),
    ],
)
def test_libero_bad_observations_name_what_they_found(obs, message):
    with pytest.raises(ValueError, match=message):
        LiberoAdapter().images(obs)


def test_libero_missing_key_error_lists_the_keys_found():
    with pytest.raises(ValueError, match=r"'state': 'float32 \[2, 8\]'"):
        LiberoAdapter().images({"state": np.zeros((2, 8), np.float32)})


# ---------------------------------------------------------------------------- LIBERO prompt

SUFFIX = (
    "This video contains concatenated views from multiple camera perspectives. "
    "The left half shows the third-person view; the right half shows the wrist-mounted camera."
)


def test_libero_prompt_appends_the_official_viewpoint_sentences():
    adapter = LiberoAdapter()
    assert adapter.prompt("put the bowl on the plate") == f"put the bowl on the plate. {SUFFIX}"
    # A task that already ends its sentence is not given a second full stop.
    assert adapter.prompt("put the bowl on the plate.") == f"put the bowl on the plate. {SUFFIX}"
    assert adapter.prompt("open the drawer  ") == f"open the drawer. {SUFFIX}"


def test_libero_prompt_augmentation_is_idempotent():
    adapter = LiberoAdapter()
    once = adapter.prompt("open the drawer")
    assert adapter.prompt(once) == once


# ---------------------------------------------------------------------------- LIBERO actions


def rot6d_of(rotations: Rotation) -> np.ndarray:
    """Column-based rot6d: the matrix's first column, then its second."""
    m = rotations.as_matrix()
    return np.concatenate([m[:, :, 0], m[:, :, 1]], axis=-1)


def assert_same_rotation(rotvec_a: np.ndarray, rotvec_b: np.ndarray, atol: float = 1e-5):
    # Compare as rotations: near pi a rotation vector and its antipode describe the same turn.
    delta = Rotation.from_rotvec(rotvec_a) * Rotation.from_rotvec(rotvec_b).inv()
    assert np.abs(delta.magnitude()).max() < atol


def test_rot6d_of_a_rotation_decodes_to_that_rotations_axis_angle():
    rotations = Rotation.random(200, random_state=0)
    decoded = rot6d_to_axis_angle(rot6d_of(rotations))
    assert decoded.shape == (200, 3)
    assert_same_rotation(decoded, rotations.as_rotvec())


def test_rot6d_columns_scaled_by_any_positive_factors_decode_to_the_same_rotation():
    rotations = Rotation.random(50, random_state=1)
    r6 = rot6d_of(rotations)
    scale = np.random.default_rng(2).uniform(0.2, 5.0, (50, 2))
    scaled = np.concatenate([r6[:, :3] * scale[:, :1], r6[:, 3:] * scale[:, 1:]], axis=-1)
    np.testing.assert_allclose(rot6d_to_matrix(scaled), rotations.as_matrix(), atol=1e-9)


def test_noisy_rot6d_projects_to_the_nearest_rotation():
    rng = np.random.default_rng(3)
    rotations = Rotation.random(20, random_state=4)
    noisy = rot6d_of(rotations) + 0.05 * rng.standard_normal((20, 6))
    col0, col1 = noisy[:, :3], noisy[:, 3:]
    approx = np.stack([col0, col1, np.cross(col0, col1)], axis=-1)
    projected = rot6d_to_matrix(noisy)
    gram = projected @ projected.transpose(0, 2, 1)
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(3), (20, 3, 3)), atol=1e-9)
    np.testing.assert_allclose(np.linalg.det(projected), 1.0, atol=1e-9)
    # No rotation in a neighbourhood is closer (Frobenius) to the un-projected matrix.
    best = np.linalg.norm(projected - approx, axis=(1, 2))
    for _ in range(200):
        nudge = Rotation.from_rotvec(0.05 * rng.standard_normal((20, 3))).as_matrix()
        assert (np.linalg.norm(nudge @ projected - approx, axis=(1, 2)) >= best - 1e-12).all()


def test_projection_turns_a_reflection_into_a_rotation():
    reflection = np.diag([1.0, 1.0, -1.0])
    projected = project_to_so3(reflection)
    assert projected.shape == (3, 3)
    np.testing.assert_allclose(np.linalg.det(projected), 1.0)


def test_libero_actions_are_dpos_axis_angle_and_libero_gripper():
    rotations = Rotation.random(6, random_state=5)
    raw = np.zeros((2, 3, 10), np.float32)
    raw[..., 0:3] = np.arange(18).reshape(2, 3, 3) / 100
    raw[..., 3:9] = rot6d_of(rotations).reshape(2, 3, 6)
    raw[..., 9] = [[0.0, 0.25, 1.0], [1.5, -0.5, 0.5]]
    original = raw.copy()
    actions = LiberoAdapter().actions(raw)
    assert actions.shape == (2, 3, 7) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions[..., :3], raw[..., :3])
    assert_same_rotation(actions[..., 3:6].reshape(-1, 3), rotations.as_rotvec(), atol=1e-5)
    # Data gripper 0 (closed) -> +1 (LIBERO close); 1 (open) -> -1 (LIBERO open); clipped.
    np.testing.assert_allclose(actions[..., 6], [[1.0, 0.5, -1.0], [-1.0, 1.0, 0.0]])
    np.testing.assert_array_equal(raw, original)
    binary = LiberoAdapter(binarize_gripper=True).actions(raw)
    np.testing.assert_array_equal(binary[..., 6], [[1.0, 1.0, -1.0], [-1.0, 1.0, 0.0]])


def test_libero_actions_refuse_a_wrong_raw_width():
    with pytest.raises(ValueError, match=r"expected raw actions \[B, H, 10\].*found \[2, 16, 7\]"):
        LiberoAdapter().actions(np.zeros((2, 16, 7), np.float32))


def test_libero_adapter_through_the_policy_leaves_observations_untouched():
    obs = libero_obs(batch=3)
    original = {k: v.copy() for k, v in obs.items()}
    pipe = StandInPipeline(horizon=4, action_dim=10)
    policy = VectorPolicy(pipe, adapter="libero", n_action_steps=2)
    action = policy.select_action(obs, ["open the drawer", "close the drawer", "wipe it"])
    assert action.shape == (3, 7)
    assert pipe.calls[0]["prompts"][1] == f"close the drawer. {SUFFIX}"
    assert policy.last_chunk_record.raw_actions.shape == (3, 4, 10)
    policy.select_action(obs, ["open the drawer", "close the drawer", "wipe it"])
    for key in obs:
        np.testing.assert_array_equal(obs[key], original[key])
    assert policy.adapter.domain == "libero"


# ---------------------------------------------------------------------------- generic


def test_generic_adapter_takes_an_array_or_the_single_image_of_a_dict():
    image = np.zeros((2, 8, 8, 3), np.uint8)
    adapter = GenericAdapter()
    assert adapter.images(image) is image
    obs = {"pixels": {"top": image}, "agent_pos": np.zeros((2, 4), np.float32)}
    assert adapter.images(obs) is image
    raw = np.ones((2, 4, 5), np.float32)
    actions = adapter.actions(raw)
    np.testing.assert_array_equal(actions, raw)
    assert actions is not raw and adapter.prompt("x") == "x"


def test_generic_adapter_refuses_an_ambiguous_dict_and_lists_the_keys():
    obs = {
        "front": np.zeros((2, 8, 8, 3), np.uint8),
        "wrist": np.zeros((2, 8, 8, 3), np.uint8),
        "state": np.zeros((2, 4), np.float32),
    }
    with pytest.raises(ValueError, match="found 2 images") as error:
        GenericAdapter().images(obs)
    for text in ("'front': 'uint8 [2, 8, 8, 3]'", "'wrist'", "'state': 'float32 [2, 4]'"):
        assert text in str(error.value)
    assert "image_key" in str(error.value)
    assert GenericAdapter(image_key="wrist").images(obs) is obs["wrist"]
    with pytest.raises(ValueError, match=r"image_key 'side' not in the observation; found keys"):
        GenericAdapter(image_key="side").images(obs)


def test_generic_adapter_refuses_a_dict_without_a_uint8_image():
    obs = {"pixels": np.zeros((2, 8, 8, 3), np.float32)}
    with pytest.raises(ValueError, match=r"no uint8 \[B, H, W, C\] image.*'pixels': 'float32"):
        GenericAdapter().images(obs)


# ---------------------------------------------------------------------------- your own


class TopCameraAdapter(Adapter):
    """A custom benchmark in a few lines."""

    name = "top_camera"

    def images(self, obs):
        return obs["top"]

    def prompt(self, task):
        return f"In the kitchen: {task}"

    def actions(self, raw):
        return -raw[..., :2]


def test_a_custom_adapter_drives_the_policy():
    obs = {"top": np.full((2, 4, 4, 3), 3, np.uint8), "side": np.zeros((2, 4, 4, 3), np.uint8)}
    pipe = StandInPipeline()
    policy = VectorPolicy(pipe, adapter=TopCameraAdapter())
    chunks = policy(obs, ["boil water", "slice bread"])
    assert chunks.shape == (2, 4, 2)
    assert pipe.calls[0]["prompts"] == ["In the kitchen: boil water", "In the kitchen: slice bread"]
    np.testing.assert_array_equal(chunks, -policy.last_chunk_record.raw_actions[..., :2])


def test_a_custom_adapter_returning_bad_images_is_named_in_the_error():
    class FloatAdapter(Adapter):
        name = "float"

        def images(self, obs):
            return obs.astype(np.float32)

    policy = VectorPolicy(StandInPipeline(), adapter=FloatAdapter())
    with pytest.raises(ValueError, match=r"adapter FloatAdapter\(name='float'\) returned images "
                       r"float32 \[2, 4, 4, 3\]; expected uint8"):
        policy(np.zeros((2, 4, 4, 3), np.uint8), "a")


def test_get_adapter_by_name_or_object():
    assert isinstance(get_adapter("libero"), LiberoAdapter)
    assert isinstance(get_adapter("generic"), GenericAdapter)
    custom = TopCameraAdapter()
    assert get_adapter(custom) is custom
    message = (r"unknown adapter 'robocasa'; expected one of \['droid', 'generic', 'libero', "
               r"'metaworld'\]")
    with pytest.raises(ValueError, match=message):
        get_adapter("robocasa")
    with pytest.raises(TypeError, match=r"lacks the methods \['images', 'prompt', 'actions'\]"):
        get_adapter(object())


def test_env_action_dim_follows_the_adapters_own_actions():
    assert adapters_module.GenericAdapter().env_action_dim(10) == 10
    assert adapters_module.LiberoAdapter().env_action_dim(10) == 7
    with pytest.raises(ValueError, match=r"expected raw actions \[B, H, 10\]"):
        adapters_module.LiberoAdapter().env_action_dim(2)

    class FirstThree(adapters_module.Adapter):
        def actions(self, raw):
            return raw[..., :3]

    assert FirstThree().env_action_dim(10) == 3

    class DuckTyped:  # no base class, so no hook: the check probes its actions() the same way
        name = "duck"

        def images(self, obs):
            return obs

        def prompt(self, task):
            return task

        def actions(self, raw):
            return raw[..., :3]

    from gymnasium.spaces import Box

    adapters_module.check_action_fit(DuckTyped(), 10, "libero", Box(-1, 1, (3,)), fix="")
    message = (r"'duck' adapter passes on as 3-D env actions, but the env's action space is "
               r"Box\(-1.0, 1.0, \(4,\), float32\)")
    with pytest.raises(ValueError, match=message):
        adapters_module.check_action_fit(DuckTyped(), 10, "libero", Box(-1, 1, (4,)), fix="")


# ---------------------------------------------------------------- a checkpoint's declared cameras

LEROBOT_FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "lerobot_cosmos3"


def test_image_key_maps_a_lerobot_folders_cameras_onto_another_envs() -> None:
    """``--image-key`` with a checkpoint that declares its cameras was silently ignored (the
    first observation then lacked ``observation.images.image``); it now names the env's camera
    for each of the checkpoint's, in the checkpoint's order."""
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.formats import read_checkpoint
    from cosmos3_gym.policy.adapters import adapter_for_contract, compose_views

    contract = read_checkpoint(LEROBOT_FIXTURES / "libero").contract
    assert contract.image_keys == ("observation.images.image", "observation.images.image2")
    env = EvalConfig(env="gym:cosmos3_gym/ColorReach-v0", image_key=["pixels/top", "wrist"],
                     flip="vertical", prompt="reach the red target",
                     max_episode_steps=3).make_env()  # as the command line makes it
    adapter = adapter_for_contract(contract, env.adapter_options)
    rng = np.random.default_rng(0)
    top, wrist = (rng.integers(0, 256, (2, 24, 32, 3), dtype=np.uint8) for _ in range(2))
    obs = {"pixels": {"top": top, "side": top[:, ::2]}, "wrist": wrist}
    expected = compose_views([top[:, ::-1], wrist[:, ::-1]], num_views=contract.num_views,
                             primary_height=contract.primary_height,
                             canvas_hw=contract.canvas_hw)  # each camera flipped, then composed
    np.testing.assert_array_equal(adapter.images(obs), expected)
    with pytest.raises(ValueError, match=r"--image-key pixels: the checkpoint reads 2 cameras "
                                         r"\(observation.images.image, observation.images.image2\)"
                                         r"; give one observation key of the env per camera"):
        adapter_for_contract(contract, {"image_key": "pixels"})


def test_a_libero_exports_fixed_cameras_refuse_an_image_key() -> None:
    from cosmos3_gym.formats import ObservationContract
    from cosmos3_gym.policy.adapters import adapter_for_contract

    contract = ObservationContract("cosmos-framework-libero", domain="libero")
    assert adapter_for_contract(contract, {"image_key": None}).name == "libero"
    with pytest.raises(ValueError, match="--image-key 'pixels'.*cannot stand for them"):
        adapter_for_contract(contract, {"image_key": "pixels"})


def test_a_channels_first_view_is_refused_naming_the_layout() -> None:
    """A ``[B, C, H, W]`` camera reached PIL as 128-channel rows ("Cannot handle this data type:
    (1, 1, 128)"); it is refused, saying how to move the channels last."""
    from cosmos3_gym.formats import read_checkpoint
    from cosmos3_gym.policy.adapters import adapter_for_contract

    adapter = adapter_for_contract(read_checkpoint(LEROBOT_FIXTURES / "libero").contract)
    chw = np.zeros((1, 3, 128, 128), np.uint8)
    with pytest.raises(ValueError, match=r"observation\['observation.images.image'\]: expected "
                                         r"images \[B, H, W, C\] with C in 1, 3, 4 channels last; "
                                         r"found \[1, 3, 128, 128\]: channels first.*moveaxis"):
        adapter.images({"observation.images.image": chw, "observation.images.image2": chw})
