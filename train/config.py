"""What a training run is: every knob with its default (the shipped ``tiny`` checkpoint's), and
the transformer and policy-head configs it writes; and what a GRPO run is (:class:`GRPOConfig`,
``cosmos3-gym rl grpo``). Standard library only, so the command line reads and checks these
settings before torch loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cosmos3_gym.settings import (
    EnvSettings,
    ModelSettings,
    RuntimeSettings,
    check_settings,
    csv,
    nonnegative_int,
    positive_int,
    positive_number,
    ratio_above_one,
    sde_steps_value,
    seed_value,
    setting,
    unit_fraction,
)

# The env families whose scripted experts give demos, and the policy head each one's checkpoint
# gets. Neither is a released Cosmos3 embodiment: both take row 0 of the DomainAwareLinear
# tables. ColorReach: 2-D velocities; Meta-World: the metaworld adapter's raw actions (hand
# deltas and the gripper in [0, 1], 1 open), at its 80 Hz control, seen from the corner camera.
DEMO_HEADS: dict[str, dict[str, Any]] = {
    "color_reach": {"domain_name": "color_reach", "domain_id": 0, "raw_action_dim": 2,
                    "fps": 20.0, "view_point": "ego_view"},
    "metaworld": {"domain_name": "metaworld", "domain_id": 0, "raw_action_dim": 4,
                  "fps": 80.0, "view_point": "third_person_view"},
}
DEMO_ENVS = tuple(DEMO_HEADS)
METAWORLD_DEMO_STEPS = 150  # Meta-World demo episodes' default step limit (the experts need <120)
# How the future video's noise level relates to the actions' in training (train/trainer.py).
VIDEO_NOISE = ("shared", "independent")


def check_demo_env(env: str) -> None:
    """Refuse an env family without a scripted expert (:data:`DEMO_HEADS`): the one refusal of
    the trainer's settings check and of :func:`~cosmos3_gym.train.demos.collect_demos`."""
    if env not in DEMO_HEADS:
        raise ValueError(f"env: expected one of {', '.join(DEMO_ENVS)} (the env families with "
                         f"scripted experts); found {env!r}")


def _knob(default: Any, text: str, flag: str | None = None,
          choices: tuple[str, ...] | None = None) -> Any:
    """A field with its default and its one-line help (``cosmos3-gym train --help``)."""
    return setting(default, text, group="train", flag=flag, choices=choices)


