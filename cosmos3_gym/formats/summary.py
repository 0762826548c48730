"""``cosmos3-gym inspect``: what a checkpoint folder is and how it would run, before any weight
loads (headers only: an export of any size is described without reading its tensors)."""

from __future__ import annotations

import math
from typing import Any

from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.formats.base import CheckpointFolder


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if nbytes < 1024 or unit == "TB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    raise AssertionError


def _parameters(folder: CheckpointFolder) -> str:
    count = sum(math.prod(shape) for shape in folder.transformer_weights.shapes().values())
    return f"{count / 1e9:.2f} B" if count >= 1e8 else f"{count / 1e6:.2f} M"


def _dtypes(folder: CheckpointFolder) -> str:
    counts: dict[str, int] = {}
    for path in folder.transformer_weights.files:
        for key, entry in folder.transformer_weights.headers(path).items():
            if folder.transformer_weights.rename(key) is not None:
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + 1
    return ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))


def describe(folder: CheckpointFolder, policy: PolicyConfig | None, contract: Any,
             why_no_policy: str | None = None) -> list[tuple[str, str]]:
    """The rows ``inspect`` prints: ``(what, value)``."""
    t = folder.transformer
    rows = [
        ("checkpoint", str(folder.root)),
        ("format", folder.format + (f" ({folder.kind})" if folder.kind else "")),
        ("generator", f"hidden {t.hidden_size}, {t.num_hidden_layers} layers, "
                      f"{t.num_attention_heads} heads ({t.num_key_value_heads} kv) of "
                      f"{t.head_dim}, {t.hidden_act}; {_parameters(folder)} "
                      f"parameters ({_dtypes(folder)}); config: {folder.transformer_source}"),
        ("weights", folder.transformer_weights.mapping + (
            "; skipped: " + ", ".join(f"{n} {w}" for w, n in folder.ignored.items())
            if folder.ignored else "")),
        ("vae", f"AutoencoderKLWan z {folder.vae_config.get('z_dim')}, "
                f"{folder.vae_config.get('scale_factor_spatial', 8)}x spatial, "
                f"{folder.vae_config.get('scale_factor_temporal', 4)}x temporal "
                f"({folder.vae_source})"),
        ("tokenizer", f"{folder.tokenizer} ({folder.tokenizer_source})"),
    ]
    if policy is None:
        rows.append(("policy", why_no_policy or "none declared"))
    else:
        p = policy
        rows += [
            ("domain", f"{p.domain_name} (embodiment row {p.domain_id})"),
            ("actions", f"{p.raw_action_dim}-D, chunk {p.action_horizon}"
                        + (f", executes {contract.n_action_steps}" if contract is not None
                           and contract.n_action_steps else "")
                        + f"; normalisation {p.normalization}"
                        + ("; gripper inverted inside the model" if p.invert_gripper else "")),
            ("statistics", _stats(p.stats) if p.normalization != "none" else "not used"),
            ("state", "none" if not p.history_length else
                      f"{p.history_length} row(s)" + (f", own statistics ({p.state_normalization}:"
                                                      f" {_stats(p.state_stats)})"
                                                      if p.state_stats else ", like the actions")),
            ("image", f"tier {p.resolution_tier} ({p.canvas_bins} bins), resize {p.resize}"),
            ("caption", f"{p.caption_format}, view point {p.view_point}, fps {p.fps:g}"
                        + (f"; view description {p.view_description!r}"
                           if p.view_description else "")),
            ("sampler", p.describe_sampler()),
            ("recipe", p.recipe or "none"),
        ]
    if contract is not None:
        views = ", ".join(contract.image_keys) if contract.image_keys else "agentview, wrist"
        canvas = (f" -> {contract.canvas_hw[0]}x{contract.canvas_hw[1]} canvas (top view "
                  f"{contract.primary_height} rows)" if contract.canvas_hw else "")
        rows.append(("observations", f"{contract.convention}: {views}{canvas}"
                                     + (f"; state {contract.state_key}" if contract.state_key
                                        else "")))
    files = folder.files()
    rows.append(("files", f"{len(files)} files, {_size(sum(s for _, s in files))}"))
    rows += [("note", note) for note in folder.notes]
    return rows


def _stats(stats: dict | None) -> str:
    if not stats:
        return "none (actions stay in the model's normalised space)"
    blocks = {k: v for k, v in stats.items() if isinstance(v, dict)} or {"global": stats}
    out = []
    for name, block in blocks.items():
        vectors = [k for k, v in block.items() if isinstance(v, (list, tuple))]
        width = len(block[vectors[0]]) if vectors else 0
        out.append(f"{name}: {', '.join(vectors)} ({width}-D)")
    return "; ".join(out)


def render(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
