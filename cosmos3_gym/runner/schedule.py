"""Which episode each env slot runs next, and how its chunks are seeded.

The runner asks a schedule for a slot's next episode whenever the slot is free
(:meth:`Schedule.next`); ``None`` leaves it idle. An :class:`EpisodeSpec` is everything the
runner needs to start it: the run-wide id, the env's reset seed and options, an optional prompt
that replaces the env's own, whether its chunks decode their predicted future, and the layer's
own tag (an evaluation's :class:`~cosmos3_gym.envs.Episode`).

- :class:`EpisodeList`: a fixed list of episodes handed out in order (evaluations: the run's
  pending ``(task, trial)`` pairs; any slot may run any of them, since an episode's result does
  not depend on its slot).
- :class:`TaskRotation`: an endless stream (rollouts, on-policy batches): the k-th episode (or
  GRPO group) to start runs task ``k % n_tasks``, trial ``k // n_tasks``, so a run covers every
  task it was given, evenly; with ``group_size`` G, slots ``[g·G, (g+1)·G)`` form group g, and
  the e-th episode of each of its slots is one group episode (same task, trial, env seed and init
  state: the G episodes start from the same state and differ only by the policy's noise).
- :class:`GroupEpisodes`: one episode per slot and then idle (a GRPO iteration): slots
  ``[b·G, (b+1)·G)`` run group ``groups[b]``, the groups numbered run-wide, so the episodes, their
  ids and (with :func:`group_seed_rule`) their chunks' noise are the same whichever process or
  slot runs a group (a torchrun rank collects its share of an iteration's groups).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from cosmos3_gym.envs.base import Episode, EvalEnv, derive_seed
from cosmos3_gym.policy.planner import SeedRule, chunk_seed
from cosmos3_gym.seeding import repeat_seed


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode as the runner starts it in a slot."""

    # Run-wide id: episode records, rollouts' episode_ids, and (where the layer's seed rule
    # reads it) the noise seeds' episode coordinate.
    id: int
    seed: int | None
    reset_options: dict[str, Any] = field(default_factory=dict)
    # Replaces the env's task_description as the policy's prompt (shuffled prompts); None: the
    # env's own.
    prompt: str | None = None
    # Whether this episode's chunks also decode the predicted future (imagined videos).
    video: bool = False
    # The episode coordinate the policy's seed rule reads for this episode's chunks; None: the
    # slot's own episode count (the policy's default rule).
    rule_episode: int | None = None
    # The layer's own description of the episode (an evaluation's Episode; a GRPO group id).
    tag: Any = None


class Schedule(Protocol):
    """Hands out episodes to free slots."""

    def next(self, slot: int) -> EpisodeSpec | None:
        """The next episode for ``slot``, or ``None``: the slot stays idle from now on."""
        ...


class EpisodeList:
    """A fixed sequence of episodes, handed out in order to whichever slot is free.

    >>> from cosmos3_gym.envs import ColorReachEval
    >>> env = ColorReachEval(["red", "blue"])
    >>> schedule = EpisodeList(iter([EpisodeSpec(0, 5), EpisodeSpec(1, 6)]))
    >>> [s.id if s else None for s in (schedule.next(3), schedule.next(0), schedule.next(1))]
    [0, 1, None]
    """

    def __init__(self, specs: Iterable[EpisodeSpec]) -> None:
        self._specs: Iterator[EpisodeSpec] = iter(specs)
        self._done = False

    def next(self, slot: int) -> EpisodeSpec | None:
        if self._done:
            return None
        spec = next(self._specs, None)
        self._done = spec is None
        return spec


@dataclass(frozen=True)
class RotationTag:
    """What :class:`TaskRotation` says of an episode: its env family episode and GRPO group."""

    episode: Episode
    group: int


