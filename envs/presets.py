"""Benchmarks by name: each preset is the data a run of that benchmark needs, in one table.

``--env pusht``, ``--env aloha``, ``--env aloha:insertion``, ``--env metaworld:mt10``,
``--env fetch``, ``--env panda:push``, ``--env robosuite:lift``, ``--env maniskill:PickCube-v1``:
a :class:`Preset` names its variants (each an env id with its instruction and budget), the
modules that register them, the camera key(s), frame size and flips, the action map, the success
rule, and the package versions CI runs it with. Every command that takes ``--env`` resolves
these names here (:func:`split_preset_name`, :func:`preset_eval_env`, through
:func:`~cosmos3_gym.envs.names.make_eval_env`); options given on the command line (``--prompt``,
``--success``, ``--image-key``, ``--render-size``, ``--flip``, ``--action-map``,
``--max-episode-steps``, ``--tasks`` to pick variants) override the preset's.

``cosmos3-gym inspect --env NAME`` prints a preset as JSON; docs/presets.md holds the table made
from :data:`PRESETS` (:func:`presets_markdown`, kept current by a test). A new benchmark is one
entry of :data:`PRESETS`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .gym import Variant
from .gym_eval import GymEval
from .maniskill import ManiSkillEval
from .metaworld import (
    METAWORLD_MT10,
    METAWORLD_TASK_DESCRIPTIONS,
    METAWORLD_TASKS,
    MetaWorldEval,
)
from .success import parse_success

# Meta-World's benchmark task lists (metaworld 3.0's ML10 / ML45 train and test classes; a test
# checks them against the package).
METAWORLD_ML10_TRAIN = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "sweep-v3",
    "basketball-v3")
METAWORLD_ML10_TEST = ("drawer-open-v3", "door-close-v3", "shelf-place-v3", "sweep-into-v3",
                       "lever-pull-v3")
METAWORLD_ML45_TEST = ("bin-picking-v3", "box-close-v3", "hand-insert-v3", "door-lock-v3",
                       "door-unlock-v3")
METAWORLD_ML45_TRAIN = tuple(t for t in METAWORLD_TASKS if t not in METAWORLD_ML45_TEST)


@dataclass(frozen=True)
class Preset:
    """One benchmark's defaults. ``variants`` are every env the preset knows, by task name;
    ``default`` those ``--env NAME`` runs (all where empty), ``sets`` named selections
    (``metaworld:mt10``); ``open_ids``: any registered id may follow ``NAME:`` (ManiSkill3),
    run with ``env_kwargs`` and its prompt from ``--prompt`` where the preset knows none."""

    name: str
    title: str
    variants: tuple[Variant, ...]
    # "gym": GymEval; "metaworld": the built-in MetaWorldEval; "maniskill": ManiSkillEval
    # (its sim_backend resolved, GPU simulation on ManiSkill3's own vector env).
    family: str = "gym"
    default: tuple[str, ...] = ()
    sets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    open_ids: bool = False
    import_modules: tuple[str, ...] = ()
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # Wrappers ("module:Class") applied to each env right after it is made, before ours.
    env_wrappers: tuple[str, ...] = ()
    image_key: tuple[str, ...] | None = None
    state_key: str | None = None
    render_size: tuple[int, int] | None = None
    flip: str | None = None
    action_map: str | None = None
    success: str = "auto"
    success_why: str = "the env's own flag"
    # Env steps per second, and what a stall sends under real-time execution
    # (:class:`~cosmos3_gym.envs.EvalEnv`'s control_hz and hold).
    control_hz: float | None = None
    hold: str = "repeat"
    # The width of the env's action Box: one for every variant, or per variant (a test checks
    # them against the envs). What a checkpoint's head must give, after the action map.
    action_dim: int | Mapping[str, int] = 0
    # The extra that installs it, and the versions CI runs it with (a test checks them).
    extra: str = "gym"
    versions: Mapping[str, str] = field(default_factory=dict)
    not_covered: str = ""

    def variant(self, task: str) -> Variant:
        for v in self.variants:
            if v.task == task:
                return v
        choices = [*(v.task for v in self.variants), *self.sets]
        close = difflib.get_close_matches(task, choices, n=1, cutoff=0.6)
        hint = f" (did you mean {self.name}:{close[0]}?)" if close else ""
        raise ValueError(f"--env {self.name}:{task}: {self.name} has no variant {task!r}{hint}; "
                         f"expected one of {[v.task for v in self.variants]}"
                         f"{' or a set: ' + ', '.join(self.sets) if self.sets else ''}")

    def select(self, selector: str | None, tasks: Sequence[str] | None = None
               ) -> list[Variant]:
        """The variants ``--env NAME[:SELECTOR]`` (then ``--tasks``) picks, in order."""
        if selector is None:
            chosen = [self.variant(t) for t in self.default] if self.default else \
                list(self.variants)
        elif selector in self.sets:
            chosen = [self.variant(t) for t in self.sets[selector]]
        elif self.open_ids and not any(v.task == selector for v in self.variants):
            known = {v.env_id: v for v in self.variants}
            chosen = [known.get(selector, Variant(selector, selector, None))]
        else:
            chosen = [self.variant(t.strip()) for t in selector.split(",")]
        if tasks is not None:
            names = [v.task for v in chosen]
            unknown = [t for t in tasks if t not in names]
            if unknown:
                raise ValueError(f"--tasks {','.join(tasks)}: --env {self.name}"
                                 f"{':' + selector if selector else ''} runs {names}; found "
                                 f"{unknown}")
            chosen = [v for v in chosen if v.task in tasks]
        return chosen

    def action_dim_of(self, task: str) -> int:
        """The width of variant ``task``'s action Box.

        >>> PRESETS["panda"].action_dim_of("reach"), PRESETS["panda"].action_dim_of("stack")
        (3, 4)
        """
        if isinstance(self.action_dim, int):
            return self.action_dim
        return self.action_dim[task]

    def describe_action_dims(self) -> str:
        """The action widths, as the presets table shows them (``3-D: reach, push; 4-D: stack``).

        >>> PRESETS["aloha"].describe_action_dims()
        '14-D'
        """
        widths: dict[int, list[str]] = {}
        for v in self.variants:
            widths.setdefault(self.action_dim_of(v.task), []).append(v.task)
        if len(widths) == 1:
            return f"{next(iter(widths))}-D"
        return "; ".join(f"{d}-D: {', '.join(tasks)}" for d, tasks in widths.items())

    def as_dict(self) -> dict[str, Any]:
        """The preset as plain data (``cosmos3-gym inspect``)."""
        out = dataclasses.asdict(self)
        out["variants"] = [v.as_dict() for v in self.variants]
        out["sets"] = {k: list(v) for k, v in self.sets.items()}
        out["action_dim"] = {v.task: self.action_dim_of(v.task) for v in self.variants}
        return out


def _variants(env_ids: Mapping[str, tuple[str, str]], **common: Any) -> tuple[Variant, ...]:
    return tuple(Variant(task, env_id, prompt, **common)
                 for task, (env_id, prompt) in env_ids.items())


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "pusht", "gym-pusht's PushT: push the T onto its target (2-D pixel targets)",
        _variants({"pusht": ("gym_pusht/PushT-v0",
                             "push the T-shaped block onto the T-shaped target")}),
        import_modules=("gym_pusht",), env_kwargs={"obs_type": "pixels_agent_pos"},
        image_key=("pixels",), state_key=None, action_map="box", action_dim=2, success="auto",
        success_why="gym-pusht's is_success (coverage above 95%, which also ends the episode)",
        control_hz=10.0,
        versions={"gym-pusht": "0.1.8"},
        not_covered="the keypoint observation modes; LeRobot's 96x96 frames are the env's own"),
    Preset(
        "aloha", "gym-aloha's bimanual ALOHA tasks: Insertion and TransferCube (14-D actions)",
        _variants({
            "insertion": ("gym_aloha/AlohaInsertion-v0",
                          "pick up the peg and the socket and insert the peg into the socket"),
            "transfer_cube": ("gym_aloha/AlohaTransferCube-v0",
                              "pick up the cube with the right arm and hand it to the left arm"),
        }),
        import_modules=("gym_aloha",), image_key=("top",), action_dim=14, success="auto",
        success_why="gym-aloha's is_success (the task's full reward)", control_hz=50.0,
        versions={"gym-aloha": "0.1.5", "dm-control": "1.0.49", "mujoco": "3.16.0"},
        not_covered="the end-effector action mode; cameras other than top"),
    Preset(
        "fetch", "gymnasium-robotics' Fetch tasks (MuJoCo; 4-D actions, 50-step episodes)",
        _variants({
            "reach": ("cosmos3_gym/FetchReach-v4", "move the gripper to the red target"),
            "push": ("cosmos3_gym/FetchPush-v4", "push the block to the red target"),
            "slide": ("cosmos3_gym/FetchSlide-v4", "slide the puck to the red target"),
            "pick_and_place": ("cosmos3_gym/FetchPickAndPlace-v4",
                               "pick up the block and place it at the red target"),
        }),
        import_modules=("cosmos3_gym.envs.robotics",), image_key=("pixels",),
        render_size=(224, 224), action_dim=4, success="auto",
        success_why="gymnasium-robotics' is_success (the goal within 5 cm), at the last step",
        control_hz=25.0, hold="still-gripper",
        versions={"gymnasium-robotics": "1.4.2", "mujoco": "3.16.0"},
        not_covered="the Hand tasks, Maze, Kitchen; the goal vectors are not given to the "
                    "policy (it sees the render() frame)"),
    Preset(
        "panda", "panda-gym's Franka tasks (PyBullet): Reach, Push, Slide (3-D); "
                 "PickAndPlace, Stack, Flip (4-D) one at a time",
        _variants({
            "reach": ("PandaReach-v3", "move the gripper to the green target"),
            "push": ("PandaPush-v3", "push the cube to the green target"),
            "slide": ("PandaSlide-v3", "slide the puck to the green target"),
            "pick_and_place": ("PandaPickAndPlace-v3",
                               "pick up the cube and place it at the green target"),
            "stack": ("PandaStack-v3", "stack the two cubes on their targets"),
            "flip": ("PandaFlip-v3", "flip the cube to the target orientation"),
        }),
        default=("reach", "push", "slide"), import_modules=("panda_gym",),
        image_key=("pixels",), render_size=(224, 224), success="auto",
        action_dim={"reach": 3, "push": 3, "slide": 3, "pick_and_place": 4, "stack": 4,
                    "flip": 4},
        success_why="panda-gym's is_success (the goal within 5 cm), at the last step",
        control_hz=25.0, hold="still",
        versions={"panda-gym": "3.0.7", "pybullet": "3.2.7"},
        not_covered="the joint-control variants; 3-D and 4-D tasks in one run (their action "
                    "spaces differ)"),
    Preset(
        "robosuite", "robosuite's manipulation tasks with a Panda (registered by us)",
        _variants({
            "lift": ("cosmos3_gym/robosuite-Lift-v0", "lift the red cube"),
            "door": ("cosmos3_gym/robosuite-Door-v0", "open the door"),
            "stack": ("cosmos3_gym/robosuite-Stack-v0", "stack the red cube on the green cube"),
            "square": ("cosmos3_gym/robosuite-NutAssemblySquare-v0",
                       "fit the square nut onto the square peg"),
            "can": ("cosmos3_gym/robosuite-PickPlaceCan-v0", "put the can into its bin"),
        }),
        default=("lift",), import_modules=("cosmos3_gym.envs.robotics",),
        image_key=("agentview_image", "robot0_eye_in_hand_image"), flip="vertical",
        state_key=None, success="auto", action_dim=7,  # the Panda's OSC_POSE arm and gripper
        success_why="robosuite's _check_success(), which ends the episode; the horizon is a "
                    "truncation, never a success",
        control_hz=20.0, hold="still-gripper",
        extra="own venv: .ci/robosuite",
        versions={"robosuite": "1.5.2", "mujoco": "3.3.7", "numpy": "1.26.4"},
        not_covered="the main venv (its MuJoCo 3.16 breaks robosuite's controllers); two-arm "
                    "tasks, other robots and controllers; variants have different state sizes, "
                    "so one run holds variants of one observation space"),
    Preset(
        "maniskill", "ManiSkill3 tasks (SAPIEN; GPU simulation in one vector env where CUDA "
                     "is, else one CPU env per sub-env)",
        _variants({
            "pick_cube": ("PickCube-v1", "pick up the red cube and move it to the green goal"),
            "push_cube": ("PushCube-v1", "push the cube to the red and white target"),
            "stack_cube": ("StackCube-v1", "stack the red cube on the green cube"),
        }),
        family="maniskill", default=("pick_cube",), open_ids=True,
        import_modules=("mani_skill.envs",),
        env_kwargs={"obs_mode": "rgb", "sim_backend": "auto"},
        env_wrappers=("mani_skill.utils.wrappers.gymnasium:CPUGymWrapper",),
        image_key=("sensor_data/base_camera/rgb",), success="auto",
        action_dim=8,  # the Panda's default pd_joint_delta_pos: 7 joints and the gripper
        success_why="ManiSkill3's info['success'] (which ends the episode)",
        control_hz=20.0, hold="still-gripper",
        versions={"mani-skill": "3.0.1"},
        not_covered="several tasks in one GPU run (one task per ManiSkill3 vector env); "
                    "tasks that download assets"),
    Preset(
        "metaworld", "Meta-World (the built-in family: corner2 camera, 50 layouts per task)",
        tuple(Variant(t, "metaworld", METAWORLD_TASK_DESCRIPTIONS[t]) for t in METAWORLD_TASKS),
        family="metaworld", default=METAWORLD_MT10,
        sets={"mt10": METAWORLD_MT10, "mt50": METAWORLD_TASKS,
              "ml10-train": METAWORLD_ML10_TRAIN, "ml10-test": METAWORLD_ML10_TEST,
              "ml45-train": METAWORLD_ML45_TRAIN, "ml45-test": METAWORLD_ML45_TEST},
        success="auto", success_why="Meta-World's info['success'], which ends the episode",
        action_dim=4,
        extra="metaworld", versions={"metaworld": "3.0.0", "mujoco": "3.16.0"},
        not_covered="meta-RL adaptation (ML tasks run as plain tasks); Meta-World's own "
                    "Gymnasium ids"),
)}


def split_preset_name(text: str) -> tuple[Preset, str | None] | None:
    """``(preset, selector)`` for ``NAME`` or ``NAME:SELECTOR``; ``None`` where ``NAME`` is no
    preset (``gym:ID`` never is).

    >>> preset, selector = split_preset_name("aloha:insertion")
    >>> preset.name, selector
    ('aloha', 'insertion')
    """
    name, _, selector = text.partition(":")
    preset = PRESETS.get(name.strip())
    if preset is None:
        return None
    return preset, (selector.strip() or None)


def preset_eval_env(text: str, *, suite: str | None = None, tasks: list[str] | None = None,
                    image_size: int | None = None, max_episode_steps: int | None = None,
                    step_budget: str | None = None, **options: Any) -> GymEval | MetaWorldEval:
    """The env family ``--env NAME[:SELECTOR]`` names, with the command line's ``options``
    (:data:`~cosmos3_gym.envs.names.GYM_OPTIONS`) over the preset's own."""
    found = split_preset_name(text)
    if found is None:
        raise ValueError(f"--env {text!r}: no such preset; expected one of {list(PRESETS)}")
    preset, selector = found
    if suite is not None:
        raise ValueError(f"--suite {suite!r} does not apply to --env {text}; choose its "
                         f"variants with --env {preset.name}:VARIANT or --tasks")
    if step_budget is not None:
        raise ValueError(f"--step-budget {step_budget!r} applies to --env libero only; "
                         f"--env {text} takes --max-episode-steps")
    variants = preset.select(selector, tasks)
    if preset.family == "metaworld":
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise ValueError(f"--env {text} is the built-in Meta-World family: its camera, "
                             f"prompts and success are its own; found {given}")
        return MetaWorldEval([v.task for v in variants], image_size=image_size or 224,
                             max_episode_steps=max_episode_steps)
    if image_size is not None:
        raise ValueError(f"--image-size does not apply to --env {text}; the size of its "
                         "render() frames is --render-size HxW")
    prompt = options.pop("prompt", None)
    if prompt is not None:
        variants = _with_prompts(text, variants, prompt)
    missing = [v.task for v in variants if v.prompt is None]
    if missing:
        raise ValueError(f"--env {text}: the preset knows no instruction for {missing}; give "
                         "it with --prompt TEXT (before the model loads)")

    def chosen(name: str, default: Any) -> Any:
        value = options.pop(name, None)
        return default if value is None else (None if value == "none" else value)

    family = ManiSkillEval if preset.family == "maniskill" else GymEval
    return family(
        variants, import_modules=(*preset.import_modules, *options.pop("import_modules", ())),
        env_kwargs={**preset.env_kwargs, **(options.pop("env_kwargs", None) or {})},
        env_wrappers=preset.env_wrappers, max_episode_steps=max_episode_steps,
        success=options.pop("success", None) or (
            None if options.get("success_key") else _rule(preset)),
        success_key=options.pop("success_key", None),
        image_key=chosen("image_key", preset.image_key),
        state_key=chosen("state_key", preset.state_key),
        render_size=chosen("render_size", preset.render_size),
        flip=chosen("flip", preset.flip), action_map=preset.action_map,
        suite=preset.name, label=text, control_hz=preset.control_hz, hold=preset.hold)