@dataclass
class TrainConfig:
    """Every knob of a training run, with its default (the shipped ``tiny`` checkpoint's)."""

    out: str = _knob("tiny", "where the command writes its results; the checkpoint folder")
    seed: int = _knob(0, "the run's root seed; the demos, the initial weights and the data "
                      "order derive from it")
    # Demo collection: episodes, the chance of a random detour per step, and the chance that
    # a visited state is kept as a sample (fewer samples per layout, more layouts per VAE second).
    episodes: int = _knob(1400, "expert episodes collected as demos")
    detour_prob: float = _knob(
        0.3, "chance per step that a random action replaces the expert's (off-expert states)"
    )
    keep_prob: float = _knob(0.3, "chance that a visited state is kept as a training sample")
    image_size: int = _knob(128, "the env's square image size in pixels; the demos'")
    env: str = _knob("color_reach", "the env family; the one whose scripted expert gives the "
                     "demos: color_reach, or metaworld (its experts, frames rendered without "
                     "shadows)", choices=DEMO_ENVS)
    tasks: list[str] | None = setting(
        None, "the tasks to run, comma-separated; --env metaworld: those whose experts give the "
        "demos (episode k runs task k mod their number)", group="train", parse=csv)
    max_episode_steps: int | None = setting(
        None, "the episode's step limit; --env metaworld's demo episodes (default "
        f"{METAWORLD_DEMO_STEPS}); ColorReach's keep their own", group="train",
        parse=positive_int)
    # Model: the real architecture at tiny widths.
    hidden_size: int = _knob(128, "transformer width")
    num_layers: int = _knob(2, "transformer layers")
    num_heads: int = _knob(4, "attention query heads")
    num_kv_heads: int = _knob(2, "attention key/value heads (grouped-query attention)")
    head_dim: int = _knob(32, "width of one attention head")
    intermediate_size: int = _knob(256, "MLP width")
    # Policy head.
    action_horizon: int = _knob(4, "actions per chunk (a multiple of 4)")
    num_inference_steps: int = _knob(8, "denoising steps the trained head asks for at inference",
                                     flag="head-denoising-steps")
    flow_shift: float = _knob(1.0, "the flow shift the trained head asks for at inference",
                              flag="head-flow-shift")
    # Optimisation.
    steps: int = _knob(2400, "optimiser steps of the transformer", flag="train-steps")
    batch_size: int = _knob(64, "samples per optimiser step")
    lr: float = _knob(2e-3, "the optimiser's learning rate (AdamW); the peak of a warmup and "
                      "cosine schedule")
    weight_decay: float = _knob(0.01, "AdamW weight decay")
    warmup_steps: int = _knob(150, "linear warmup steps before the cosine decay")
    video_loss_weight: float = _knob(
        0.1, "weight of the future-frame velocity loss beside the action loss"
    )
    video_target: str = _knob(
        "still", "future latent frames trained towards: 'still' (the observation's latent) or "
        "'future' (the frames the expert's chunk renders; see train/trainer.py)"
    )
    video_noise: str = _knob(
        "shared", "noise levels of the future video and the action tokens: 'shared' (one per "
        "sample) or 'independent' (each its own; see train/trainer.py)", choices=VIDEO_NOISE
    )
    pure_noise_video: float = _knob(
        0.0, "share of samples whose future video is pure noise (with 'independent' video noise)"
    )
    video_motion_weight: float = _knob(
        0.0, "extra weight of the video loss on latent cells the chunk changes, per share of "
        "their pixels that move"
    )
    log_every: int = _knob(25, "steps per point of the loss curves (train_log.json)")
    # Success while training: the model being trained, evaluated in memory every eval_every
    # steps by the evaluation's own call (cosmos3_gym.evaluate); the training is unchanged.
    eval_every: int = _knob(0, "iterations between held-out measurements; here optimiser "
                            "steps: the model being trained is evaluated on the demos' env "
                            "as it is in memory, each result in train_log.json (0: none)")
    eval_trials: int = _knob(2, "held-out episodes per task, with the deterministic sampler (the "
                             "family's own evaluation episodes under --eval-seed)")
    eval_seed: int = _knob(1_000_000, "the held-out evaluation's root seed (not --seed)")
    encode_batch_size: int = _knob(32, "demo images per VAE encode call")
    stats_samples: int = _knob(
        64, "demos whose latents set the VAE's per-channel normalisation statistics"
    )
    # The VAE's decoder, trained after the statistics are set (train/vae.py); the encoder stays.
    vae_clips: int = _knob(1024, "demo clips the VAE decoder learns to draw (the first ones)")
    vae_steps: int = _knob(1800, "VAE decoder optimiser steps (0: keep it random)")
    vae_batch_size: int = _knob(8, "clips per VAE decoder step")
    vae_still_rows: int = _knob(
        2, "clips per VAE step shown as the still future (with the 'still' video target)"
    )
    vae_crop: int = _knob(64, "side of the window each VAE training clip is cut to (px)")
    vae_lr: float = _knob(3e-3, "peak learning rate of the VAE decoder (AdamW)")
    vae_warmup_steps: int = _knob(50, "VAE linear warmup steps before the cosine decay")
    vae_holdout_episodes: int = _knob(
        40, "expert episodes after the training ones whose clips measure the VAE's PSNR"
    )
    # One intra-op thread: the result does not depend on how busy a shared machine is, and
    # two threads on two shared cores are slower than one.
    threads: int = _knob(1, "torch intra-op CPU threads; 1 keeps the result independent of how "
                         "busy a shared machine is")


