"""The GPU check: one short script for a machine with CUDA GPUs (never run by CI).

    python benchmarks/gpu_check.py --out /tmp/gpu          # on the GPU host, from the repo root

Each row is a real ``torchrun`` job of ``training.worker`` (see BENCHMARKS.md, "GPU"), after the
environment and a bf16 matmul probe, the ceiling MFU is read against. A run that fails under
``training.deterministic=true`` (an op without a deterministic CUDA kernel) is repeated with it
off. ``--dry-run`` prints each job's command without touching CUDA. Writes ``gpu_check.json`` to
``--out``, prints one markdown table, and last the ``--lm100m`` and ``--finetune`` figures as
``name=value``. ``--resnet50`` adds ResNet-50 training steps at 224 px (bf16, channels_last) on
synthetic tensors already on the GPU: the rate an image input pipeline must feed.

``--finetune`` (or ``--only finetune``) adds ``finetune-fsdp-bf16``: the ``causal_lm`` task
fine-tuning a Llama-style decoder of 0.84 B parameters (TinyLlama's widths, 16 layers, vocabulary
32,000), built from a config with random weights and saved in bf16 safetensors, with a byte-level
BPE tokenizer trained on local text (this Python's standard-library sources, then the repository's
own). The project folder (``.dvc``, JSON Lines, a ``.dvc`` file, the model folder, the config) is
built under ``--out`` inside the row's ``--timeout``. The run: FSDP2 with one block per unit, bf16
params through the MixedPrecisionPolicy, activation checkpointing on every block, one process per
GPU. Sequences of 2,048 tokens, 8 per GPU: 16 K tokens a step keeps each block's matmuls large
enough for the tensor cores, while with checkpointing the saved activations (a block input per
layer) and the 32,000-way logits of 8 x 2,048 tokens stay a fraction of an 80 GB H100, so nothing
is offloaded. About 0.9 M training tokens, 2 epochs: enough steps (over 100 on one GPU) for a
steady metrics window, and a row that fits the default ``--timeout``. Deterministic kernels are
off (a throughput figure; no rerun), checkpoints off (the final export still runs).

Tokens/s is the engine's ``perf/tokens_per_s`` (non-padding tokens, all ranks); without it, the
window's ``perf/samples_per_s`` x 2,048 (packed text fills every sequence), and the table says
which. MFU is ``perf/mfu`` as for the other rows; ``mfu_6n`` beside it in the JSON is the
6 N + 12 L d s per-token formula on the same tokens/s, a check on what the FLOP counter counted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Dense per-GPU peaks used for MFU (H100/H200 SXM datasheet): bf16 tensor cores, fp32 (no TF32).
PEAK_TFLOPS = {"bf16": 989.0, "fp32": 67.0}
BF16 = ["training.precision=bf16", f"training.peak_tflops={PEAK_TFLOPS['bf16']}"]
FP32 = [f"training.peak_tflops={PEAK_TFLOPS['fp32']}"]
LM_CONFIG = "configs/stdlib-lm.yaml"
# The ~100 M-parameter LM of BENCHMARKS.md's GPU section (``configs/stdlib-lm.yaml`` made bigger).
LM_100M = ["model.d_model=1024", "model.n_layers=8", "model.n_heads=16", "model.d_ff=4096",
           "model.seq_len=256", "dataset.text.seq_len=256", "dataset.text.stride=256",
           "training.batch_size=64", "training.epochs=6", "training.lr=0.0006"]
FINETUNE = "finetune-fsdp-bf16"
FT_MODEL = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048}
FT_SEQ, FT_BATCH, FT_EPOCHS = 2048, 8, 2
FT_TEXT_CHARS, FT_DOC_CHARS = 4_000_000, 16_000
FT_SETS = ["training.strategy=fsdp", *BF16, "training.deterministic=false", "training.checkpoints=false"]


def job_cmd(config: str, sets: list[str], folder: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "training.worker", "--config", config, "--out", str(folder), *(a for s in sets for a in ("--set", s))]


def environment() -> dict:
    import torch

    try:  # a missing tool is a finding, not a crash
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        smi = f"unavailable: {exc}"
    env = {"nvidia_smi": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    try:
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # noqa: BLE001
        env["nccl"] = f"unavailable: {exc}"
    return env


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def resnet50_step_rate(device: str = "cuda", size: int = 224, batch: int = 128, steps: int = 30,
                       warmup: int = 5) -> dict:
    """Images/s of ResNet-50 training steps (forward, backward, SGD) on synthetic tensors already on
    ``device``: bf16 autocast and channels_last on CUDA, fp32 on CPU. No input pipeline at all, so
    it is the rate a loader must keep up with (NVIDIA's published A100 AMP figure: ~2,470 images/s)."""
    import torch

    from tasks.image_nets import ResNet50, channels_last

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = ResNet50(3, 1000).to(dev)
    if cuda:
        model = channels_last(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=dev)
    x = x.contiguous(memory_format=torch.channels_last) if cuda else x
    y = torch.randint(0, 1000, (batch,), device=dev)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step():
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"name": f"resnet50-{size}px-synthetic", "device": str(dev), "batch": batch, "steps": steps,
            "precision": "bf16" if cuda else "fp32", "channels_last": cuda,
            "images_per_s": round(batch * steps / wall, 1)}


