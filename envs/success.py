"""Where an episode's success comes from: one declared rule, evaluated where the env steps.

A success rate counts only what happened. Each run's success comes from one declared source, and
results.json records which (:meth:`SuccessRule.record`):

===========================  ==================================================================
rule (``--success``)         an episode succeeds when, at the step that ended it, ...
===========================  ==================================================================
``auto`` (default)           the env's own flag says so: ``info["is_success"]``, else
                             ``info["success"]`` (an env with neither is refused before a run)
``info.KEY``                 the bool-valued ``info[KEY]`` is true (``--success-key KEY``)
``info.KEY > X``             the number ``info[KEY]`` passes the threshold (``>``, ``>=``,
                             ``<``, ``<=``)
``return >= X``              the episode's return so far (the sum of its rewards) passes it
``terminated``               the episode terminated (not truncated): only for envs whose
                             termination *is* their success (gym-pusht), and only when declared
``none``                     nothing counts: the run reports returns and lengths, no rate
===========================  ==================================================================

A flag must hold a bool (Python, numpy, a one-element array or tensor; the numbers 0 and 1 too,
as gymnasium-robotics writes ``is_success`` as a float): anything else is refused with what was
found, never ``bool()``-ed. :class:`~cosmos3_gym.envs.gym.ReportSuccess` evaluates the rule in
each sub-env and writes the outcome as ``info["is_success"]``; the episode runner reads only
that, and an episode whose last step reports none has no outcome (``None``), never a failure or
a success by default.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Where benchmarks put success, in the order "auto" looks: Gymnasium-robotics / LeRobot's envs
# (gym-pusht, gym-aloha, Meta-World) report "is_success"; ManiSkill3 and Meta-World "success".
SUCCESS_KEYS = ("is_success", "success")
RULE_KINDS = ("flag", "threshold", "return", "terminated", "none")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
}
_THRESHOLD = re.compile(
    r"^\s*(?:info\.(?P<key>[A-Za-z_][\w./-]*)|(?P<ret>return))\s*(?P<op>>=|<=|>|<)\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_FLAG = re.compile(r"^\s*info\.(?P<key>[A-Za-z_][\w./-]*)\s*$")
SYNTAX = ("auto, info.KEY (a bool flag), 'info.KEY > X' or 'return >= X' (>, >=, <, <=), "
          "terminated, or none")


@dataclass(frozen=True)
class SuccessRule:
    """A declared success source: ``kind`` with its ``key``, ``op`` and ``value`` where it has
    them, and who declared it (``declared_by``: ``"--success"``, ``"preset pusht"``, ...).

    >>> rule = parse_success("info.reward_dist > -0.05")
    >>> rule.kind, rule.key, rule.op, rule.value, rule.text
    ('threshold', 'reward_dist', '>', -0.05, 'info.reward_dist > -0.05')
    >>> rule.outcome({"reward_dist": -0.01}, terminated=False, episode_return=0.0)
    True
    """

    kind: str = "flag"
    key: str | None = None  # flag: None reads SUCCESS_KEYS in order; threshold: the info key
    op: str | None = None
    value: float | None = None
    declared_by: str = "the env"

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"success rule: kind must be one of {RULE_KINDS}; found "
                             f"{self.kind!r}")
        if self.kind in ("threshold", "return") and (self.op not in _OPS or not isinstance(
                self.value, (int, float)) or not math.isfinite(self.value)):
            raise ValueError(f"success rule {self.kind}: expected an operator in {list(_OPS)} "
                             f"and a finite number; found {self.op!r} {self.value!r}")
        if self.kind == "threshold" and not self.key:
            raise ValueError("success rule threshold: expected the info key it reads")

    @property
    def counts(self) -> bool:
        """Whether the rule gives episodes an outcome (every kind but ``none``)."""
        return self.kind != "none"

    @property
    def text(self) -> str:
        """The rule as ``--success`` writes it (``parse_success(rule.text)`` gives it back)."""
        if self.kind == "flag":
            return "auto" if self.key is None else f"info.{self.key}"
        if self.kind == "threshold":
            return f"info.{self.key} {self.op} {_number(self.value)}"
        if self.kind == "return":
            return f"return {self.op} {_number(self.value)}"
        return self.kind

    def describe(self) -> str:
        """The rule in words, with who declared it: the summary's ``success:`` line."""
        if self.kind == "flag":
            what = ("the env's flag info['is_success'] (else info['success'])"
                    if self.key is None else f"the env's flag info[{self.key!r}]")
        elif self.kind == "threshold":
            what = f"info[{self.key!r}] {self.op} {_number(self.value)}"
        elif self.kind == "return":
            what = f"the episode's return (sum of rewards) {self.op} {_number(self.value)}"
        elif self.kind == "terminated":
            what = "the episode terminated (a truncation is a failure)"
        else:
            what = "none (no success signal: returns and lengths only, no rate)"
        if self.kind == "none":
            return f"{what}; declared by {self.declared_by}"
        return f"{what}, at the step that ended the episode; declared by {self.declared_by}"

    def record(self) -> dict[str, Any]:
        """What results.json keeps of the rule (``success_source``)."""
        return {"rule": self.text, "kind": self.kind, "declared_by": self.declared_by,
                "description": self.describe()}

    def declared(self, by: str) -> SuccessRule:
        """The same rule, declared by ``by``."""
        return SuccessRule(self.kind, self.key, self.op, self.value, by)

    # ------------------------------------------------------------------ evaluation

    def flag_key(self, info: Mapping[str, Any]) -> str | None:
        """The info key a flag rule reads in ``info`` (``None``: ``auto`` found neither key)."""
        if self.key is not None:
            return self.key
        return next((k for k in SUCCESS_KEYS if k in info), None)

    def outcome(self, info: Mapping[str, Any], *, terminated: bool,
                episode_return: float) -> bool | None:
        """Whether the step that produced ``info`` counts as a success; ``None`` where the rule
        gives no outcome (``none``, or ``auto`` on an info with neither flag). A named key
        missing from ``info``, or a flag that holds no bool, is a ``ValueError``."""
        if self.kind == "none":
            return None
        if self.kind == "terminated":
            return bool(terminated)
        if self.kind == "return":
            return _OPS[self.op](float(episode_return), float(self.value))
        key = self.flag_key(info)
        if key is None:
            return None
        if key not in info:
            raise ValueError(
                f"success {self.text!r} (declared by {self.declared_by}): {key!r} is not in the "
                f"env's step info; found keys {sorted(info)}")
        if self.kind == "flag":
            return as_flag(info[key], key)
        number = _as_number(info[key], key)
        return _OPS[self.op](number, float(self.value))


