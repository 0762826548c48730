"""cosmos3-gym as LeRobot sees it: the policy type ``cosmos3_gym`` and the env type
``cosmos3_gym``, in the module layout LeRobot's factories look up by name.

- :mod:`.configuration_cosmos3_gym`: :class:`Cosmos3GymConfig`, every knob of the policy
  (``--policy.checkpoint``, ``--policy.adapter``, ``--policy.seed``, ...);
- :mod:`.modeling_cosmos3_gym`: :class:`Cosmos3GymPolicy`, a :class:`~cosmos3_gym.VectorPolicy`
  behind LeRobot's ``PreTrainedPolicy`` surface (LeRobot finds it by replacing
  ``configuration_`` with ``modeling_`` in the config's module);
- :mod:`.processor_cosmos3_gym`: ``make_cosmos3_gym_pre_post_processors`` (found the same way);
- :mod:`.env_cosmos3_gym`: :class:`Cosmos3GymEnv`, cosmos3-gym's env families as a LeRobot env
  whose episodes are exactly those of ``cosmos3-gym eval``.

Importing this package imports LeRobot and registers both types. LeRobot 0.6's ``lerobot-eval``
does that on its own through the ``lerobot_policy_cosmos3_gym`` distribution
(``plugins/lerobot_policy_cosmos3_gym``), which LeRobot's plugin discovery imports by its name.
The policy type is not ``cosmos3`` (LeRobot's own Cosmos3 policy) nor ``cosmos3_edge``.
docs/lerobot.md says how to install it and how it relates to LeRobot's own Cosmos3 policy.
"""

from .configuration_cosmos3_gym import Cosmos3GymConfig
from .env_cosmos3_gym import Cosmos3GymEnv

POLICY_TYPE = "cosmos3_gym"
ENV_TYPE = "cosmos3_gym"

__all__ = ["ENV_TYPE", "POLICY_TYPE", "Cosmos3GymConfig", "Cosmos3GymEnv"]