def local_text(chars: int, doc_chars: int = FT_DOC_CHARS) -> list[str]:
    """About ``chars`` characters of local text as documents of at most ``doc_chars``: this Python's
    standard-library sources (tests left out), then the repository's ``*.py`` and ``*.md``, in path
    order. Nothing is downloaded; ValueError when there is less."""
    import itertools
    import os
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "dist-packages", "__pycache__", "node_modules"}

    def files(base: Path, suffixes: tuple[str, ...]):
        for folder, subs, names in os.walk(base):
            subs[:] = sorted(d for d in subs if d not in skip and not d.startswith("."))
            yield from (Path(folder) / n for n in sorted(names) if n.endswith(suffixes))

    docs, total = [], 0
    for path in itertools.chain(files(stdlib, (".py",)), files(ROOT, (".py", ".md"))):
        if total >= chars:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        for i in range(0, len(text), doc_chars):
            docs.append(text[i:i + doc_chars])
            total += len(docs[-1])
    if total < chars:
        raise ValueError(f"local text: {total:,} characters under {stdlib} and {ROOT}, {chars:,} wanted")
    return docs


def decoder_config(model: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**model, tie_word_embeddings=False)


def decoder_params(model: dict) -> int:
    """Parameters of the decoder ``model`` describes, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(decoder_config(model)).parameters())


def flops_per_token(model: dict, seq: int) -> float:
    """Training FLOPs a token by the 6 N + 12 L d s rule (N: the matmul parameters, all but the input
    embedding; attention over ``seq`` positions, forward and backward, no recomputation)."""
    n = decoder_params(model) - model["vocab_size"] * model["hidden_size"]
    return 6 * n + 12 * model["num_hidden_layers"] * model["hidden_size"] * seq


def finetune_config(seq: int = FT_SEQ, batch: int = FT_BATCH, epochs: int = FT_EPOCHS) -> dict:
    """The fine-tune's config: causal_lm on packed JSON Lines text, activation checkpointing on."""
    return {"name": "gpu-finetune", "task": "causal_lm", "seed": 0,
            "dataset": {"path": "data/code", "text": {"train_file": "train.jsonl", "eval_file": "val.jsonl",
                                                      "holdout_fraction": 0.01}},
            "pretrained": {"path": "models/decoder", "max_length": seq, "activation_checkpointing": True},
            "training": {"epochs": epochs, "batch_size": batch, "base_batch": batch, "lr": 1e-4,
                         "optimizer": "adamw", "warmup_epochs": 0.1, "log_every_steps": 10}}


