"""The ``cosmos3-gym`` console script: ``eval``, ``rollout``, ``bench``, ``train``, ``report``
(argparse only).

Examples:

    cosmos3-gym eval --trials 10 --out runs/color_reach            # built-in env, tiny checkpoint
    cosmos3-gym eval --checkpoint PATH --env libero --suite libero_10 --tasks 0,3 \\
        --trials 50 --num-envs 8 --async-envs --seed 7 --out runs/libero_10
    cosmos3-gym eval --checkpoint PATH --env libero --suite libero_4 --protocol official \\
        --num-envs 8 --async-envs --out runs/libero_4     # NVIDIA's LIBERO table (docs/libero.md)
    torchrun --nproc_per_node 2 -m cosmos3_gym.eval.cli eval ... --out DIR   # rank 0 merges
    cosmos3-gym rollout --steps 256 --num-envs 4 --out runs/rollouts
    cosmos3-gym bench --checkpoint PATH --out bench.json          # on the GPU where there is one
    cosmos3-gym eval --synthetic nano --trials 8 --num-envs 8 --out runs/size_it  # no weights
    cosmos3-gym bench --checkpoint /models/Cosmos3-Nano --domain droid_lerobot --device cuda \\
        --out bench.json                     # a diffusers folder: name its embodiment
    cosmos3-gym report runs/color_reach                            # table + results.png again
    cosmos3-gym report runs/right runs/shuffled --out compare.png  # two runs in one plot
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosmos3_gym.checkpoint import DOMAINS
from cosmos3_gym.envs import ENV_NAMES, STEP_BUDGETS
from cosmos3_gym.envs.families import GYM_PREFIX
from cosmos3_gym.eval.protocol import PROTOCOLS
from cosmos3_gym.eval.synthetic import PRESETS as SYNTHETIC_PRESETS
from cosmos3_gym.policy.adapters import ACTION_MAPS

# cosmos3_gym.devices.DTYPE_CHOICES, without importing torch to build the parser.
DTYPE_CHOICES = ("auto", "bfloat16", "float32")
PRECISION_CHOICES = ("bf16", "fp8")


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list; found {text!r}")
    return items


def _env_name(text: str) -> str:
    if text in ENV_NAMES or (text.startswith(GYM_PREFIX) and text[len(GYM_PREFIX):].strip()):
        return text
    raise argparse.ArgumentTypeError(
        f"expected one of {', '.join(ENV_NAMES)} or gym:ID (a registered Gymnasium id, e.g. "
        f"gym:gym_pusht/PushT-v0); found {text!r}"
    )


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object; found {text!r} ({err})") \
            from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}; found {text!r}")
    return value


def _prompt(text: str) -> str | dict[str, str]:
    """One instruction, or a JSON object {task name: instruction} for several tasks."""
    if text.lstrip().startswith("{"):
        tasks = _json_object(text)
        bad = {k: v for k, v in tasks.items() if not isinstance(v, str) or not v.strip()}
        if not tasks or bad:
            raise argparse.ArgumentTypeError(
                f"expected {{task name: non-empty instruction}}; found {text!r}")
        return tasks
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty instruction")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; found {value}")
    return value


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    """``--checkpoint``, and how to use one whose folder has no ``action_policy.json``."""
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint folder or shipped name (default: tiny)")
    p.add_argument("--domain", default=None, choices=sorted(DOMAINS), metavar="NAME",
                   help="embodiment of a checkpoint without action_policy.json (a diffusers "
                        "folder such as nvidia/Cosmos3-*): libero (the official LIBERO recipe), "
                        f"or one of {', '.join(n for n in sorted(DOMAINS) if n != 'libero')}")
    p.add_argument("--action-stats", default=None, metavar="FILE",
                   help="action statistics JSON (cosmos-framework's global / global_raw blocks); "
                        "without statistics the actions stay in the model's normalised space")


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--precision``: where the model runs and in which
    precision."""
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help="auto (default: the GPU where there is one, cuda:LOCAL_RANK under "
                        "torchrun, else the CPU), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="model precision: auto (default: bfloat16 on CUDA, float32 on the CPU), "
                        "bfloat16 or float32")
    p.add_argument("--precision", default="bf16", choices=PRECISION_CHOICES,
                   help="bf16 (default): every GEMM in --dtype; fp8: the generation tower's "
                        "Q/K/V, attention-output, gate/up and down GEMMs in FP8 e4m3 (per-channel "
                        "weights, per-token activations; the first and last 3 denoising steps "
                        "stay in --dtype), compute capability >= 8.9 on CUDA (else switched off "
                        "with a warning), emulated on the CPU. Not the same actions: see the "
                        "accuracy gates in docs/benchmarks.md")


