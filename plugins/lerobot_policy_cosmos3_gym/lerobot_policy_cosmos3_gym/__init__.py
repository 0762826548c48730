"""LeRobot imports this module by its distribution's name (``lerobot_policy_*``) before it
parses ``lerobot-eval``'s command line; importing it registers cosmos3-gym's policy type
``cosmos3_gym`` (``--policy.type=cosmos3_gym``) and env type ``cosmos3_gym``
(``--env.type=cosmos3_gym``). Everything else lives in
:mod:`cosmos3_gym.integrations.lerobot_plugin`."""

from cosmos3_gym.integrations.lerobot_plugin import (
    ENV_TYPE,
    POLICY_TYPE,
    Cosmos3GymConfig,
    Cosmos3GymEnv,
)

__all__ = ["ENV_TYPE", "POLICY_TYPE", "Cosmos3GymConfig", "Cosmos3GymEnv"]
