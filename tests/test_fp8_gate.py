"""bench/fp8_gate.py, the FP8 accuracy gates, at CI size (the tiny checkpoint on the CPU, torch
emulating the FP8 products): the command that produced the README's closed-loop numbers keeps
working."""

from __future__ import annotations

import json

import pytest

from cosmos3_gym.bench import fp8_gate


def test_mcnemar_p_is_one_for_balanced_pairs_and_small_for_one_sided_ones() -> None:
    assert fp8_gate.mcnemar_p(5, 5) == 1.0
    assert fp8_gate.mcnemar_p(0, 10) == pytest.approx(2 / 1024)  # all discordant pairs one way


@pytest.mark.slow
def test_the_gates_run_at_cpu_size_and_pair_their_episodes(tmp_path, capsys) -> None:
    out = tmp_path / "gates.json"
    result = fp8_gate.main(["--batch", "2", "--denoising-steps", "4", "--trials", "1",
                            "--num-envs", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    sqnr = result["sqnr"]["per_layer_db"]
    assert set(sqnr) == set(fp8_gate.GEMMS) and all(len(v) == 2 for v in sqnr.values())
    assert all(20 < db < 60 for v in sqnr.values() for db in v)  # e4m3: ~3 bits of mantissa
    actions = result["actions"]
    assert actions["vs_fp32"]["bf16"]["mean"] > 0 and actions["vs_fp32"]["fp8"]["mean"] > 0
    assert actions["disabled"] == {} and actions["passed"] == (actions["mean_ratio"] <= 2)
    loop = result["closed_loop"]
    assert loop["episodes"] == 4 and set(loop["arms"]) == {"fp32", "bf16", "fp8"}
    for arm in loop["arms"].values():
        assert arm["episodes"] == 4 and arm["disabled"] == {}
        assert arm["wilson95"][0] <= arm["rate"] <= arm["wilson95"][1]
    for other in ("bf16", "fp32"):
        m = loop[f"fp8_vs_{other}"]
        assert m["mcnemar_p"] == fp8_gate.mcnemar_p(m[f"only_{other}"], m["only_fp8"])
    printed = capsys.readouterr().out
    assert "closed loop, 4 paired ColorReach episodes" in printed and "McNemar" in printed
