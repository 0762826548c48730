"""LeRobot policy folders: ``config.json`` with the component configs inline, one
``model.safetensors``, and the pre/post-processor files that hold the statistics.

What is known of the format, with sources, is in docs/checkpoints.md ("LeRobot policy
folders"); in short (huggingface/lerobot PR #3745, commit 68ff20d2, ``policies/cosmos3/``):

* ``config.json``: LeRobot's ``Cosmos3Config`` as draccus writes it, ``type`` ``cosmos3`` (the
  public Edge folders say ``cosmos3_edge``, whose code is not public: the same keys are
  expected, and a key this reader does not know is refused by name, not guessed at).
  ``transformer_config`` / ``vae_config`` / ``scheduler_config`` are the constructor arguments
  of diffusers' ``Cosmos3OmniTransformer``, ``AutoencoderKLWan`` and
  ``UniPCMultistepScheduler``.
* ``model.safetensors``: the whole policy, ``model.transformer.<diffusers name>`` and
  ``model.vae.<diffusers name>``; the prefixes are stripped, nothing is renamed.
* ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and their steps' state files:
  the normaliser's and un-normaliser's statistics (``action.q01``, ``observation.state.mean``,
  ...) and modes (``norm_map``).
* the tokenizer ``text_processor_name_or_path`` names: inside the folder, beside it, in the
  Hugging Face cache, or given (:func:`resolve_tokenizer`).

The folder declares its whole contract, and the pipeline takes it as LeRobot's policy does:
LeRobot's plain-text caption and token ids, float resize on diffusers' canvas bins, diffusers'
UniPC scheduler from ``scheduler_config``, ``invert_gripper``, the state row, LeRobot's
normalisation modes; the policy's default adapter composes the views as LeRobot does.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any

from cosmos3_gym.checkpoint import (
    DEFAULT_SOURCE,
    SAMPLER_FIELDS,
    PolicyConfig,
)
from cosmos3_gym.formats.base import (
    CheckpointFolder,
    Headers,
    ObservationContract,
    WeightFiles,
    check_claimed,
    inside,
)
from cosmos3_gym.jsonio import read_json_object

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
TYPES = ("cosmos3", "cosmos3_edge")
TRANSFORMER_PREFIX = "model.transformer."
VAE_PREFIX = "model.vae."
STATE_KEY = "observation.state"
# config.json's names of the PolicyConfig fields it gives under another name.
LEROBOT_NAMES = {"action_horizon": "chunk_size", "fps": "conditioning_fps",
                 "vision_start_token_id": "start_of_generation_token_id"}
ACTION_KEY = "action"

# LeRobot's normalisation modes -> this project's (pipeline/normalization.py).
MODES = {"IDENTITY": "none", "MEAN_STD": "meanstd", "MIN_MAX": "minmax",
         "QUANTILES": "quantile", "QUANTILE10": "quantile10"}

# The keys of LeRobot's Cosmos3Config (and of its base PreTrainedConfig) this reader uses...
USED_KEYS = frozenset({
    "type", "n_obs_steps", "input_features", "output_features", "text_processor_name_or_path",
    "transformer_config", "vae_config", "scheduler_config", "dtype", "chunk_size",
    "n_action_steps", "raw_action_dim", "max_action_dim", "max_state_dim", "joint_position_dim",
    "gripper_position_dim", "use_state", "history_length", "action_space", "invert_gripper",
    "domain_name", "domain_id", "eos_token_id", "start_of_generation_token_id", "mode",
    "viewpoint", "additional_view_description", "conditioning_fps", "resolution_tier",
    "guidance_scale", "num_inference_steps", "seed", "deterministic_seed", "image_keys",
    "num_views", "image_height", "image_width", "composed_image_height",
    "composed_image_width", "prompt_key", "normalization_mapping",
})
# ... and those that do not change what the policy computes (training, hub bookkeeping,
# LeRobot's runtime switches). Any other key is refused by name.
INERT_KEYS = frozenset({
    "shift", "train_time_video_distribution", "video_loss_weight", "action_loss_weight",
    "normalize_loss_by_active", "optimizer_lr", "optimizer_betas", "optimizer_eps",
    "optimizer_weight_decay", "optimizer_grad_clip_norm", "scheduler_warmup_steps",
    "scheduler_decay_steps", "scheduler_decay_lr", "freeze_vae", "local_files_only",
    "generate_video", "output_type", "device", "use_amp", "use_peft", "push_to_hub", "repo_id",
    "private", "tags", "license", "pretrained_path",
})
# Files a tokenizer folder holds (one is enough to call it one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def is_lerobot_config(raw: dict[str, Any]) -> bool:
    """A root ``config.json`` whose ``type`` is a Cosmos3 policy type, or that carries LeRobot's
    inline ``transformer_config``."""
    return raw.get("type") in TYPES or "transformer_config" in raw


def _require(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in raw:
        raise ValueError(f"{path}: no {key!r}; a LeRobot Cosmos3 config.json states it")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{path}: {key} is {value!r}; expected {names}")
    return value


def _processor_stats(root: Path, name: str, step: str, headers: Headers
                     ) -> tuple[dict[str, dict], dict[str, str]]:
    """The statistics (``{feature: {stat: list}}``) and modes (``{"ACTION": "QUANTILES", ...}``)
    of the ``step`` (``normalizer_processor`` / ``unnormalizer_processor``) of processor file
    ``name``; empty where the folder has no such file or step."""
    path = root / name
    if not path.is_file():
        return {}, {}
    spec = read_json_object(inside(root, path, "processor"), what=name)
    steps = spec.get("steps")
    if not isinstance(steps, list):
        raise ValueError(f"{path}: expected a 'steps' list (LeRobot's processor pipeline file)")
    for entry in steps:
        if not isinstance(entry, dict) or entry.get("registry_name") != step:
            continue
        modes = (entry.get("config") or {}).get("norm_map") or {}
        state_file = entry.get("state_file")
        if state_file is None:
            return {}, modes
        stats_path = inside(root, root / state_file, f"{name}'s {step} state")
        if not stats_path.is_file():
            raise FileNotFoundError(f"{path} names the state file {state_file}, which the folder "
                                    "lacks (an incomplete download? fetch the whole folder)")
        stats: dict[str, dict] = {}
        from safetensors.numpy import load_file

        headers(stats_path)  # complete, and safetensors
        for key, value in load_file(str(stats_path)).items():
            feature, _, stat = key.rpartition(".")
            stats.setdefault(feature, {})[stat] = value.astype("float64").reshape(-1).tolist()
        return stats, modes
    return {}, {}


def _stats_block(stats: dict[str, list], path: str) -> dict[str, Any]:
    """LeRobot statistics of one feature as this project's one-block statistics."""
    from cosmos3_gym.pipeline.normalization import STAT_KEYS, ActionStats

    block = {k: v for k, v in stats.items() if k in STAT_KEYS}
    out = {"global": block}
    ActionStats.from_dict(out, source=path)
    return out