def make_finetune_root(root: Path, model: dict = FT_MODEL, text_chars: int = FT_TEXT_CHARS, seq: int = FT_SEQ,
                       batch: int = FT_BATCH, epochs: int = FT_EPOCHS, doc_chars: int = FT_DOC_CHARS) -> dict:
    """A project folder for ``training.worker``: ``.dvc/``, ``data/code/{train,val}.jsonl`` with
    ``data/code.dvc``, ``models/decoder`` (``model``'s decoder with random weights, bf16 safetensors,
    and a byte-level BPE tokenizer of ``model``'s vocabulary trained on the same text) and
    ``finetune.yaml``. Returns what was built."""
    import hashlib

    import torch
    import yaml
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per shard written: noise in the check's log
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.hf_models import _bpe

    root = Path(root)
    (root / ".dvc").mkdir(parents=True, exist_ok=True)
    data = root / "data" / "code"
    data.mkdir(parents=True, exist_ok=True)
    docs = local_text(text_chars, doc_chars)
    n_eval = max(2, len(docs) // 100)
    md5 = hashlib.md5()
    for name, part in (("train.jsonl", docs[:-n_eval]), ("val.jsonl", docs[-n_eval:])):
        raw = "".join(json.dumps({"text": d}) + "\n" for d in part).encode()
        (data / name).write_bytes(raw)
        md5.update(raw)
    (root / "data" / "code.dvc").write_text(yaml.safe_dump({"outs": [{"md5": md5.hexdigest(), "path": "code"}]}))
    eos = "<|endoftext|>"
    tok = _bpe(docs[:-n_eval], model["vocab_size"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=eos,
                                   model_max_length=model["max_position_embeddings"])
    eos_id = tok.token_to_id(eos)
    torch.manual_seed(0)
    config = decoder_config({**model, "bos_token_id": eos_id, "eos_token_id": eos_id})
    net = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in net.parameters())
    folder = root / "models" / "decoder"
    net.save_pretrained(folder)
    fast.save_pretrained(folder)
    del net
    (root / "finetune.yaml").write_text(yaml.safe_dump(finetune_config(seq, batch, epochs)))
    return {"config": str(root / "finetune.yaml"), "params": params, "docs": len(docs), "eval_docs": n_eval,
            "tokenizer_vocab": tok.get_vocab_size()}


def run_job(name: str, config: str, sets: list[str], out: Path, nproc: int, timeout: float) -> dict:
    folder = out / name
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(job_cmd(config, sets, folder, nproc), cwd=ROOT, capture_output=True, text=True,
                              timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as exc:  # one row's failure: the other rows and the JSON still come
        tail = exc.stderr or exc.stdout or ""
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"name": name, "sets": sets, "rc": "timeout", "job_wall_s": round(time.perf_counter() - t0, 1),
                "error": f"timed out after {max(timeout, 1):.0f} s\n{tail[-3000:]}"}
    row = {"name": name, "sets": sets, "rc": proc.returncode, "job_wall_s": round(time.perf_counter() - t0, 1)}
    result_file = folder / "result.json"
    if proc.returncode != 0 or not result_file.exists():
        return {**row, "error": (proc.stderr or proc.stdout)[-3000:]}
    r = json.loads(result_file.read_text())
    perf = r.get("perf") or {}
    return {**row, "status": r["status"], "backend": r["backend"], "strategy": r["strategy"], "world": r["world_size"],
            "samples_per_s": r["samples_per_s"], "train_wall_s": r["train_wall_s"],
            "checkpoint_stall_frac": r["checkpoint_stall_frac"], "final": r["final"], "mfu": perf.get("perf/mfu"),
            "tokens_per_s": perf.get("perf/tokens_per_s"),
            "gpu_util": perf.get("perf/gpu_util"), "data_wait_frac": perf.get("perf/data_wait_frac"),
            "peak_mem_mb": max((round(rk.get("peak_mem_mb") or 0, 1) for rk in r.get("ranks") or []), default=None),
            "perf": perf}


def run(name: str, config: str, sets: list[str], out: Path, nproc: int, timeout: float) -> list[dict]:
    rows = [run_job(name, config, sets, out, nproc, timeout)]
    row = rows[0]
    if "error" not in row:
        tokens = f", {row['tokens_per_s']:.0f} tokens/s" if row.get("tokens_per_s") is not None else ""
        print(f"[{name}] {row['samples_per_s']:.0f} samples/s{tokens}, mfu {row['mfu']}, util {row['gpu_util']}, "
              f"peak {row['peak_mem_mb']} MB, final {row['final']}", flush=True)
        return rows
    print(f"[{name}] failed (rc {row['rc']}):\n{row['error'][-1500:]}", flush=True)
    if not any(s.startswith("training.deterministic") for s in sets):
        rows.append(run_job(name + "-nondet", config, [*sets, "training.deterministic=false"], out, nproc, timeout))
        if "error" in rows[1]:
            print(f"[{name}-nondet] failed too:\n{rows[1]['error'][-1500:]}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| run | backend | strategy | samples/s | tokens/s | train s | MFU | GPU util % | peak MB | ckpt stall "
             "| val acc |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed rc {r['rc']} | | | | | | | | | |")
            continue
        if r.get("tokens_per_s_source"):
            notes.append(f"{r['name']} tokens/s: {r['tokens_per_s_source']}")
        mfu = f"{r['mfu'] * 100:.3f} %" if r.get("mfu") is not None else "-"
        tokens = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") is not None else "-"
        acc = r["final"].get("val_accuracy")
        lines.append(
            f"| {r['name']} | {r['backend']} | {r['strategy']} | {r['samples_per_s']:.0f} | {tokens} "
            f"| {r['train_wall_s']:.2f} | {mfu} | {r.get('gpu_util') if r.get('gpu_util') is not None else '-'} "
            f"| {r['peak_mem_mb']} | {r['checkpoint_stall_frac'] * 100:.1f} % "
            f"| {acc if acc is None else round(acc, 4)} |")
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lm", default=None, help="an LM config to add (bf16), e.g. configs/stdlib-lm.yaml")
    ap.add_argument("--lm-set", action="append", default=[], help="extra --set for the LM runs (e.g. a bigger model)")
    ap.add_argument("--only", default=None, help="comma-separated run-name prefixes to keep (e.g. lm,wide)")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--lm100m", action="store_true",
                    help="the ~100 M-parameter LM on one GPU, bf16 eager vs bf16 + torch.compile")
    ap.add_argument("--resnet50", action="store_true",
                    help="also ResNet-50 at 224 px, bf16 + channels_last, on synthetic tensors on the GPU")
    ap.add_argument("--finetune", action="store_true",
                    help=f"also {FINETUNE}: causal_lm fine-tune of a 0.84 B decoder built from a config (FSDP2, bf16, "
                         "activation checkpointing); --only finetune runs it alone")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no CUDA needed)")
    args = ap.parse_args(argv)
    if args.lm100m and not (ROOT / (args.lm or LM_CONFIG)).exists():
        ap.error(f"--lm100m needs the LM config, {args.lm or LM_CONFIG!r} does not exist (--lm)")
    if args.dry_run:
        plan = build_plan(args)
        for name, config, sets, nproc in plan:
            if name == FINETUNE:
                print(f"{name}: builds {Path(config).parent}: a Llama-style decoder of {decoder_params(FT_MODEL):,} "
                      f"parameters (bf16 safetensors), {FT_SEQ} tokens x {FT_BATCH} sequences a GPU")
            print(name, " ".join(job_cmd(config, sets, args.out / name, nproc or 0)).replace(
                "--nproc-per-node=0", "--nproc-per-node=<gpus>"))
        print(f"dry_run=1 runs={len(plan)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check is for a GPU host", file=sys.stderr)
        return 2
    env = environment()
    print(json.dumps(env), flush=True)
    env["bf16_matmul_tflops"] = round(matmul_tflops(), 1)
    print(f"bf16 matmul 8192^3: {env['bf16_matmul_tflops']} TFLOP/s", flush=True)
    rows = []
    for name, config, sets, nproc in build_plan(args):
        if name != FINETUNE:
            rows += run(name, config, sets, args.out, nproc or env["gpus"], args.timeout)
            continue
        t0 = time.perf_counter()  # the folder is built inside the row's --timeout
        try:
            built = make_finetune_root(Path(config).parent)
        except Exception as exc:  # noqa: BLE001 - a failed build is this row's failure, not the check's
            rows.append({"name": name, "sets": sets, "rc": "build", "error": f"{type(exc).__name__}: {exc}"})
            print(f"[{name}] the project folder was not built: {rows[-1]['error']}", flush=True)
            continue
        built["build_s"] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] a Llama-style decoder of {built['params']:,} parameters (bf16), {built['docs']} documents "
              f"of local text, tokenizer vocabulary {built['tokenizer_vocab']:,}: built in {built['build_s']} s",
              flush=True)
        rows += [{**finetune_figures(r), "built": built}
                 for r in run(name, config, sets, args.out, nproc or env["gpus"], args.timeout - built["build_s"])]
    if args.resnet50:
        rate = resnet50_step_rate()
        env["resnet50"] = rate
        print(f"resnet50 224 px bf16 channels_last, synthetic tensors on the GPU: {rate['images_per_s']} images/s",
              flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps({"env": env, "runs": rows}, indent=2, default=str))
    print(table(rows))
    print(summary_line(rows))
    return 0 if all("error" not in r for r in rows) else 1


