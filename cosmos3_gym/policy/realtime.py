"""Real-time execution on a virtual clock: an env keeps executing while its next chunk is computed.

A simulator waits for the policy; a robot does not. Given a :class:`RealTime`, a
:class:`~cosmos3_gym.policy.VectorPolicy` runs every env of its batch on a clock of its own (the
steps of the env's episode) under this model:

- **request**: the next chunk is planned from the observation at step ``t`` when no chunk of the
  env is in flight and its queue holds at most ``K`` actions (``replan_at``; by default the
  delay ``d`` expected, so that the queue runs out as the chunk arrives);
- **flight**: the chunk arrives at step ``t + d``. Until then the env goes on executing its
  queue; where the queue runs out first, the env *holds* (:class:`HoldRule`: the env family
  says what holding is) and those steps are *stalls*;
- **arrival**: the chunk's first ``d`` actions belong to steps already taken and are *dropped*;
  the queue becomes its rows ``d .. d + n - 1`` (``n``: ``n_action_steps``, else H; cut at H),
  and whatever was left of the old queue is *superseded*;
- an episode's first chunk is awaited at rest: no step is taken before it arrives and it runs
  from row 0 (a robot starts when its first chunk is ready), so the episodes of every latency
  start alike;
- **RTC** (``rtc``, real-time chunking, Black et al. 2025): the ``c = min(d, queue length)``
  actions the env executes during the flight go into the call as clean leading action rows
  (the pipeline's ``committed_actions``, the conditioning a state row uses), so the new chunk's
  rows ``0 .. c - 1`` are those very actions and the rest goes on from them.

``d`` comes from a :class:`DelayRule`: a fixed number of steps (an injected latency; two runs are
byte-identical), each batched call's own wall time over the control period (``measured``: the
batch size then changes every env's delay), or the delays a run recorded (``replay``). With
``measured`` (and a replay of it), the delay a request expects (for ``K`` and ``c``) is the one
the env's previous chunk took. Each chunk's timing is recorded (:class:`ChunkTiming`,
``ChunkRecord.timing``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cosmos3_gym.policy.planner import ChunkRecord
    from cosmos3_gym.policy.queues import ActionQueues

LATENCY_HELP = "0, a duration (150ms, 0.3s), a step count (3steps), measured or replay:DIR"
_AMOUNT = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|steps?)$")


@dataclass(frozen=True)
class Latency:
    """One inference latency, as ``--latency`` names it: ``none`` (0: the env waits for every
    chunk, the synchronous protocol), ``steps`` (a count of env steps), ``duration`` (``ms``
    milliseconds; steps at the env's control rate, rounded up), ``measured`` (each call's wall
    time) or ``replay`` (the delays recorded in the evaluation folder ``source``).

    >>> [Latency.parse(t).text for t in ("0", "3steps", "0.3s", "150ms", "0ms", "measured")]
    ['0', '3steps', '300ms', '150ms', '0', 'measured']
    >>> Latency.parse("150ms").delay_steps(20.0), Latency.parse("0.3s").delay_steps(10.0)
    (3, 3)
    """

    kind: str
    steps: int | None = None
    ms: float | None = None
    source: str | None = None

    @classmethod
    def parse(cls, text: str) -> Latency:
        given = str(text).strip()
        low = given.lower()
        if low == "measured":
            return cls("measured")
        if low.startswith("replay:") and given[len("replay:"):].strip():
            return cls("replay", source=given[len("replay:"):].strip())
        if low in ("0", "0.0"):
            return cls("none")
        found = _AMOUNT.match(low)
        if found is not None:
            value, unit = float(found.group(1)), found.group(2)
            if unit.startswith("step"):
                if value != int(value):
                    raise ValueError(f"latency {given!r}: a step count is a whole number; "
                                     f"expected {LATENCY_HELP}")
                return cls("steps", steps=int(value)) if value else cls("none")
            ms = value * (1000.0 if unit == "s" else 1.0)
            return cls("duration", ms=round(ms, 6)) if ms else cls("none")
        raise ValueError(f"latency {given!r}: expected {LATENCY_HELP}")

    @property
    def text(self) -> str:
        """The canonical spelling (what a run's identity and an arm's name hold)."""
        if self.kind == "steps":
            return f"{self.steps}steps"
        if self.kind == "duration":
            return f"{self.ms:g}ms"
        if self.kind == "replay":
            return f"replay:{self.source}"
        return {"none": "0", "measured": "measured"}[self.kind]

    @property
    def needs_control_rate(self) -> bool:
        """Whether turning it into env steps needs the env's control rate."""
        return self.kind in ("duration", "measured")

    def delay_steps(self, control_hz: float | None) -> int | None:
        """``d`` for a fixed latency (0, steps, a duration at ``control_hz``), else None."""
        if self.kind == "none":
            return 0
        if self.kind == "steps":
            return self.steps
        if self.kind == "duration":
            if control_hz is None:
                raise ValueError(f"latency {self.text}: a duration needs the env's control rate")
            return steps_of(self.ms / 1000.0, control_hz)
        return None