def transformer_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """``transformer/config.json`` keys that differ from the tiny test default."""
    quarter = cfg.head_dim // 8
    axes = [cfg.head_dim // 2 - 2 * quarter, quarter, quarter]  # (T, H, W) split of mRoPE
    return {
        "hidden_size": cfg.hidden_size,
        "head_dim": cfg.head_dim,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.num_layers,
        "intermediate_size": cfg.intermediate_size,
        "rope_axes_dim": axes,
        "rope_scaling": {"mrope_section": axes, "mrope_interleaved": True},
    }


def demo_episode_steps(cfg: TrainConfig) -> int | None:
    """The step limit of ``cfg``'s demo episodes and of its success measurements while
    training: ``--max-episode-steps``, else :data:`METAWORLD_DEMO_STEPS` on Meta-World; None
    on ColorReach (its episodes keep their own)."""
    if cfg.env == "metaworld":
        return cfg.max_episode_steps or METAWORLD_DEMO_STEPS
    return None


def policy_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """``action_policy.json`` of the trained checkpoint: the demo family's head
    (:data:`DEMO_HEADS`). Its raw actions lie in [-1, 1] (ColorReach's velocities, Meta-World's
    hand deltas; the gripper in [0, 1]), where the experts' saturate, so its samples are clipped
    to that range (``clip_actions``)."""
    return {
        **DEMO_HEADS[cfg.env], "action_horizon": cfg.action_horizon, "normalization": "none",
        "stats": None, "resolution_tier": 256,
        "num_inference_steps": cfg.num_inference_steps, "flow_shift": cfg.flow_shift,
        "clip_actions": True,
    }


# ---------------------------------------------------------------------- rl grpo


def parse_train(text: str) -> str:
    """``--train``: ``full``, ``lora`` or ``modules:NAME[,NAME...]``.

    >>> parse_train("modules: action_proj_in , action_proj_out")
    'modules:action_proj_in,action_proj_out'
    """
    text = text.strip()
    if text in ("full", "lora"):
        return text
    head, _, names = text.partition(":")
    modules = [n.strip() for n in names.split(",") if n.strip()]
    if head.strip() != "modules" or not modules:
        raise ValueError(f"expected full, lora or modules:NAME[,NAME...]; found {text!r}")
    return "modules:" + ",".join(modules)


# Settings that do not change what the run computes (where, how fast, how it reports, how long
# this session may go on): a resumed run may change them.
RUN_ONLY = ("device", "progress", "threads", "time_budget_s", "iterations", "num_envs",
            "async_envs", "env_timeout", "overlap", "out")
IDENTITY_FILE = "grpo.json"
CURVE_FILE = "curve.json"
STATE_PREFIX = "state-"
EVALS = "evals"
TEST_PREFIX = "test-"  # evals/test-iter-NNNNNN/: --keep best's measurements on the test episodes
REWARDS = ("success", "return", "success+return")
ADVANTAGES = ("group", "mean", "batch")
NEGATIVES = ("keep", "drop")
AGGREGATES = ("episode", "chunk")
LOSS_NORMS = ("signal", "collected")
RATIOS = ("chunk", "step")
KEEPS = ("last", "best")
GROUP_NOISES = ("episode", "shared")
DEFAULT_MINIBATCH = 64
DEFAULT_RETURN_WEIGHT = 0.1  # also what folders written before --return-weight resume with


@dataclass
class GRPOConfig(ModelSettings, RuntimeSettings, EnvSettings):
    """Every knob of a GRPO run, with its default and why (``cosmos3-gym rl grpo``'s options
    are generated from these fields; docs/rl.md says how to size them)."""

    out: str = setting(
        "runs/grpo", "where the command writes its results; the run folder: curve.json and "
        "curve.png, the held-out evaluations (evals/), the state it resumes from (state-*/), "
        "and at the end the fine-tuned checkpoint/ (and adapter/ for --train lora)", group="rl")
    num_envs: int = setting(
        16, "env slots stepped together; the held-out evaluation's (an iteration's episodes take "
        "groups x group-size slots, shared out over the ranks)", group="env",
        parse=positive_int)
    seed: int = setting(
        0, "the run's root seed; the training episodes, their noise and the minibatch order "
        "derive from it and the iteration", group="rl", parse=seed_value)
    iterations: int = setting(120, "GRPO iterations (collect, then update); a run's length is "
                              "its iterations (docs/rl.md measures them over seeds)", group="rl",
                              parse=positive_int)
    group_size: int = setting(
        8, "episodes per group, from one start state; GRPO compares them with each other (docs/"
        "rl.md: how to size groups)", group="rl", parse=positive_int)
    groups: int = setting(2, "groups collected per iteration (at least one per rank)",
                          group="rl", parse=positive_int)
    replay_groups: int = setting(
        0, "of each iteration's groups, this many rerun (with fresh noise) a start state whose "
        "latest group disagreed, least recently run first, while there are such start states "
        "(the others start fresh; a start state whose group agrees is not rerun again): "
        "episodes go where success is in doubt; must be below --groups; 0: every group from a "
        "fresh start state", group="rl", parse=nonnegative_int)
    group_noise: str = setting(
        "episode", "the noise of a group's episodes: episode (each its own: start noise, which "
        "denoising steps are stochastic, and their Gaussian draws) or shared (the episodes of a "
        "group share the start noise and the stochastic steps, and differ only in the Gaussian "
        "draws the log-probability scores, so their differences in reward come from the noise "
        "the update credits; DanceGRPO shares a group's start noise)", group="rl",
        choices=GROUP_NOISES)
    reward: str = setting(
        "success", "what an episode scores: success (1 or 0, the benchmark's own signal), "
        "return (the sum of the env's rewards) or success+return (success's advantage plus "
        "--return-weight times the return's: success decides where the group's episodes "
        "differ in it, the return breaks the ties)", group="rl", choices=REWARDS)
    return_weight: float = setting(
        DEFAULT_RETURN_WEIGHT,
        "with --reward success+return: the weight of the return's advantage beside success's "
        "(each computed as --advantages says; under mean the return's is in the env's reward "
        "units); the gradient is clipped to norm 1, so only a weight that keeps the return's "
        "gradient below that makes the ties minor (docs/rl.md: on Meta-World 0.1 did not, "
        "0.01 did)", group="rl", parse=positive_number)
    sampler: str = setting(
        "flow_sde", "the sampler: flow_unipc (deterministic given its noise), or flow_sde / "
        "flow_cps (Gaussian action steps whose log-probability every chunk records, for RL); "
        "training episodes take flow_sde or flow_cps, held-out ones flow_unipc",
        group="sampler", choices=("flow_sde", "flow_cps"))
    noise_level: float = setting(
        0.5, "the stochastic steps' noise level (flow_sde, flow_cps); RLinf's default",
        group="sampler")
    sde_steps: str | tuple[int, ...] = setting(
        "random", "which denoising steps are stochastic (flow_sde, flow_cps): random (one per "
        "chunk, from its seed), random-but-last (the same, never the last step, whose Gaussian "
        "is the narrowest), all, or step indices such as 2,3; a chunk's log-probability is "
        "that of its stochastic steps, which each update scores",
        group="sampler", parse=sde_steps_value)
    num_inference_steps: int | None = setting(
        None, "denoising steps per chunk (default: the checkpoint's)", group="sampler",
        flag="denoising-steps", parse=positive_int)
    n_action_steps: int = setting(
        4, "actions executed per chunk before replanning; their log-probability is the chunk's",
        group="rl", parse=positive_int)
    train: str = setting(
        "full", "what trains: full (every weight), lora (LoRA adapters on the generation tower "
        "and the action heads in full; needs peft) or modules:NAME,NAME (named modules in full)",
        group="rl", parse=parse_train, metavar="WHAT")
    lora_rank: int = setting(16, "LoRA's rank (--train lora)", group="rl", parse=positive_int)
    lora_alpha: float | None = setting(
        None, "LoRA's scale numerator alpha (the update is alpha/rank x BA); default: 2 x rank",
        group="rl")
    gradient_checkpointing: bool = setting(
        False, "recompute each GEN layer in the backward instead of keeping its activations (a "
        "fraction of the memory per chunk, about a third more time per update)", group="rl")
    lr: float = setting(1e-4, "the optimiser's learning rate (AdamW); constant after the "
                        "warmup (docs/rl.md: 3e-4 collapsed on ColorReach)", group="rl")
    lr_warmup: int = setting(
        10, "optimiser steps over which the learning rate rises linearly to --lr (Adam's first "
        "steps move every weight by about lr, whatever its gradient)", group="rl",
        parse=nonnegative_int)
    lr_half_life: int | None = setting(
        None, "optimiser steps after the warmup over which the learning rate halves (an "
        "exponential decay: late steps move the policy less); default: constant", group="rl",
        parse=positive_int)
    ema: float | None = setting(
        None, "keep an exponential moving average of the trained weights, moved by (1 - this) "
        "towards them after every iteration (0.9: about the last 10 iterations); the held-out "
        "measurements and the fine-tuned checkpoint are the average, the training episodes "
        "the trained weights; default: off", group="rl", parse=unit_fraction)
    target_kl: float | None = setting(
        None, "end an iteration's update early once a minibatch's approx_kl (the sampling "
        "policy against the updated one) exceeds this: a trust region per iteration; default: "
        "no limit", group="rl", parse=positive_number)
    advantages: str = setting(
        "group", "an episode's advantage: group (its reward minus its group's mean, over the "
        "group's standard deviation), mean (minus the group's mean only) or batch (minus the "
        "group's mean, over the standard deviation of those differences across the iteration)",
        group="rl", choices=ADVANTAGES)
    negatives: str = setting(
        "keep", "what becomes of a negative advantage: keep (GRPO's: the update makes the "
        "episode's chunks less likely) or drop (set to 0: the update only makes the better "
        "episodes of a group likelier, never pushes a sample away; with a success reward the "
        "expected direction is the same, without the failures' noise)", group="rl",
        choices=NEGATIVES)
    aggregate: str = setting(
        "episode", "how the loss weighs chunks: episode (an episode's chunks share one weight, "
        "equal for every episode, as GRPO averages a sequence's tokens: a failure that runs to "
        "the time limit counts as much as a success that ends early) or chunk (every chunk "
        "counts once)", group="rl", choices=AGGREGATES)
    loss_norm: str = setting(
        "signal", "what the loss is a mean over: signal (the chunks that carry an advantage, so "
        "every update has the same scale however little of the iteration carried a signal) or "
        "collected (every unit the iteration collected, episodes under --aggregate episode, "
        "chunks under chunk, a silent group's as zeros: Dr. GRPO's constant normaliser, so an "
        "iteration with little signal takes a smaller step; pair it with a --max-grad-norm "
        "above the usual norm, which every update reaches otherwise)", group="rl",
        choices=LOSS_NORMS)
    max_grad_norm: float = setting(
        1.0, "the norm each update's gradient is clipped to (docs/rl.md: the defaults' "
        "gradients have a median norm of 8 to 10 on ColorReach, so every step is clipped to "
        "the same length)", group="rl", parse=positive_number)
    ratio: str = setting(
        "chunk", "what PPO's probability ratio is taken of: chunk (the chunk's, the product over "
        "its stochastic steps) or step (each stochastic denoising step's own, clipped on its own "
        "and averaged over the chunk's steps, as Flow-GRPO scores each step of the denoising "
        "chain); the same under --sde-steps random (one step per chunk)", group="rl",
        choices=RATIOS)
    clip: float = setting(0.2, "PPO's clip on the probability ratio", group="rl")
    dual_clip: float | None = setting(
        None, "PPO's second clip (dual-clip PPO; verl's clip_ratio_c is 3): a chunk with a "
        "negative advantage whose probability ratio passes this counts as this ratio, with no "
        "gradient, so one chunk the update made far likelier cannot steer it; must be > 1; "
        "default: off (docs/rl.md measured no gain on ColorReach)", group="rl",
        parse=ratio_above_one)
    kl_coef: float = setting(
        0.0, "weight of a KL term to the base policy (the k3 estimate on each chunk; LoRA's "
        "reference is the base with adapters off, full fine-tuning keeps a frozen copy); 0: "
        "none, as SimpleVLA-RL and piRL train", group="rl")
    epochs: int = setting(2, "passes over each iteration's chunks", group="rl",
                          parse=positive_int)
    minibatch: int | None = setting(
        None, f"chunks per update step (default {DEFAULT_MINIBATCH}; not with --minibatches): "
        "the steps an iteration takes grow with its chunks, so with the episodes' length",
        group="rl", parse=positive_int)
    minibatches: int | None = setting(
        None, "update steps per pass instead of --minibatch: each pass splits the iteration's "
        "chunks into this many minibatches of equal size (PPO's number of minibatches), so an "
        "iteration takes the same steps however long its episodes are; default: off",
        group="rl", parse=positive_int)
    microbatch: int | None = setting(
        None, "chunks per forward and backward: a minibatch in several microbatches makes the "
        "same update in less memory (default: the whole minibatch)", group="rl",
        parse=positive_int)
    eval_trials: int = setting(
        50, "held-out episodes per task, with the deterministic sampler (the family's own "
        "evaluation episodes under --eval-seed)", group="rl", parse=positive_int)
    eval_seed: int = setting(1_000_000, "the held-out evaluation's root seed (not --seed)",
                             group="rl", parse=seed_value)
    eval_every: int = setting(15, "iterations between held-out measurements", group="rl",
                              parse=positive_int)
    keep: str = setting(
        "best", "the result: best (the weights of the best held-out measurement, kept in host "
        "memory, then measured with the start on fresh episodes under --test-seed, since the "
        "best of several noisy measurements overstates itself) or last (the weights as "
        "training left them; docs/rl.md measured both over seeds)", group="rl", choices=KEEPS)
    rollback: float | None = setting(
        None, "when a held-out measurement falls more than this below the best so far (a "
        "fraction: 0.1 is 10 points), training goes on from the best measurement's weights "
        "with a fresh optimiser (its warmup again), so a run cannot drift far from its best; "
        "default: off", group="rl", parse=unit_fraction)
    test_seed: int = setting(
        2_000_000, "the root seed of the episodes --keep best measures its result and the start "
        "on (not --seed, not --eval-seed)", group="rl", parse=seed_value)
    save_every: int = setting(
        10, "iterations between saved states (the run resumes from the newest; every "
        "measurement saves one too)", group="rl", parse=positive_int)
    time_budget_s: float = setting(
        0.0, "stop early (after a measurement) once this session has run this many seconds "
        "(how many iterations that is depends on the machine); 0: no limit", group="rl")
    threads: int | None = setting(
        1, "torch intra-op CPU threads; 1 keeps the result independent of how busy a shared "
        "machine is", group="runtime", parse=positive_int)

    def __post_init__(self) -> None:
        """Each setting against its declared rule (``check_settings``) and the rules that tie
        settings together; nothing rewritten (:meth:`resolved`)."""
        check_settings(self)
        self.check_model_source()
        if parse_train(self.train) != self.train:
            raise ValueError(f"train must be written {parse_train(self.train)!r}; found "
                             f"{self.train!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares a group); found "
                             f"{self.group_size}")
        if self.replay_groups >= self.groups:
            raise ValueError(f"replay_groups must be below groups ({self.groups}): each "
                             f"iteration starts one group fresh; found {self.replay_groups}")
        if self.minibatch is not None and self.minibatches is not None:
            raise ValueError(f"give --minibatch (chunks per step) or --minibatches (steps per "
                             f"pass), not both; found {self.minibatch} and {self.minibatches}")
        if self.minibatches is None and self.microbatch is not None and \
                not 1 <= self.microbatch <= self.minibatch_size(0):
            raise ValueError(f"microbatch must be between 1 and minibatch "
                             f"({self.minibatch_size(0)}); found {self.microbatch}")
        if self.precision == "fp8":
            raise ValueError("--precision fp8 is for inference (FP8 weights are copies autograd "
                             "does not reach); train in bf16 (auto on CUDA) or fp32")
        for name in ("lr", "clip", "noise_level"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0; found {getattr(self, name)}")
        if self.kl_coef < 0 or self.time_budget_s < 0:
            raise ValueError(f"kl_coef and time_budget_s must be >= 0; found {self.kl_coef}, "
                             f"{self.time_budget_s}")
        if self.eval_seed == self.seed:
            raise ValueError(f"eval_seed ({self.eval_seed}) must differ from seed: held-out "
                             "episodes would repeat the training episodes' seeds")
        if self.keep == "best" and self.test_seed in (self.seed, self.eval_seed):
            raise ValueError(f"test_seed ({self.test_seed}) must differ from seed ({self.seed}) "
                             f"and eval_seed ({self.eval_seed}): --keep best measures its result "
                             "on episodes neither training nor the selection saw")
        if self.overlap and self.num_envs < 2:  # the runner's rule (cosmos3_gym.runner)
            raise ValueError(f"overlap needs num_envs >= 2; found {self.num_envs}")

    def resolved(self) -> GRPOConfig:
        """These settings with the run's defaults filled in (once, by
        :func:`~cosmos3_gym.eval.run.resolve`): the shipped checkpoint where none is named,
        canonical suite names, the env's image size for a synthetic model."""
        from cosmos3_gym.envs import canonical_suites
        from cosmos3_gym.synthetic import view_size

        return dataclasses.replace(
            self, **self.model_defaults(), suite=canonical_suites(self.suite),
            image_size=view_size(self.env, self.synthetic, self.image_size),
            minibatch=None if self.minibatches is not None else self.minibatch_size(0))

    def minibatch_size(self, chunks: int) -> int:
        """The chunks of the largest minibatch of an iteration that has ``chunks``: --minibatch
        (64 by default), or under --minibatches the largest of that many equal parts."""
        if self.minibatches is None:
            return self.minibatch or DEFAULT_MINIBATCH
        return max(1, -(-chunks // self.minibatches))

    def check_run(self, model: Any, env: Any, rank: Any) -> None:
        """GRPO's own checks of a resolved run: the env's success signal where the reward is
        success, one group per rank at least."""
        if model.head is not None:
            from cosmos3_gym.pipeline.sampling import unscorable

            head = model.head
            cannot = unscorable(head, state_rows=head.history_length > 0,
                                guidance_interval=head.guidance_interval,
                                guidance_scale=head.guidance_scale)
            if cannot:
                raise ValueError(
                    f"{model.label}: GRPO's training episodes sample with {self.sampler}, which "
                    f"cannot score chunks of a head with {' and '.join(cannot)} yet; fine-tune "
                    "a checkpoint whose head samples with the official FlowUniPC, no state rows "
                    "and guidance on every step (docs/rl.md)")
        if self.reward != "return":
            env.check_success()  # no signal to score: refused now, not after the load
        if self.groups < rank.world_size:
            raise ValueError(f"--groups {self.groups}: each of the {rank.world_size} ranks needs "
                             "at least one group per iteration")

    def preflight(self) -> Any:
        """The run resolved (:func:`~cosmos3_gym.eval.run.resolve`): every check that needs no
        model, before torch loads (the starting checkpoint read once, the env family built, its
        success signal, the ranks, the run folder free and no other kind of run's)."""
        from cosmos3_gym.eval.run import resolve

        return resolve(self, self.out, kind="GRPO run")

    def identity(self) -> dict[str, Any]:
        """The settings that decide what the run computes (``grpo.json`` keeps them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in RUN_ONLY}
