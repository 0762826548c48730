"""cosmos-framework exports: ``config.json`` with a ``"model"`` section, sharded ``model.net.*``
safetensors, the bundled processor and tokenizer; no VAE, no statistics, no policy settings.

What is known of the format, with sources, is in docs/checkpoints.md ("cosmos-framework
exports"); in short (NVIDIA/cosmos-framework 5eee9ed, ``scripts/export_model.py``,
``scripts/_convert_model_to_diffusers.py``, ``inference/model.py``):

* tensor names are ``model.net.<OmniMoT name>``, mapped to the diffusers names by the renames
  of cosmos-framework's own diffusers conversion (:func:`diffusers_name`); the vision tower
  (``language_model.visual.*``, Nano) is a part the action policy never runs and is skipped;
* the generator's config is not written out whole: its shapes are read from the tensors
  (:func:`transformer_config`), its latent layout and position settings from the ``"model"``
  section, and its language model's rope and norm settings from that section where it holds
  them, else from the published Cosmos3 model of the same shape
  (:data:`~cosmos3_gym.model.presets.GENERATOR_PRESETS`);
* the Wan2.2 VAE is not in the export: it comes from a diffusers ``AutoencoderKLWan`` folder
  (``--vae PATH``: such a folder, or a Cosmos3 diffusers checkpoint with its ``vae/``). A
  training ``Wan2.2_VAE.pth`` is refused: it is a pickle, and reading it with
  ``torch.load(weights_only=True)`` would still leave its key layout (the original Wan code's)
  unverified here; the diffusers folder of the same VAE is public (docs/checkpoints.md);
* statistics and the LIBERO settings come from a recipe and ``--action-stats``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cosmos3_gym.formats.base import (
    PICKLE_SUFFIXES,
    CheckpointFolder,
    Headers,
    WeightFiles,
    check_claimed,
    inside,
)
from cosmos3_gym.jsonio import read_json_object

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
PREFIX = "model.net."
VISUAL = "language_model.visual."
LANGUAGE_MODEL = "language_model.model."
LM_HEAD = "language_model.lm_head."
MODEL_TYPE = "cosmos3_omni"

# cosmos-framework's attention names -> diffusers' (its conversion's _ATTN_KEY_REMAP, and the
# inverse in inference/model.py), one attribute of layers.N.self_attn each.
ATTENTION_RENAMES = {
    "q_proj_moe_gen": "add_q_proj", "k_proj_moe_gen": "add_k_proj",
    "v_proj_moe_gen": "add_v_proj", "o_proj_moe_gen": "to_add_out",
    "q_norm_moe_gen": "norm_added_q", "k_norm_moe_gen": "norm_added_k",
    "q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "o_proj": "to_out",
    "q_norm": "norm_q", "k_norm": "norm_k",
}
# The generation tower's own modules (outside the language model) -> diffusers' names.
MODULE_RENAMES = {
    "vae2llm": "proj_in", "llm2vae": "proj_out", "action2llm": "action_proj_in",
    "llm2action": "action_proj_out", "sound2llm": "audio_proj_in", "llm2sound": "audio_proj_out",
}
# The time embedder's MLP, a Sequential([Linear, SiLU, Linear]) in cosmos-framework.
TIME_EMBEDDER_RENAMES = {"mlp.0": "linear_1", "mlp.2": "linear_2"}
PARAMETER_RENAMES = {"action_modality_embed": "action_modality_embed",
                     "sound_modality_embed": "audio_modality_embed"}
_LAYER = re.compile(r"^layers\.(\d+)\.")


def is_export_config(raw: dict[str, Any]) -> bool:
    """A root ``config.json`` with a ``"model"`` section (or ``model_type`` cosmos3_omni)."""
    return isinstance(raw.get("model"), dict) or raw.get("model_type") == MODEL_TYPE


def diffusers_name(key: str) -> str | None:
    """The diffusers ``Cosmos3OmniTransformer`` name of an export tensor, or None for one that
    is not the generator's (the vision tower, or a name this map does not know).

    >>> diffusers_name("model.net.language_model.model.layers.3.self_attn.q_proj_moe_gen.weight")
    'layers.3.self_attn.add_q_proj.weight'
    >>> diffusers_name("model.net.time_embedder.mlp.2.bias")
    'time_embedder.linear_2.bias'
    >>> diffusers_name("model.net.language_model.visual.blocks.0.attn.qkv.weight") is None
    True
    """
    if not key.startswith(PREFIX):
        return None
    name = key[len(PREFIX):]
    if name.startswith(VISUAL):
        return None
    if name.startswith(LM_HEAD):
        return "lm_head." + name[len(LM_HEAD):]
    if name.startswith(LANGUAGE_MODEL):
        parts = name[len(LANGUAGE_MODEL):].split(".")
        if len(parts) > 3 and parts[0] == "layers" and parts[2] == "self_attn":
            parts[3] = ATTENTION_RENAMES.get(parts[3], parts[3])
        return ".".join(parts)
    head, _, rest = name.partition(".")
    if head in PARAMETER_RENAMES and not rest:
        return PARAMETER_RENAMES[head]
    if head in MODULE_RENAMES:
        return f"{MODULE_RENAMES[head]}.{rest}"
    if head == "time_embedder":
        layer, _, leaf = rest.rpartition(".")
        if layer in TIME_EMBEDDER_RENAMES:
            return f"time_embedder.{TIME_EMBEDDER_RENAMES[layer]}.{leaf}"
    return None


def export_name(name: str) -> str:
    """The inverse of :func:`diffusers_name` for the generator's tensors (what an export holds
    for a diffusers name): for writing test exports and for error messages.

    >>> export_name("layers.0.self_attn.to_add_out.weight")
    'model.net.language_model.model.layers.0.self_attn.o_proj_moe_gen.weight'
    """
    inverse_attention = {v: k for k, v in ATTENTION_RENAMES.items()}
    parts = name.split(".")
    if name.startswith("lm_head."):
        return PREFIX + LM_HEAD + name[len("lm_head."):]
    if parts[0] in ("embed_tokens", "layers", "norm", "norm_moe_gen"):
        if len(parts) > 3 and parts[0] == "layers" and parts[2] == "self_attn":
            parts[3] = inverse_attention.get(parts[3], parts[3])
        return PREFIX + LANGUAGE_MODEL + ".".join(parts)
    inverse_modules = {v: k for k, v in MODULE_RENAMES.items()}
    inverse_params = {v: k for k, v in PARAMETER_RENAMES.items()}
    if name in inverse_params:
        return PREFIX + inverse_params[name]
    if parts[0] in inverse_modules:
        return PREFIX + ".".join([inverse_modules[parts[0]], *parts[1:]])
    if parts[0] == "time_embedder":
        inverse_time = {v: k for k, v in TIME_EMBEDDER_RENAMES.items()}
        return PREFIX + ".".join(["time_embedder", inverse_time[parts[1]], *parts[2:]])
    raise ValueError(f"{name!r} is not a Cosmos3 generator tensor name")


def _find(tree: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in a nested config."""
    found = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key:
                found.append(v)
            found += _find(v, key)
    elif isinstance(tree, list):
        for v in tree:
            found += _find(v, key)
    return found