def steps_of(seconds: float, control_hz: float) -> int:
    """Env steps that pass in ``seconds`` at ``control_hz``, rounded up (float error aside).

    >>> steps_of(0.3, 10.0), steps_of(0.301, 10.0), steps_of(0.0, 20.0)
    (3, 4, 0)
    """
    return max(0, math.ceil(round(seconds * control_hz, 9)))


def parse_latencies(text: str) -> list[Latency]:
    """``--latency``'s value: one latency, or a comma list (one arm each, the first the control).

    >>> [lat.text for lat in parse_latencies("0, 100ms,4steps")]
    ['0', '100ms', '4steps']
    """
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError(f"latency {text!r}: expected {LATENCY_HELP}, or several comma-separated")
    found = [Latency.parse(p) for p in parts]
    texts = [lat.text for lat in found]
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise ValueError(f"latency {text!r}: {', '.join(repeated)} given twice; expected "
                         "distinct values (one arm each)")
    if len(found) > 1 and any(lat.kind == "replay" for lat in found):
        raise ValueError(f"latency {text!r}: a replay is one run's recorded delays; it cannot "
                         "be an arm of a sweep")
    return found


HOLDS = ("repeat", "still", "still-gripper")


@dataclass(frozen=True)
class HoldRule:
    """What an env does on a step with no action to execute (a stall): ``repeat`` its last
    action (position targets, or a controller's zero-order hold), ``still`` (zero: velocity or
    delta actions) or ``still-gripper`` (zero, but the gripper, the last dimension, stays as last
    commanded).

    >>> HoldRule("still-gripper").action(np.array([0.1, -0.2, 1.0], np.float32))
    array([0., 0., 1.], dtype=float32)
    """

    kind: str = "repeat"

    def __post_init__(self) -> None:
        if self.kind not in HOLDS:
            raise ValueError(f"hold must be one of {HOLDS}; found {self.kind!r}")

    def action(self, last: np.ndarray) -> np.ndarray:
        """The held action, from the last one executed."""
        if self.kind == "repeat":
            return last.copy()
        held = np.zeros_like(last)
        if self.kind == "still-gripper":
            held[-1] = last[-1]
        return held

    def describe(self) -> str:
        return {"repeat": "repeat the last action", "still": "a zero action",
                "still-gripper": "a zero action, the gripper as last commanded"}[self.kind]


@dataclass(frozen=True)
class DelayRule:
    """How many env steps a chunk's call takes (``d``): the :class:`Latency`'s, at
    ``control_hz`` where it is a duration or measured; ``recorded`` (replay): episode -> the d of
    each of its chunks, in chunk order (episodes numbered as the policy's seed rule reads them)."""

    latency: Latency
    control_hz: float | None = None
    recorded: Mapping[int, Sequence[int]] | None = None

    def __post_init__(self) -> None:
        if self.latency.needs_control_rate and not (self.control_hz or 0) > 0:
            raise ValueError(f"latency {self.latency.text} needs the env's control rate; found "
                             f"{self.control_hz!r}")
        if (self.latency.kind == "replay") != (self.recorded is not None):
            raise ValueError("a replay latency goes with its recorded delays, and only it")

    def expected(self, episode: int, chunk: int, previous: int) -> int:
        """d as known before the call (``previous``: the env's previous chunk's d). A replay
        expects what the run it repeats expected (a measured run: the previous d; a fixed
        latency: the previous d is that latency), so it asks for its chunks at the same steps,
        and never asks about a chunk that run did not plan."""
        if self.latency.kind in ("measured", "replay"):
            return previous
        return int(self.latency.delay_steps(self.control_hz))

    def applied(self, episode: int, chunk: int, wall_s: float) -> int:
        """d as applied once the call returned after ``wall_s`` seconds."""
        if self.latency.kind == "measured":
            return steps_of(wall_s, float(self.control_hz))
        if self.latency.kind == "replay":
            return self._recorded(episode, chunk)
        return self.expected(episode, chunk, 0)

    def _recorded(self, episode: int, chunk: int) -> int:
        delays = (self.recorded or {}).get(int(episode))
        if delays is None or not 0 <= chunk < len(delays):
            held = "no chunks" if delays is None else f"{len(delays)} chunks"
            raise ValueError(f"latency {self.latency.text}: episode {episode} asks for its chunk "
                             f"{chunk}, but the recorded run holds {held} of it; a replay "
                             "repeats a run only where every chunk is planned as it was")
        return int(delays[chunk])


