"""Presets: names, ladders monotone in N and FLOPs, K2/K3 pairing, overrides and errors."""

from __future__ import annotations

import math

import pytest

from k3scale.errors import K3ScaleError
from k3scale.models import accounting
from k3scale.models.config import K2Config, K3Config
from k3scale.models.presets import LADDER_VOCAB, get_preset, head_dim, ladder, preset_names


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_ladder_is_monotone_in_params_and_flops(family):
    configs = [get_preset(name) for name in ladder(family)]
    assert len(configs) >= 8
    for metric in (
        accounting.num_params_total,
        accounting.num_params_active,
        accounting.flops_per_token_6n,
        lambda c: accounting.flops_per_token(c, 4096),
        lambda c: accounting.flops_per_token(c, 256),
    ):
        values = [metric(c) for c in configs]
        assert values == sorted(values) and len(set(values)) == len(values)


def test_ladder_spans_cpu_to_gpu_sizes():
    active = [accounting.num_params_active(get_preset(n)) for n in ladder("k2")]
    assert active[0] < 100_000  # tens of thousands (the 8192 x d head dominates)
    assert active[-1] > 500_000_000


def test_rungs_are_paired_at_matched_active_params():
    for k2_name, k3_name in zip(ladder("k2"), ladder("k3"), strict=True):
        assert k2_name.removeprefix("k2-") == k3_name.removeprefix("k3-")
        ratio = accounting.num_params_active(get_preset(k3_name)) / accounting.num_params_active(
            get_preset(k2_name)
        )
        assert 0.8 < ratio < 1.25, (k2_name, ratio)


