"""Damaged checkpoint folders, one per way a folder can be wrong: the corpus that
``tests/test_checkpoint_checks.py`` runs ``inspect``, ``convert`` and ``from_pretrained`` over.

Each builder copies a good folder (the shipped tiny diffusers checkpoint, or a LeRobot folder of
``tests/fixtures/lerobot_cosmos3``) into ``root`` and breaks one thing; :data:`CORRUPTIONS`
holds it beside a regular expression the one error must match (what was found, and where).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "cosmos3_gym" / "checkpoints" / "tiny"
LEROBOT = ROOT / "tests" / "fixtures" / "lerobot_cosmos3"
# The statistics files of a LeRobot folder (the preprocessor's and the postprocessor's).
LEROBOT_STATS = ("policy_preprocessor_step_2_normalizer_processor.safetensors",
                 "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def _copy(source: Path, root: Path) -> Path:
    return Path(shutil.copytree(source, root / source.name))


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _edit_tensors(path: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _edit_stats(folder: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    for name in LEROBOT_STATS:
        _edit_tensors(folder / name, edit)


def _lerobot(name: str, root: Path, **config: object) -> Path:
    """A copy of LeRobot folder ``name`` with ``config`` over its config.json (a new
    ``normalization_mapping`` goes into its processors' ``norm_map`` too, as LeRobot writes it)."""
    folder = _copy(LEROBOT / name, root)
    if config:
        _edit_json(folder / "config.json", **config)
    mapping = config.get("normalization_mapping")
    for processor in ("policy_preprocessor.json", "policy_postprocessor.json"):
        if mapping is None:
            break
        spec = json.loads((folder / processor).read_text())
        for step in spec["steps"]:
            if "norm_map" in step.get("config", {}):
                step["config"]["norm_map"] = mapping
        (folder / processor).write_text(json.dumps(spec))
    return folder


def _tiny(root: Path, **policy: object) -> Path:
    folder = _copy(TINY, root)
    if policy:
        _edit_json(folder / "action_policy.json", **policy)
    return folder


# ---------------------------------------------------------------------------- declared values


def state_statistics_cut(root: Path) -> Path:
    folder = _lerobot("state", root)

    def cut(t: dict[str, np.ndarray]) -> None:
        for key in [k for k in t if k.startswith("observation.state.") and t[k].shape != (1,)]:
            t[key] = t[key][:5]
    _edit_stats(folder, cut)
    return folder


def chunk_size_huge(root: Path) -> Path:
    return _lerobot("libero", root, chunk_size=2**30, n_action_steps=2**30)


def lerobot_steps_huge(root: Path) -> Path:
    return _lerobot("libero", root, num_inference_steps=10**9)


def lerobot_guidance_nan(root: Path) -> Path:
    return _lerobot("libero", root, guidance_scale=math.nan)


def policy_guidance_nan(root: Path) -> Path:
    return _tiny(root, guidance_scale=math.nan)


def policy_steps_zero(root: Path) -> Path:
    return _tiny(root, num_inference_steps=0)


def policy_steps_huge(root: Path) -> Path:
    return _tiny(root, num_inference_steps=10**9)


def policy_shift_negative(root: Path) -> Path:
    return _tiny(root, flow_shift=-1.0)


def rope_theta_negative(root: Path) -> Path:
    folder = _tiny(root)
    _edit_json(folder / "transformer" / "config.json", rope_theta=-5.0)
    return folder


def fps_infinite(root: Path) -> Path:
    return _tiny(root, fps=math.inf)


# ---------------------------------------------------------------------------- statistics


def action_quantile10_flat(root: Path) -> Path:
    folder = _lerobot("state", root, normalization_mapping={
        "VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILE10"})

    def flat(t: dict[str, np.ndarray]) -> None:
        t["action.q90"] = t["action.q10"].copy()
    _edit_stats(folder, flat)
    return folder


def action_std_zero(root: Path) -> Path:
    folder = _lerobot("state", root, normalization_mapping={
        "VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})

    def flat(t: dict[str, np.ndarray]) -> None:
        t["action.std"] = np.zeros_like(t["action.std"])
    _edit_stats(folder, flat)
    return folder


def state_std_zero(root: Path) -> Path:
    folder = _lerobot("state", root)

    def flat(t: dict[str, np.ndarray]) -> None:
        t["observation.state.std"] = np.zeros_like(t["observation.state.std"])
    _edit_stats(folder, flat)
    return folder


def state_quantiles_equal(root: Path) -> Path:
    folder = _lerobot("state", root, normalization_mapping={
        "VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "MIN_MAX"})

    def flat(t: dict[str, np.ndarray]) -> None:
        t["observation.state.q99"] = t["observation.state.q01"].copy()
    _edit_stats(folder, flat)
    return folder


def action_q90_missing(root: Path) -> Path:
    folder = _lerobot("state", root, normalization_mapping={
        "VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILE10"})

    def drop(t: dict[str, np.ndarray]) -> None:
        del t["action.q90"]
    _edit_stats(folder, drop)
    return folder


def policy_stats_nan(root: Path) -> Path:
    from cosmos3_gym.tiny import tiny_action_stats

    stats = tiny_action_stats(2)
    stats["global"]["q99"][1] = math.nan
    return _tiny(root, normalization="quantile", stats=stats)


# ---------------------------------------------------------------------------- files and tensors


def _drop_tensor(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def drop(t: dict[str, np.ndarray]) -> None:
        del t[name]
    return drop


def tensor_missing(root: Path) -> Path:
    folder = _tiny(root)
    _edit_tensors(folder / "transformer" / WEIGHTS, _drop_tensor("action_modality_embed"))
    return folder


def tensor_extra(root: Path) -> Path:
    folder = _tiny(root)

    def add(t: dict[str, np.ndarray]) -> None:
        t["layers.0.self_attn.extra_gate"] = np.zeros(4, np.float32)
    _edit_tensors(folder / "transformer" / WEIGHTS, add)
    return folder


def tensor_misshaped(root: Path) -> Path:
    folder = _tiny(root)

    def reshape(t: dict[str, np.ndarray]) -> None:
        t["action_modality_embed"] = np.zeros((1, 3), np.float32)
    _edit_tensors(folder / "transformer" / WEIGHTS, reshape)
    return folder


def vae_tensor_missing(root: Path) -> Path:
    folder = _tiny(root)
    from safetensors.numpy import load_file

    first = sorted(load_file(str(folder / "vae" / WEIGHTS)))[0]
    _edit_tensors(folder / "vae" / WEIGHTS, _drop_tensor(first))
    return folder


def header_shape_overflows(root: Path) -> Path:
    """A header whose shape does not fit its bytes (2^62 x 2^62 elements in 4 bytes)."""
    folder = _tiny(root)
    path = folder / "transformer" / WEIGHTS
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header["action_modality_embed"]["shape"] = [2**62, 2**62]
    raw = json.dumps(header).encode()  # offsets count from the data: they stay right
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + size:])
    return folder


def tokenizer_cut(root: Path) -> Path:
    folder = _tiny(root)
    path = folder / "text_tokenizer" / "tokenizer.json"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return folder


def processor_state_pickled(root: Path) -> Path:
    """A statistics file that is a pickle under its safetensors name."""
    import torch

    folder = _lerobot("state", root)
    for name in LEROBOT_STATS:
        torch.save({"action.mean": torch.zeros(8)}, folder / name)
    return folder


# name -> (builder, the error a refusal must match)
CORRUPTIONS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "state_statistics_cut": (state_statistics_cut, r"5-D state statistics.*observation.state 7-D"),
    "chunk_size_huge": (chunk_size_huge,
                        r"config\.json: chunk_size .*at most 1024.*found 1073741824"),
    "lerobot_steps_huge": (lerobot_steps_huge,
                           r"config\.json: num_inference_steps.*at most 1000 .*found 1000000000"),
    "lerobot_guidance_nan": (lerobot_guidance_nan, r"guidance_scale.*nan"),
    "policy_guidance_nan": (policy_guidance_nan, r"action_policy\.json.*guidance_scale.*nan"),
    "policy_steps_zero": (policy_steps_zero, r"action_policy\.json.*num_inference_steps.* 0"),
    "policy_steps_huge": (policy_steps_huge,
                          r"num_inference_steps.*at most 1000 .*found 1000000000"),
    "policy_shift_negative": (policy_shift_negative, r"flow_shift.*-1\.0"),
    "rope_theta_negative": (rope_theta_negative, r"config\.json.*rope_theta.*-5\.0"),
    "fps_infinite": (fps_infinite, r"fps.*inf"),
    "action_quantile10_flat": (action_quantile10_flat, r"action statistics.*q90 - q10 is 0"),
    "action_std_zero": (action_std_zero, r"action statistics.*std is 0"),
    "state_std_zero": (state_std_zero, r"state statistics.*std is 0"),
    "state_quantiles_equal": (state_quantiles_equal, r"state statistics.*q99 - q01 is 0"),
    "action_q90_missing": (action_q90_missing, r"action statistics.*q90"),
    "policy_stats_nan": (policy_stats_nan, r"action_policy\.json.*NaN"),
    "tensor_missing": (tensor_missing, r"missing.*action_modality_embed"),
    "tensor_extra": (tensor_extra, r"unexpected.*extra_gate"),
    "tensor_misshaped": (tensor_misshaped, r"action_modality_embed.*\(1, 3\)"),
    "vae_tensor_missing": (vae_tensor_missing, r"vae.*missing"),
    "header_shape_overflows": (header_shape_overflows,
                               r"action_modality_embed.*4611686018427387904"),
    "tokenizer_cut": (tokenizer_cut, r"tokenizer\.json"),
    "processor_state_pickled": (processor_state_pickled,
                                r"normalizer_processor\.safetensors is a torch\.save archive.*"
                                r"never unpickles"),
}