@dataclass(frozen=True)
class RealTime:
    """Real-time execution (module notes): the delay rule, the replanning point ``replan_at``
    (None: the expected delay), real-time chunking, and the env's hold."""

    delay: DelayRule
    replan_at: int | None = None
    rtc: bool = False
    hold: HoldRule = HoldRule()

    def __post_init__(self) -> None:
        k = self.replan_at
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"replan_at must be an integer >= 0 or None; found {k!r}")

    def describe(self) -> str:
        """The model in one line (results.json and the summary)."""
        lat, hz = self.delay.latency, self.delay.control_hz
        rate = f" at {hz:g} Hz" if hz else ""
        if lat.kind == "measured":
            delay = f"each call's own wall time in steps{rate}, rounded up"
        elif lat.kind == "replay":
            delay = f"the delays recorded in {lat.source}"
        else:
            d = lat.delay_steps(hz)
            delay = f"{d} step{'' if d == 1 else 's'}" + (
                f" ({lat.text}{rate})" if lat.kind == "duration" else "")
        when = ("when the delay expected is left in the queue" if self.replan_at is None
                else f"at {self.replan_at} actions left")
        return (f"real time on a virtual clock per env: a chunk arrives {delay} after its "
                f"observation, its first d actions dropped; replan {when}; stalls "
                f"{self.hold.describe()}; RTC {'on' if self.rtc else 'off'}")


SYNCHRONOUS = "synchronous, each env waits for its chunk (latency 0)"


@dataclass(frozen=True)
class ChunkTiming:
    """When each row of a :class:`~cosmos3_gym.policy.ChunkRecord` was asked for and what its
    delay did, on its env's clock; int64 ``[N]`` arrays but ``latency_s``.

    Attributes:
        request_step: the step of the env's episode whose observation the chunk came from.
        latency_s: float64, the wall time of the pipeline call (one batched call: every row's).
        batch: the envs that call planned together (the batch size behind ``latency_s``).
        delay: d, the steps from request to arrival (as applied).
        committed: RTC's rows: the chunk's leading actions given as executing (0 without RTC).
        dropped: leading actions in the past at arrival (d, at most H; 0 for an episode's
            first chunk, which is awaited).
        stalls: steps the env holds waiting for it (its flight beyond the queue left).
        superseded: actions of the old queue not executed because it arrived.
    """

    request_step: np.ndarray
    latency_s: np.ndarray
    batch: np.ndarray
    delay: np.ndarray
    committed: np.ndarray
    dropped: np.ndarray
    stalls: np.ndarray
    superseded: np.ndarray

    FIELDS = ("request_step", "latency_s", "batch", "delay", "committed", "dropped", "stalls",
              "superseded")

    def row(self, k: int) -> dict[str, float | int]:
        """Row ``k`` as plain numbers (a record's entry)."""
        return {name: (float if name == "latency_s" else int)(getattr(self, name)[k])
                for name in self.FIELDS}


@dataclass
class _Flight:
    """A chunk of one env in flight: row ``row`` of ``record``, arriving at step ``arrival``."""

    record: ChunkRecord
    row: int
    arrival: int
    delay: int