def resolve_tokenizer(root: Path, name: str | None, given: str | Path | None
                      ) -> tuple[Path, str]:
    """The tokenizer folder of a LeRobot folder and how it was found: ``given`` (``--tokenizer``)
    where set; else the ``text_processor_name_or_path`` of ``config.json`` as a path (absolute,
    inside the folder, or beside it), or as a Hugging Face repository id already in the local
    cache; else tokenizer files in the folder itself. Never downloads."""

    def is_tokenizer(path: Path) -> bool:
        return path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES)

    if given is not None:
        path = Path(given)
        if not is_tokenizer(path):
            raise FileNotFoundError(f"--tokenizer {given}: no tokenizer there (expected a folder "
                                    f"with one of {', '.join(TOKENIZER_FILES)})")
        return path, "given"
    looked = []
    if name:
        candidates = [Path(name), root / name, root.parent / name, root.parent / Path(name).name]
        places = ("as written", "inside the folder", "beside the folder", "beside the folder")
        for candidate, where in zip(candidates, places, strict=True):
            looked.append(str(candidate))
            if is_tokenizer(candidate):
                return candidate, f"text_processor_name_or_path {name!r}, {where}"
        if "/" in name and not Path(name).is_absolute():
            cached = _hub_cache(name)
            looked.append(f"the Hugging Face cache ({name})")
            if cached is not None and is_tokenizer(cached):
                return cached, f"text_processor_name_or_path {name!r}, from the local hub cache"
    looked.append(f"{root} itself")
    if is_tokenizer(root):
        return root, "the folder's own tokenizer files"
    named = f"config.json's text_processor_name_or_path {name!r}" if name else (
        "config.json names no tokenizer (text_processor_name_or_path is null) and")
    raise FileNotFoundError(
        f"the tokenizer of {root} does not resolve: {named} was looked for at {looked}; "
        f"download it (hf download {name or 'Qwen/Qwen3-VL-8B-Instruct'}) or pass --tokenizer "
        "PATH (a folder with tokenizer.json)")


