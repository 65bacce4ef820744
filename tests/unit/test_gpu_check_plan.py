"""benchmarks/gpu_check.py's CPU side: the plan it would run is valid config, and its last line parses."""

import importlib.util
from pathlib import Path

import pytest

from core.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_100m_lm_runs_are_valid_configs_one_gpu_each(gpu_check, tmp_path):
    args = gpu_check.argparse.Namespace(lm=None, lm_set=[], only="lm100m", lm100m=True)
    plan = gpu_check.build_plan(args)
    assert [p[0] for p in plan] == ["lm100m-bf16", "lm100m-bf16-compile"]
    for name, config, sets, nproc in plan:
        cfg = load_config(ROOT / config, sets)  # a typo'd key or a bad layout fails here, not on the GPU
        assert nproc == 1 and cfg.training.strategy == "single" and cfg.training.precision == "bf16"
        assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.d_ff) == (1024, 8, 4096)
        assert cfg.training.compile.enabled is name.endswith("-compile")


def test_dry_run_prints_the_plan_and_a_name_value_last_line(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--lm100m", "--only", "lm100m"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "dry_run=1 runs=2"
    assert "--set training.compile=true" in lines[1] and "--nproc-per-node=1" in lines[1]


def test_summary_line_gives_both_mfus_the_speedup_and_data_wait(gpu_check):
    rows = [{"name": "lm100m-bf16", "mfu": 0.2, "data_wait_frac": 0.01, "samples_per_s": 1000.0},
            {"name": "lm100m-bf16-compile", "rc": 1, "error": "boom"},
            {"name": "lm100m-bf16-compile-nondet", "mfu": 0.41, "data_wait_frac": 0.02, "samples_per_s": 2050.0}]
    line = gpu_check.summary_line(rows)
    assert dict(kv.split("=") for kv in line.split()) == {
        "mfu_eager": "0.2", "data_wait_frac_eager": "0.01", "mfu_compile": "0.41",
        "data_wait_frac_compile": "0.02", "compile_speedup": "2.05", "finetune_tokens_per_s": "na",
        "finetune_mfu": "na", "runs_failed": "1"}


def test_the_resnet50_step_rate_runs_on_cpu_too(gpu_check):
    rate = gpu_check.resnet50_step_rate("cpu", size=32, batch=2, steps=1, warmup=0)
    assert rate["images_per_s"] > 0 and rate["precision"] == "fp32" and rate["channels_last"] is False


# A decoder of the fine-tune's architecture small enough to build here.
TINY = {"vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _llama_params(m: dict) -> int:
    """Llama's parameter count by formula: untied embedding and head, grouped-query attention, a
    gated MLP, two RMSNorms a block and a final one."""
    d, head = m["hidden_size"], m["hidden_size"] // m["num_attention_heads"]
    attention = 2 * d * d + 2 * d * m["num_key_value_heads"] * head
    block = attention + 3 * d * m["intermediate_size"] + 2 * d
    return 2 * m["vocab_size"] * d + m["num_hidden_layers"] * block + d


def test_the_finetune_decoder_has_half_to_one_billion_parameters(gpu_check):
    n = gpu_check.decoder_params(gpu_check.FT_MODEL)  # on the meta device: nothing allocated
    assert n == _llama_params(gpu_check.FT_MODEL) and 0.5e9 <= n <= 1e9
    assert gpu_check.decoder_params(TINY) == _llama_params(TINY)
    assert gpu_check.FT_SEQ == gpu_check.FT_MODEL["max_position_embeddings"]


def test_the_finetune_plan_is_a_causal_lm_config_with_fsdp_bf16_and_checkpointing(gpu_check, tmp_path):
    import yaml

    from tasks import get_task

    args = gpu_check.argparse.Namespace(lm=None, lm_set=[], only="finetune", lm100m=False, finetune=False,
                                        out=tmp_path)
    [(name, config, sets, nproc)] = gpu_check.build_plan(args)
    assert name == gpu_check.FINETUNE and nproc is None  # one process per GPU
    Path(config).parent.mkdir(parents=True)
    Path(config).write_text(yaml.safe_dump(gpu_check.finetune_config()))  # what make_finetune_root writes
    cfg = load_config(Path(config), sets)
    get_task("causal_lm").check_config(cfg)
    t, p = cfg.training, cfg.pretrained
    assert cfg.task == "causal_lm" and t.strategy == "fsdp" and t.precision == "bf16" and t.peak_tflops == 989.0
    assert p.activation_checkpointing and p.max_length == 2048 and t.batch_size == 8
    assert not t.deterministic and not t.checkpoints


def test_a_tiny_build_is_a_model_folder_and_project_the_worker_reads(gpu_check, tmp_path):
    import json

    import yaml

    from tasks import get_task
    from tasks.hf_folder import check_folder, load_tokenizer

    built = gpu_check.make_finetune_root(tmp_path, TINY, text_chars=20_000, seq=32, batch=4, doc_chars=2_000)
    facts = check_folder(tmp_path / "models" / "decoder")
    assert facts.model_type == "llama" and facts.weights == ("model.safetensors",) and facts.has_tokenizer
    assert facts.config["dtype"] == "bfloat16" and built["params"] == _llama_params(TINY)
    header = (tmp_path / "models" / "decoder" / "model.safetensors").read_bytes()
    meta = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    assert {v["dtype"] for k, v in meta.items() if k != "__metadata__"} == {"BF16"}
    tok = load_tokenizer(facts.path)
    assert len(tok) <= TINY["vocab_size"] and tok.eos_token_id == facts.config["eos_token_id"]
    cfg = load_config(Path(built["config"]), gpu_check.FT_SETS)
    get_task("causal_lm").check_config(cfg)
    dvc = yaml.safe_load((tmp_path / cfg.dataset.dvc_file).read_text())  # what the worker reads as the data md5
    assert len(dvc["outs"][0]["md5"]) == 32
    docs = [json.loads(line)["text"] for line in (tmp_path / "data" / "code" / "train.jsonl").read_text().splitlines()]
    assert built["docs"] == len(docs) + built["eval_docs"] and all(0 < len(d) <= 2_000 for d in docs)


def test_dry_run_lists_the_finetune_row(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--only", "finetune"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "dry_run=1 runs=1"
    assert lines[0].startswith(f"{gpu_check.FINETUNE}: builds ") and "835,782,656 parameters" in lines[0]
    cmd = lines[1]
    assert cmd.startswith(gpu_check.FINETUNE + " ") and "--nproc-per-node=<gpus>" in cmd
    assert f"--config {tmp_path.resolve()}/finetune-project/finetune.yaml" in cmd
    assert "--set training.strategy=fsdp --set training.precision=bf16" in cmd
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--finetune"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "dry_run=1 runs=7"


def test_finetune_tokens_per_s_is_the_engines_else_the_windows_samples_times_the_sequence(gpu_check):
    row = {"name": gpu_check.FINETUNE, "world": 2, "samples_per_s": 20.0, "mfu": 0.31234,
           "perf": {"perf/samples_per_s": 25.0}, "tokens_per_s": None}
    fallback = gpu_check.finetune_figures(row)
    assert fallback["tokens_per_s"] == 25.0 * 2048 and "perf/samples_per_s x 2048" in fallback["tokens_per_s_source"]
    per_token = gpu_check.flops_per_token(gpu_check.FT_MODEL, 2048)
    assert fallback["mfu_6n"] == round(25.0 * 2048 * per_token / (2 * 989e12), 4)
    engine = gpu_check.finetune_figures({**row, "tokens_per_s": 50_000.4})
    assert engine["tokens_per_s"] == 50_000.4 and engine["tokens_per_s_source"].startswith("perf/tokens_per_s")
    fields = dict(kv.split("=") for kv in gpu_check.summary_line([engine]).split())
    assert fields["finetune_tokens_per_s"] == "50000" and fields["finetune_mfu"] == "0.3123"
    assert "perf/tokens_per_s" in gpu_check.table([{**engine, "backend": "nccl", "strategy": "fsdp",
                                                    "train_wall_s": 1.0, "peak_mem_mb": 1.0, "gpu_util": None,
                                                    "checkpoint_stall_frac": 0.0, "final": {}}])