def _one(tree: Any, key: str, default: Any, where: str) -> Any:
    values = _find(tree, key)
    distinct = {repr(v) for v in values}
    if len(distinct) > 1:
        raise ValueError(f"{where} states {key} more than once, with different values: "
                         f"{sorted(distinct)}")
    return values[0] if values else default


def _language_model_config(tree: Any) -> dict[str, Any] | None:
    """The language model's own config where the ``"model"`` section holds it (a dict with its
    ``hidden_size`` and ``rope_theta``), else None."""
    if isinstance(tree, dict):
        if "hidden_size" in tree and ("rope_theta" in tree or "rope_parameters" in tree):
            return tree
        values = tree.values()
    elif isinstance(tree, list):
        values = tree
    else:
        return None
    for value in values:
        found = _language_model_config(value)
        if found is not None:
            return found
    return None


def transformer_config(shapes: dict[str, list[int]], model: dict[str, Any], where: str
                       ) -> tuple[dict[str, Any], str]:
    """The diffusers ``transformer/config.json`` of an export, and where its values came from.

    Shapes from the tensors: widths, layers, heads (GQA), the MLP (a gate: SwiGLU, none:
    Nemotron's squared ReLU), the action and sound heads, the text QK norms. From the
    ``"model"`` section: the latent patch and channels, fps modulation, the mRoPE margin and
    the timestep scale. The language model's rope and norm settings from the section where it
    holds them, else from the published model of the same shape.
    """
    from cosmos3_gym.model.presets import GENERATOR_PRESETS

    def shape(name: str) -> list[int]:
        if name not in shapes:
            raise ValueError(f"{where} has no {export_name(name)!r}, which every Cosmos3 "
                             "generator has (an incomplete or foreign export?)")
        return shapes[name]

    vocab, hidden = shape("embed_tokens.weight")
    layers = 1 + max(int(m.group(1)) for m in map(_LAYER.match, shapes) if m)
    head_dim = shape("layers.0.self_attn.norm_added_q.weight")[0]
    gated = "layers.0.mlp.gate_proj.weight" in shapes
    config: dict[str, Any] = {
        "hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": layers,
        "head_dim": head_dim,
        "num_attention_heads": shape("layers.0.self_attn.to_q.weight")[0] // head_dim,
        "num_key_value_heads": shape("layers.0.self_attn.to_k.weight")[0] // head_dim,
        "intermediate_size": shape("layers.0.mlp.up_proj.weight")[0],
        "attention_bias": "layers.0.self_attn.to_q.bias" in shapes,
        "hidden_act": "silu" if gated else "relu2",
        "qk_norm_for_text": "layers.0.self_attn.norm_q.weight" in shapes,
        "use_und_k_norm_for_gen": "layers.0.self_attn.k_norm_und_for_gen.weight" in shapes,
        "patch_latent_dim": shape("proj_in.weight")[1],
    }
    if "action_proj_in.fc.weight" in shapes:
        domains, flat = shapes["action_proj_in.fc.weight"]
        config.update(action_gen=True, action_dim=flat // hidden, num_embodiment_domains=domains)
    if "audio_proj_in.weight" in shapes:
        config.update(sound_gen=True, sound_dim=shapes["audio_proj_in.weight"][1])
    patch = _one(model, "patch_spatial", 2, where)
    channels = _one(model, "state_ch", None, where)
    if channels is None:
        channels = config["patch_latent_dim"] // (patch * patch)
    config.update(latent_patch_size=patch, latent_channel=channels)
    stated = []
    for key in ("base_fps", "enable_fps_modulation", "unified_3d_mrope_reset_spatial_ids",
                "unified_3d_mrope_temporal_modality_margin"):
        value = _one(model, key, None, where)
        if value is None:
            raise ValueError(f"{where}: its \"model\" section does not state {key}, which the "
                             "generator's positions depend on (the export's config.json is the "
                             "one export_model.py writes? see docs/checkpoints.md)")
        config[key] = value
        stated.append(key)
    steps = _one(model, "num_train_timesteps", 1000, where)
    config["timestep_scale"] = float(_one(model, "timestep_range", 1.0, where)) / float(steps)
    lm = _language_model_config(model)
    rope_keys = ("rope_theta", "rms_norm_eps")
    if lm is not None and lm.get("hidden_size") == hidden:
        rope = lm.get("rope_parameters") or lm.get("rope_scaling") or {}
        section = rope.get("mrope_section") or lm.get("mrope_section")
        if section is None:
            raise ValueError(f"{where}: its language model config states no mrope_section")
        config.update(rope_theta=float(rope.get("rope_theta", lm.get("rope_theta"))),
                      rms_norm_eps=float(lm.get("rms_norm_eps", 1e-6)),
                      rope_scaling={"mrope_section": list(section),
                                    "mrope_interleaved": bool(rope.get("mrope_interleaved", True))})
        source = "shapes from the tensors; latent and position settings and the language " \
                 "model's rope from config.json's \"model\" section"
        return config, source
    shape_keys = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                  "hidden_act")
    matches = [name for name, preset in GENERATOR_PRESETS.items() if name != "tiny"
               and all(preset.get(k) == config[k] for k in shape_keys)]
    if not matches:
        raise ValueError(
            f"{where}: the export states neither its language model's {', '.join(rope_keys)} "
            f"and mrope sections, nor has the shape of a published Cosmos3 model (hidden "
            f"{hidden}, {layers} layers, {config['num_attention_heads']} heads, vocabulary "
            f"{vocab}); convert it with cosmos-framework's own diffusers conversion instead")
    preset = GENERATOR_PRESETS[matches[0]]
    config.update(rope_theta=preset["rope_theta"], rms_norm_eps=preset.get("rms_norm_eps", 1e-6))
    if "rope_scaling" in preset:
        config["rope_scaling"] = dict(preset["rope_scaling"])
    else:
        config["rope_axes_dim"] = list(preset["rope_axes_dim"])
    source = (f"shapes from the tensors; latent and position settings from config.json's "
              f"\"model\" section; rope and norm eps of the published {matches[0]!r} model, "
              "whose shape the tensors have")
    return config, source


