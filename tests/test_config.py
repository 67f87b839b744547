"""Config system: overrides, type checks, canonical JSON and config_hash."""

import dataclasses
import json
import subprocess
import sys

import pytest

from k3scale.config import (
    ConfigError,
    RunConfig,
    ScheduleConfig,
    apply_overrides,
    canonical_json,
    config_hash,
    flatten,
    load_run_config,
    to_dict,
)
from k3scale.models.config import K2Config, K3Config, KDAConfig, MLAConfig, MoEConfig


def k3_run() -> RunConfig:
    model = K3Config(
        vocab_size=256,
        d_model=32,
        num_layers=4,
        kda=KDAConfig(num_heads=2, d_head=16),
        mla=MLAConfig(num_heads=2, kv_lora_rank=16, d_nope=8, d_rope=4, d_v=8, rope=False),
        d_ff_dense=64,
        moe=MoEConfig(num_experts=6, top_k=2, d_expert=16, d_latent=16, balancing="quantile"),
    )
    return RunConfig(model=model)


def test_configs_are_frozen_and_keyword_only():
    cfg = k3_run()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        ScheduleConfig("cosine")  # type: ignore[misc]


def test_override_sets_nested_values_with_their_types():
    cfg = apply_overrides(
        k3_run(),
        [
            "optim.lr=1e-3",
            "train.batch_size=32",
            "train.budget_tokens=2e6",
            "optim.nesterov=false",
            "schedule.kind=wsd",
            "model.kda.chunk_size=16",
            "model.moe.d_latent=none",
            "train.fork_tokens=100,200",
        ],
    )
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.train.batch_size == 32 and cfg.train.budget_tokens == 2_000_000
    assert cfg.optim.nesterov is False
    assert cfg.schedule.kind == "wsd"
    assert cfg.model.kda.chunk_size == 16
    assert cfg.model.moe.d_latent is None
    assert cfg.train.fork_tokens == (100, 200)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("optim.lrr=1", "optim.lrr: unknown key 'lrr'"),
        ("nope.lr=1", "nope.lr: unknown key 'nope'"),
        ("optim.lr=fast", "optim.lr: expected a float"),
        ("train.batch_size=1.5", "train.batch_size: expected an int"),
        ("optim.nesterov=maybe", "optim.nesterov: expected a bool"),
        ("schedule.kind=linear", "schedule.kind: 'linear' is not one of"),
        ("optim=1", "optim: is a section"),
        ("optim.lr.x=1", "optim.lr.x: 'lr' is a value"),
        ("optim.lr", "must look like a.b.c=value"),
        ("optim.lr=-1", "optim.lr: must be finite and > 0"),
    ],
)
def test_bad_overrides_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as info:
        apply_overrides(k3_run(), [override])
    assert fragment in str(info.value)


def test_exponential_wsd_needs_a_positive_floor():
    with pytest.raises(ConfigError, match=r"schedule\.lr_min"):
        ScheduleConfig(kind="wsd", decay_shape="exponential", lr_min=0.0)


def test_canonical_json_is_order_independent_and_round_trips():
    a = apply_overrides(k3_run(), ["optim.lr=1e-3", "train.seed=3"])
    b = apply_overrides(k3_run(), ["train.seed=3", "optim.lr=0.001"])
    assert canonical_json(a) == canonical_json(b)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(k3_run())
    assert load_run_config(json.loads(canonical_json(a))) == a


def test_family_survives_a_json_round_trip():
    k2 = RunConfig(
        model=K2Config(
            vocab_size=256,
            d_model=32,
            num_layers=2,
            mla=MLAConfig(num_heads=2, kv_lora_rank=16),
            d_ff_dense=64,
        )
    )
    back = load_run_config(to_dict(k2))
    assert isinstance(back.model, K2Config) and back == k2


def test_reading_back_rejects_unknown_keys_and_wrong_types():
    data = to_dict(k3_run())
    data["optim"]["lr"] = "high"
    with pytest.raises(ConfigError, match=r"optim\.lr: expected float"):
        load_run_config(data)
    data = to_dict(k3_run())
    data["train"]["extra"] = 1
    with pytest.raises(ConfigError, match=r"train\.extra: unknown key"):
        load_run_config(data)


def test_flatten_gives_dotted_keys():
    flat = flatten(k3_run())
    assert flat["optim.lr"] == 3e-3
    assert flat["model.kda.num_heads"] == 2
    assert flat["model.family"] == "k3"


def test_config_hash_ignores_where_a_run_logs():
    base = k3_run()
    moved = apply_overrides(
        base, ["train.out_dir=/elsewhere", "track.experiment=x", "train.num_threads=2"]
    )
    assert config_hash(moved) == config_hash(base)
    assert canonical_json(moved) != canonical_json(base)
    assert config_hash(apply_overrides(base, ["train.seed=1"])) != config_hash(base)


def test_model_configs_import_without_the_run_config_module():
    """k3scale.config imports k3scale.models.config, never the other way round (no cycle)."""
    code = (
        "import sys; import k3scale.models.config as m; "
        "assert 'k3scale.config' not in sys.modules, 'cycle'; "
        "m.MLAConfig(num_heads=0, kv_lora_rank=4)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "k3scale.errors.ConfigError: mla.num_heads: must be >= 1" in done.stderr, done.stderr