def _sde_steps(text: str) -> str | tuple[int, ...]:
    if text in ("random", "all"):
        return text
    try:
        return tuple(int(t) for t in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'random', 'all' or comma-separated step indices; found {text!r}"
        ) from None


def add_sampler_arguments(p: argparse.ArgumentParser) -> None:
    """``--sampler``, ``--noise-level``, ``--sde-steps``: stochastic action steps for RL."""
    p.add_argument("--sampler", default="flow_unipc", choices=("flow_unipc", "flow_sde",
                                                                "flow_cps"),
                   help="flow_unipc: the deterministic sampler (default); flow_sde / flow_cps: "
                        "Gaussian action steps whose log-probability every chunk records")
    p.add_argument("--noise-level", type=float, default=0.5,
                   help="noise level of the stochastic steps (default: 0.5)")
    p.add_argument("--sde-steps", type=_sde_steps, default="random",
                   help="which denoising steps are stochastic: random (one per chunk, default), "
                        "all, or indices such as 2,3")


def _common(p: argparse.ArgumentParser) -> None:
    add_checkpoint_arguments(p)
    add_device_arguments(p)
    p.add_argument("--synthetic", default=None, choices=SYNTHETIC_PRESETS, metavar="PRESET",
                   help="instead of a checkpoint, a published model shape with random weights "
                        "(nano, super, edge; tiny on a CPU): the real loop and its timings "
                        "before you have weights; success rates are meaningless")
    p.add_argument("--env", default="color_reach", type=_env_name, metavar="ENV",
                   help=f"env family: {', '.join(ENV_NAMES)} (default: the built-in "
                        "color_reach), or gym:ID for any registered Gymnasium env "
                        "(docs/your_own_env.md)")
    p.add_argument("--import", dest="import_modules", action="append", default=None,
                   metavar="MODULE",
                   help="gym:ID: import MODULE first, which registers the id (gym_pusht, "
                        "gym_aloha, ...); repeat for several")
    p.add_argument("--env-kwargs", type=_json_object, default=None, metavar="JSON",
                   help="gym:ID: keyword arguments for every env, e.g. '{\"obs_type\": "
                        "\"pixels_agent_pos\"}'")
    p.add_argument("--prompt", type=_prompt, default=None, metavar="TEXT",
                   help="gym:ID: the instruction the policy is given, or a JSON object "
                        "{task name: instruction} for several tasks (default: the env's own "
                        "task_description)")
    p.add_argument("--success-key", default=None, metavar="KEY",
                   help="gym:ID: the step-info key that holds success (default: is_success, "
                        "else success, else the episode's termination)")
    p.add_argument("--action-map", default=None, choices=ACTION_MAPS,
                   help="box: map the policy's actions affinely from [-1, 1] onto the env's "
                        "Box bounds, per dimension (default: none, actions as the adapter "
                        "makes them)")
    p.add_argument("--suite", default=None,
                   help="LIBERO suite, e.g. libero_10, or several comma-separated, or libero_4 "
                        "(spatial, object, goal, 10: the published four); --env libero")
    p.add_argument("--tasks", type=_csv, default=None,
                   help="comma-separated tasks: colours for color_reach, task ids for LIBERO, "
                        "task names for metaworld (reach-v3,push-v3) "
                        "(default: all)")
    p.add_argument("--num-envs", type=_positive_int, default=4,
                   help="parallel env slots (default: 4)")
    p.add_argument("--async-envs", action="store_true",
                   help="run sub-envs in worker processes (crash/hang recovery)")
    p.add_argument("--seed", type=int, default=0, help="global seed (default: 0)")
    p.add_argument("--image-size", type=_positive_int, default=None, help="env image size")
    p.add_argument("--max-episode-steps", type=_positive_int, default=None,
                   help="episode step limit")
    p.add_argument("--step-budget", choices=STEP_BUDGETS, default=None,
                   help="LIBERO episode budget: cosmos3 (default; the official Cosmos3 client's, "
                        "settle steps counted inside: 510 on libero_10) or openpi (settle steps "
                        "on top: 520)")
    p.add_argument("--num-inference-steps", type=_positive_int, default=None,
                   help="denoising steps (default: the checkpoint's)")
    p.add_argument("--n-action-steps", type=_positive_int, default=None,
                   help="actions executed per chunk before replanning (default: whole chunk)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The ``cosmos3-gym`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="cosmos3-gym",
        description="Cosmos3 action policies in Gymnasium envs, in one process:\n"
                    "success-rate evaluation, RL rollouts, benchmarks and training.",
        epilog=__doc__[__doc__.index("Examples:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="success-rate evaluation (resumable; torchrun-shardable)")
    _common(ev)
    ev.add_argument("--trials", type=_positive_int, default=None,
                    help="episodes per task (default: 10; 50 under --protocol official)")
    ev.add_argument("--protocol", choices=PROTOCOLS, default="default",
                    help="default: fresh noise per chunk, --trials as given; official: the rules "
                         "behind NVIDIA's published LIBERO numbers (50 trials per task, init "
                         "state t, the client's budget, whole chunks, every chunk from seed 0, "
                         "the checkpoint's sampler), recorded in results.json (docs/libero.md)")
    ev.add_argument("--allow-normalized-actions", action="store_true",
                    help="run a checkpoint without action statistics in an env with real units "
                         "(LIBERO); its actions then stay in the model's normalised space")
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
    ro.add_argument("--steps", type=_positive_int, required=True,
                    help="vector env steps to collect")
    ro.add_argument("--shard-steps", type=_positive_int, default=256, help="steps per .npz shard")
    ro.add_argument("--deterministic", action="store_true",
                    help="same noise for every chunk (default: fresh noise per chunk)")
    ro.add_argument("--format", choices=("npz", "lerobot"), default="npz",
                    help="npz shards (default), or lerobot: the shards and, in OUT/lerobot, "
                         "their finished episodes as a LeRobot dataset (needs LeRobot)")
    add_sampler_arguments(ro)

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

    Bad input (a missing or broken checkpoint, a mismatched or busy or unwritable run folder,
    an unknown task...) ends with one ``error:`` line and exit status 2, like argparse's own
    errors, before anything runs; a failure during a run that is not a bug (a full disk, envs
    that keep faulting) ends with one ``error:`` line and exit status 1, the folder resumable;
    Ctrl-C ends with one line saying what was saved and how to go on, exit status 130; other
    exceptions keep their traceback, since they are bugs to report.
    """
    from cosmos3_gym.runner import FolderInUse, TooManyFaults

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else None
    try:
        if command == "train":
            from cosmos3_gym.train import main as train_main

            return train_main(argv[1:])
        return _run(parser.parse_args(argv))
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError,
            FolderInUse) as err:
        parser.exit(2, f"cosmos3-gym {command}: error: {err}\n")
    except (OSError, TooManyFaults) as err:
        parser.exit(1, f"cosmos3-gym {command}: error: {_failure(err)}; the run's folder keeps "
                       "what was saved: fix the cause and rerun the same command to go on\n")
    except KeyboardInterrupt:
        parser.exit(130, f"cosmos3-gym {command}: interrupted; {_interrupted(command, argv)}\n")


def _failure(err: BaseException) -> str:
    """An error during a run in one line: an ``OSError`` with its file and what the system
    said (``[Errno 28] No space left on device: 'runs/x/shard-00003.npz'``)."""
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where} ({type(err).__name__}, errno {err.errno})"
    return str(err)


def _interrupted(command: str | None, argv: list[str]) -> str:
    """What an interrupted command leaves behind and how to go on, in one line."""
    if command == "train":
        from cosmos3_gym.train.trainer import parse_args

        out = parse_args(argv[1:]).out
        return (f"the checkpoint in {out} is incomplete (training does not resume); rerun the "
                "same command to train from the start")
    if command == "report":
        return "it only reads runs; rerun the same command"
    out = build_parser().parse_known_args(argv)[0].out
    if command == "eval":
        from cosmos3_gym.eval.results import read_episode_records

        folder = Path(out)
        finished = len(read_episode_records(folder)) if folder.is_dir() else 0
        return (f"{out} holds {finished} finished episode{'' if finished == 1 else 's'}; rerun "
                "the same command to resume (finished episodes are not run again)")
    if command == "rollout":
        return (f"the shards saved in {out} are kept; rerun the same command to collect the "
                "remaining steps")
    return f"nothing written ({out} is written at the end)"


def _check_out_folder(out: str) -> None:
    """``--out`` must be a folder or a new path (no part of it an existing file)."""
    path = Path(out)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise ValueError(
                f"--out {out}: {part} is a file; expected a folder (a new one, or one this "
                "command wrote)"
            )


def _check_model_arguments(args: argparse.Namespace) -> None:
    """The model source and the device, checked before anything loads: ``--synthetic`` builds
    a random model, so a checkpoint's options do not go with it; a device that is not there is
    an error now, not a traceback later."""
    if args.synthetic is not None:
        given = [f"--{name.replace('_', '-')}" for name in ("checkpoint", "domain", "action_stats")
                 if getattr(args, name) is not None]
        if given:
            raise ValueError(f"--synthetic {args.synthetic} builds a model with random weights; "
                             f"{', '.join(given)} would not be used. Give one or the other")
    args.checkpoint = args.checkpoint or "tiny"
    from cosmos3_gym.devices import resolve_device, resolve_dtype

    resolve_dtype(args.dtype, resolve_device(args.device))


def _run(args: argparse.Namespace) -> int:
    if args.command in ("eval", "rollout"):
        _check_out_folder(args.out)
    if args.command in ("eval", "rollout", "bench"):
        _check_model_arguments(args)
    if args.command == "eval":
        from cosmos3_gym.eval.evaluate import EvalConfig, Evaluator
        from cosmos3_gym.eval.results import format_table

        config = EvalConfig(
            checkpoint=args.checkpoint, domain=args.domain, action_stats=args.action_stats,
            env=args.env, suite=args.suite, tasks=args.tasks,
            trials=args.trials, seed=args.seed, num_envs=args.num_envs,
            async_envs=args.async_envs, image_size=args.image_size,
            max_episode_steps=args.max_episode_steps, step_budget=args.step_budget,
            num_inference_steps=args.num_inference_steps, n_action_steps=args.n_action_steps,
            out_of_range=args.out_of_range, env_timeout=args.env_timeout, videos=args.videos,
            video_trials=args.video_trials,
            shuffle_prompts=args.shuffle_prompts, progress=not args.no_progress,
            device=args.device, dtype=args.dtype, synthetic=args.synthetic,
            protocol=args.protocol, allow_normalized_actions=args.allow_normalized_actions,
            precision=None if args.precision == "bf16" else args.precision,
            prompt=args.prompt, import_modules=args.import_modules, env_kwargs=args.env_kwargs,
            success_key=args.success_key, action_map=args.action_map,
        )
        evaluator = Evaluator(config, args.out)
        results = evaluator.run()
        if results is not None:
            if evaluator.already_complete:
                print(f"{args.out} is complete: its {results['episodes']} episodes were recorded "
                      "before, nothing to run. Its results:")
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
