"""The chunk planner: the one place where observations become env actions.

One call of :meth:`ChunkPlanner.plan` for the envs that need a chunk:

    obs ------------------ adapter.images --> uint8 [N, H, W, C]
    tasks ---------------- adapter.prompt --> prompts
    (env, episode, chunk) ----- seed rule --> seeds
    pipeline(images, prompts, seed=seeds) --> raw actions [N, H, D]
    raw actions ---------- adapter.actions -> env actions [N, H, D_env]  --> ChunkRecord
    rows asked for video ---- return_video --> predicted future clips    --> ChunkRecord.video

:class:`~cosmos3_gym.policy.VectorPolicy` (its queues, and through it rollouts and the overlap
runner) and the evaluator plan through it. They differ only in who counts episodes and chunks
and in the seed rule they pass in: the policy's seeds follow ``(env, episode, chunk)``, the
evaluator's follow ``(task, trial, chunk)``, so that an episode's result does not depend on the
env slot that runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.policy.adapters import Adapter, is_uint8
from cosmos3_gym.policy.observations import Observation, batch_size, describe, take_envs
from cosmos3_gym.seeding import check_seed

if TYPE_CHECKING:
    from cosmos3_gym.pipeline.output import ActionOutput
    from cosmos3_gym.pipeline.sde import StochasticRecord
    from cosmos3_gym.policy.realtime import ChunkTiming



def chunk_seed(seed: int, env_index: int, episode_index: int, chunk_index: int) -> int:
    """The noise seed of one chunk under the ``per_chunk`` noise rule: a 63-bit hash of its four
    coordinates.

    ``numpy.random.SeedSequence`` mixes the coordinates, so neighbouring envs, episodes and
    chunks get unrelated seeds, and a learner can recompute any chunk's seed from its record.
    """
    entropy = [int(seed), int(env_index), int(episode_index), int(chunk_index)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def pipeline_action_head(pipeline: Any) -> tuple[int, str | None] | None:
    """``(raw action width, domain)`` of a pipeline's checkpoint, read from its ``action_dim`` and
    ``policy.domain_name`` as :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline` has them (the
    domain ``None`` where it has no ``policy``); ``None`` for a callable without ``action_dim``.
    No model call: what :func:`~cosmos3_gym.policy.adapters.check_action_fit` needs to refuse a
    checkpoint before any env or model runs.
    """
    width = getattr(pipeline, "action_dim", None)
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)):
        return None
    domain = getattr(getattr(pipeline, "policy", None), "domain_name", None)
    return int(width), domain if isinstance(domain, str) else None


def takes_committed_actions(pipeline: Any) -> bool:
    """Whether ``pipeline`` takes real-time chunking's rows (``committed_actions``, as
    :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline` does)."""
    return getattr(pipeline, "takes_committed_actions", False) is True


def pipeline_state_rows(pipeline: Any) -> int:
    """S, the state rows each call of ``pipeline`` takes (its ``history_length``, as
    :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline` has it); 0 for a callable without."""
    rows = getattr(pipeline, "history_length", 0)
    return int(rows) if isinstance(rows, (int, np.integer)) and not isinstance(rows, bool) else 0


@dataclass(frozen=True)
class SeedRule:
    """How a chunk's noise seed follows from its coordinates: ``seed_of(env, episode, chunk)``.

    >>> SeedRule.fixed(7).seed_of(3, 1, 2), SeedRule.fixed(7).fresh
    (7, False)
    >>> SeedRule.per_chunk(7).seed_of(3, 1, 2) == chunk_seed(7, 3, 1, 2)
    True
    """

    seed_of: Callable[[int, int, int], int]
    # False: every chunk starts from the same noise, so a chunk is a function of (image,
    # prompt) alone; recorded as ChunkRecord.fresh_noise.
    fresh: bool = True
    # With a stochastic sampler: the seed of a chunk's scored Gaussian draws, apart from
    # seed_of's (which still draws its start noise and picks its stochastic steps); None: the
    # chunk's seed draws them too. GRPO's shared group noise (runner.group_seed_rule).
    step_noise_of: Callable[[int, int, int], int] | None = None

    @classmethod
    def per_chunk(cls, root: int) -> SeedRule:
        """Fresh noise per ``(env, episode, chunk)``: :func:`chunk_seed` under ``root``."""
        return cls(functools.partial(chunk_seed, root))

    @classmethod
    def fixed(cls, seed: int) -> SeedRule:
        """The same seed for every chunk (the official server's rule, with seed 0)."""
        return cls(lambda env, episode, chunk: seed, fresh=False)

    @classmethod
    def lerobot(cls, seed: int, num_envs: int, deterministic: bool = False) -> SeedRule:
        """The seeds LeRobot's Cosmos3 policy draws when it is given none: at ``reset()`` its
        generator restarts as ``np.random.default_rng(seed)``, and each replanning call draws
        one ``integers(0, 2**31)`` per env, in env order. LeRobot's evaluator resets the policy
        at the start of every rollout and replans every env together, so chunk ``c`` of env
        ``e`` (of ``num_envs``) gets draw ``c * num_envs + e`` in every episode. With
        ``deterministic`` (LeRobot's ``deterministic_seed``) every chunk gets ``seed``.

        >>> rule = SeedRule.lerobot(0, num_envs=2)
        >>> rng = np.random.default_rng(0)
        >>> draws = [int(rng.integers(0, 2**31)) for _ in range(4)]
        >>> [rule.seed_of(0, 0, 0), rule.seed_of(1, 0, 0), rule.seed_of(1, 5, 1)] == [
        ...     draws[0], draws[1], draws[3]]
        True
        """
        check_seed(seed, "seed")
        if deterministic:
            return cls.fixed(seed)
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected an int >= 1, got {num_envs!r}")
        rng = np.random.default_rng(seed)
        draws: list[int] = []

        def seed_of(env: int, episode: int, chunk: int) -> int:
            if not 0 <= env < num_envs:
                raise ValueError(f"LeRobot's seed rule was made for {num_envs} envs; env {env} "
                                 "is not one of them")
            index = chunk * num_envs + env
            while len(draws) <= index:  # one scalar draw at a time, as LeRobot draws them
                draws.append(int(rng.integers(0, 2**31)))
            return draws[index]

        return cls(seed_of)

    def shifted(self, offset: int) -> SeedRule:
        """This rule for envs numbered from ``offset``: env ``e`` of a group that starts at env
        ``offset`` of the whole batch gets the seeds of env ``offset + e``.

        >>> rule = SeedRule.per_chunk(7)
        >>> rule.shifted(2).seed_of(1, 0, 0) == rule.seed_of(3, 0, 0)
        True
        """
        if offset == 0:
            return self
        seed_of, noise_of = self.seed_of, self.step_noise_of
        return SeedRule(
            lambda env, episode, chunk: seed_of(env + offset, episode, chunk), fresh=self.fresh,
            step_noise_of=None if noise_of is None else (
                lambda env, episode, chunk: noise_of(env + offset, episode, chunk)))


@dataclass(frozen=True, eq=False)
class ChunkRecord:
    """What one pipeline call planned: everything a learner needs to replay or score it.

    Row ``k`` of every array belongs to env ``env_indices[k]``. Records compare (and hash) by
    identity: a queued action points back to the record and row it came from.

    Attributes:
        env_indices: int64 ``[N]``, the envs planned, in pipeline batch order.
        episode_indices: int64 ``[N]``, each env's episode index when planned.
        chunk_indices: int64 ``[N]``, each chunk's index within its episode.
        tasks: the task strings (before the adapter's prompt augmentation).
        prompts: the prompts the pipeline received.
        seeds: the per-item seeds: each item's video noise was drawn from its seed, and so was
            its action noise unless noise was passed in.
        step_noise_seeds: with a stochastic sampler whose seed rule sets them apart
            (``SeedRule.step_noise_of``), the per-item seeds of the stochastic steps' Gaussian
            draws; None: ``seeds`` drew them. Replaying a row needs them too.
        action_noise: float32 ``[N, H, 64]``, the initial action noise each item started from.
        raw_actions: float32 ``[N, H, D]``, the pipeline's actions before the adapter.
        normalized_actions: float32 ``[N, H, D]``, the sampler's output before un-normalisation.
        actions: float32 ``[N, H, D_env]``, the env-space actions after the adapter.
        fresh_noise: whether each chunk's noise came fresh from the ``per_chunk`` seed rule
            (False under ``fixed``, or where seeds or action noise were passed in).
        video: per row, the pipeline's decoded future clip (uint8 ``[H + 1, h, w, 3]``; frame 0
            is the observation as decoded, frame k follows action k) where the plan asked for
            it, else None; None when no row asked.
        sde: with a stochastic sampler (``flow_sde`` / ``flow_cps``), the rows' stochastic
            steps and log-probabilities
            (:class:`~cosmos3_gym.pipeline.sde.StochasticRecord`), else None.
        state: float32 ``[N, S, D]``, the robot state rows a state-conditioned head was given
            (as the adapter read them, before normalisation), else None. Replaying a row needs
            them too: ``state=record.state[k:k+1]``.
        clipped: float32 ``[N, H]``, how far each env action lay outside the env's bounds
            before the adapter clipped it into them (0: inside), where the adapter clips and
            says so (``clip_excess``: the box map), else None.
        committed: per row, the raw actions real-time chunking gave the call as the chunk's
            leading rows (``[C, D]``, which ``raw_actions[k, :C]`` equal exactly), or None
            for a row without; None when no row had any. Replaying a row needs them too.
        timing: under real-time execution, when each row was asked for and what its delay did
            (:class:`~cosmos3_gym.policy.realtime.ChunkTiming`), else None.

    Replaying row ``k`` (same observation, prompt and sampler settings) takes both noises:
    ``action_noise=record.action_noise[k:k+1]`` and ``seed=[record.seeds[k]]`` for the video
    noise; :meth:`VectorPolicy.predict_action_chunk` takes the whole record's as ``action_noise``
    and ``seeds``.
    """

    env_indices: np.ndarray
    episode_indices: np.ndarray
    chunk_indices: np.ndarray
    tasks: list[str]
    prompts: list[str]
    seeds: list[int]
    action_noise: np.ndarray
    raw_actions: np.ndarray
    normalized_actions: np.ndarray
    actions: np.ndarray
    fresh_noise: bool
    video: list[np.ndarray | None] | None = None
    sde: StochasticRecord | None = None
    state: np.ndarray | None = None
    clipped: np.ndarray | None = None
    committed: list[np.ndarray | None] | None = None
    timing: ChunkTiming | None = None
    step_noise_seeds: list[int] | None = None

    def __len__(self) -> int:
        return int(self.env_indices.shape[0])

    @property
    def horizon(self) -> int:
        """H, the actions per chunk."""
        return int(self.raw_actions.shape[1])


@dataclass(frozen=True)
class ChunkPlanner:
    """Plans chunks with ``pipeline`` (anything with ``Cosmos3ActionPipeline.__call__``'s
    signature) under ``adapter``'s conventions, seeding them by ``seed_rule``; the sampler
    settings are forwarded to every call (None keeps the pipeline's defaults).
    """

    pipeline: Any
    adapter: Adapter
    seed_rule: SeedRule
    # How every chunk is denoised (SamplerConfig.call_kwargs gives the pipeline call's
    # arguments); a stochastic sampler records each chunk's log-probability over its first
    # `executed_actions` actions (None: all H).
    sampling: SamplerConfig = field(default_factory=SamplerConfig)
    progress: bool = False
    executed_actions: int | None = None

    def plan(
        self,
        obs: Observation,
        envs: np.ndarray,
        tasks: Sequence[str],
        episodes: Sequence[int],
        chunks: Sequence[int],
        *,
        action_noise: np.ndarray | None = None,
        seeds: Sequence[int] | None = None,
        step_noise_seeds: Sequence[int] | None = None,
        horizon: int | None = None,
        action_dim: int | None = None,
        video: Sequence[bool] | None = None,
        committed: Sequence[np.ndarray | None] | None = None,
    ) -> ChunkRecord:
        """One pipeline call for ``envs`` (indices into the vector observation ``obs``).

        ``tasks``, ``episodes`` and ``chunks`` hold one entry per planned env: its task, and the
        episode and chunk indices the seed rule reads. ``seeds`` (one per env) replace the seed
        rule's; ``action_noise`` (``[N, H, 64]``) replaces the seeded action noise, while the
        video noise still comes from the seeds: both together replay a recorded chunk (its
        ``seeds`` and ``action_noise``, and its ``step_noise_seeds`` where it has them: they
        replace the seed rule's ``step_noise_of``). ``horizon`` and ``action_dim``, where given,
        are what earlier chunks had (H and D_env); a chunk of another shape is refused. ``video``
        (one bool per planned env) asks the pipeline to decode those rows' predicted future
        clips into ``ChunkRecord.video``; the decoder runs for them alone and no action changes.
        ``committed`` (one entry per planned env: raw actions ``[C, D]`` or None) are real-time
        chunking's leading rows (the pipeline's ``committed_actions``). Checks everything the
        pipeline and the adapter return, raises ``ValueError`` naming what it found, and changes
        nothing.
        """
        envs = np.asarray(envs, dtype=np.int64)
        n = int(envs.size)
        part = obs if n == batch_size(obs) else take_envs(obs, envs)
        images = self.images(part, n)
        prompts = [self.adapter.prompt(t) for t in tasks]
        for env, prompt in zip(envs, prompts, strict=True):
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(
                    f"adapter {self.adapter!r} made prompt {prompt!r} for env {env}; "
                    "expected non-empty text"
                )
        video_rows = [False] * n if video is None else [bool(v) for v in video]
        if len(video_rows) != n:
            raise ValueError(
                f"video: expected one bool per planned env ({n}); found {len(video_rows)}"
            )
        # Asked only when some row wants it, so a pipeline without return_video plans as before.
        video_kwargs = {"return_video": video_rows} if any(video_rows) else {}
        rows = pipeline_state_rows(self.pipeline)
        state = self.state(part, n, rows) if rows else None
        state_kwargs = {} if state is None else {"state": state}
        if committed is not None and len(committed) != n:
            raise ValueError(f"committed: expected one entry per planned env ({n}); found "
                             f"{len(committed)}")
        if committed is not None and all(c is None for c in committed):
            committed = None
        if committed is not None:  # asked only where some row has them: RTC's rows
            state_kwargs["committed_actions"] = list(committed)
        episodes = np.asarray(episodes, dtype=np.int64)
        chunks = np.asarray(chunks, dtype=np.int64)
        explicit = seeds is not None
        if seeds is None:
            coords = zip(envs, episodes, chunks, strict=True)
            seeds = [self.seed_rule.seed_of(int(e), int(ep), int(c)) for e, ep, c in coords]
        elif len(seeds) != n:
            raise ValueError(f"expected {n} seeds, one per planned env; found {len(seeds)}")
        seeds = [check_seed(s, f"seeds[{k}]") for k, s in enumerate(seeds)]
        noise_of = self.seed_rule.step_noise_of
        noise_seeds = None
        if step_noise_seeds is not None:
            if len(step_noise_seeds) != n:
                raise ValueError(f"expected {n} step_noise_seeds, one per planned env; found "
                                 f"{len(step_noise_seeds)}")
            noise_seeds = [check_seed(s, f"step_noise_seeds[{k}]")
                           for k, s in enumerate(step_noise_seeds)]
        elif noise_of is not None and not explicit and self.sampling.stochastic:
            noise_seeds = [check_seed(noise_of(int(e), int(ep), int(c)), f"step noise seed {k}")
                           for k, (e, ep, c) in enumerate(zip(envs, episodes, chunks, strict=True))]
        noise_kwargs = {} if noise_seeds is None else {"step_noise_seed": noise_seeds}

        # Seeds go with explicit action noise too: they draw the video noise, which the actions
        # depend on, so a record's (seeds, action_noise) reproduce its chunk.
        out: ActionOutput = self.pipeline(
            images,
            prompts,
            seed=seeds,
            action_noise=action_noise,
            video_noise=None,
            progress=self.progress,
            **video_kwargs,
            **state_kwargs,
            **self.sampling.call_kwargs(self.executed_actions),
            **noise_kwargs,
        )
        raw, noise, normalized = self._checked_output(out, n, horizon)
        clips = self._checked_video(out, video_rows, raw.shape[1]) if video_kwargs else None
        actions = self._env_actions(raw, action_dim)
        return ChunkRecord(
            env_indices=envs,
            episode_indices=episodes,
            chunk_indices=chunks,
            tasks=list(tasks),
            prompts=prompts,
            seeds=seeds,
            action_noise=noise,
            raw_actions=raw,
            normalized_actions=normalized,
            actions=actions,
            fresh_noise=self.seed_rule.fresh and action_noise is None and not explicit,
            video=clips,
            sde=self._checked_sde(out, n),
            state=state,
            clipped=self._clipped(raw),
            committed=None if committed is None else list(committed),
            step_noise_seeds=noise_seeds,
        )

    def state(self, obs: Observation, n: int, rows: int) -> np.ndarray:
        """The adapter's state rows of ``obs`` (``n`` envs) for a head that takes ``rows`` of
        them, checked: float32 ``[n, rows, D]``."""
        hook = getattr(self.adapter, "state", None)
        state = hook(obs) if callable(hook) else None
        if state is None:
            raise ValueError(
                f"the pipeline's head is conditioned on the robot state ({rows} row"
                f"{'' if rows == 1 else 's'} per env), but adapter {self.adapter!r} reads none; "
                "use an adapter whose state(obs) reads it ('droid', "
                "GenericAdapter(state_key=...), or your own)"
            )
        state = np.asarray(state)
        if state.dtype.kind != "f" or state.ndim != 3 or state.shape[:2] != (n, rows):
            raise ValueError(
                f"adapter {self.adapter!r} returned state {describe(state)}; expected float "
                f"[{n}, {rows}, D] (one row per state the head takes, per env)"
            )
        return state.astype(np.float32, copy=False)

    def images(self, obs: Observation, n: int) -> Any:
        """The adapter's model images of ``obs`` (``n`` envs), checked: uint8 ``[n, H, W, C]``, a
        numpy array or a torch tensor (which the pipeline takes on its device)."""
        images = self.adapter.images(obs)
        if not is_uint8(images) or images.ndim != 4:
            raise ValueError(
                f"adapter {self.adapter!r} returned images {describe(images)}; "
                "expected uint8 [B, H, W, C]"
            )
        if images.shape[0] != n:
            raise ValueError(
                f"adapter {self.adapter!r} returned {images.shape[0]} images for {n} envs"
            )
        return images

    @staticmethod
    def _checked_output(
        out: Any, n: int, horizon: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raw = np.asarray(getattr(out, "actions", None), dtype=np.float32)
        if raw.ndim != 3 or raw.shape[0] != n:
            raise ValueError(f"pipeline returned actions {list(raw.shape)}; expected [{n}, H, D]")
        if horizon is not None and raw.shape[1] != horizon:
            raise ValueError(
                f"pipeline returned chunks of H={raw.shape[1]}; expected H={horizon}"
            )
        noise = np.asarray(out.action_noise, dtype=np.float32)
        normalized = np.asarray(out.normalized_actions, dtype=np.float32)
        if noise.shape[:2] != raw.shape[:2] or normalized.shape != raw.shape:
            raise ValueError(
                f"pipeline returned action_noise {list(noise.shape)} and normalized_actions "
                f"{list(normalized.shape)}; expected [{n}, {raw.shape[1]}, 64] and "
                f"{list(raw.shape)}"
            )
        return raw, noise, normalized

    def _checked_sde(self, out: Any, n: int) -> StochasticRecord | None:
        if not self.sampling.stochastic:
            return None
        record = getattr(out, "stochastic", None)
        if record is None or len(record) != n:
            found = "none" if record is None else f"{len(record)} rows"
            raise ValueError(
                f"pipeline returned stochastic records of {found} for sampler "
                f"{self.sampling.sampler!r}; expected {n} rows (one per item)"
            )
        return record

    @staticmethod
    def _checked_video(
        out: Any, video_rows: list[bool], horizon: int
    ) -> list[np.ndarray | None]:
        clips = getattr(out, "video", None)
        if clips is None or len(clips) != len(video_rows):
            found = "no video" if clips is None else f"{len(clips)} clips"
            raise ValueError(
                f"pipeline returned {found} for return_video over {len(video_rows)} items; "
                "expected one entry per item"
            )
        checked: list[np.ndarray | None] = []
        for row, (wanted, clip) in enumerate(zip(video_rows, clips, strict=True)):
            if not wanted:
                checked.append(None)
                continue
            if (not isinstance(clip, np.ndarray) or clip.dtype != np.uint8 or clip.ndim != 4
                    or clip.shape[0] != horizon + 1 or clip.shape[3] != 3):
                raise ValueError(
                    f"pipeline returned video row {row} as {describe(clip)}; expected uint8 "
                    f"[{horizon + 1}, h, w, 3] (the observation and one frame per action)"
                )
            checked.append(clip)
        return checked

    def _clipped(self, raw: np.ndarray) -> np.ndarray | None:
        """The adapter's ``clip_excess(raw)`` (float32 ``[N, H]``), where it has that hook."""
        hook = getattr(self.adapter, "clip_excess", None)
        if not callable(hook):
            return None
        excess = np.asarray(hook(raw.copy()), np.float32)
        if excess.shape != raw.shape[:2]:
            raise ValueError(f"adapter {self.adapter!r}: clip_excess returned "
                             f"{list(excess.shape)}; expected {list(raw.shape[:2])}")
        return excess

    def _env_actions(self, raw: np.ndarray, action_dim: int | None) -> np.ndarray:
        n, horizon = raw.shape[:2]
        actions = np.asarray(self.adapter.actions(raw.copy()), dtype=np.float32)
        if actions.ndim != 3 or actions.shape[:2] != (n, horizon):
            raise ValueError(
                f"adapter {self.adapter!r} returned actions {list(actions.shape)}; "
                f"expected [{n}, {horizon}, D_env]"
            )
        if action_dim is not None and actions.shape[2] != action_dim:
            raise ValueError(
                f"adapter {self.adapter!r} returned {actions.shape[2]}-D actions; "
                f"earlier chunks were {action_dim}-D"
            )
        return actions
