"""The three checkpoint formats: cosmos-framework exports by the documented renames, the
``convert`` round trip, ``inspect`` before any weight loads, and every bad download as one
clear error (exit 2 on the command line) before the model is built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.eval.cli import main
from cosmos3_gym.formats import read_checkpoint
from cosmos3_gym.formats.cosmos_framework import diffusers_name, export_name, write_export
from cosmos3_gym.tiny import tiny_action_stats

FIXTURES = Path(__file__).parent / "fixtures" / "lerobot_cosmos3"
IMAGE = np.random.default_rng(0).integers(0, 256, (2, 64, 128, 3), dtype=np.uint8)
TASKS = ["pick up the bowl", "open the drawer"]

# cosmos-framework's own conversion tables (scripts/_convert_model_to_diffusers.py at 5eee9ed:
# _ATTN_KEY_REMAP, _TIME_EMBEDDER_KEY_REMAP and the module assignments of
# convert_model_to_diffusers), as (export name after "model.net.", diffusers name) pairs.
CF_TABLE = [
    ("language_model.model.layers.0.self_attn.q_proj_moe_gen.weight",
     "layers.0.self_attn.add_q_proj.weight"),
    ("language_model.model.layers.0.self_attn.k_proj_moe_gen.weight",
     "layers.0.self_attn.add_k_proj.weight"),
    ("language_model.model.layers.0.self_attn.v_proj_moe_gen.weight",
     "layers.0.self_attn.add_v_proj.weight"),
    ("language_model.model.layers.0.self_attn.o_proj_moe_gen.weight",
     "layers.0.self_attn.to_add_out.weight"),
    ("language_model.model.layers.0.self_attn.q_norm_moe_gen.weight",
     "layers.0.self_attn.norm_added_q.weight"),
    ("language_model.model.layers.0.self_attn.k_norm_moe_gen.weight",
     "layers.0.self_attn.norm_added_k.weight"),
    ("language_model.model.layers.7.self_attn.q_proj.weight", "layers.7.self_attn.to_q.weight"),
    ("language_model.model.layers.7.self_attn.k_proj.weight", "layers.7.self_attn.to_k.weight"),
    ("language_model.model.layers.7.self_attn.v_proj.weight", "layers.7.self_attn.to_v.weight"),
    ("language_model.model.layers.7.self_attn.o_proj.weight", "layers.7.self_attn.to_out.weight"),
    ("language_model.model.layers.7.self_attn.q_norm.weight", "layers.7.self_attn.norm_q.weight"),
    ("language_model.model.layers.7.self_attn.k_norm.weight", "layers.7.self_attn.norm_k.weight"),
    ("language_model.model.layers.1.mlp_moe_gen.gate_proj.weight",
     "layers.1.mlp_moe_gen.gate_proj.weight"),
    ("language_model.model.layers.1.post_attention_layernorm_moe_gen.weight",
     "layers.1.post_attention_layernorm_moe_gen.weight"),
    ("language_model.model.embed_tokens.weight", "embed_tokens.weight"),
    ("language_model.model.norm_moe_gen.weight", "norm_moe_gen.weight"),
    ("language_model.lm_head.weight", "lm_head.weight"),
    ("vae2llm.weight", "proj_in.weight"), ("llm2vae.bias", "proj_out.bias"),
    ("time_embedder.mlp.0.weight", "time_embedder.linear_1.weight"),
    ("time_embedder.mlp.2.bias", "time_embedder.linear_2.bias"),
    ("action2llm.fc.weight", "action_proj_in.fc.weight"),
    ("llm2action.bias.weight", "action_proj_out.bias.weight"),
    ("action_modality_embed", "action_modality_embed"),
    ("sound2llm.weight", "audio_proj_in.weight"), ("sound_modality_embed", "audio_modality_embed"),
]


def test_the_export_map_is_cosmos_frameworks_conversion_table() -> None:
    for export, ours in CF_TABLE:
        assert diffusers_name("model.net." + export) == ours, export
        assert export_name(ours) == "model.net." + export, ours
    assert diffusers_name("model.net.language_model.visual.merger.fc.weight") is None
    assert diffusers_name("model.net.something_new.weight") is None


@pytest.fixture(scope="module")
def tiny() -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained("tiny")


@pytest.fixture(scope="module")
def export(tiny, tmp_path_factory) -> Path:
    return write_export(tmp_path_factory.mktemp("export") / "cf", transformer=tiny.transformer,
                        tokenizer_dir=tiny.checkpoint.tokenizer)


LIBERO = {"action_stats": tiny_action_stats(10), "recipe": "libero"}


def test_an_export_runs_as_the_same_weights_in_a_diffusers_folder(tiny, export) -> None:
    folder = read_checkpoint(export, vae="tiny")
    assert folder.format == "cosmos-framework" and folder.transformer == tiny.transformer.config
    assert folder.ignored == {"vision tower (ViT)": 2}
    ours = Cosmos3ActionPipeline.from_pretrained(export, vae="tiny", **LIBERO)
    ref = Cosmos3ActionPipeline.from_pretrained("tiny", policy=ours.policy)
    np.testing.assert_array_equal(ours(IMAGE, TASKS, progress=False).actions,
                                  ref(IMAGE, TASKS, progress=False).actions)
    # A LIBERO export gets the official LIBERO client's conventions by default.
    from cosmos3_gym import VectorPolicy

    assert VectorPolicy(ours).adapter.name == "libero"


def test_an_export_needs_a_vae_and_statistics_and_never_a_pickle(export, tmp_path) -> None:
    with pytest.raises(ValueError, match="holds no VAE: give --vae PATH"):
        read_checkpoint(export)
    pth = tmp_path / "Wan2.2_VAE.pth"
    pth.write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="pickled VAE .* is not loaded"):
        read_checkpoint(export, vae=pth)
    with pytest.raises(ValueError, match="carries no action statistics.*--action-stats"):
        Cosmos3ActionPipeline.from_pretrained(export, vae="tiny", recipe="libero")
    with pytest.raises(FileNotFoundError, match="no action_policy.json.*--domain"):
        Cosmos3ActionPipeline.from_pretrained(export, vae="tiny")


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / src.name))


def test_a_partial_export_download_is_named(export, tmp_path) -> None:
    root = _copy(export, tmp_path)
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"lists shards missing .*model-00002-of-00002"):
        read_checkpoint(root, vae="tiny")
    root = _copy(export, tmp_path / "cut")
    shard = root / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match="model-00001-of-00002.safetensors is truncated"):
        read_checkpoint(root, vae="tiny")


@pytest.mark.parametrize("source", ["lerobot", "export"])
def test_convert_writes_a_diffusers_folder_with_the_same_actions(source, export, tmp_path) -> None:
    if source == "lerobot":
        src, args, load = FIXTURES / "libero", [], {}
    else:
        stats = tmp_path / "stats.json"
        stats.write_text(json.dumps(tiny_action_stats(10)))
        src, args = export, ["--vae", "tiny", "--recipe", "libero", "--action-stats", str(stats)]
        load = {"vae": "tiny", **LIBERO}
    out = tmp_path / "converted"
    assert main(["convert", str(src), str(out), *args]) == 0
    assert read_checkpoint(out).format == "diffusers"
    before = Cosmos3ActionPipeline.from_pretrained(src, **load)
    after = Cosmos3ActionPipeline.from_pretrained(out)
    image = IMAGE[:, :, :64] if source == "lerobot" else IMAGE
    np.testing.assert_array_equal(after(image, TASKS, seed=[3, 4], progress=False).actions,
                                  before(image, TASKS, seed=[3, 4], progress=False).actions)
    assert after.contract == before.contract  # the observation contract travels too
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(src), str(out), *args])  # never over an existing folder
    assert exit_info.value.code == 2


def test_inspect_describes_a_folder_from_its_headers(capsys) -> None:
    assert main(["inspect", str(FIXTURES / "state"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows["format"] == "lerobot (cosmos3)"
    assert rows["actions"].startswith("8-D, chunk 8") and "gripper inverted" in rows["actions"]
    assert rows["state"].startswith("1 row(s), own statistics (meanstd")
    assert "diffusers UniPCMultistepScheduler" in rows["sampler"]
    assert rows["observations"].startswith("lerobot: observation.images.wrist")


# ------------------------------------------------------------------------------ bad input


def _edit_config(root: Path, **changes) -> None:
    config = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (root / "config.json").write_text(json.dumps(config))


def _refused(args: list[str], capsys, match: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], err
    assert __import__("re").search(match, lines[0]), lines[0]


def test_every_bad_lerobot_folder_is_one_error_line(tmp_path, capsys) -> None:
    def folder(name: str) -> Path:
        return Path(shutil.copytree(FIXTURES / "libero", tmp_path / name))

    root = folder("type")
    _edit_config(root, type="pi0")
    _refused([str(root)], capsys, r"policy type 'pi0' is not a Cosmos3 policy")
    root = folder("key")
    _edit_config(root, new_sampler_knob=1)
    _refused([str(root)], capsys, r"keys unknown .* \['new_sampler_knob'\]")
    root = folder("transformer_key")
    config = json.loads((root / "config.json").read_text())
    _edit_config(root, transformer_config={**config["transformer_config"], "mystery": 2})
    _refused([str(root)], capsys, r"keys unknown to cosmos3-gym's Cosmos3 generator: \['mystery'")
    root = folder("weights")
    (root / "model.safetensors").unlink()
    (root / "pytorch_model.bin").write_bytes(b"pickle")
    _refused([str(root)], capsys, r"only pickled weights \['pytorch_model.bin'\]")
    root = folder("cut")
    weights = root / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    _refused([str(root)], capsys, "model.safetensors is (truncated|not a complete safetensors)")
    root = folder("stats")
    (root / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    _refused([str(root)], capsys, "names the state file .* which the folder lacks")
    root = folder("no_stats")
    (root / "policy_postprocessor.json").unlink()
    (root / "policy_preprocessor.json").unlink()
    _refused([str(root)], capsys, "holds no 'action' statistics .* --action-stats")
    root = folder("tokenizer")
    shutil.rmtree(root / "tokenizer")
    _refused([str(root)], capsys, "tokenizer .* does not resolve")
    root = folder("history")
    _edit_config(root, history_length=2)
    _refused([str(root)], capsys, "history_length 2 with use_state False")


def test_weights_that_do_not_fit_the_config_are_named(tmp_path) -> None:
    root = Path(shutil.copytree(FIXTURES / "libero", tmp_path / "wide"))
    config = json.loads((root / "config.json").read_text())
    _edit_config(root, transformer_config={**config["transformer_config"],
                                           "intermediate_size": 96})
    with pytest.raises(ValueError, match=r"wrong shape .*mlp.*\(128, 64\) vs model \(96, 64\)"):
        Cosmos3ActionPipeline.from_pretrained(root)
    root = Path(shutil.copytree(FIXTURES / "libero", tmp_path / "stray"))
    from safetensors.torch import load_file, save_file

    state = load_file(str(root / "model.safetensors"))
    state["model.vision_tower.extra"] = state["model.transformer.norm.weight"].clone()
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(ValueError, match=r"1 tensors cosmos3-gym does not know: "
                                         r"\['model.vision_tower.extra'\]"):
        read_checkpoint(root)


def test_a_link_out_of_the_folder_is_refused(tmp_path) -> None:
    root = Path(shutil.copytree("cosmos3_gym/checkpoints/tiny", tmp_path / "linked"))
    outside = tmp_path / "elsewhere.json"
    shutil.move(root / "transformer" / "config.json", outside)
    (root / "transformer" / "config.json").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        read_checkpoint(root)


def test_a_damaged_tokenizer_file_is_named(tmp_path) -> None:
    root = Path(shutil.copytree("cosmos3_gym/checkpoints/tiny", tmp_path / "tok"))
    path = root / "text_tokenizer" / "tokenizer.json"
    path.write_text(path.read_text()[:500])
    with pytest.raises(ValueError, match=r"text_tokenizer/tokenizer.json: not valid JSON"):
        Cosmos3ActionPipeline.from_pretrained(root)


def test_policy_config_keeps_lerobots_fields_through_a_save(tmp_path) -> None:
    policy = read_checkpoint(FIXTURES / "state").policy
    saved = PolicyConfig.from_json_file(policy.save(tmp_path / "p.json"))
    assert saved == policy


def test_the_vae_keys_read_from_diffusers_source_are_its_constructor_s() -> None:
    """A LeRobot folder's VAE config is checked against AutoencoderKLWan's keywords, read from
    diffusers' source (no torch before the model loads): the same set the class takes."""
    import inspect

    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    from cosmos3_gym.formats.lerobot import vae_constructor_keys

    taken = set(inspect.signature(AutoencoderKLWan.__init__).parameters) - {"self"}
    assert vae_constructor_keys() == taken and "z_dim" in taken
