"""What a fine-tuning run trains: every weight, LoRA adapters, or named modules.

:func:`make_trainable` sets a transformer up for one of three settings (``--train``):

- ``full``: every parameter;
- ``lora``: LoRA adapters (``peft``, the ``rl`` extra) on every GEN layer's seven projections
  (the generation tower's Q, K, V, output, gate, up, down; the text tower stays frozen, so the
  prompt cache stays valid), and the action heads (``action_proj_in`` / ``action_proj_out``)
  trained in full as peft's ``modules_to_save`` copies: the base weights stay untouched, and the
  adapters switched off give the base policy back (the KL reference costs nothing);
- ``modules:NAME,NAME``: the named submodules in full (``action_proj_in,layers.1.mlp_moe_gen``).

Trained parameters keep fp32 master copies where the model runs in bf16
(:class:`MasterWeights`), so AdamW's moments and its small steps are fp32; the frozen weights and
the forward stay in the model's dtype; a run's state saves the masters by name.
:class:`Trainable` switches to the reference policy for the KL term and writes the result: the
adapters in peft's layout beside a merged transformer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmos3_gym.train.config import parse_train

# The GEN layers' projections LoRA adapts (the text tower's to_q/to_k/to_v/to_out and mlp are not).
LORA_TARGETS = (r"layers\.\d+\.(self_attn\.(add_q_proj|add_k_proj|add_v_proj|to_add_out)"
                r"|mlp_moe_gen\.(gate_proj|up_proj|down_proj))")
# Trained in full beside the adapters: the action heads (DomainAwareLinear tables).
LORA_FULL_MODULES = ("action_proj_in", "action_proj_out")


@dataclass
class Trainable:
    """A transformer set up for training, and what was chosen."""

    model: nn.Module
    train: str
    tuner: Any = None  # peft's LoraModel for --train lora
    lora_config: Any = None

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    @property
    def count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def fully_trained_count(self) -> int:
        """Parameters trained in full (not adapters): what a frozen KL reference must copy."""
        return sum(p.numel() for n, p in self.named_parameters() if ".lora_" not in n)

    @contextlib.contextmanager
    def reference(self, frozen: dict[str, torch.Tensor] | None) -> Iterator[None]:
        """The base policy for the KL term: LoRA's adapters (and its trained head copies)
        switched off; for full or named modules, ``frozen`` (their values at the start) swapped
        in for the duration."""
        if self.tuner is not None:
            self.tuner.disable_adapter_layers()
            try:
                yield
            finally:
                self.tuner.enable_adapter_layers()
            return
        if frozen is None:
            raise ValueError("a KL reference for --train full or modules needs the frozen copy")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                p.data, frozen[name] = frozen[name], p.data
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.data, frozen[name] = frozen[name], p.data

    def frozen_copy(self) -> dict[str, torch.Tensor] | None:
        """The fully trained parameters' starting values (the KL reference of full or named
        modules; None for LoRA, whose reference is the base with adapters off)."""
        if self.tuner is not None:
            return None
        return {n: p.detach().clone() for n, p in self.named_parameters()}

    def save_adapter(self, folder: str | Path) -> Path | None:
        """peft's adapter layout (``adapter_config.json``, ``adapter_model.safetensors``) for
        ``--train lora``; None otherwise."""
        if self.tuner is None:
            return None
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu()
                 for k, v in get_peft_model_state_dict(self.model).items()}
        save_file(state, folder / "adapter_model.safetensors")
        self.lora_config.save_pretrained(folder)
        return folder

    def merged(self) -> nn.Module:
        """The transformer with the adapters merged into its weights (and the trained head
        copies in place of the base heads): a plain ``Cosmos3Transformer`` again. For LoRA this
        unwraps the model in place; the others return it as it is."""
        if self.tuner is None:
            return self.model
        return self.tuner.merge_and_unload()


def make_trainable(model: nn.Module, train: str, *, lora_rank: int = 16,
                   lora_alpha: float | None = None) -> Trainable:
    """Set ``model`` up to train as ``train`` says (see the module notes); returns what trains.
    LoRA's initialisation draws from torch's global generator: seed it for a reproducible run."""
    train = parse_train(train)
    model.requires_grad_(False)
    if train == "full":
        model.requires_grad_(True)
        return Trainable(model, train)
    if train.startswith("modules:"):
        names = train.removeprefix("modules:").split(",")
        modules = dict(model.named_modules())
        unknown = [n for n in names if n not in modules or n == ""]
        if unknown:
            tops = sorted({n.split(".")[0] for n in modules if n})
            raise ValueError(f"--train {train}: no module named {unknown} in the transformer; "
                             f"expected dotted names such as {tops[:6]} or layers.0.mlp_moe_gen")
        for name in names:
            modules[name].requires_grad_(True)
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(f"--train {train}: those modules hold no parameters")
        return Trainable(model, train)
    try:
        import peft
    except ImportError:
        raise ImportError("--train lora needs peft: pip install 'cosmos3-gym[rl]'") from None
    if lora_rank < 1:
        raise ValueError(f"--lora-rank must be >= 1; found {lora_rank}")
    full = [m for m in LORA_FULL_MODULES if hasattr(model, m)]
    config = peft.LoraConfig(r=lora_rank, lora_alpha=lora_alpha or 2 * lora_rank,
                             lora_dropout=0.0, target_modules=LORA_TARGETS,
                             modules_to_save=full or None)
    matched = [n for n, _ in model.named_modules() if re.fullmatch(LORA_TARGETS, n)]
    if not matched:
        raise ValueError("--train lora: the transformer has no GEN projections to adapt")
    tuner = peft.LoraModel(model, config, "default")
    return Trainable(model, train, tuner=tuner, lora_config=config)


class MasterWeights:
    """fp32 master copies of trained parameters held in a lower precision (bf16), for the
    optimiser: ``grads_to_master()`` before its step, ``master_to_model()`` after. Parameters
    already in fp32 are their own masters. A run's state saves the masters (:meth:`state_dict`),
    so a resumed run continues from the same fp32 values."""

    def __init__(self, named: list[tuple[str, nn.Parameter]]) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.masters = [p if p.dtype == torch.float32 else
                        nn.Parameter(p.detach().float().clone()) for p in self.params]

    @property
    def copies(self) -> bool:
        """Whether any master is a separate fp32 copy."""
        return any(m is not p for m, p in zip(self.masters, self.params, strict=True))

    def grads_to_master(self) -> None:
        for m, p in zip(self.masters, self.params, strict=True):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()

    def master_to_model(self) -> None:
        with torch.no_grad():
            for m, p in zip(self.masters, self.params, strict=True):
                if m is not p:
                    p.copy_(m)

    def zero_grad(self) -> None:
        for m, p in zip(self.masters, self.params, strict=True):
            p.grad = None
            m.grad = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The masters by parameter name (CPU, contiguous)."""
        return {n: m.detach().contiguous().cpu()
                for n, m in zip(self.names, self.masters, strict=True)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Set the masters and the model's parameters from :meth:`state_dict` (names and
        shapes checked first: nothing changes on a mismatch)."""
        missing = sorted(set(self.names) - set(state))
        extra = sorted(set(state) - set(self.names))
        wrong = sorted(n for n, m in zip(self.names, self.masters, strict=True)
                       if n in state and tuple(state[n].shape) != tuple(m.shape))
        if missing or extra or wrong:
            raise ValueError(f"the saved trained parameters do not match this setting: "
                             f"missing {missing[:4]}, unexpected {extra[:4]}, wrong shapes "
                             f"{wrong[:4]}")
        with torch.no_grad():
            for name, m, p in zip(self.names, self.masters, self.params, strict=True):
                m.copy_(state[name].to(m.device, m.dtype))
                if m is not p:
                    p.copy_(m)

    def sync_from_model(self) -> None:
        """The masters follow the model's parameters (after they were set from elsewhere: rank
        0's values broadcast)."""
        with torch.no_grad():
            for m, p in zip(self.masters, self.params, strict=True):
                if m is not p:
                    m.copy_(p.float())
