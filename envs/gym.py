"""Any registered Gymnasium env as a vector env the policy can drive: prompt, image, success.

:func:`make_gym_vector_env` adds what a benchmark nobody here wrote (gym-pusht, gym-aloha,
ManiSkill3, ...) lacks, one small piece each: a prompt (:class:`TaskPrompt`,
:class:`VectorTaskPrompt`), an image (the observation's own, else the ``render()`` frame through
Gymnasium's ``AddRenderObservation``), success in ``info["is_success"]``
(:class:`ReportSuccess`). Nothing here imports the model stack.

What a foreign env gets wrong for the input it was given (a package it needs that is not
installed, a constructor keyword it does not take, a ``render()`` that gives no image) is one
``ValueError`` saying so (:func:`foreign_env_errors`, :class:`CheckedRender`), not its traceback.

What each piece does, the command line's ``--env gym:ID``: docs/your_own_env.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, VectorEnv

from cosmos3_gym.vector_env import ForwardingVectorWrapper

from .base import make_render_context_current
from .chunking import EpisodeEndHold
from .success import SuccessRule, parse_success

# The reset option TaskPrompt reads (and removes before the env below sees the options).
PROMPT_OPTION = "task_description"
IMAGE_MODES = ("auto", "obs", "render")


def import_env_modules(modules: Sequence[str]) -> None:
    """Import the modules that register a benchmark's ids (``gym_pusht``, ``gym_aloha``,
    ``mani_skill.envs``, or one's own ``my_envs.py``). As ``python -m`` does, the current
    directory is searched too (a console script's path starts at its own bin folder); async
    workers inherit the path. One error says which: a module found nowhere (naming where it was
    looked for), or a module whose own import failed (naming what it lacked)."""
    for name in modules:
        here = os.getcwd()
        if here not in sys.path and "" not in sys.path and _found_in(name, here):
            sys.path.insert(0, here)
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing = getattr(err, "name", None)
            if isinstance(err, ModuleNotFoundError) and missing is not None and (
                    name == missing or name.startswith(f"{missing}.")):
                searched = [p or here for p in sys.path][:6]
                more = len(sys.path) - len(searched)
                raise ValueError(
                    f"--import {name}: no module {missing!r} in the current directory ({here}) "
                    f"or on the path (searched {searched}{f' and {more} more' if more else ''}); "
                    "run from the folder that holds it, add its folder to PYTHONPATH, or install "
                    "the benchmark's package (e.g. pip install gym-pusht)") from None
            raise ValueError(
                f"--import {name}: importing it failed ({type(err).__name__}: {err}); it needs "
                "a package that is not installed, or has an error of its own") from err


def _found_in(name: str, folder: str) -> bool:
    """Whether ``folder`` holds the top-level module or package of ``name``."""
    top = Path(folder) / name.split(".")[0]
    return top.with_suffix(".py").is_file() or (top / "__init__.py").is_file() or top.is_dir()


def has_image(space: spaces.Space) -> bool:
    """Whether an observation space holds a uint8 ``[H, W, C]`` image (C in 1, 3, 4) anywhere.

    >>> has_image(spaces.Box(0, 255, (96, 96, 3), np.uint8))
    True
    >>> has_image(spaces.Dict({"state": spaces.Box(-1, 1, (5,))}))
    False
    """
    if isinstance(space, spaces.Dict):
        return any(has_image(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return any(has_image(s) for s in space.spaces)
    return (
        isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
        and space.shape[-1] in (1, 3, 4)
    )


# gymnasium.make's own keywords: they never reach the env's constructor.
_MAKE_KEYWORDS = ("max_episode_steps", "disable_env_checker", "autoreset",
                  "apply_api_compatibility")


@contextlib.contextmanager
def foreign_env_errors(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Turn what a registered env raises for input it cannot take into one ``ValueError`` that
    names the fix: a package it needs that is not installed (``DependencyNotInstalled``, an
    ``ImportError``), or a constructor keyword it does not take or lacks (``env_kwargs``, the
    command line's ``--env-kwargs``). Any other error passes through unchanged (a bug to
    report, with its traceback).

    >>> try:
    ...     with foreign_env_errors("CartPole-v1"):
    ...         raise gym.error.DependencyNotInstalled("pygame is not installed")
    ... except ValueError as err:
    ...     print(str(err).split(";")[0])
    gym:CartPole-v1 needs a package that is not installed (pygame is not installed)
    """
    try:
        yield
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        raise ValueError(
            f"gym:{env_id} needs a package that is not installed ({err}); install it (the env's "
            'extra, e.g. pip install "gymnasium[classic-control]"), then rerun') from err
    except TypeError as err:
        problem = _keyword_problem(env_id, dict(env_kwargs or {}))
        if problem is None:
            raise
        raise ValueError(problem) from err


def _keyword_problem(env_id: str, env_kwargs: dict[str, Any]) -> str | None:
    """What is wrong with the keywords ``env_id``'s constructor got, read from its signature
    (its spec's own kwargs with ``env_kwargs`` over them); None where nothing is."""
    spec = gym.spec(env_id)
    try:
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(
            spec.entry_point)
        signature = inspect.signature(creator)
    except (AttributeError, ImportError, ValueError, TypeError):
        return None
    given = {k: v for k, v in {**spec.kwargs, **env_kwargs}.items() if k not in _MAKE_KEYWORDS}
    params = {name: p for name, p in signature.parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    unknown = [k for k in given if k not in params and not takes_any]
    missing = [name for name, p in params.items() if p.default is p.empty and name not in given]
    name = getattr(creator, "__qualname__", str(creator))
    takes = ", ".join(params) or "no keywords"
    if unknown:
        return (f"--env-kwargs: gym:{env_id}'s constructor ({name}) takes no keyword "
                f"{', '.join(map(repr, unknown))}; it takes: {takes}")
    if missing:
        return (f"gym:{env_id}'s constructor ({name}) needs {', '.join(map(repr, missing))}; give "
                f"{'it' if len(missing) == 1 else 'them'} with --env-kwargs "
                f"'{json.dumps({k: '...' for k in missing})}' (it takes: {takes})")
    return None


class CheckedRender(gym.Wrapper):
    """Refuse a ``render()`` frame the policy cannot take as its image: anything but a uint8
    numpy array ``[H, W, C]`` (C 1, 3 or 4), found at the first render (which Gymnasium's
    ``AddRenderObservation`` makes when it is built), as one ``ValueError`` saying what the env
    returned.

    >>> import gymnasium as gym
    >>> class Blank(gym.Wrapper):
    ...     def render(self):
    ...         return None
    >>> env = CheckedRender(Blank(gym.make("CartPole-v1", render_mode="rgb_array")))
    >>> try:
    ...     env.render()
    ... except ValueError as err:
    ...     print(str(err).split(";")[0])
    CartPole-v1's render() returned None (render_mode 'rgb_array')
    """

    def render(self) -> Any:
        make_render_context_current(self.env)  # a MuJoCo env's own GL context (base.py)
        frame = self.env.render()
        if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3
                and frame.shape[-1] in (1, 3, 4) and frame.shape[0] and frame.shape[1]):
            raise ValueError(
                f"{_env_name(self.env)}'s render() returned {_describe_frame(frame)} "
                f"(render_mode {self.env.render_mode!r}); expected a uint8 [H, W, C] frame "
                "(C 1, 3 or 4), the policy's image: an env that renders 'rgb_array' frames, or "
                "an image in its observation")
        return frame


def _describe_frame(frame: Any) -> str:
    if frame is None:
        return "None"
    if isinstance(frame, np.ndarray):
        return f"a {frame.dtype} array of shape {list(frame.shape)}"
    shape = getattr(frame, "shape", None)
    return type(frame).__name__ + ("" if shape is None else f" of shape {list(shape)}")


class TaskPrompt(gym.Wrapper):
    """Give an env that names no task an instruction: ``task_description`` (alias ``task``).

    ``reset(options={"task_description": text})`` switches the prompt from that episode on; the
    option is removed before the env below sees the options, so an env that takes no options
    is not bothered. Everything else passes through unchanged.

    Example:
        >>> import gymnasium as gym
        >>> env = TaskPrompt(gym.make("CartPole-v1"), "balance the pole")
        >>> env.task_description, env.task
        ('balance the pole', 'balance the pole')
        >>> _ = env.reset(seed=0, options={"task_description": "keep it upright"})
        >>> env.task_description
        'keep it upright'
    """

    def __init__(self, env: gym.Env, prompt: str) -> None:
        super().__init__(env)
        self.task_description = _checked_prompt(prompt, "TaskPrompt")

    @property
    def task(self) -> str:
        return self.task_description

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if options is not None and PROMPT_OPTION in options:
            options = dict(options)
            self.task_description = _checked_prompt(options.pop(PROMPT_OPTION), "reset option")
            options = options or None
        return self.env.reset(seed=seed, options=options)


class ReportSuccess(gym.Wrapper):
    """Report an env's success by a declared rule (:class:`~cosmos3_gym.envs.success.
    SuccessRule`) as ``info["is_success"]`` (a bool), at every step.

    ``rule`` is a rule or its ``--success`` text: ``"auto"`` reads the env's own flag
    (``is_success``, else ``success``) and leaves an info that holds neither without an
    outcome; ``"info.KEY"`` a named bool flag; ``"info.KEY > X"`` / ``"return >= X"`` a
    threshold (the return is summed here since the last reset); ``"terminated"`` the
    termination; ``"none"`` removes ``is_success``, so no episode has an outcome. A named key
    missing from a step's info, or a flag that holds no bool, raises a ``ValueError`` listing
    what was found.

    >>> import gymnasium as gym
    >>> class Scored(gym.Wrapper):
    ...     def step(self, action):
    ...         obs, reward, terminated, truncated, info = self.env.step(action)
    ...         return obs, reward, terminated, truncated, {**info, "success": reward > 0}
    >>> env = ReportSuccess(Scored(gym.make("CartPole-v1")))
    >>> _ = env.reset(seed=0)
    >>> env.step(0)[4]["is_success"]
    True
    """

    def __init__(self, env: gym.Env, rule: SuccessRule | str = "auto") -> None:
        super().__init__(env)
        self.rule = rule if isinstance(rule, SuccessRule) else parse_success(rule)
        self.episode_return = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self.episode_return = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        outcome = self.rule.outcome(info, terminated=bool(terminated),
                                    episode_return=self.episode_return)
        if outcome is None:
            info = {k: v for k, v in info.items() if k != "is_success"} if \
                self.rule.kind == "none" else info
            return obs, reward, terminated, truncated, info
        return obs, reward, terminated, truncated, {**info, "is_success": outcome}


class VectorTaskPrompt(ForwardingVectorWrapper):
    """Prompts for a vector env that has no sub-envs to wrap (a ``vector_entry_point``, such as
    ManiSkill3's ``ManiSkillVectorEnv``): ``call("task_description")`` and ``call("task")``
    answer one prompt per env, as a vector env of :class:`TaskPrompt` envs would, and
    ``call("has_wrapper_attr", name)`` says so; every other call passes through."""

    _NAMES = ("task_description", "task")

    def __init__(self, env: VectorEnv, prompts: str | Sequence[str]) -> None:
        super().__init__(env)
        self.prompts = per_env_prompts(prompts, env.num_envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        if name in self._NAMES and not args and not kwargs:
            return self.prompts
        if name == "has_wrapper_attr" and args and args[0] in self._NAMES:
            return (True,) * self.num_envs
        return super().call(name, *args, **kwargs)


def per_env_prompts(prompts: str | Sequence[str], num_envs: int) -> tuple[str, ...]:
    """One prompt per env: a string for all of them, or exactly ``num_envs`` strings."""
    if isinstance(prompts, str):
        return (_checked_prompt(prompts, "prompt"),) * num_envs
    prompts = tuple(prompts)
    if len(prompts) != num_envs:
        raise ValueError(
            f"prompts: expected one string for all envs or one per env ({num_envs}); found "
            f"{len(prompts)}"
        )
    return tuple(_checked_prompt(p, f"prompt {i}") for i, p in enumerate(prompts))


def with_image(env: gym.Env, image: str = "auto",
               render_size: tuple[int, int] | None = None) -> gym.Env:
    """``env`` whose observation holds an image: as it is where it has one (``image="auto"``,
    or ``"obs"``, which never renders), else (or always, with ``"render"``) with Gymnasium's
    :class:`~gymnasium.wrappers.AddRenderObservation` adding the ``render()`` frame as
    ``"pixels"`` beside the original observation. ``render_size`` ``(H, W)``: frames of
    another size are resized to it (:class:`ResizeFrames`; an env that takes the size in its
    constructor renders at it instead, see :func:`render_size_kwargs`)."""
    if image not in IMAGE_MODES:
        raise ValueError(f"image: expected one of {IMAGE_MODES}; found {image!r}")
    if image == "obs" or (image == "auto" and has_image(env.observation_space)):
        return env
    if env.render_mode != "rgb_array":
        raise ValueError(
            f"{_env_name(env)}'s observation holds no uint8 image ({env.observation_space}) and "
            f"it renders with render_mode={env.render_mode!r}; expected an env that renders "
            "'rgb_array' frames (its metadata lists "
            f"{env.metadata.get('render_modes')}), or an image in its observation "
            "(e.g. --env-kwargs '{\"obs_type\": \"pixels\"}')"
        )
    env = CheckedRender(env)
    if render_size is not None:
        env = ResizeFrames(env, render_size)
    return gym.wrappers.AddRenderObservation(env, render_only=False)


class ResizeFrames(gym.Wrapper):
    """``render()`` frames resized to ``size`` ``(H, W)`` (PIL's area filter), for envs whose
    constructor takes no frame size; frames of that size already pass unchanged."""

    def __init__(self, env: gym.Env, size: tuple[int, int]) -> None:
        super().__init__(env)
        self.size = check_render_size(size)

    def render(self) -> Any:
        frame = self.env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or \
                frame.shape[:2] == self.size:
            return frame
        from PIL import Image

        height, width = self.size
        return np.asarray(Image.fromarray(frame).resize((width, height), Image.BOX))


def check_render_size(size: Any) -> tuple[int, int]:
    """``(H, W)``, two integers >= 1; a ``ValueError`` otherwise."""
    try:
        height, width = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"render size: expected (height, width); found {size!r}") from None
    if height < 1 or width < 1:
        raise ValueError(f"render size: expected two sizes >= 1; found {size!r}")
    return height, width


# Constructor keywords through which envs take their render() frame size, (height, width):
# Gymnasium's MuJoCo envs and gymnasium-robotics, panda-gym.
RENDER_SIZE_KEYWORDS = (("height", "width"), ("render_height", "render_width"))


def render_size_kwargs(env_id: str, size: tuple[int, int] | None) -> dict[str, int]:
    """The keywords that make ``env_id``'s env render ``size`` ``(H, W)`` frames itself, where
    its constructor takes them (:data:`RENDER_SIZE_KEYWORDS`); ``{}`` where it takes none (the
    frames are then resized: :class:`ResizeFrames`).

    >>> render_size_kwargs("InvertedPendulum-v5", (96, 128))
    {'height': 96, 'width': 128}
    >>> render_size_kwargs("CartPole-v1", (96, 128))
    {}
    """
    if size is None:
        return {}
    height, width = check_render_size(size)
    params = _constructor_params(gym.spec(env_id))
    for h, w in RENDER_SIZE_KEYWORDS:
        if h in params and w in params:
            return {h: height, w: width}
    return {}


@dataclasses.dataclass(frozen=True)
class SubEnvWrapping:
    """How the gym route wraps each sub-env, inside its :class:`EpisodeEndHold`: the image
    (:func:`with_image`, ``render_size`` for resized frames), success by ``success``
    (:class:`ReportSuccess`), the prompt (:class:`TaskPrompt`, where given), then
    ``wrappers``. Picklable, so async workers get a copy."""

    prompt: str | None = None
    image: str = "auto"
    success: SuccessRule | str = "auto"
    render_size: tuple[int, int] | None = None
    wrappers: tuple[Callable[[gym.Env], gym.Env], ...] = ()
    # Wrappers named "module:Class", applied first, right after gym.make (ManiSkill3's
    # CPUGymWrapper); imported in the process that makes the env.
    env_wrappers: tuple[str, ...] = ()
    # The observation keys kept (Gymnasium's FilterObservation), None: all of them.
    keep: tuple[str, ...] | None = None

    def inner(self, env: gym.Env) -> gym.Env:
        """``env`` with every wrapper but the hold."""
        for name in self.env_wrappers:
            env = load_object(name)(env)
        env = with_image(env, self.image, self.render_size)
        if self.keep is not None:
            env = gym.wrappers.FilterObservation(env, list(self.keep))
        env = ReportSuccess(env, self.success)
        if self.prompt is not None:
            env = TaskPrompt(env, self.prompt)
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env

    def __call__(self, env: gym.Env) -> gym.Env:
        return EpisodeEndHold(self.inner(env))


def load_object(name: str) -> Any:
    """``module:attr`` imported (a wrapper class a preset names as data)."""
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot load {name!r} ({err}); expected module:attribute of an "
                         "installed package") from None


