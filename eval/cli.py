"""The ``cosmos3-gym`` console script: ``eval``, ``rollout``, ``bench``, ``train`` (argparse only).

Examples:

    cosmos3-gym eval --trials 10 --out runs/color_reach            # built-in env, tiny checkpoint
    cosmos3-gym eval --checkpoint PATH --env libero --suite libero_10 --tasks 0,3 \\
        --trials 50 --num-envs 8 --async-envs --seed 7 --out runs/libero_10
    torchrun --nproc_per_node 2 -m cosmos3_gym.eval.cli eval ... --out DIR   # rank 0 merges
    cosmos3-gym rollout --steps 256 --num-envs 4 --out runs/rollouts
    cosmos3-gym bench --checkpoint PATH --out bench.json          # add --device cuda on a GPU
    cosmos3-gym report runs/color_reach                            # table + results.png again
    cosmos3-gym report runs/right runs/shuffled --out compare.png  # two runs in one plot
"""

from __future__ import annotations

import argparse
import sys

from cosmos3_gym.envs import STEP_BUDGETS
from cosmos3_gym.eval.tasks import ENV_NAMES


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list; found {text!r}")
    return items


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default="tiny",
                   help="checkpoint folder or shipped name (default: tiny)")
    p.add_argument("--env", default="color_reach", choices=ENV_NAMES,
                   help="env family (default: the built-in color_reach)")
    p.add_argument("--suite", default=None, help="LIBERO suite, e.g. libero_10 (--env libero)")
    p.add_argument("--tasks", type=_csv, default=None,
                   help="comma-separated tasks: colours for color_reach, task ids for LIBERO "
                        "(default: all)")
    p.add_argument("--num-envs", type=int, default=4, help="parallel env slots (default: 4)")
    p.add_argument("--async-envs", action="store_true",
                   help="run sub-envs in worker processes (crash/hang recovery)")
    p.add_argument("--seed", type=int, default=0, help="global seed (default: 0)")
    p.add_argument("--image-size", type=int, default=None, help="env image size")
    p.add_argument("--max-episode-steps", type=int, default=None, help="episode step limit")
    p.add_argument("--step-budget", choices=STEP_BUDGETS, default=None,
                   help="LIBERO episode budget: cosmos3 (default; the official Cosmos3 client's, "
                        "settle steps counted inside: 510 on libero_10) or openpi (settle steps "
                        "on top: 520)")
    p.add_argument("--num-inference-steps", type=int, default=None,
                   help="denoising steps (default: the checkpoint's)")
    p.add_argument("--n-action-steps", type=int, default=None,
                   help="actions executed per chunk before replanning (default: whole chunk)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The ``cosmos3-gym`` argument parser."""
    parser = argparse.ArgumentParser(prog="cosmos3-gym", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="success-rate evaluation (resumable; torchrun-shardable)")
    _common(ev)
    ev.add_argument("--trials", type=int, default=10, help="episodes per task (default: 10)")
    ev.add_argument("--out-of-range", choices=("report", "fail"), default="report",
                    help="actions outside the action space: count them and let the env apply "
                         "its own handling (report), or fail the episode (fail)")
    ev.add_argument("--env-timeout", type=float, default=300.0,
                    help="seconds before an async env step/reset counts as hung (default: 300)")
    ev.add_argument("--videos", nargs="?", const="env", default=None, choices=("env", "imagined"),
                    help="write a video per episode to OUT/videos: the env's frames as a GIF, "
                         "or with 'imagined' the model's input, its predicted future and the "
                         "env's frames side by side (MP4 with imageio-ffmpeg, else GIF; decodes "
                         "the future, so it costs time)")
    ev.add_argument("--video-trials", type=int, default=None, metavar="N",
                    help="videos for the first N trials of each task only (default: every trial)")
    ev.add_argument("--shuffle-prompts", action="store_true",
                    help="diagnostic: give each episode another task's prompt; a policy that "
                         "reads its prompt should then drop to chance")

    ro = sub.add_parser("rollout", help="collect policy rollouts as .npz shards")
    _common(ro)
    ro.add_argument("--steps", type=int, required=True, help="vector env steps to collect")
    ro.add_argument("--shard-steps", type=int, default=256, help="steps per .npz shard")
    ro.add_argument("--deterministic", action="store_true",
                    help="same noise for every chunk (default: fresh noise per chunk)")

    # Listed for `cosmos3-gym -h`; `main` hands `train ...` to the trainer's own parser before
    # this one runs (argparse's REMAINDER would refuse a first argument like `--out`).
    sub.add_parser("train", add_help=False,
                   help="train the tiny checkpoint on ColorReach demos (see train --help)")

    from cosmos3_gym.eval import report

    report.add_arguments(sub.add_parser(
        "report", help="print a run's results table and redraw its plot (finished or partial "
                       "runs; two or more runs side by side)"
    ))

    from cosmos3_gym.bench import latency, synthetic

    bench = sub.add_parser(
        "bench", help="latency/throughput of the action stack: batched vs serial, cache on/off; "
                      "--synthetic PRESET: a published model shape without weights"
    )
    latency.add_arguments(bench)
    synthetic.add_arguments(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cosmos3-gym`` console script.

    Bad input (a missing checkpoint, a mismatched resume folder, an unknown task...) ends with
    one ``error:`` line and exit status 2, like argparse's own errors; other exceptions keep their
    traceback, since they are bugs to report.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else None
    try:
        if command == "train":
            from cosmos3_gym.train import main as train_main

            return train_main(argv[1:])
        return _run(parser.parse_args(argv))
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"cosmos3-gym {command}: error: {err}\n")


def _run(args: argparse.Namespace) -> int:
    if args.command == "eval":
        from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
        from cosmos3_gym.eval.results import format_table

        config = EvalConfig(
            checkpoint=args.checkpoint, env=args.env, suite=args.suite, tasks=args.tasks,
            trials=args.trials, seed=args.seed, num_envs=args.num_envs,
            async_envs=args.async_envs, image_size=args.image_size,
            max_episode_steps=args.max_episode_steps, step_budget=args.step_budget,
            num_inference_steps=args.num_inference_steps, n_action_steps=args.n_action_steps,
            out_of_range=args.out_of_range, env_timeout=args.env_timeout, videos=args.videos,
            video_trials=args.video_trials,
            shuffle_prompts=args.shuffle_prompts, progress=not args.no_progress,
        )
        results = evaluate(config, args.out)
        if results is not None:
            print(format_table(results))
        return 0
    if args.command == "report":
        from cosmos3_gym.eval import report

        return report.run(args)
    if args.command == "bench":
        from cosmos3_gym.bench import latency, synthetic

        (synthetic if args.synthetic else latency).run(args)
        return 0
    from cosmos3_gym.eval.rollout import run_rollout_command

    run_rollout_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
