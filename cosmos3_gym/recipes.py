"""The released Cosmos3 checkpoints and post-training recipes, as NVIDIA runs them, with sources.

Each :class:`Recipe` is the set of :class:`~cosmos3_gym.checkpoint.PolicyConfig` values one
release is run with (sampler steps, guidance and its interval, flow shift, chunk, action head,
state rows, resolution tier, view point, caption format) and, for every value, the file or page
it comes from (:data:`SOURCES`). Where sources disagree the recipe follows NVIDIA's own code and
docs (cosmos-framework, NVIDIA/cosmos) and names the disagreement; a value no public source
states is marked ``not sourced`` rather than invented. ``docs/recipes.md`` is this table
rendered (:func:`recipe_table`), and a test keeps the two equal.

Pick one with ``Cosmos3ActionPipeline.from_pretrained(path, recipe="nano-policy-droid")``.

>>> RECIPES["nano-policy-droid"].settings["num_inference_steps"]
4
>>> RECIPES["edge-policy-droid"].settings["guidance_interval"]
(960.0, 1001.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Where the values come from. NVIDIA/cosmos-framework at 5eee9ed ("Release 2026-08-21"),
# NVIDIA/cosmos at aca7057, sglang's cookbook and diffusers 0.42.1 as read for this table.
SOURCES: dict[str, str] = {
    "CF:robolab-server": "NVIDIA/cosmos-framework cosmos_framework/scripts/"
                         "action_policy_server_robolab.py (RobolabServerArgs defaults, "
                         "_build_sample, infer)",
    "CF:droid-server-doc": "NVIDIA/cosmos-framework docs/action_policy_droid_server.md "
                           "(launch commands; PR #202)",
    "CF:droid-sft": "NVIDIA/cosmos-framework cosmos_framework/configs/base/experiment/action/"
                    "posttrain_config/action_policy_droid_nano.py and datasets/"
                    "action_sft_dataset.py get_action_droid_sft_dataset",
    "CF:sequence-plan": "NVIDIA/cosmos-framework cosmos_framework/data/generator/action/utils/"
                        "transforms.py build_sequence_plan_from_mode (use_state: Case B)",
    "CF:guidance-interval": "NVIDIA/cosmos-framework cosmos_framework/model/generator/"
                            "omni_mot_model.py generate_samples_from_batch (guidance_interval: "
                            "t_lo < timestep < t_hi)",
    "CF:generate-default": "NVIDIA/cosmos-framework omni_mot_model.py generate_samples_from_batch "
                           "signature (shift: float = 5.0)",
    "CF:libero-server": "NVIDIA/cosmos-framework cosmos_framework/scripts/"
                        "action_policy_server_libero.py (defaults; calls "
                        "generate_samples_from_batch without shift)",
    "CF:libero-sft": "NVIDIA/cosmos-framework docs/action_policy_libero_posttrain.md and "
                     "configs/.../action_policy_libero_nano.py",
    "CF:wam-defaults": "NVIDIA/cosmos-framework cosmos_framework/inference/defaults/wam/"
                       "sample_args.json",
    "CF:input-bridge": "NVIDIA/cosmos-framework inputs/omni/action_policy_robot.json",
    "CF:input-av": "NVIDIA/cosmos-framework inputs/omni/action_policy_av.json",
    "CF:model-configs": "NVIDIA/cosmos-framework cosmos_framework/inference/configs/model/"
                        "Cosmos3-{Nano,Super,Edge}.yaml (action_gen: true)",
    "COS:action-readme": "NVIDIA/cosmos cookbooks/cosmos3/generator/action/README.md "
                         "(Action Definition table)",
    "COS#323": "NVIDIA/cosmos PR #323 (the internal stack runs [2, 1, 1, 1] denoiser forwards "
               "over 4 steps; the Nano invocation is unchanged)",
    "COS#275": "NVIDIA/cosmos issue #275 (\"4 denoising steps which is setting of the released "
               "code\"; RoboLab-120 26.5% reproduced vs 36.8% published)",
    "SGL:cookbook": "sgl-project/sglang docs/cookbook/diffusion/Cosmos/Cosmos3.mdx (action "
                    "example request; default flow_shift 10.0 for all action modes)",
    "DIF:domains": "diffusers 0.42.1 pipelines/cosmos/pipeline_cosmos3_omni.py "
                   "_EMBODIMENT_TO_DOMAIN_ID / _EMBODIMENT_TO_RAW_ACTION_DIM",
    "CF:unipc-shift": "NVIDIA/cosmos-framework cosmos_framework/model/generator/diffusion/"
                      "samplers/unipc.py (UniPCSampler.__call__: the call's shift, 5.0 from "
                      "generate_samples_from_batch, is passed to set_timesteps and wins over "
                      "the model config's rectified_flow_inference_config.shift)",
    "CF:nano-config": "NVIDIA/cosmos-framework configs/base/experiment/sft/models/"
                      "nano_model_config.py (rectified_flow_inference_config.shift = 1)",
    "HF:lerobot-nano-libero": "the model card of lerobot/Cosmos3-Nano-Policy-LIBERO_10 (LIBERO-10 "
                              "97.6%, 488/500; image + image2 256 x 256, 20 FPS, no state, 10-D "
                              "[dpos, rot6d, gripper], chunk 16)",
    "HF:lerobot-edge-libero": "the model card of lerobot/Cosmos3-Edge-Policy-LIBERO_10 (type "
                              "cosmos3_edge, Nemotron 3 Dense VL MoT; the same LIBERO contract)",
    "HF:sdg-export": "the model card of nvidia/cosmos3-nano-libero10-sdg-export-R (LIBERO-10 "
                     "93.9 +- 1.0% standard scenes, 85.1 +- 0.6% perturbed: 10 tasks x 50 init "
                     "states, 3 seeds)",
    "HF:vecum-sft": "the model card of vecum0814/Cosmos3-Nano-LIBERO10-SFT (an export of the "
                    "cosmos-framework LIBERO recipe with the Wan2.2 VAE; no result published)",
    "mstar": "the mstar serving engine's model table (cosmos3_droid: \"serves the released "
             "policy sampling defaults (4 steps, guidance 3.0)\"; quoted secondhand, the "
             "table itself not read)",
}

# The official RoboLab/DROID server's view description, appended to the concat_view framing
# sentence of the caption (wrist camera on top, both exterior cameras below it).
DROID_VIEW_DESCRIPTION = (
    "The top row is from the wrist-mounted camera. The bottom row contains two horizontally "
    "concatenated third-person perspective views of the scene from opposite sides, with the "
    "robot visible."
)

# The table's columns: PolicyConfig fields (and the representation text) in display order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("num_inference_steps", "steps"),
    ("guidance_scale", "guidance"),
    ("guidance_interval", "guidance interval"),
    ("flow_shift", "shift"),
    ("action_horizon", "chunk"),
    ("representation", "actions"),
    ("history_length", "state rows"),
    ("resolution_tier", "tier"),
    ("view_point", "view point"),
    ("fps", "fps"),
)


@dataclass(frozen=True)
class Published:
    """A result the checkpoint's publisher reports, and what a run of ours should show.

    Attributes:
        benchmark: what was measured (``"LIBERO-10, standard scenes"``).
        rate: the published success rate in [0, 1], or None where the source states none.
        episodes: episodes behind it, where stated.
        spread: how the publisher states its uncertainty (``"+- 1.0 over 3 seeds"``).
        source: a key of :data:`SOURCES`.
    """

    benchmark: str
    rate: float | None
    episodes: int | None
    spread: str | None
    source: str

    def interval(self, episodes: int = 500) -> tuple[float, float] | None:
        """Where a run of ``episodes`` episodes lands 95% of the time if the checkpoint's true
        rate is the published one: the Wilson interval of that rate over that many episodes
        (about +-1.3 to 2.1 points at 500 for rates of 98 to 94%).

        >>> [round(x, 3) for x in RECIPES["lerobot-nano-libero10"].published[0].interval()]
        [0.959, 0.986]
        """
        if self.rate is None:
            return None
        from cosmos3_gym.stats import wilson_interval_of_rate

        return wilson_interval_of_rate(self.rate, episodes)


@dataclass(frozen=True)
class Recipe:
    """One released checkpoint (or post-training recipe) as its publisher runs it.

    Attributes:
        name: what ``recipe=`` and ``--recipe`` take.
        checkpoints: the checkpoints it serves.
        representation: the action head in words (width, meaning, normalisation, state input).
        settings: the :class:`~cosmos3_gym.checkpoint.PolicyConfig` fields it sets.
        sources: per setting (and ``"representation"``): keys of :data:`SOURCES`, or text that
            starts with ``not sourced`` where no public source states the value.
        disagreements: what other sources say instead, and why this recipe does not follow them.
        from_folder: settings the checkpoint folder itself states (a LeRobot folder's sampler),
            which the recipe leaves to it.
        published: the results the publisher reports for these checkpoints.
    """

    name: str
    checkpoints: str
    representation: str
    settings: dict[str, Any]
    sources: dict[str, str]
    disagreements: tuple[str, ...] = ()
    from_folder: tuple[str, ...] = ()
    published: tuple[Published, ...] = ()

    def __post_init__(self) -> None:
        missing = sorted((set(self.settings) | {"representation"}) - set(self.sources))
        if missing:
            raise ValueError(f"recipe {self.name!r}: no source for {missing}")


_DROID_POLICY = {
    "domain_name": "droid_lerobot", "raw_action_dim": 8, "action_horizon": 32,
    "normalization": "none", "history_length": 1, "fps": 15.0, "resolution_tier": 480,
    "view_point": "concat_view", "view_description": DROID_VIEW_DESCRIPTION,
    "idle_frame": False, "num_inference_steps": 4, "guidance_scale": 3.0,
    "guidance_interval": None, "flow_shift": 5.0,
}
_DROID_POLICY_SOURCES = {
    "domain_name": "CF:robolab-server",
    "raw_action_dim": "CF:robolab-server",
    "action_horizon": "CF:robolab-server; CF:droid-sft",
    "normalization": "CF:droid-sft",
    "history_length": "CF:robolab-server; CF:sequence-plan",
    "fps": "CF:robolab-server; CF:droid-sft",
    "resolution_tier": "CF:robolab-server",
    "view_point": "CF:robolab-server",
    "view_description": "CF:robolab-server",
    "idle_frame": "CF:robolab-server; CF:droid-sft",
    "num_inference_steps": "CF:robolab-server; COS#275; mstar",
    "guidance_scale": "CF:robolab-server; mstar",
    "guidance_interval": "CF:droid-server-doc; COS#323",
    "flow_shift": "CF:robolab-server",
    "representation": "CF:robolab-server; CF:droid-sft",
}
_DROID_REPRESENTATION = (
    "8-D joint positions [7 joints, gripper], raw (no normalisation), gripper 1 - g; one clean "
    "state row [joint_position, 1 - gripper_position] before the chunk, stripped from the output; "
    "image: wrist camera on top of both exterior cameras (540 x 640); JSON caption without "
    "idle_frame, with the DROID view description"
)
_DROID_DISAGREEMENTS = (
    "sglang's cookbook example request for this checkpoint uses 30 steps, guidance 1.0, 16 "
    "actions at fps 5 on 832x480 with the 10-D droid_lerobot width of diffusers' and sglang's "
    "tables, and no state input (SGL:cookbook; DIF:domains): NVIDIA's own server decides",
    "NVIDIA/cosmos PR #323 says the internal stack guides the first of the 4 steps only, but "
    "NVIDIA's Nano launch command applies guidance at every step (no --guidance-interval): the "
    "Nano recipe follows the command; the Edge recipe carries the interval",
)

_GENERIC = {
    "num_inference_steps": 30, "guidance_scale": 1.0, "guidance_interval": None,
    "flow_shift": 10.0, "normalization": "quantile", "history_length": 0,
}
_GENERIC_SOURCES = {
    "num_inference_steps": "CF:wam-defaults", "guidance_scale": "CF:wam-defaults",
    "guidance_interval": "CF:wam-defaults (none)", "flow_shift": "CF:wam-defaults",
    "normalization": "not sourced: the mid-train normalisation mode is not stated publicly "
                     "(this project's quantile)",
    "history_length": "CF:wam-defaults (no state input)",
}
_GENERIC_CHECKPOINTS = (
    "nvidia/Cosmos3-Nano, nvidia/Cosmos3-Edge (and Super, whose config has action_gen: true; "
    "CF:model-configs)"
)

# cosmos-framework's LIBERO policy server and post-training recipe: the LIBERO settings of a
# cosmos-framework checkpoint, yours or an export.
_LIBERO_SERVER = {
    "domain_name": "libero", "raw_action_dim": 10, "action_horizon": 16,
    "normalization": "quantile_rot", "fps": 20.0, "resolution_tier": 256,
    "view_point": "concat_view", "num_inference_steps": 30, "guidance_scale": 1.0,
    "guidance_interval": None, "flow_shift": 5.0, "history_length": 0,
}
_LIBERO_SERVER_SOURCES = {
    "domain_name": "CF:libero-sft", "raw_action_dim": "CF:libero-server",
    "action_horizon": "CF:libero-server; CF:libero-sft",
    "normalization": "CF:libero-sft", "fps": "CF:libero-server",
    "resolution_tier": "CF:libero-server", "view_point": "CF:libero-sft",
    "num_inference_steps": "CF:libero-server", "guidance_scale": "CF:libero-server",
    "guidance_interval": "CF:libero-server (none)",
    "flow_shift": "CF:libero-server; CF:generate-default",
    "history_length": "CF:libero-server (zeros chunk, no history)",
    "representation": "CF:libero-sft",
}

RECIPES: dict[str, Recipe] = {
    "libero": Recipe(
        name="libero",
        checkpoints="your own LIBERO post-training of nvidia/Cosmos3-Nano (a diffusers folder; the "
                    "public LIBERO checkpoints have recipes of their own below)",
        representation="10-D frame-wise relative [dpos, rot6d, gripper], quantile_rot "
                       "statistics; no state; agentview and wrist views side by side, 256 x 256 "
                       "each",
        settings=dict(_LIBERO_SERVER),
        sources=dict(_LIBERO_SERVER_SOURCES),
        disagreements=(
            "shift: the LIBERO server passes none, so generate_samples_from_batch's default 5.0 "
            "applies; the wam defaults and sglang use 10.0 (CF:wam-defaults, SGL:cookbook). "
            "Which one produced the published 97.4% is not stated",
        ),
    ),
    "nano-libero10-export": Recipe(
        name="nano-libero10-export",
        checkpoints="nvidia/cosmos3-nano-libero10-sdg-export-R, "
                    "vecum0814/Cosmos3-Nano-LIBERO10-SFT (cosmos-framework exports; with --vae "
                    "and --action-stats)",
        representation="10-D frame-wise relative [dpos, rot6d, gripper], quantile_rot "
                       "statistics (not in the export: --action-stats); no state; agentview and "
                       "wrist views side by side, 256 x 256 each",
        settings=dict(_LIBERO_SERVER),
        sources={**_LIBERO_SERVER_SOURCES, "domain_name": "CF:libero-sft; HF:sdg-export",
                 "flow_shift": "CF:libero-server; CF:unipc-shift"},
        disagreements=(
            "shift: the Nano model config says rectified_flow_inference_config.shift = 1 "
            "(CF:nano-config), but the LIBERO server calls generate_samples_from_batch without a "
            "shift, whose default 5.0 is handed to the sampler's set_timesteps, which overrides "
            "the config's value (CF:unipc-shift): the server samples at 5.0, and so does this "
            "recipe",
        ),
        published=(
            Published("LIBERO-10, standard scenes", 0.939, 1500, "+- 1.0 over 3 seeds",
                      "HF:sdg-export"),
            Published("LIBERO-10, perturbed scenes", 0.851, 1500, "+- 0.6 over 3 seeds",
                      "HF:sdg-export"),
        ),
    ),
    "lerobot-nano-libero10": Recipe(
        name="lerobot-nano-libero10",
        checkpoints="lerobot/Cosmos3-Nano-Policy-LIBERO_10 (LeRobot policy folder)",
        representation="10-D [dpos, rot6d, gripper], the folder's statistics; no state; "
                       "observation.images.image (third person) and image2 (wrist), 256 x 256, "
                       "composed as the folder's config says",
        settings={"domain_name": "libero", "raw_action_dim": 10, "action_horizon": 16,
                  "fps": 20.0, "history_length": 0},
        sources={"domain_name": "HF:lerobot-nano-libero",
                 "raw_action_dim": "HF:lerobot-nano-libero",
                 "action_horizon": "HF:lerobot-nano-libero", "fps": "HF:lerobot-nano-libero",
                 "history_length": "HF:lerobot-nano-libero",
                 "representation": "HF:lerobot-nano-libero"},
        disagreements=(
            "the LeRobot code that wrote the public folders is not public (LeRobot PR #3745's "
            "draft differs from it at least in the type name); the folder's own config.json is "
            "followed for everything it states, and this recipe only checks the card's contract",
        ),
        from_folder=("num_inference_steps", "guidance_scale", "guidance_interval", "flow_shift",
                     "resolution_tier", "view_point"),
        published=(Published("LIBERO-10", 0.976, 500, "488/500", "HF:lerobot-nano-libero"),),
    ),
    "lerobot-edge-libero10": Recipe(
        name="lerobot-edge-libero10",
        checkpoints="lerobot/Cosmos3-Edge-Policy-LIBERO_10 (LeRobot policy folder, type "
                    "cosmos3_edge)",
        representation="10-D [dpos, rot6d, gripper], the folder's statistics; no state; "
                       "observation.images.image and image2, 256 x 256",
        settings={"domain_name": "libero", "raw_action_dim": 10, "action_horizon": 16,
                  "fps": 20.0, "history_length": 0},
        sources={"domain_name": "HF:lerobot-edge-libero",
                 "raw_action_dim": "HF:lerobot-edge-libero",
                 "action_horizon": "HF:lerobot-edge-libero", "fps": "HF:lerobot-edge-libero",
                 "history_length": "HF:lerobot-edge-libero",
                 "representation": "HF:lerobot-edge-libero"},
        disagreements=(
            "the cosmos3_edge LeRobot code is not public: the folder is read with the cosmos3 "
            "keys, any other key refused by name, and the Nemotron backbone run as diffusers' "
            "Cosmos3OmniTransformer defines it",
        ),
        from_folder=("num_inference_steps", "guidance_scale", "guidance_interval", "flow_shift",
                     "resolution_tier", "view_point"),
        published=(Published("LIBERO-10", None, None, "the card's table: not sourced here",
                             "HF:lerobot-edge-libero"),),
    ),
    "nano-policy-droid": Recipe(
        name="nano-policy-droid",
        checkpoints="nvidia/Cosmos3-Nano-Policy-DROID",
        representation=_DROID_REPRESENTATION,
        settings=dict(_DROID_POLICY),
        sources=dict(_DROID_POLICY_SOURCES),
        disagreements=_DROID_DISAGREEMENTS,
    ),
    "edge-policy-droid": Recipe(
        name="edge-policy-droid",
        checkpoints="nvidia/Cosmos3-Edge-Policy-DROID",
        representation=_DROID_REPRESENTATION,
        # Guidance on the first of the 4 steps only: its timestep (999) is the only one inside
        # (960, 1001); the second is 937.
        settings={**_DROID_POLICY, "guidance_interval": (960.0, 1001.0)},
        sources={**_DROID_POLICY_SOURCES, "guidance_interval": "CF:droid-server-doc; "
                                                             "CF:guidance-interval; COS#323"},
        disagreements=(
            _DROID_DISAGREEMENTS[0],
            "the launch doc calls [960, 1001] inclusive; the code compares strictly "
            "(t_lo < t < t_hi). Both select step 0 only at 4 steps, shift 5: this project "
            "follows the code",
        ),
    ),
    "generic-bridge": Recipe(
        name="generic-bridge",
        checkpoints=_GENERIC_CHECKPOINTS,
        representation="10-D [dpos, rot6d, gripper] (bridge_orig_lerobot, domain 7); no state",
        settings={**_GENERIC, "domain_name": "bridge_orig_lerobot", "raw_action_dim": 10,
                  "action_horizon": 16, "fps": 5.0, "resolution_tier": 480,
                  "view_point": "ego_view"},
        sources={**_GENERIC_SOURCES, "domain_name": "CF:input-bridge",
                 "raw_action_dim": "DIF:domains", "action_horizon": "CF:input-bridge",
                 "fps": "CF:input-bridge", "resolution_tier": "CF:input-bridge",
                 "view_point": "CF:input-bridge", "representation": "DIF:domains"},
        disagreements=("sglang's action defaults are 35 steps (its docs: 30), flow shift 10, "
                       "fps 5, 832x480 (SGL:cookbook): the steps differ",),
    ),
    "generic-av": Recipe(
        name="generic-av",
        checkpoints=_GENERIC_CHECKPOINTS,
        representation="9-D ego pose [translation, rot6d] (av, domain 1); no state",
        settings={**_GENERIC, "domain_name": "av", "raw_action_dim": 9, "action_horizon": 60,
                  "fps": 10.0, "resolution_tier": 480, "view_point": "ego_view"},
        sources={**_GENERIC_SOURCES, "domain_name": "CF:input-av",
                 "raw_action_dim": "DIF:domains; COS:action-readme",
                 "action_horizon": "CF:input-av; COS:action-readme",
                 "fps": "CF:input-av; COS:action-readme", "resolution_tier": "CF:input-av",
                 "view_point": "CF:input-av", "representation": "COS:action-readme"},
    ),
    "generic-droid": Recipe(
        name="generic-droid",
        checkpoints=_GENERIC_CHECKPOINTS,
        representation="10-D end-effector pose [dpos, rot6d] + gripper (droid_lerobot, domain "
                        "8), multiview concatenation; no state",
        settings={**_GENERIC, "domain_name": "droid_lerobot", "raw_action_dim": 10,
                  "action_horizon": 16, "fps": 15.0, "resolution_tier": 480,
                  "view_point": "concat_view"},
        sources={**_GENERIC_SOURCES, "domain_name": "COS:action-readme",
                 "raw_action_dim": "COS:action-readme; DIF:domains",
                 "action_horizon": "COS:action-readme", "fps": "COS:action-readme",
                 "resolution_tier": "not sourced: 480 as the DROID data and policy server use",
                 "view_point": "COS:action-readme (multiview concatenation)",
                 "representation": "COS:action-readme"},
    ),
    "generic-umi": Recipe(
        name="generic-umi",
        checkpoints=_GENERIC_CHECKPOINTS,
        representation="10-D end-effector pose [dpos, rot6d] + gripper (umi, domain 6); no state",
        settings={**_GENERIC, "domain_name": "umi", "raw_action_dim": 10, "action_horizon": 16,
                  "fps": 20.0, "resolution_tier": 480, "view_point": "ego_view"},
        sources={**_GENERIC_SOURCES, "domain_name": "COS:action-readme",
                 "raw_action_dim": "COS:action-readme; DIF:domains",
                 "action_horizon": "COS:action-readme", "fps": "COS:action-readme",
                 "resolution_tier": "not sourced: 480 as the other generic examples",
                 "view_point": "not sourced: ego_view as the other single-camera examples",
                 "representation": "COS:action-readme"},
    ),
}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a ``ValueError`` listing the names otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    return RECIPES[name]


def _cell(recipe: Recipe, key: str) -> str:
    if key in recipe.from_folder:
        return "the folder's"
    value = recipe.representation if key == "representation" else recipe.settings.get(key)
    if key == "guidance_interval":
        text = "every step" if value is None else f"timesteps ({value[0]:g}, {value[1]:g})"
    elif key == "history_length":
        text = "none" if not value else f"{value} (state)"
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = str(value)
    return f"{text} [{recipe.sources[key]}]"


def recipe_table() -> str:
    """The recipes as a Markdown table, each value followed by its sources in brackets, then
    each recipe's disagreements and the source list (what ``docs/recipes.md`` holds)."""
    header = ["recipe", "checkpoints", *(title for _, title in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for recipe in RECIPES.values():
        cells = [f"`{recipe.name}`", recipe.checkpoints, *(_cell(recipe, k) for k, _ in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Published results (and where a run of 500 episodes lands 95% of the time if "
              "the checkpoint's true rate is the published one):", ""]
    for recipe in RECIPES.values():
        for result in recipe.published:
            if result.rate is None:
                text = f"not sourced ({result.spread}) [{result.source}]"
            else:
                # The source straight after the rate: "[lo, hi] [source]" would read as a
                # Markdown reference link.
                lo, hi = result.interval()
                text = (f"{100 * result.rate:.1f}% ({result.spread}) [{result.source}]; a "
                        f"500-episode run: [{100 * lo:.1f}%, {100 * hi:.1f}%]")
            lines.append(f"- `{recipe.name}`, {result.benchmark}: {text}")
    lines += ["", "Disagreements between sources:", ""]
    for recipe in RECIPES.values():
        lines += [f"- `{recipe.name}`: {text}." for text in recipe.disagreements]
    lines += ["", "Sources:", ""]
    lines += [f"- **{key}**: {text}" for key, text in SOURCES.items()]
    return "\n".join(lines) + "\n"