def make_gym_vector_env(
    env_id: str,
    num_envs: int = 1,
    *,
    prompt: str | Sequence[str] | None = None,
    vectorization_mode: str | None = None,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    import_modules: Sequence[str] = (),
    max_episode_steps: int | None = None,
    success: SuccessRule | str = "auto",
    image: str = "auto",
    render_size: tuple[int, int] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    env_wrappers: Sequence[str] = (),
    **env_kwargs: Any,
) -> VectorEnv:
    """The registered env ``env_id`` as a vector env of ``num_envs`` that the policy can drive.

    Built by Gymnasium's own ``gymnasium.make_vec``: ``vectorization_mode`` ``"sync"``,
    ``"async"`` or ``"vector_entry_point"``; ``None`` is Gymnasium's default (the id's vector
    entry point where it registers one, else sync), except that where that vector env's
    observation has no image, sync sub-envs are made instead so that they can render.
    ``import_modules`` are imported first (what registers the ids); ``env_kwargs`` go to every
    env; ``prompt`` is one instruction for every env or one per env (``None``: the env must have
    its own ``task_description``); ``max_episode_steps`` replaces the spec's; ``success`` is the
    success rule (:class:`ReportSuccess`; ``"auto"``: the env's own ``is_success``, else
    ``success``) and ``image`` where the image comes from (:func:`with_image`);
    ``render_size`` ``(H, W)`` the size of ``render()`` frames (the env's constructor takes
    it where it can: :func:`render_size_kwargs`). ``wrappers`` wrap each sub-env after ours,
    inside its :class:`EpisodeEndHold`; ``env_wrappers`` (``"module:Class"``) before ours,
    right after ``gym.make`` (ManiSkill3's ``CPUGymWrapper``).

    An env without an image in its observation is made with ``render_mode="rgb_array"`` where
    its class offers that mode and ``env_kwargs`` name none (it renders only where needed).

    A vector entry point (ManiSkill3's ``ManiSkillVectorEnv``) is used as it is: it keeps its
    own autoreset mode (ManiSkill3: ``SAME_STEP``) and infos (``info["success"]``, a tensor),
    and only the prompt is added (:class:`VectorTaskPrompt`).

    Example:
        >>> envs = make_gym_vector_env("CartPole-v1", 2, prompt="balance the pole")
        >>> obs, _ = envs.reset(seed=0)
        >>> sorted(obs), obs["pixels"].shape, envs.call("task_description")
        (['pixels', 'state'], (2, 400, 600, 3), ('balance the pole', 'balance the pole'))
        >>> envs.close()
    """
    import_env_modules(import_modules)
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1; found {num_envs}")
    spec = gym.spec(env_id)
    if max_episode_steps is not None:
        env_kwargs["max_episode_steps"] = max_episode_steps
    prompts = None if prompt is None else per_env_prompts(prompt, num_envs)
    explicit = vectorization_mode is not None
    if vectorization_mode is None:
        vectorization_mode = "vector_entry_point" if spec.vector_entry_point else "sync"
    if vectorization_mode == "vector_entry_point":
        if wrappers or image == "render":
            raise ValueError(
                f"{env_id} is vectorised by its own vector_entry_point, which takes no "
                "per-env wrappers (and so no render() frames); choose vectorization_mode='sync' "
                "or 'async', or an image in its observation"
            )
        # Gymnasium refuses a vector entry point whose spec lists wrappers; ManiSkill3's lists
        # its TimeLimit, and its vector entry point applies it itself (it builds its batched env
        # with gymnasium.make(id)), so the spec goes without them.
        entry_spec = dataclasses.replace(spec, additional_wrappers=())
        with foreign_env_errors(env_id, env_kwargs):
            envs = gym.make_vec(entry_spec, num_envs, vectorization_mode=vectorization_mode,
                                **env_kwargs)
        if image == "obs" or has_image(envs.single_observation_space):
            return envs if prompts is None else VectorTaskPrompt(envs, prompts)
        envs.close()
        if explicit or spec.entry_point is None:
            raise ValueError(
                f"{env_id}'s observation holds no uint8 image ({envs.single_observation_space}); "
                "choose an observation mode with images (ManiSkill3: obs_mode='rgb'), or "
                "vectorization_mode='sync' for render() frames"
            )
        # Gymnasium's default picked the id's vector env, which has no image: sub-envs render.
        vectorization_mode = "sync"
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(
            "vectorization_mode: expected 'sync', 'async', 'vector_entry_point' or None; "
            f"found {vectorization_mode!r}"
        )
    env_kwargs, frames = sub_env_kwargs(env_id, env_kwargs, image, render_size)
    wrap = SubEnvWrapping(None if prompts is None else prompts[0], image, success, frames,
                          tuple(wrappers), tuple(env_wrappers))
    with foreign_env_errors(env_id, env_kwargs):
        envs = gym.make_vec(
            env_id, num_envs, vectorization_mode=vectorization_mode,
            vector_kwargs={"autoreset_mode": autoreset_mode}, wrappers=[wrap], **env_kwargs,
        )
    try:
        if prompts is not None and len(set(prompts)) > 1:
            envs.set_attr("task_description", list(prompts))
        if prompts is None:
            found = np.array(envs.call("has_wrapper_attr", "task_description"), dtype=bool)
            if not found.all():
                raise ValueError(
                    f"{env_id} names no task (no task_description attribute); give the "
                    "instruction with prompt=... (command line: --prompt TEXT)"
                )
    except Exception:
        envs.close()
        raise
    return envs


