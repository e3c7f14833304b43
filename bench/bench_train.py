#!/usr/bin/env python3
"""A full training step, gmod vs transformers (same torch build, same threads, same model and batch shape).

For each model config (the demo model, and a SmolLM2-135M-sized LLaVA: configs/bench_smollm2_llava) this runs
`gmod train` for a few steps, dense and γ-MoD (keep_top:4 → most layers MoD, skip_frac 0.5), on the demo data and
reads tokens/s, step time and MFU from its metrics.jsonl; then it runs the same optimizer step in Python
(transformers LlavaForConditionalGeneration from the same config.json, random init, torch AdamW) on a batch of
the same shape (samples per step x gmod's mean padded length, with the same number of image tokens per sample) and
prints both side by side.

    python bench/bench_train.py [--threads 2] [--steps 6] [--models demo,smollm2]

Needs transformers in the venv. gmod numbers exclude the first two steps (warm-up).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"demo": "configs/demo_model", "smollm2": "configs/bench_smollm2_llava"}


def run_gmod(gmod, model_dir, mod, steps, threads, run_dir, micro_batch, global_batch):
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [f"model.path={model_dir}", f"run_dir={run_dir}", f"schedule.max_steps={steps}", "eval.data=",
            "checkpoint.every=0", "metrics.log_every=1", "resume=none", f"batch.micro_batch={micro_batch}",
            f"batch.global_batch={global_batch}", f"data.train={run_dir}-data/train.json", "data.demo_records=200"]
    sets += ["mod.enabled=true", "mod.rule=keep_top:4"] if mod else ["mod.enabled=false"]
    cmd = [gmod, "train", "--config", os.path.join(ROOT, "configs/demo.json"),
           "--threads", str(threads)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"tokens_per_s"' in l]
    rows = rows[2:] or rows
    med = lambda k: statistics.median(r[k] for r in rows)
    skip = [v for r in rows for v in r.get("skip_ratio", {}).values()]
    return {"step_s": med("step_s"), "tokens_per_s": med("tokens_per_s"), "mfu": med("mfu"),
            "tokens": med("tokens"), "samples": med("samples"), "padded": med("padded_tokens"), "skip": statistics.mean(skip) if skip else 0.0}


def run_transformers(model_dir, samples, seq, steps, threads):
    import torch
    from transformers import AutoConfig, LlavaForConditionalGeneration
    torch.set_num_threads(threads)
    cfg = AutoConfig.from_pretrained(os.path.join(ROOT, model_dir))
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    n_img = cfg.image_seq_length
    ids = torch.randint(3, cfg.text_config.vocab_size - 2, (samples, seq))
    ids[:, 1:1 + n_img] = cfg.image_token_index
    labels = ids.clone()
    labels[:, :1 + n_img] = -100
    pix = torch.randn(samples, 3, cfg.vision_config.image_size, cfg.vision_config.image_size)
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        out = model(input_ids=ids, pixel_values=pix, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[2:] or times)
    return {"step_s": t, "tokens_per_s": samples * seq / t}  # positions/s; gmod's tokens/s counts real tokens


def main():
    ap = argparse.ArgumentParser(description="A full training step, gmod (dense, γ-MoD) vs transformers.")
    ap.add_argument("--gmod", default=os.path.join(ROOT, "build", "bin", "gmod"), help="the gmod binary")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--models", default="demo,smollm2")
    ap.add_argument("--micro-batch", type=int, default=4)
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("bench_train: transformers is not installed in this venv (launch/setup.sh installs it)")
        return 77  # ctest's skip code
    tmp = tempfile.mkdtemp(prefix="gmod-bench-train-")
    print(f"threads {args.threads}, {args.steps} steps, micro-batch {args.micro_batch} (global = micro-batch), CPU")
    print(f"{'model':9s} {'variant':14s} {'step s':>8s} {'tokens/s':>10s} {'MFU':>7s} {'skip':>6s}")
    for name in args.models.split(","):
        md = MODELS[name]
        dense = run_gmod(args.gmod, md, False, args.steps, args.threads, os.path.join(tmp, name + "-dense"), args.micro_batch,
                         args.micro_batch)
        mod = run_gmod(args.gmod, md, True, args.steps, args.threads, os.path.join(tmp, name + "-mod"), args.micro_batch,
                       args.micro_batch)
        seq = max(1, round(dense["padded"] / dense["samples"]))  # gmod computes padded batches: same shape
        hf = run_transformers(md, int(dense["samples"]), seq, args.steps, args.threads)
        for variant, r in (("gmod dense", dense), ("gmod γ-MoD", mod)):
            print(f"{name:9s} {variant:14s} {r['step_s']:8.3f} {r['tokens_per_s']:10.0f} {100 * r['mfu']:6.2f}% "
                  f"{100 * r['skip']:5.1f}%")
        print(f"{name:9s} {'transformers':14s} {hf['step_s']:8.3f} {hf['tokens_per_s']:10.0f} "
              f"{'':>7s} {'':>6s}   (same shape: {int(dense['samples'])} x {seq} tokens)")
        print(f"{name:9s} dense speed-up over transformers {hf['step_s'] / dense['step_s']:.2f}x, "
              f"γ-MoD over dense {dense['step_s'] / mod['step_s']:.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
