"""``python -m cosmos3_gym.train --out DIR --seed 0``: the same as ``cosmos3-gym train``."""

from cosmos3_gym.train import main

raise SystemExit(main())