def _rule(preset: Preset) -> Any:
    return parse_success(preset.success, f"preset {preset.name} ({preset.success_why})")


def _with_prompts(text: str, variants: list[Variant], prompt: str | dict[str, str]
                  ) -> list[Variant]:
    """``--prompt`` over the preset's: one text for a one-variant run, or ``{task: text}``."""
    if isinstance(prompt, str):
        if len(variants) != 1:
            raise ValueError(f"--prompt: --env {text} runs {len(variants)} variants "
                             f"{[v.task for v in variants]}; give '{{\"task\": \"text\", ...}}'")
        return [dataclasses.replace(variants[0], prompt=prompt)]
    unknown = sorted(set(prompt) - {v.task for v in variants})
    if unknown:
        raise ValueError(f"--prompt: --env {text} has no variants {unknown}; its variants: "
                         f"{[v.task for v in variants]}")
    return [dataclasses.replace(v, prompt=prompt.get(v.task, v.prompt)) for v in variants]


def presets_markdown() -> str:
    """The presets table of docs/presets.md, made from :data:`PRESETS`."""
    lines = ["| `--env` | variants (default first) | camera(s) | action width | action map | "
             "success | extra | versions CI runs |", "|---|---|---|---|---|---|---|---|"]
    for p in PRESETS.values():
        default = list(p.default) or [v.task for v in p.variants]
        others = [v.task for v in p.variants if v.task not in default]
        shown = ", ".join(f"`{t}`" for t in default)
        if others:
            shown += "; also " + ", ".join(f"`{t}`" for t in others[:6]) + (
                " ..." if len(others) > 6 else "")
        if p.sets:
            shown += "; sets " + ", ".join(f"`{s}`" for s in p.sets)
        if p.open_ids:
            shown += "; any registered id (`maniskill:ID`)"
        camera = ", ".join(f"`{k}`" for k in p.image_key) if p.image_key else "the env's"
        if p.render_size:
            camera += f" ({p.render_size[0]}x{p.render_size[1]})"
        if p.flip:
            camera += f", flipped {p.flip}"
        versions = ", ".join(f"{k} {v}" for k, v in p.versions.items())
        lines.append(f"| `{p.name}` | {shown} | {camera} | {p.describe_action_dims()} | "
                     f"{p.action_map or 'none'} | "
                     f"`{p.success}`: {p.success_why} | `{p.extra}` | {versions} |")
    return "\n".join(lines)