def build_plan(args) -> list[tuple[str, str, list[str], int | None]]:
    """(run name, config, --set overrides, processes; None: one per GPU) for each job to run."""
    digits = "configs/digits.yaml"
    wide = ["model.kind=mlp", "model.hidden=4096", "training.batch_size=1024", "training.base_batch=1024",
            "training.epochs=30", "training.log_every_steps=1"]
    plan = [("digits-ddp-fp32", digits, FP32), ("digits-ddp-bf16", digits, BF16),
            ("digits-fsdp-bf16", digits, ["training.strategy=fsdp", *BF16]),
            ("wide-mlp-fp32", digits, [*wide, *FP32]), ("wide-mlp-bf16", digits, [*wide, *BF16]),
            ("wide-mlp-bf16-nockpt", digits, [*wide, "training.checkpoints=false", *BF16])]
    if args.lm and (ROOT / args.lm).exists():
        lm = ["training.strategy=ddp", "training.checkpoint_every_epochs=1000", *args.lm_set]
        plan += [("lm-ddp-fp32", args.lm, [*lm, *FP32]), ("lm-ddp-bf16", args.lm, [*lm, *BF16]),
                 ("lm-fsdp-bf16", args.lm, [*lm, "training.strategy=fsdp", *BF16])]
    only = args.only.split(",") if args.only else []
    if getattr(args, "finetune", False) or any(o.startswith("finetune") for o in only):
        plan.append((FINETUNE, str(Path(args.out).resolve() / "finetune-project" / "finetune.yaml"), FT_SETS))
    plan = [(name, config, sets, None) for name, config, sets in plan]
    if args.lm100m:
        # One GPU, one process: the figure is per device. Checkpoints only at the end.
        big = ["training.strategy=single", "training.cpu_workers=1", "training.checkpoint_every_epochs=1000",
               *BF16, *LM_100M, *args.lm_set]
        plan += [("lm100m-bf16", args.lm or LM_CONFIG, big, 1),
                 ("lm100m-bf16-compile", args.lm or LM_CONFIG, [*big, "training.compile=true"], 1)]
    if only:
        plan = [p for p in plan if any(p[0].startswith(o) for o in only)]
    return plan