def read(root: Path, raw: dict[str, Any], headers: Headers, *, vae: str | Path | None = None
         ) -> CheckpointFolder:
    """A cosmos-framework export, checked: the index's shards present and complete, every
    tensor mapped or knowingly skipped, the generator's config derived, a VAE given."""
    from cosmos3_gym.formats import SHIPPED
    from cosmos3_gym.formats.base import safetensors_files
    from cosmos3_gym.formats.diffusers import VAE, vae_folder
    from cosmos3_gym.model.config import Cosmos3Config

    path = inside(root, root / CONFIG, "config")
    model = raw.get("model")
    if not isinstance(model, dict):
        raise ValueError(f"{path}: no \"model\" section (a cosmos-framework export's config.json "
                         "has one)")
    files = tuple(inside(root, p, "weights") for p in safetensors_files(root, headers))
    weights = WeightFiles(files, diffusers_name,
                          f"{PREFIX}* renamed as cosmos-framework's diffusers conversion does",
                          headers=headers)

    def skipped(key: str) -> str | None:
        return "vision tower (ViT)" if key.startswith(PREFIX + VISUAL) else None

    ignored = check_claimed(files, (weights,), skipped, str(root), headers)
    config_raw, source = transformer_config(weights.shapes(), model, str(path))
    transformer = Cosmos3Config.from_dict(config_raw, source=f"{path} (derived)", strict=True)
    if vae is None:
        raise ValueError(
            f"{root} is a cosmos-framework export, which holds no VAE: give --vae PATH, a "
            "diffusers AutoencoderKLWan folder (Wan-AI/Wan2.2-TI2V-5B-Diffusers' vae/) or a "
            "Cosmos3 diffusers checkpoint (nvidia/Cosmos3-Nano) whose vae/ is used")
    vae_path = Path(vae)
    if not vae_path.exists() and (SHIPPED / str(vae)).is_dir():
        vae_path = SHIPPED / str(vae)  # a shipped checkpoint's vae/
    if vae_path.is_file() and vae_path.suffix in PICKLE_SUFFIXES:
        raise ValueError(
            f"--vae {vae}: a pickled VAE ({vae_path.suffix}) is not loaded (unpickling can run "
            "code, and the original Wan key layout is not verified here); give the diffusers "
            "folder of the same VAE (Wan-AI/Wan2.2-TI2V-5B-Diffusers, its vae/)")
    if (vae_path / VAE).is_dir() and not (vae_path / "config.json").is_file():
        vae_path = vae_path / VAE
    if not vae_path.is_dir():
        raise FileNotFoundError(f"--vae {vae}: no such folder (expected a diffusers "
                                "AutoencoderKLWan folder)")
    vae_config, vae_weights = vae_folder(vae_path, vae_path, "--vae", headers)
    if int(vae_config.get("z_dim", 16)) != transformer.latent_channel:
        raise ValueError(f"--vae {vae}: its z_dim {vae_config.get('z_dim')} latent channels do "
                         f"not fit the export's {transformer.latent_channel} (the Wan2.2 VAE "
                         "has 48)")
    tokenizer = root
    if not any((root / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(f"{root} has no tokenizer files (tokenizer.json, "
                                "tokenizer_config.json): an export bundles its processor; an "
                                "incomplete download?")
    checkpoint = root / "checkpoint.json"
    notes = [f"transformer config: {source}"]
    if checkpoint.is_file():
        policy = read_json_object(inside(root, checkpoint, "checkpoint.json"),
                                  what="checkpoint.json").get("policy")
        if policy:
            notes.append(f"checkpoint.json policy: {policy}")
    notes.append("statistics: none in the export (give --action-stats; the LIBERO recipe's file "
                 "is cosmos-framework's libero_native_frame_wise_relative_rot6d.json)")
    return CheckpointFolder(
        root=root, format="cosmos-framework", kind=raw.get("model_type"),
        transformer=transformer, transformer_source=source, transformer_weights=weights,
        vae_config=vae_config, vae_weights=vae_weights, vae_source=f"--vae {vae}",
        tokenizer=tokenizer, tokenizer_source="the export's bundled processor files",
        ignored=ignored, notes=tuple(notes),
    )


def write_export(directory: str | Path, *, transformer: Any, tokenizer_dir: Path,
                 shards: int = 2, vision_tower: bool = True) -> Path:
    """Write a cosmos-framework export of ``transformer``: the layout :func:`read` reads, built
    by the inverse of the documented renames (:func:`export_name`): ``config.json`` with a
    ``"model"`` section (the latent and position settings, and the language model's config),
    ``model-0000K-of-0000N.safetensors`` shards with their index, the tokenizer files at the
    root and, with ``vision_tower``, a few ``language_model.visual.*`` tensors as Nano's export
    carries its ViT. For tests and the GPU session; cosmos-framework's own exporter needs a
    training checkpoint and a GPU (docs/checkpoints.md)."""
    import torch

    from cosmos3_gym.jsonio import copy_file_atomic, save_safetensors, write_json_atomic

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = transformer.config
    model = {
        "_target": "omni_mot_model",
        "config": {
            "state_ch": c.latent_channel, "max_action_dim": c.action_dim,
            "num_embodiment_domains": c.num_embodiment_domains, "action_gen": c.action_gen,
            "sound_gen": c.sound_gen,
            "rectified_flow_inference_config": {"_type": "rectified_flow_inference_config",
                                                "scheduler_type": "unipc",
                                                "num_train_timesteps": 1000, "shift": 1},
            "diffusion_expert_config": {
                "_type": "diffusion_expert_config", "patch_spatial": c.latent_patch_size,
                "base_fps": c.base_fps, "enable_fps_modulation": c.enable_fps_modulation,
                "unified_3d_mrope_reset_spatial_ids": c.unified_3d_mrope_reset_spatial_ids,
                "unified_3d_mrope_temporal_modality_margin":
                    c.unified_3d_mrope_temporal_modality_margin,
                "timestep_range": c.timestep_scale * 1000.0,
            },
            "vlm_config": {"_type": "vlm_config", "model_name": "tiny", "model_instance": {
                "_target": "qwen3_vl_text_for_causal_lm", "config": {
                    "hidden_size": c.hidden_size, "rope_theta": c.rope_theta,
                    "rms_norm_eps": c.rms_norm_eps, "hidden_act": c.hidden_act,
                    "rope_scaling": {"mrope_section": list(c.rope_axes_dim),
                                     "mrope_interleaved": True}}}},
        },
    }
    write_json_atomic(directory / CONFIG, {"model_type": MODEL_TYPE, "model": model})
    state = {export_name(k): v.detach().contiguous().cpu()
             for k, v in transformer.state_dict().items()}
    state.setdefault(PREFIX + LM_HEAD + "weight", torch.zeros(c.vocab_size, c.hidden_size))
    if vision_tower:
        gen = torch.Generator().manual_seed(0)
        for i in range(2):
            state[f"{PREFIX}{VISUAL}blocks.{i}.attn.qkv.weight"] = torch.randn(8, 4, generator=gen)
    names = sorted(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        part = names[k * per:(k + 1) * per]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors({n: state[n] for n in part}, directory / file)
        weight_map.update({n: file for n in part})
    write_json_atomic(directory / INDEX, {"metadata": {}, "weight_map": weight_map})
    for file in sorted(Path(tokenizer_dir).iterdir()):
        copy_file_atomic(file, directory / file.name)
    return directory