def test_family_ratios_of_a_gpu_rung():
    k2, k3 = get_preset("k2-t8"), get_preset("k3-t8")
    assert isinstance(k2, K2Config) and isinstance(k3, K3Config)
    assert k2.vocab_size == k3.vocab_size == LADDER_VOCAB
    assert k2.mla.num_heads == round(1.14 * k2.d_model / 128)
    assert k3.kda.num_heads == k3.mla.num_heads == round(1.71 * k3.d_model / 128)
    assert k3.moe.num_experts == round(7 / 3 * k2.moe.num_experts)
    assert k3.moe.top_k == 2 * k2.moe.top_k and k3.moe.num_shared == 2
    assert k3.moe.d_latent == k3.d_model // 2
    assert abs(k3.moe.d_expert / k3.moe.d_latent - 0.857) < 0.03
    assert abs(k2.moe.d_expert / k2.d_model - 0.286) < 0.03
    assert abs(k2.d_ff_dense / k2.d_model - 2.57) < 0.05
    assert abs(k3.d_ff_dense / k3.d_model - 4.71) < 0.05
    assert k3.mla.output_gate and not k3.mla.rope and k2.mla.rope
    assert k3.attnres and k3.attnres_block_size == -(-k3.num_layers // 8)


def test_head_dim_rule():
    assert [head_dim(d) for d in (8, 16, 32, 64, 256, 512, 4096)] == [4, 4, 8, 16, 64, 128, 128]


def test_full_scale_presets_present():
    names = preset_names()
    assert names[:2] == ["kimi-k2", "kimi-k3"]
    assert get_preset("kimi-k3").num_layers == 93


def test_overrides_apply_and_are_checked():
    cfg = get_preset("k2-t1", ["moe.top_k=3", "mtp_depth=1"])
    assert cfg.moe.top_k == 3 and cfg.mtp_depth == 1
    with pytest.raises(K3ScaleError, match=r"moe\.top_k"):
        get_preset("k2-t1", ["moe.top_k=99"])


def test_unknown_preset_lists_valid_names():
    with pytest.raises(K3ScaleError, match="k3-t0") as info:
        get_preset("k4-t0")
    assert "kimi-k2" in str(info.value)
    with pytest.raises(K3ScaleError):
        ladder("k4")


def test_cli_model_info_json_counts_full_scale_without_building(capsys):
    import json
    import subprocess
    import sys

    from k3scale.cli import main

    assert main(["model", "info", "kimi-k3", "--seq-len", "4096", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_params_total"] == 2_779_484_393_568
    assert info["num_params_active"] == 104_189_530_208
    assert info["flops_per_token"] == accounting.flops_per_token(get_preset("kimi-k3"), 4096)
    assert info["layout"].endswith("KKKM M")
    assert "flops_per_token_kimi_linear_eq13" in info
    # Counting needs no torch: check in a fresh interpreter (this one may have imported it).
    script = (
        "import sys; from k3scale.cli import main; main(['model', 'info', 'kimi-k2']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_cli_model_list_and_unknown_preset(capsys):
    from k3scale.cli import main

    assert main(["model", "list"]) == 0
    listing = capsys.readouterr().out
    assert "k2-t0" in listing and "104,189,530,208" in listing
    assert main(["model", "info", "k9-t0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "kimi-k2" in err and "k3-t0" in err


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_small_vocab_ladders_meet_the_v2_study_rules(family):
    # Issue 20: the body matters (non-embedding share >= 0.6 with the head in N_active), at least
    # 3 sizes over at least 0.6 decade, one depth rule, >= 4 layers at the largest rung.
    from k3scale.models.presets import SMALL_VOCAB, small_ladder

    configs = [get_preset(name) for name in small_ladder(family)]
    active = [accounting.num_params_active(c) for c in configs]
    assert len(configs) >= 3 and all(c.vocab_size == SMALL_VOCAB for c in configs)
    for cfg, n in zip(configs, active, strict=True):
        assert (n - cfg.vocab_size * cfg.d_model) / n >= 0.6
    assert math.log10(active[-1] / active[0]) >= 0.6
    divisor = 12 if family == "k2" else 8
    # Exact at the v2 rungs s1-s3; the held-out ones (issue 47) take the nearest whole layer.
    depths = [c.d_model / divisor + 2 for c in configs]
    assert [c.num_layers for c in configs[:3]] == depths[:3]
    assert all(abs(c.num_layers - L) <= 0.5 for c, L in zip(configs, depths, strict=True))
    assert configs[-1].num_layers >= 4


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_held_out_rungs_double_and_quadruple_s3(family):
    # Issue 47: s4 and s5 sit at about 2x and 4x s3's N_active, compute the v3 fits never saw.
    n_s3, n_s4, n_s5 = (
        accounting.num_params_active(get_preset(f"{family}-{size}")) for size in ("s3", "s4", "s5")
    )
    assert abs(n_s4 / n_s3 / 2 - 1) < 0.1 and abs(n_s5 / n_s3 / 4 - 1) < 0.1


def test_small_vocab_rungs_pair_k2_with_k3_within_15_percent():
    from k3scale.models.presets import small_ladder

    for k2, k3 in zip(small_ladder("k2"), small_ladder("k3"), strict=True):
        n2, n3 = (accounting.num_params_active(get_preset(n)) for n in (k2, k3))
        assert abs(n3 / n2 - 1) < 0.15


def test_cli_model_info_gives_flops_at_the_length_the_studies_train_at(capsys):
    import json

    from k3scale.cli import main

    assert main(["model", "info", "k3-s2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # The small-vocabulary rungs train at 256 tokens (sweeps/presets.py cpu_v2 and cpu_v3).
    assert info["seq_len"] == 256 and "k2_vs_k3 cpu_v2" in info["seq_len_source"]
    assert info["flops_per_token"] == accounting.flops_per_token(get_preset("k3-s2"), 256)
    assert main(["model", "info", "kimi-k3", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["seq_len"] == 4096 and info["seq_len_source"] == "no study here trains it"
    assert main(["model", "info", "k3-s2", "--seq-len", "128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq_len_source"] == "--seq-len"
