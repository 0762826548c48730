"""The env family of registered Gymnasium envs (``--env gym:ID``) and of the benchmark presets
built on them (:mod:`~cosmos3_gym.envs.presets`): a task is a :class:`~cosmos3_gym.envs.gym.
Variant`, and its success is checked before a run. The envs themselves are
:mod:`~cosmos3_gym.envs.gym`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gymnasium.spaces import Space
from gymnasium.vector import AutoresetMode, VectorEnv

from .base import Episode, EvalEnv
from .gym import VARIANT_OPTION, Variant, episode_budget
from .success import SuccessRule, parse_success, probe_action


class GymEval(EvalEnv):
    """Registered Gymnasium envs (``--env gym:ID``, and the benchmark presets); a task is a
    :class:`~cosmos3_gym.envs.gym.Variant`: an env id with its instruction and budget.

    The envs come from Gymnasium's registry: one id through :func:`~cosmos3_gym.envs.
    make_gym_vector_env` (``gymnasium.make_vec``, sync or async), several through
    :func:`~cosmos3_gym.envs.gym.make_variant_vector_env` (each slot runs any variant).
    ``import_modules`` register the ids (``gym_pusht``, ``gym_aloha``), ``env_kwargs`` go to
    every env, the image is the observation's own or the ``render()`` frame (``render_size``
    ``(H, W)``), and success follows ``success`` (a :class:`~cosmos3_gym.envs.success.
    SuccessRule` or its text; default ``auto``: the env's own flag, checked before a run by
    :meth:`check_success`). ``image_key`` / ``state_key`` / ``flip`` choose what the generic
    adapter reads (:attr:`adapter`); ``action_map`` is the map the run applies unless told
    otherwise.

    ``env`` is one id or the run's variants. With one id, ``prompts`` is one instruction (one
    task, named by the id), a ``{task name: instruction}`` dict (several tasks of the same env,
    each episode told its own), or ``None`` where the env names its task itself
    (``task_description``). Each episode's prompt reaches its sub-env as the reset option
    ``task_description`` (and its variant as ``variant``), so a slot switches tasks between
    episodes. ``--synthetic`` sizes its random action head to this env's action width.
    """

    # A synthetic (random-weight) model gets an action head as wide as this env's actions.
    sizes_synthetic_head = True

    def __init__(
        self,
        env: str | Sequence[Variant],
        prompts: str | dict[str, str] | None = None,
        *,
        import_modules: Sequence[str] = (),
        env_kwargs: dict[str, Any] | None = None,
        max_episode_steps: int | None = None,
        success: SuccessRule | str | None = None,
        success_key: str | None = None,
        image_key: str | Sequence[str] | None = None,
        state_key: str | None = None,
        render_size: tuple[int, int] | None = None,
        flip: str | None = None,
        action_map: str | None = None,
        env_wrappers: Sequence[str] = (),
        suite: str | None = None,
        label: str | None = None,
        control_hz: float | None = None,
        hold: str = "repeat",
    ) -> None:
        import gymnasium

        from .gym import check_render_size, import_env_modules

        import_env_modules(import_modules)
        if isinstance(env, str):
            name = env.rsplit("/", 1)[-1]
            given = {name: prompts} if prompts is None or isinstance(prompts, str) else prompts
            variants = [Variant(task, env, prompt) for task, prompt in given.items()]
        else:
            if prompts is not None:
                raise ValueError("GymEval: variants carry their own prompts; found prompts too")
            variants = list(env)
        if not variants:
            raise ValueError("GymEval: expected one env id or at least one variant; found none")
        for v in variants:
            try:
                gymnasium.spec(v.env_id)
            except gymnasium.error.Error as err:
                raise ValueError(
                    f"--env {label or 'gym:' + v.env_id}: {v.env_id} is not in Gymnasium's "
                    f"registry ({err}); import the package that registers it with --import "
                    "MODULE (e.g. --import gym_pusht)"
                ) from None
        super().__init__([v.task for v in variants])
        self.label = label or f"gym:{variants[0].env_id}"
        self.suite = suite or f"gym:{variants[0].env_id}"
        self.import_modules = tuple(import_modules)
        self.env_kwargs = dict(env_kwargs or {})
        budgets = {}
        for v in variants:
            budget = episode_budget(v.env_id, max_episode_steps or v.max_episode_steps)
            if budget is None:
                raise ValueError(
                    f"--env {self.label}: {v.env_id}'s spec sets no max_episode_steps, so "
                    "episodes would not end; give one with --max-episode-steps N")
            budgets[v.task] = budget
        self._variants = [Variant(v.task, v.env_id, v.prompt, budgets[v.task],
                                  {**self.env_kwargs, **v.env_kwargs}) for v in variants]
        self.variants = [v.as_dict() for v in self._variants]  # what identity() records
        self.prompts = {v.task: v.prompt for v in self._variants}
        self.env_id = variants[0].env_id
        self.max_episode_steps = budgets[variants[0].task]
        if success is not None and success_key is not None:
            raise ValueError(f"--success {success!r} and --success-key {success_key!r} both "
                             "say where success comes from; give one")
        if success_key is not None:
            rule = parse_success(f"info.{success_key}", "--success-key")
        elif isinstance(success, str):
            rule = parse_success(success)
        else:
            rule = success or SuccessRule("flag", declared_by="the env")
        self._rule = rule
        self.success = rule.text
        self.image_key = _keys(image_key)
        self.state_key = state_key
        self.render_size = None if render_size is None else check_render_size(render_size)
        self.flip = flip  # checked by the adapter (cosmos3_gym.policy.adapters.FLIPS)
        self.action_map = action_map
        self.env_wrappers = tuple(env_wrappers)
        self.control_hz = control_hz  # a preset's; a gym: id declares none
        self.hold = hold
        distinct = {(v.env_id, repr(sorted(v.env_kwargs.items())), v.max_episode_steps)
                    for v in self._variants}
        self._several_envs = len(distinct) > 1
        self._action_space: Space | None = None
        self._success_checked = False

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None, env_id: str = "",
        prompt: str | dict[str, str] | None = None, **options: Any,
    ) -> GymEval:
        given = {"--suite": suite, "--tasks": tasks, "--image-size": image_size,
                 "--step-budget": step_budget}
        unused = [flag for flag, value in given.items() if value is not None]
        if unused:
            raise ValueError(
                f"{', '.join(unused)} do not apply to --env gym:{env_id}: name its tasks with "
                "--prompt '{\"task\": \"instruction\", ...}', the size of its render() frames "
                "with --render-size HxW, or its own image size with --env-kwargs"
            )
        return cls(env_id, prompt, max_episode_steps=max_episode_steps, **options)

    @property
    def success_rule(self) -> SuccessRule:
        return self._rule

    @property
    def adapter_options(self) -> dict[str, Any]:  # type: ignore[override]
        """The generic adapter's image key(s), state key and flip for this env."""
        keys = self.image_key
        return {"image_key": None if keys is None else (keys[0] if len(keys) == 1
                                                          else tuple(keys)),
                "state_key": self.state_key, "flip": self.flip}

    def episode_budget(self) -> dict[str, Any]:
        budgets = {v.task: v.max_episode_steps for v in self._variants}
        if len(set(budgets.values())) == 1:
            budgets = {self.suite: self.max_episode_steps}
        return {"step_budget": None, "settle_steps": 0, "max_episode_steps": budgets}

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        prompt = self.prompts[episode.task]
        options = {} if prompt is None else {"task_description": prompt}
        if self._several_envs:
            options[VARIANT_OPTION] = episode.task
        return options

    def task_prompt(self, task_index: int) -> str:
        prompt = self.prompts[self.tasks[task_index]]
        if prompt is None:
            raise ValueError(f"--env {self.label} names its own tasks; give them with "
                             "--prompt to know them before an episode runs")
        return prompt

    def single_action_space(self) -> Space:
        """The env's action space, from one sync sub-env built as the runner builds them and
        reset once (then closed), so that what the env gets wrong for this run is one
        ``ValueError`` before any model loads: a package it needs, a ``--env-kwargs`` keyword
        its constructor does not take, no prompt where it names no task, a ``render()`` that
        gives no image, an action space the adapters cannot map (they map actions onto a
        ``Box``)."""
        if self._action_space is None:
            from gymnasium.spaces import Box

            from .gym import foreign_env_errors

            envs = self.make(1, False)
            try:
                space = envs.single_action_space
                if not isinstance(space, Box):
                    raise ValueError(
                        f"--env {self.label}'s action space is {space}; the policy's actions "
                        "are real vectors, which its adapters map onto a Box action space only. "
                        "Expected an env with a Box action space (a discrete env can be wrapped "
                        "in a gymnasium.ActionWrapper that takes a Box: docs/your_own_env.md)")
                with foreign_env_errors(self.env_id, self.env_kwargs):
                    envs.reset(seed=0, options=self.reset_options(self.episode(0, 0, 0)))
            finally:
                envs.close()
            self._action_space = space
        return self._action_space

    def check_success(self) -> None:
        """Before a run: build each variant's sub-env once (as a run wraps it), step it once
        (the action at the middle of its Box) and read its success there, so that an env with
        no success signal, a key that is not there or a flag that holds no bool is one error
        now, not a fault in the middle of a run; variants whose spaces differ (one vector env
        cannot hold them) are refused here too."""
        if self._success_checked:
            return
        import gymnasium

        from .gym import SubEnvWrapping, sub_env_kwargs

        keep = self._kept_keys() if self._several_envs else None
        wrap = SubEnvWrapping(None, "auto", self._rule, None, (), self.env_wrappers, keep)
        first: tuple[Any, Any] | None = None
        for v in self._variants:
            kwargs, frames = sub_env_kwargs(v.env_id, v.env_kwargs, "auto", self.render_size)
            env = dataclasses.replace(wrap, render_size=frames).inner(gymnasium.make(
                v.env_id, max_episode_steps=v.max_episode_steps, **kwargs))
            try:
                spaces = (env.observation_space, env.action_space)
                if first is None:
                    first = spaces
                elif spaces != first:
                    raise ValueError(
                        f"--env {self.label}: variant {v.task!r} ({v.env_id}) has the spaces "
                        f"{spaces}; the first variant has {first}: one run's variants must "
                        "share them (run them apart with --tasks)")
                if not self._rule.counts:
                    continue
                env.reset(seed=0)
                try:
                    info = env.step(probe_action(env.action_space))[4]
                except ValueError as err:
                    raise ValueError(f"--env {self.label}: {err}") from None
                if "is_success" not in info:
                    threshold = gymnasium.spec(v.env_id).reward_threshold
                    hint = f" (its spec's reward_threshold is {threshold:g})" if threshold else ""
                    raise ValueError(
                        f"--env {self.label}: {v.env_id} reports no success signal: its step "
                        f"info holds {sorted(info)}, neither is_success nor success. Declare "
                        "where success comes from: --success 'info.KEY > X' (a threshold on an "
                        "info number), --success 'return >= X' (the episode's return"
                        f"{hint}), --success terminated (its termination is its success), or "
                        "--success none (returns and lengths only, no rate)")
            finally:
                env.close()
        self._success_checked = True

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        from .gym import make_gym_vector_env, make_variant_vector_env

        if self._several_envs:
            return make_variant_vector_env(
                self._variants, num_envs, async_=async_, autoreset_mode=autoreset_mode,
                success=self._rule, render_size=self.render_size,
                env_wrappers=self.env_wrappers, keep=self._kept_keys())
        v = self._variants[0]
        return make_gym_vector_env(
            v.env_id, num_envs, prompt=v.prompt,
            vectorization_mode="async" if async_ else "sync", autoreset_mode=autoreset_mode,
            max_episode_steps=v.max_episode_steps, success=self._rule,
            render_size=self.render_size, env_wrappers=self.env_wrappers, **v.env_kwargs,
        )

    def _kept_keys(self) -> tuple[str, ...] | None:
        """Variants of one run share the observation keys the policy reads (the camera, the
        state): where the image keys are named, only those (top-level) keys are kept."""
        if self.image_key is None:
            return None
        keys = [k.split("/", 1)[0] for k in [*self.image_key, *(
            [self.state_key] if self.state_key else [])]]
        return tuple(dict.fromkeys(keys))


def _keys(keys: str | Sequence[str] | None) -> list[str] | None:
    if keys is None:
        return None
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"--image-key: expected one or more observation keys; found {keys!r}")
    return keys