class TaskRotation:
    """Episodes for ever: tasks in turn in the order episodes start, GRPO groups of
    ``group_size`` slots (see the module notes). ``first_group`` and ``first_id`` continue a
    resumed run's numbering.

    >>> from cosmos3_gym.envs import ColorReachEval
    >>> rotation = TaskRotation(ColorReachEval(["red", "blue"]), seed=0, num_envs=4,
    ...                         group_size=2)
    >>> [(s.tag.episode.task, s.tag.episode.trial, s.tag.group)
    ...  for s in (rotation.next(slot) for slot in range(4))]
    [('red', 0, 0), ('red', 0, 0), ('blue', 0, 1), ('blue', 0, 1)]
    >>> [(s.tag.episode.task, s.tag.group) for s in (rotation.next(3), rotation.next(3))]
    [('red', 2), ('blue', 3)]
    """

    def __init__(self, env: EvalEnv, seed: int, num_envs: int, group_size: int = 1, *,
                 first_group: int = 0, first_id: int = 0) -> None:
        if group_size < 1 or num_envs % group_size:
            raise ValueError(
                f"group_size must be >= 1 and divide num_envs ({num_envs}); found {group_size}"
            )
        self.env, self.seed, self.group_size = env, int(seed), group_size
        self.first_group = first_group
        self.next_id = first_id
        self._rounds = [0] * num_envs
        self._groups: dict[tuple[int, int], int] = {}

    def next(self, slot: int) -> EpisodeSpec:
        key = (slot // self.group_size, self._rounds[slot])
        self._rounds[slot] += 1
        group = self._groups.setdefault(key, self.first_group + len(self._groups))
        n = len(self.env.tasks)
        episode = self.env.episode(group % n, group // n, self.seed)
        spec = EpisodeSpec(id=self.next_id, seed=episode.seed,
                           reset_options=self.env.reset_options(episode),
                           tag=RotationTag(episode, group))
        self.next_id += 1
        return spec


class GroupEpisodes:
    """One episode per slot, then the slot stays idle: slot ``s`` runs member ``s % G`` of group
    ``groups[s // G]``. Group ``g`` is the family's task ``g % n_tasks``, trial ``g // n_tasks``
    (the :class:`TaskRotation` order), so its ``G`` members share the task, env seed and init
    state; member ``m`` of group ``g`` has the run-wide id ``g·G + m``, which is also its
    ``rule_episode`` (the chunk-seed coordinate of :func:`group_seed_rule`). ``starts``, one
    per group, reruns another group's start state: group ``groups[i]`` then starts where group
    ``starts[i]`` started, with its own ids (fresh noise); GRPO's ``--replay-groups``.

    >>> from cosmos3_gym.envs import ColorReachEval
    >>> schedule = GroupEpisodes(ColorReachEval(["red", "blue"]), seed=0, groups=[3, 4],
    ...                          group_size=2)
    >>> [(s.id, s.tag.group, s.tag.episode.task, s.tag.episode.trial)
    ...  for s in (schedule.next(slot) for slot in range(4))]
    [(6, 3, 'blue', 1), (7, 3, 'blue', 1), (8, 4, 'red', 2), (9, 4, 'red', 2)]
    >>> schedule.next(0) is None
    True
    >>> again = GroupEpisodes(ColorReachEval(["red", "blue"]), seed=0, groups=[3, 4],
    ...                       group_size=2, starts=[3, 1])
    >>> [(s.id, s.tag.group, s.tag.episode.task, s.tag.episode.trial)
    ...  for s in (again.next(slot) for slot in range(4))]
    [(6, 3, 'blue', 1), (7, 3, 'blue', 1), (8, 4, 'blue', 0), (9, 4, 'blue', 0)]
    """

    def __init__(self, env: EvalEnv, seed: int, groups: Iterable[int], group_size: int,
                 starts: Iterable[int] | None = None) -> None:
        self.groups = [int(g) for g in groups]
        self.starts = list(self.groups) if starts is None else [int(s) for s in starts]
        if group_size < 1 or any(g < 0 for g in self.groups + self.starts) \
                or len(self.starts) != len(self.groups):
            raise ValueError(f"expected group_size >= 1, group ids >= 0 and one start per "
                             f"group; found {group_size}, {self.groups} and {self.starts}")
        self.env, self.seed, self.group_size = env, int(seed), group_size
        self._given = [False] * (len(self.groups) * group_size)

    @property
    def num_envs(self) -> int:
        """The slots this schedule fills: one per member of each group."""
        return len(self._given)

    def next(self, slot: int) -> EpisodeSpec | None:
        if slot >= len(self._given):
            raise ValueError(f"slot {slot}: this schedule fills {len(self._given)} slots")
        if self._given[slot]:
            return None
        self._given[slot] = True
        group, member = self.groups[slot // self.group_size], slot % self.group_size
        start, n = self.starts[slot // self.group_size], len(self.env.tasks)
        episode = self.env.episode(start % n, start // n, self.seed)
        episode_id = group * self.group_size + member
        return EpisodeSpec(id=episode_id, seed=episode.seed,
                           reset_options=self.env.reset_options(episode),
                           rule_episode=episode_id, tag=RotationTag(episode, group))


def group_seed_rule(root: int, shared_by: int | None = None) -> SeedRule:
    """Chunk ``c`` of the episode with run-wide id ``k`` (:class:`GroupEpisodes`) gets
    ``chunk_seed(root, 0, k, c)`` whichever slot runs it: the noise follows the episode, not the
    slot or the process.

    ``shared_by=G`` (the group size): the episodes of a group (ids ``g·G`` to ``g·G + G - 1``)
    share each chunk's start noise and stochastic steps, ``chunk_seed(root, 1, g, c)``, and
    only the stochastic steps' Gaussian draws stay the episode's own (``chunk_seed(root, 0, k,
    c)``, as without sharing): a group's episodes then differ only in the noise their
    log-probabilities score (GRPO's ``--group-noise shared``).

    >>> rule = group_seed_rule(5, shared_by=4)
    >>> rule.seed_of(0, 4, 2) == rule.seed_of(3, 7, 2) != rule.seed_of(0, 8, 2)
    True
    >>> rule.step_noise_of(0, 4, 2) == group_seed_rule(5).seed_of(0, 4, 2)
    True
    """
    if shared_by is None:
        return SeedRule(lambda env, episode, chunk: chunk_seed(root, 0, episode, chunk))
    if isinstance(shared_by, bool) or not isinstance(shared_by, int) or shared_by < 1:
        raise ValueError(f"shared_by: expected the group size, an int >= 1; found {shared_by!r}")
    return SeedRule(lambda env, episode, chunk: chunk_seed(root, 1, episode // shared_by, chunk),
                    step_noise_of=lambda env, episode, chunk: chunk_seed(root, 0, episode, chunk))


def episode_specs(env: EvalEnv, episodes: Iterable[Episode]) -> list[EpisodeSpec]:
    """A fixed episode set (``env.episodes(trials, seed)``) as the runner starts it: episode
    ``k`` is spec ``k``, tagged with the episode, its chunks seeded as episode ``k``'s (pair with
    :func:`episode_seed_rule` over the same set)."""
    return [EpisodeSpec(id=k, seed=e.seed, reset_options=env.reset_options(e), rule_episode=k,
                        tag=e) for k, e in enumerate(episodes)]


def episode_seed_rule(global_seed: int, episode_of: Callable[[int], Episode],
                      fresh: bool = True, repeat: int = 0) -> SeedRule:
    """The evaluation's seed rule: chunk ``c`` of the episode with run-wide id ``k`` gets
    ``derive_seed(global_seed, task, trial, chunk=c)`` of ``episode_of(k)``, whichever env slot
    runs it, mixed with ``repeat`` (:func:`~cosmos3_gym.seeding.repeat_seed`: repeat 0 is that
    seed itself; ``--repeats`` reruns the same episodes with another noise draw); with
    ``fresh=False`` (the ``fixed`` noise rule) every chunk gets ``global_seed`` itself, in every
    repeat (the official LIBERO server's rule: every request from seed 0)."""
    if not fresh:
        return SeedRule.fixed(global_seed)
    repeat_seed(0, repeat)  # a bad repeat is refused now, not at the first chunk

    def seed_of(env: int, episode: int, chunk: int) -> int:
        task, trial = episode_of(episode).seed_key
        return repeat_seed(derive_seed(global_seed, task, trial, chunk), repeat)

    return SeedRule(seed_of)