def sub_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any], image: str = "auto",
                   render_size: tuple[int, int] | None = None
                   ) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """The keywords a sub-env of ``env_id`` is made with, and the size its ``render()`` frames
    are resized to (``None``: as the env renders them): ``render_mode="rgb_array"`` where the
    env may need to render, its class offers that mode and neither ``env_kwargs`` nor the spec
    name one; ``render_size`` through the constructor where it takes a size
    (:func:`render_size_kwargs`), else by resizing."""
    kwargs = dict(env_kwargs)
    spec = gym.spec(env_id)
    if image != "obs" and "render_mode" not in kwargs and "render_mode" not in spec.kwargs \
            and "rgb_array" in _render_modes(spec):
        kwargs["render_mode"] = "rgb_array"
    own = render_size_kwargs(env_id, render_size)
    taken = [k for k in own if k in kwargs]
    if taken:
        raise ValueError(f"--render-size and --env-kwargs both set {taken}; give one")
    kwargs.update(own)
    return kwargs, (None if own else render_size)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One env of a run of several (``--env aloha``: Insertion and TransferCube): the task name
    results are grouped by, the registered id, its instruction, budget and keywords."""

    task: str
    env_id: str
    prompt: str | None = None
    max_episode_steps: int | None = None
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "env_id": self.env_id, "prompt": self.prompt,
                "max_episode_steps": self.max_episode_steps, "env_kwargs": dict(self.env_kwargs)}


# The reset option VariantEnv reads: which variant the episode runs.
VARIANT_OPTION = "variant"


class VariantEnv(gym.Env):
    """One sub-env that runs any of several registered envs (:class:`Variant`), switched by
    ``reset(options={"variant": task})``; each is made on first use, with ``wrapping`` and its
    own ``TimeLimit``, and kept. Every variant must have the first one's observation and action
    spaces (one vector env stacks them): another is a ``ValueError`` naming both."""

    def __init__(self, variants: Sequence[Variant], wrapping: SubEnvWrapping,
                 kwargs: Mapping[str, Mapping[str, Any]]) -> None:
        self.variants = {v.task: v for v in variants}
        self.wrapping, self.kwargs = wrapping, dict(kwargs)
        self._envs: dict[str, gym.Env] = {}
        first = self._env(variants[0].task)
        self.current = variants[0].task
        self.observation_space = first.observation_space
        self.action_space = first.action_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode

    def _env(self, task: str) -> gym.Env:
        if task not in self.variants:
            raise ValueError(f"variant {task!r}: expected one of {list(self.variants)}")
        if task not in self._envs:
            v = self.variants[task]
            env = self.wrapping.inner(gym.make(v.env_id, max_episode_steps=v.max_episode_steps,
                                               **self.kwargs[task]))
            if self._envs:
                first = next(iter(self._envs.values()))
                for what in ("observation_space", "action_space"):
                    if getattr(env, what) != getattr(first, what):
                        env.close()
                        raise ValueError(
                            f"variant {task!r} ({v.env_id}) has the {what} "
                            f"{getattr(env, what)}; the run's first variant has "
                            f"{getattr(first, what)}: variants of one run must share it (run "
                            "them apart with --tasks, or keep only the image with --image-key)")
            self._envs[task] = env
        return self._envs[task]

    @property
    def env(self) -> gym.Env:
        """The current variant's env."""
        return self._env(self.current)

    @property
    def task_description(self) -> str:
        return self.env.get_wrapper_attr("task_description")

    @task_description.setter
    def task_description(self, value: str) -> None:
        self.env.set_wrapper_attr("task_description", value)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        if options and VARIANT_OPTION in options:
            options = dict(options)
            self.current = str(options.pop(VARIANT_OPTION))
            self._env(self.current)
            options = options or None
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def make_variant_sub_env(variants: Sequence[Variant], wrapping: SubEnvWrapping,
                         kwargs: Mapping[str, Mapping[str, Any]]) -> gym.Env:
    """One held :class:`VariantEnv` (module level: async workers unpickle a partial of it)."""
    return EpisodeEndHold(VariantEnv(variants, wrapping, kwargs))