def _hub_cache(repo_id: str) -> Path | None:
    """The newest cached snapshot of a hub repository, without network access; None if absent."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or no hub library): not found here
        return None


def read(root: Path, raw: dict[str, Any], headers: Headers, *,
         tokenizer: str | Path | None = None) -> CheckpointFolder:
    """A LeRobot Cosmos3 policy folder, checked: the config's keys and types, the weights'
    names against the two components, the statistics the modes need, the tokenizer."""
    from cosmos3_gym.model.config import ARCHITECTURE_KEYS, Cosmos3Config

    path = inside(root, root / CONFIG, "config")
    kind = raw.get("type")
    if kind not in TYPES:
        raise ValueError(f"{path}: policy type {kind!r} is not a Cosmos3 policy; cosmos3-gym "
                         f"reads the types {list(TYPES)}")
    unknown = sorted(set(raw) - USED_KEYS - INERT_KEYS)
    if unknown:
        raise ValueError(f"{path}: keys unknown to cosmos3-gym's reader of LeRobot's {kind!r} "
                         f"policy: {unknown}; they may change what the policy computes, so the "
                         "folder is not loaded (a newer LeRobot format? see docs/checkpoints.md)")
    mode = raw.get("mode", "policy")
    if mode != "policy":
        raise ValueError(f"{path}: mode is {mode!r}; cosmos3-gym runs action mode 'policy'")
    if raw.get("n_obs_steps", 1) != 1:
        raise ValueError(f"{path}: n_obs_steps is {raw['n_obs_steps']!r}; the Cosmos3 policy "
                         "conditions on one observation (n_obs_steps 1)")

    transformer_raw = dict(_require(raw, "transformer_config", dict, path))
    transformer_raw.setdefault("action_dim", raw.get("max_action_dim", 64))
    transformer_raw.setdefault("action_gen", True)
    missing = [k for k in ARCHITECTURE_KEYS if k not in transformer_raw]
    if missing:
        raise ValueError(f"{path}: transformer_config lacks {missing}, the keys that fix the "
                         "generator's shape")
    transformer = Cosmos3Config.from_dict(transformer_raw, source=f"{path} transformer_config",
                                          strict=True)
    vae_config = dict(_require(raw, "vae_config", dict, path))
    _check_vae_keys(vae_config, f"{path} vae_config")
    scheduler_config = dict(_require(raw, "scheduler_config", dict, path))
    if scheduler_config.get("prediction_type") != "flow_prediction" or not scheduler_config.get(
            "use_flow_sigmas", False):
        raise ValueError(f"{path}: scheduler_config is not a flow-matching UniPC schedule "
                         "(expected prediction_type 'flow_prediction' and use_flow_sigmas true); "
                         f"found {scheduler_config}")

    weights_path = root / WEIGHTS
    if not weights_path.is_file():
        pickled = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if pickled:
            raise ValueError(f"{root} offers only pickled weights {pickled}; cosmos3-gym loads "
                             "safetensors only (unpickling can run code)")
        raise FileNotFoundError(f"{root} has no {WEIGHTS} (LeRobot folders hold the whole policy "
                                "in it); an incomplete download?")
    files = (inside(root, weights_path, "weights"),)

    def prefixed(prefix: str):
        return lambda key: key[len(prefix):] if key.startswith(prefix) else None

    transformer_weights = WeightFiles(files, prefixed(TRANSFORMER_PREFIX),
                                      f"{WEIGHTS} {TRANSFORMER_PREFIX}* (prefix stripped)",
                                      headers=headers)
    vae_weights = WeightFiles(files, prefixed(VAE_PREFIX),
                              f"{WEIGHTS} {VAE_PREFIX}* (prefix stripped)", headers=headers)
    check_claimed(files, (transformer_weights, vae_weights), lambda key: None, str(weights_path),
                  headers)

    policy, contract = _policy(raw, root, path, scheduler_config, headers)
    tokenizer_dir, tokenizer_source = resolve_tokenizer(
        root, raw.get("text_processor_name_or_path"), tokenizer)
    return CheckpointFolder(
        root=root, format="lerobot", kind=kind, transformer=transformer,
        transformer_source=f"{CONFIG} transformer_config",
        transformer_weights=transformer_weights, vae_config=vae_config,
        vae_weights=vae_weights, vae_source=f"{CONFIG} vae_config + {WEIGHTS} {VAE_PREFIX}*",
        tokenizer=tokenizer_dir, tokenizer_source=tokenizer_source, policy=policy,
        contract=contract,
        notes=(f"LeRobot ran it in {raw.get('dtype', 'bfloat16')}; cosmos3-gym runs bf16 on CUDA, "
               "fp32 on the CPU (--precision)",),
    )


def _check_vae_keys(config: dict[str, Any], where: str) -> None:
    known = vae_constructor_keys()
    unknown = sorted(k for k in config if k not in known and not k.startswith("_"))
    if unknown:
        raise ValueError(f"{where}: keys diffusers' AutoencoderKLWan does not take: {unknown}")


def _policy(raw: dict[str, Any], root: Path, path: Path, scheduler: dict[str, Any],
            headers: Headers) -> tuple[PolicyConfig, ObservationContract]:
    """The folder's policy and observation contract."""
    use_state = bool(raw.get("use_state", True))
    history = raw.get("history_length", 1)
    if history != int(use_state):
        raise ValueError(f"{path}: history_length {history} with use_state {use_state}; "
                         "LeRobot's Cosmos3 policy conditions on one state row when use_state is "
                         "true and none otherwise (history_length 1 or 0), and drops "
                         "history_length rows from the output: other pairs lose actions")
    norm_map = dict(raw.get("normalization_mapping") or {})
    post_stats, post_modes = _processor_stats(root, POSTPROCESSOR, "unnormalizer_processor",
                                              headers)
    pre_stats, pre_modes = _processor_stats(root, PREPROCESSOR, "normalizer_processor", headers)
    for modes, name in ((post_modes, POSTPROCESSOR), (pre_modes, PREPROCESSOR)):
        for feature, mode in modes.items():
            if feature in norm_map and norm_map[feature] != mode:
                raise ValueError(f"{path} normalises {feature} with {norm_map[feature]} but "
                                 f"{name} with {mode}; the folder contradicts itself")
        norm_map = {**modes, **norm_map}
    for feature, mode in norm_map.items():
        if mode not in MODES:
            raise ValueError(f"{path}: normalisation mode {mode!r} of {feature} is unknown; "
                             f"expected one of {sorted(MODES)}")
    action_mode = MODES[norm_map.get("ACTION", "IDENTITY")]
    stats = None
    if action_mode != "none":
        found = post_stats.get(ACTION_KEY) or pre_stats.get(ACTION_KEY)
        if not found:
            raise ValueError(
                f"{path} un-normalises actions with {norm_map['ACTION']} but the folder holds no "
                f"'{ACTION_KEY}' statistics ({POSTPROCESSOR} and its state file: missing or "
                "without them); without them the actions would come out in the model's "
                "normalised space. Download the whole folder, or give --action-stats FILE")
        stats = _stats_block(found, f"{root / POSTPROCESSOR} action statistics")
    state_mode = MODES[norm_map.get("STATE", "IDENTITY")]
    state_stats = None
    if use_state and state_mode != "none":
        found = pre_stats.get(STATE_KEY)
        if not found:
            raise ValueError(f"{path} normalises the state with {norm_map['STATE']} but "
                             f"{PREPROCESSOR} holds no '{STATE_KEY}' statistics")
        state_stats = _stats_block(found, f"{root / PREPROCESSOR} state statistics")
        width = len(next(iter(state_stats["global"].values())))
        feature = (raw.get("input_features") or {}).get(STATE_KEY) or {}
        declared = feature.get("shape") if isinstance(feature, dict) else None
        if isinstance(declared, list) and declared and declared[-1] != width:
            raise ValueError(
                f"{root / PREPROCESSOR} holds {width}-D state statistics; {path}'s input_features "
                f"give {STATE_KEY} {declared[-1]}-D, the state the policy takes: the statistics "
                "are cut or of another dataset (download the folder again)")
    image_keys = raw.get("image_keys")
    if not isinstance(image_keys, list) or not image_keys or not all(
            isinstance(k, str) for k in image_keys):
        raise ValueError(f"{path}: image_keys is {image_keys!r}; expected a list of observation "
                         "keys")
    raw_dim = _require(raw, "raw_action_dim", int, path)
    description = raw.get("additional_view_description") or None
    fields = {
        "domain_name": raw.get("domain_name", "droid_lerobot"),
        "domain_id": _require(raw, "domain_id", int, path),
        "raw_action_dim": raw_dim,
        "action_horizon": _require(raw, "chunk_size", int, path),
        "normalization": action_mode, "stats": stats,
        "fps": float(_require(raw, "conditioning_fps", (int, float), path)),
        "resolution_tier": _require(raw, "resolution_tier", int, path),
        "view_point": raw.get("viewpoint"), "view_description": description,
        "num_inference_steps": _require(raw, "num_inference_steps", int, path),
        "guidance_scale": float(_require(raw, "guidance_scale", (int, float), path)),
        "guidance_interval": None,
        "flow_shift": float(scheduler.get("flow_shift", 1.0)),
        "history_length": history, "caption_format": "lerobot",
        "eos_token_id": _require(raw, "eos_token_id", int, path),
        "vision_start_token_id": _require(raw, "start_of_generation_token_id", int, path),
        "resize": "float", "canvas_bins": "diffusers", "scheduler_config": scheduler,
        "invert_gripper": bool(raw.get("invert_gripper", True)),
        "state_normalization": state_mode if use_state else None, "state_stats": state_stats,
    }
    try:
        policy = PolicyConfig(**fields)
    except ValueError as err:
        field_name, _, rest = str(err).partition(": ")
        key = LEROBOT_NAMES.get(field_name)  # the error in the file's own words
        raise ValueError(f"{path}: {key} ({field_name}): {rest}" if key else f"{path}: {err}") \
            from None
    sources = {name: DEFAULT_SOURCE for name in SAMPLER_FIELDS}
    sources.update(num_inference_steps=CONFIG, guidance_scale=CONFIG,
                   flow_shift=f"{CONFIG} scheduler_config", scheduler=f"{CONFIG} scheduler_config")
    policy.sampler_sources.update(sources)
    composed = (_require(raw, "composed_image_height", int, path),
                _require(raw, "composed_image_width", int, path))
    num_views = _require(raw, "num_views", int, path)
    if len(image_keys) > num_views:
        raise ValueError(f"{path}: {len(image_keys)} image_keys for num_views {num_views}")
    contract = ObservationContract(
        convention="lerobot", image_keys=tuple(image_keys), num_views=num_views,
        primary_height=_require(raw, "image_height", int, path), canvas_hw=composed,
        state_key=STATE_KEY if use_state else None, domain=fields["domain_name"],
        n_action_steps=raw.get("n_action_steps"), seed=raw.get("seed", 0),
        deterministic_seed=bool(raw.get("deterministic_seed", False)),
    )
    return policy, contract


