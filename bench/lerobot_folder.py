"""A LeRobot-format Cosmos3 folder of a published shape, with random weights, end to end.

``python -m cosmos3_gym.bench.lerobot_folder --preset nano --layers 4 --device cuda --out F``
writes the folder with this project's writer (``cosmos3_gym.formats.lerobot.write_folder``:
the published generator's widths, heads and vocabulary with ``--layers`` of its layers, the
Wan2.2 VAE at its real widths, the LeRobot LIBERO cards' contract: two 256 x 256 views, 10-D
actions, chunk 16, 20 FPS, LeRobot's default sampler of 4 steps at guidance 3), reads it back
as a user would (``from_pretrained`` on the device), and times each part: the write, the
header read, the load, and the policy call at B=1 and 8 (median of ``--repeats``). Where the
device has the memory it also loads the folder in fp32 and reports the bf16 actions' distance
from fp32's on the same inputs. For the device session (``scripts/gpu_session.sh formats``);
``--preset tiny --device cpu`` runs it anywhere.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import write_text_atomic


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run(preset: str, layers: int | None, device: str, folder: Path, repeats: int = 3
        ) -> dict[str, Any]:
    import numpy as np
    import torch

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.checkpoint import PolicyConfig
    from cosmos3_gym.devices import resolve_device
    from cosmos3_gym.formats import ObservationContract, read_checkpoint
    from cosmos3_gym.formats.lerobot import write_folder
    from cosmos3_gym.model.presets import preset_config, random_transformer, random_vae, vae_preset
    from cosmos3_gym.pipeline.prompt import load_tokenizer
    from cosmos3_gym.tiny import tiny_action_stats

    dev = resolve_device(device)
    config = preset_config(preset)
    if layers is not None:
        config = type(config).from_dict({**config.to_dict(), "num_hidden_layers": layers})
    tokenizer_dir = Path(__file__).resolve().parent.parent / "cosmos3_gym" / "checkpoints" / \
        "tiny" / "text_tokenizer"
    tokenizer = load_tokenizer(tokenizer_dir)
    policy = PolicyConfig(
        domain_name="libero", raw_action_dim=10, action_horizon=16, normalization="quantile",
        stats=tiny_action_stats(10), fps=20.0, resolution_tier=256, view_point="concat_view",
        num_inference_steps=4, guidance_scale=3.0, flow_shift=5.0, history_length=0,
        caption_format="lerobot", eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        resize="float", canvas_bins="diffusers",
        scheduler_config={"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                          "flow_shift": 5.0},
    )
    contract = ObservationContract(
        convention="lerobot", image_keys=("observation.images.image", "observation.images.image2"),
        num_views=2, primary_height=128, canvas_hw=(256, 256), domain="libero", n_action_steps=16)
    result: dict[str, Any] = {"preset": preset, "layers": config.num_hidden_layers,
                              "device": str(dev)}
    shutil.rmtree(folder, ignore_errors=True)
    t = time.perf_counter()
    transformer = random_transformer(config, device=dev, dtype=torch.bfloat16, seed=0)
    vae = random_vae(vae_preset(preset), device=dev, seed=1)
    write_folder(folder, transformer=transformer, vae=vae, tokenizer_dir=tokenizer_dir,
                 policy=policy, contract=contract, dtype="bfloat16")
    del transformer, vae
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    result["write_s"] = time.perf_counter() - t
    result["folder_gb"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
    t = time.perf_counter()
    read_checkpoint(folder)
    result["read_headers_s"] = time.perf_counter() - t
    t = time.perf_counter()
    pipe = Cosmos3ActionPipeline.from_pretrained(folder, device=dev)
    _sync(dev)
    result["load_s"] = time.perf_counter() - t
    result["dtype"] = str(pipe.transformer.dtype).removeprefix("torch.")
    result["sampler"] = pipe.describe_sampler()
    rng = np.random.default_rng(0)
    tasks = ["put both the alphabet soup and the tomato sauce in the basket",
             "turn on the stove and put the moka pot on it"]
    calls = {}
    for batch in (1, 8):
        views = {k: rng.integers(0, 256, (batch, 256, 256, 3), dtype=np.uint8)
                 for k in contract.image_keys}
        from cosmos3_gym import VectorPolicy

        canvas = VectorPolicy(pipe).adapter.images(views)
        prompts = [tasks[i % 2] for i in range(batch)]
        seeds = list(range(batch))
        times = []
        for _ in range(repeats + 1):
            _sync(dev)
            t = time.perf_counter()
            out = pipe(canvas, prompts, seed=seeds, progress=False)
            _sync(dev)
            times.append(time.perf_counter() - t)
        calls[f"B{batch}"] = {"median_s": statistics.median(times[1:]),
                              "first_s": times[0],
                              "finite": bool(np.isfinite(out.actions).all()),
                              "shape": list(out.actions.shape)}
        if batch == 8:
            bf16_actions, inputs = out.actions, (canvas, prompts, seeds)
    result["calls"] = calls
    if dev.type == "cuda":
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated(dev) / 1e9
    del pipe
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    fp32 = Cosmos3ActionPipeline.from_pretrained(folder, device=dev, dtype=torch.float32)
    ref = fp32(inputs[0], inputs[1], seed=inputs[2], progress=False).actions
    result["bf16_vs_fp32_max_abs"] = float(np.abs(bf16_actions - ref).max())
    result["fp32_action_absmax"] = float(np.abs(ref).max())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the published generator to keep (default: all)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--folder", default="/tmp/cosmos3-gym-lerobot-folder",
                        help="where the folder is written (deleted first)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True, help="the JSON result")
    args = parser.parse_args(argv)
    result = run(args.preset, args.layers, args.device, Path(args.folder), args.repeats)
    write_text_atomic(args.out, json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