def make_variant_vector_env(
    variants: Sequence[Variant],
    num_envs: int,
    *,
    async_: bool = False,
    autoreset_mode: AutoresetMode = AutoresetMode.DISABLED,
    success: SuccessRule | str = "auto",
    image: str = "auto",
    render_size: tuple[int, int] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    env_wrappers: Sequence[str] = (),
    keep: Sequence[str] | None = None,
) -> VectorEnv:
    """A vector env whose every sub-env can run any of ``variants`` (:class:`VariantEnv`); each
    variant's prompt reaches it through the reset option ``task_description``. ``keep``: the
    observation keys kept (variants whose states differ share their camera)."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1; found {num_envs}")
    kwargs, sizes = {}, set()
    for v in variants:
        kwargs[v.task], frames = sub_env_kwargs(v.env_id, v.env_kwargs, image, render_size)
        sizes.add(frames)
    first = variants[0].prompt or variants[0].task
    wrap = SubEnvWrapping(first, image, success, sizes.pop() if len(sizes) == 1 else render_size,
                          tuple(wrappers), tuple(env_wrappers),
                          None if keep is None else tuple(keep))
    make = functools.partial(make_variant_sub_env, tuple(variants), wrap, kwargs)
    vector = gym.vector.AsyncVectorEnv if async_ else gym.vector.SyncVectorEnv
    return vector([make] * num_envs, autoreset_mode=autoreset_mode)


def episode_budget(env_id: str, max_episode_steps: int | None = None) -> int | None:
    """Policy steps per episode: ``max_episode_steps`` where given, else the spec's (the
    ``TimeLimit`` ``gymnasium.make`` adds), else ``None``."""
    if max_episode_steps is not None:
        return int(max_episode_steps)
    return gym.spec(env_id).max_episode_steps


def _constructor_params(spec: gym.envs.registration.EnvSpec) -> set[str]:
    """The keyword names the id's env class (or creator function) takes, read without making
    one; empty where they cannot be read."""
    try:
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(
            spec.entry_point)
        if not isinstance(creator, type):
            return set(inspect.signature(creator).parameters)
        names: set[str] = set()
        for cls in creator.__mro__:  # **kwargs handed on to a base class's __init__
            if "__init__" not in vars(cls) or cls is object:
                continue
            params = inspect.signature(cls.__init__).parameters
            names.update(params)
            if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                break
        return names
    except (AttributeError, ImportError, ValueError, TypeError):
        return set()


def _render_modes(spec: gym.envs.registration.EnvSpec) -> list[str]:
    """The render modes the id's env class lists in its metadata, read without making one."""
    try:
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(
            spec.entry_point)
    except (AttributeError, ImportError, ValueError):
        return []
    metadata = getattr(creator, "metadata", None)
    return list(metadata.get("render_modes", [])) if isinstance(metadata, Mapping) else []


def _checked_prompt(prompt: Any, what: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{what}: expected a non-empty instruction string; found {prompt!r}")
    return prompt


def _env_name(env: gym.Env) -> str:
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__