class EnvClocks:
    """The per-env state of real-time execution (a :class:`VectorPolicy`'s, under its
    ``realtime``): each env's episode step, the chunk it has in flight, the last action it
    executed (what a hold repeats) and its previous chunk's delay."""

    def __init__(self, num_envs: int, realtime: RealTime) -> None:
        self.realtime = realtime
        self.step = np.zeros(num_envs, np.int64)
        self.previous_delay = np.zeros(num_envs, np.int64)
        self.flights: list[_Flight | None] = [None] * num_envs
        self.last_action: list[np.ndarray | None] = [None] * num_envs

    def begin(self, env: int) -> None:
        """``env`` starts an episode: its clock at 0, nothing in flight."""
        self.step[env] = 0
        self.previous_delay[env] = 0
        self.flights[env] = None
        self.last_action[env] = None

    def end(self, env: int) -> None:
        """``env``'s episode is over: what it had in flight never arrives."""
        self.flights[env] = None

    def replan_point(self, env: int, episode: int, chunk: int) -> int:
        """K: the queue length at which ``env`` asks for its next chunk."""
        rt = self.realtime
        if rt.replan_at is not None:
            return rt.replan_at
        return rt.delay.expected(episode, chunk, int(self.previous_delay[env]))

    def arrive(self, env: int, queues: ActionQueues, n: int) -> None:
        """Install ``env``'s chunk if it arrives at this step: its rows ``d .. d + n - 1``."""
        flight = self.flights[env]
        if flight is None or flight.arrival != self.step[env]:
            return
        self.flights[env] = None
        horizon = flight.record.actions.shape[1]
        queues.install(flight.record, flight.row, min(flight.delay, horizon),
                       min(flight.delay + n, horizon))

    def queue_after_arrival(self, env: int, queue: int, n: int) -> tuple[int, bool]:
        """``(queue length, chunk still in flight)`` once this step's arrival is installed."""
        flight = self.flights[env]
        if flight is None:
            return queue, False
        if flight.arrival != self.step[env]:
            return queue, True
        horizon = flight.record.actions.shape[1]
        return max(0, min(flight.delay + n, horizon) - min(flight.delay, horizon)), False

    def committed(self, env: int, queues: ActionQueues, episode: int, chunk: int,
                  horizon: int | None) -> np.ndarray | None:
        """RTC's rows for ``env``'s request: the raw actions it executes during the flight
        expected (at most H - 1 of them); None without RTC or with nothing executing."""
        if not self.realtime.rtc or chunk == 0:
            return None
        expected = self.realtime.delay.expected(episode, chunk, int(self.previous_delay[env]))
        count = min(expected, int(queues.lengths()[env]))
        if horizon is not None:
            count = min(count, horizon - 1)
        return queues.upcoming_raw(env, count) if count > 0 else None

    def timing(self, env: int, record: ChunkRecord, row: int, wall_s: float, queue: int
               ) -> tuple[int, int, int, int, int]:
        """Row ``row`` of a just planned ``record``, for ``env`` whose queue holds ``queue``
        actions: ``(request_step, delay, dropped, stalls, superseded)`` (:class:`ChunkTiming`)."""
        chunk = int(record.chunk_indices[row])
        delay = self.realtime.delay.applied(int(record.episode_indices[row]), chunk, wall_s)
        step = int(self.step[env])
        if chunk == 0:  # awaited at rest: runs from row 0
            return step, delay, 0, 0, 0
        if delay == 0:
            return step, 0, 0, 0, queue
        horizon = record.actions.shape[1]
        return step, delay, min(delay, horizon), max(0, delay - queue), max(0, queue - delay)

    def send(self, env: int, record: ChunkRecord, row: int, queues: ActionQueues, n: int) -> None:
        """Row ``row`` of ``record`` (its timing attached) on its way: installed now (an
        episode's first chunk, or no delay), else in flight until its delay has passed."""
        delay = int(record.timing.delay[row])
        self.previous_delay[env] = delay
        if record.chunk_indices[row] == 0 or delay == 0:
            queues.install(record, row, 0, min(n, record.actions.shape[1]))
        else:
            self.flights[env] = _Flight(record, row, int(self.step[env]) + delay, delay)

    def hold(self, env: int) -> np.ndarray:
        """The action of a stall: the hold rule over the last action executed."""
        last = self.last_action[env]
        assert last is not None, "an env holds only after its first chunk ran"
        return self.realtime.hold.action(last)