def parse_success(text: str, declared_by: str = "--success") -> SuccessRule:
    """A :class:`SuccessRule` from its text (see the module's table).

    >>> parse_success("return >= 950").describe()
    "the episode's return (sum of rewards) >= 950, at the step that ended the episode; declared by --success"
    >>> parse_success("info.is_success").text
    'info.is_success'
    >>> parse_success("reward_dist")
    Traceback (most recent call last):
    ...
    ValueError: --success 'reward_dist': expected auto, info.KEY (a bool flag), 'info.KEY > X' or 'return >= X' (>, >=, <, <=), terminated, or none
    """  # noqa: E501
    if not isinstance(text, str):
        raise ValueError(f"--success: expected text ({SYNTAX}); found {text!r}")
    words = text.strip()
    if words in ("auto", "flag"):
        return SuccessRule("flag", declared_by=declared_by)
    if words in ("terminated", "none"):
        return SuccessRule(words, declared_by=declared_by)
    flag = _FLAG.match(words)
    if flag:
        return SuccessRule("flag", flag["key"], declared_by=declared_by)
    threshold = _THRESHOLD.match(words)
    if threshold:
        kind = "return" if threshold["ret"] else "threshold"
        return SuccessRule(kind, threshold["key"], threshold["op"], float(threshold["value"]),
                           declared_by)
    raise ValueError(f"--success {text!r}: expected {SYNTAX}")


def as_flag(value: Any, key: str) -> bool:
    """A success flag as a bool: bools (Python, numpy), the numbers 0 and 1, one-element arrays
    and tensors of them. Anything else is a ``ValueError`` saying what was found.

    >>> as_flag(1.0, "is_success"), as_flag(False, "success")
    (True, False)
    >>> as_flag(-0.31, "reward_dist")
    Traceback (most recent call last):
    ...
    ValueError: success key 'reward_dist' holds -0.31 (float), not a flag (True/False, or 0/1); for a threshold on it give --success 'info.reward_dist > X'
    """  # noqa: E501
    scalar = _scalar(value)
    if isinstance(scalar, bool):
        return scalar
    if isinstance(scalar, (int, float)) and scalar in (0, 1):
        return bool(scalar)
    raise ValueError(
        f"success key {key!r} holds {scalar!r} ({type(scalar).__name__}), not a flag "
        f"(True/False, or 0/1); for a threshold on it give --success 'info.{key} > X'")


def _as_number(value: Any, key: str) -> float:
    scalar = _scalar(value)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or math.isnan(scalar):
        raise ValueError(f"success threshold on {key!r}: expected a number in the step info; "
                         f"found {scalar!r} ({type(scalar).__name__})")
    return float(scalar)


def _scalar(value: Any) -> Any:
    """A Python scalar from a scalar, numpy scalar, or one-element array or tensor."""
    if hasattr(value, "numel") and callable(value.numel):  # a torch tensor
        if value.numel() == 1:
            return value.reshape(()).item()
        return value
    if hasattr(value, "size") and hasattr(value, "item"):  # numpy arrays and scalars
        return value.item() if value.size == 1 else value
    return value


def _number(value: float | None) -> str:
    return f"{value:g}"


def probe_action(space: Any) -> Any:
    """The action a success probe steps an env with once, to read what its step info reports
    (:meth:`~cosmos3_gym.envs.gym_eval.GymEval.check_success`, TorchRL's ``auto`` rule): a
    ``Box``'s middle (its bounds where one is infinite), else the space's own seeded sample, so
    the probe is the same on every run.

    >>> from gymnasium.spaces import Box
    >>> probe_action(Box(np.array([-1.0, 0.0]), np.array([3.0, np.inf]), dtype=np.float32))
    array([1., 0.], dtype=float32)
    """
    from gymnasium.spaces import Box

    if isinstance(space, Box):
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        middle = np.where(np.isfinite(low) & np.isfinite(high), (low + high) / 2.0,
                          np.clip(0.0, low, high))
        return middle.astype(space.dtype)
    space.seed(0)
    return space.sample()