def write_folder(directory: str | Path, *, transformer: Any, vae: Any, tokenizer_dir: Path,
                 policy: PolicyConfig, contract: ObservationContract,
                 dtype: str = "float32") -> Path:
    """Write a LeRobot Cosmos3 policy folder of the given components: the layout
    :func:`read` reads, as LeRobot's ``save_pretrained`` writes it (``config.json`` with the
    component configs inline, one ``model.safetensors`` of ``model.transformer.*`` and
    ``model.vae.*``, the processor files and their statistics, the tokenizer in
    ``tokenizer/``). For tests and the GPU session (a folder of a published shape with random
    weights); the truth for the format is LeRobot's own code (tests/fixtures/lerobot_cosmos3).
    """
    from cosmos3_gym.jsonio import copy_file_atomic, save_safetensors, write_text_atomic

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    inverse = {v: k for k, v in MODES.items()}
    transformer_config = transformer.config.to_dict()
    transformer_config.pop("_class_name", None)
    vae_config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    use_state = policy.history_length == 1
    norm_map = {"VISUAL": "IDENTITY", "ACTION": inverse[policy.normalization],
                "STATE": inverse[policy.state_normalization or "none"]}
    raw = {
        "type": "cosmos3", "n_obs_steps": 1, "device": None, "dtype": dtype,
        "text_processor_name_or_path": "tokenizer", "transformer_config": transformer_config,
        "vae_config": vae_config, "scheduler_config": policy.scheduler_config or {
            "prediction_type": "flow_prediction", "use_flow_sigmas": True,
            "flow_shift": policy.flow_shift},
        "chunk_size": policy.action_horizon,
        "n_action_steps": contract.n_action_steps or policy.action_horizon,
        "raw_action_dim": policy.raw_action_dim, "max_action_dim": transformer.config.action_dim,
        "use_state": use_state, "history_length": policy.history_length,
        "invert_gripper": policy.invert_gripper, "domain_name": policy.domain_name,
        "domain_id": policy.domain_id, "eos_token_id": policy.eos_token_id,
        "start_of_generation_token_id": policy.vision_start_token_id, "mode": "policy",
        "viewpoint": policy.view_point,
        "additional_view_description": policy.view_description or "",
        "conditioning_fps": policy.fps, "resolution_tier": policy.resolution_tier,
        "guidance_scale": policy.guidance_scale,
        "num_inference_steps": policy.num_inference_steps, "seed": contract.seed,
        "deterministic_seed": contract.deterministic_seed,
        "image_keys": list(contract.image_keys), "num_views": contract.num_views,
        "image_height": contract.primary_height, "image_width": contract.canvas_hw[1],
        "composed_image_height": contract.canvas_hw[0],
        "composed_image_width": contract.canvas_hw[1], "normalization_mapping": norm_map,
    }
    write_text_atomic(directory / CONFIG, json.dumps(raw, indent=4))
    state = {f"{TRANSFORMER_PREFIX}{k}": v.detach().contiguous().cpu()
             for k, v in transformer.state_dict().items()}
    state.update({f"{VAE_PREFIX}{k}": v.detach().contiguous().cpu()
                  for k, v in vae.state_dict().items()})
    save_safetensors(state, directory / WEIGHTS)

    def stats_file(name: str, blocks: dict[str, dict | None]) -> str:
        import numpy as np

        tensors = {f"{feature}.{stat}": np.asarray(values, np.float32)
                   for feature, stats in blocks.items() if stats is not None
                   for stat, values in stats.get("global", stats).items()}
        save_safetensors(tensors, directory / name)
        return name

    for name, step, blocks in (
            (PREPROCESSOR, "normalizer_processor",
             {STATE_KEY: policy.state_stats, ACTION_KEY: policy.stats}),
            (POSTPROCESSOR, "unnormalizer_processor", {ACTION_KEY: policy.stats})):
        state_name = f"{name.removesuffix('.json')}_step_0_{step}.safetensors"
        spec = {"name": name.removesuffix(".json"), "steps": [{
            "registry_name": step, "config": {"eps": 1e-08, "norm_map": norm_map},
            "state_file": stats_file(state_name, blocks)}]}
        write_text_atomic(directory / name, json.dumps(spec, indent=2))
    (directory / "tokenizer").mkdir(exist_ok=True)
    for file in sorted(Path(tokenizer_dir).iterdir()):
        copy_file_atomic(file, directory / "tokenizer" / file.name)
    return directory


@functools.cache
def vae_constructor_keys() -> frozenset[str]:
    """The keywords diffusers' ``AutoencoderKLWan.__init__`` takes, read from its source file
    rather than by importing it (diffusers imports torch; a folder is checked before the model
    stack loads), once per process (a run reads its folder several times). Where the source
    cannot be read, the class is imported and inspected."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("diffusers")
    if spec is not None and spec.origin is not None:
        source = (Path(spec.origin).parent / "models" / "autoencoders"
                  / "autoencoder_kl_wan.py")
        if source.is_file():
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name == "AutoencoderKLWan":
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                            args = item.args
                            names = [a.arg for a in (*args.posonlyargs, *args.args,
                                                     *args.kwonlyargs)]
                            return frozenset(names) - {"self"}
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    return frozenset(inspect.signature(AutoencoderKLWan.__init__).parameters) - {"self"}