def finetune_figures(row: dict, seq: int = FT_SEQ, model: dict = FT_MODEL) -> dict:
    """The fine-tune row with its tokens/s (the engine's ``perf/tokens_per_s``, else the window's
    samples/s x ``seq``), where that figure came from, and the 6 N + 12 L d s MFU on it."""
    if "error" in row:
        return row
    perf = row.get("perf") or {}
    if row.get("tokens_per_s") is not None:
        tokens, source = row["tokens_per_s"], "perf/tokens_per_s (non-padding tokens, all ranks)"
    elif perf.get("perf/samples_per_s") is not None:
        tokens, source = perf["perf/samples_per_s"] * seq, f"perf/samples_per_s x {seq} (no perf/tokens_per_s logged)"
    else:
        tokens, source = row["samples_per_s"] * seq, f"epoch samples/s x {seq} (no perf window logged)"
    peak = row["world"] * PEAK_TFLOPS["bf16"] * 1e12
    return {**row, "tokens_per_s": tokens, "tokens_per_s_source": source, "params": decoder_params(model),
            "mfu_6n": round(tokens * flops_per_token(model, seq) / peak, 4)}


def summary_line(rows: list[dict]) -> str:
    """The last line: MFU and data-wait fraction of the 100 M LM runs, eager and compiled, and the
    fine-tune's tokens/s and MFU, as name=value."""
    by = {r["name"].removesuffix("-nondet"): r for r in rows if "error" not in r}
    parts = []
    for name, key in (("lm100m-bf16", "eager"), ("lm100m-bf16-compile", "compile")):
        r = by.get(name) or {}
        parts += [f"{field}_{key}={r[field] if r.get(field) is not None else 'na'}" for field in ("mfu", "data_wait_frac")]
    eager, comp = by.get("lm100m-bf16"), by.get("lm100m-bf16-compile")
    speedup = round(comp["samples_per_s"] / eager["samples_per_s"], 3) if eager and comp else "na"
    ft = by.get(FINETUNE) or {}
    tokens = round(ft["tokens_per_s"]) if ft.get("tokens_per_s") is not None else "na"
    mfu = round(ft["mfu"], 4) if ft.get("mfu") is not None else "na"
    return " ".join([*parts, f"compile_speedup={speedup}", f"finetune_tokens_per_s={tokens}", f"finetune_mfu={mfu}",
                     f"runs_failed={sum('error' in r for r in rows)}"])


if __name__ == "__main__":
    sys.exit(main())
