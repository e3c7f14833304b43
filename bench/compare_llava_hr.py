#!/usr/bin/env python3
"""gmod vs the original LLaVA-HR: forward+backward step time of the same small LLaVA-HR model (same weights, batch
shape, thread count, fp32, CPU), both printed and their ratio.

The original code is imported from a checkout given by --llava-hr (or $GMOD_LLAVA_HR), never copied. It needs the
versions LLaVA-HR pins, in a venv of its own:

    git clone https://github.com/luogen1996/LLaVA-HR /tmp/LLaVA-HR
    python3 -m venv /tmp/hrvenv
    /tmp/hrvenv/bin/pip install torch transformers==4.31.0 timm==0.9.11 safetensors einops
    /tmp/hrvenv/bin/python bench/compare_llava_hr.py --llava-hr /tmp/LLaVA-HR [--threads 2] [--size 768]

The script builds the original LlavaLlamaForCausalLM (is_multipath_encoder: the fast CLIP path, ConvNeXt from the
checkout's convnext.py at the widths given here, trained towers with their stitch adapters, mlp2x_gelu projector,
LLaMA) at random weights, writes it as a LLaVA-HR dir (config.json + model.safetensors in the original names), runs
bench_model --images 1 on that dir (gmod) and times the original on a batch of the same shape: one image per sample
right after the first token, the rest text, image positions unsupervised. Both sides run in training mode as the
original trains: the original's multipath forward checkpoints every CLIP layer and timm's stages checkpoint their
blocks, so gmod runs with --tower-checkpointing 1 (its checkpoint units: one CLIP layer, one ConvNeXt stage); the
LLM is not checkpointed on either side. Times are medians over --steps after --warmup, zero_grad outside the
timed region.

Without a checkout, or without transformers 4.31 / timm in the interpreter, it says so and exits 77 (ctest: skipped).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description="Step time (fwd+bwd, CPU, fp32) of a small LLaVA-HR model: gmod vs the "
                                             "original LLaVA-HR code, and the ratio.")
    ap.add_argument("--llava-hr", default=os.environ.get("GMOD_LLAVA_HR"),
                    help="LLaVA-HR checkout (default $GMOD_LLAVA_HR)")
    ap.add_argument("--size", type=int, default=768, help="input_image_size (multiple of 32; 768 -> 576 tokens)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--text", type=int, default=64, help="text tokens per sample besides the image tokens")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llm-hidden", type=int, default=512)
    ap.add_argument("--llm-layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--clip-hidden", type=int, default=256)
    ap.add_argument("--clip-layers", type=int, default=8, help="a multiple of 4 (the four quarters)")
    ap.add_argument("--convnext-dims", default="48,96,192,384")
    ap.add_argument("--convnext-depths", default="1,1,3,1")
    ap.add_argument("--bench-binary", default=os.path.join(ROOT, "build", "bench", "bench_model"))
    ap.add_argument("--keep", help="write the model dir here (default: a temporary dir)")
    return ap.parse_args()


def skip(why):
    print(f"compare_llava_hr: skipped: {why}")
    sys.exit(77)


def import_original(checkout, dims, depths):
    if not checkout or not os.path.isdir(os.path.join(checkout, "llava_hr")):
        skip("no LLaVA-HR checkout (pass --llava-hr DIR or set GMOD_LLAVA_HR; see the header for the recipe)")
    sys.path.insert(0, os.path.abspath(checkout))
    try:
        import timm  # noqa: F401
        import transformers
        if not transformers.__version__.startswith("4.31"):
            skip(f"transformers {transformers.__version__}; the original needs 4.31 (see the header)")
        from llava_hr.model.language_model.llava_llama import LlavaConfig, LlavaLlamaForCausalLM
        from llava_hr.model.multimodal_encoder import convnext as hr_convnext
        from llava_hr.model.multimodal_encoder import convnext_encoder
    except ImportError as e:
        skip(f"cannot import the original ({e}); see the header for the venv")

    class SizedConvNeXt(hr_convnext.ConvNeXt):
        # ConvNextVisionTower.load_model pins hidden_size to convnext_large_mlp's 1536; keep this net's width.
        hidden_size = property(lambda self: dims[-1], lambda self, v: None)

    def factory(pretrained=None, **kw):  # stands in for convnext_large_mlp(<hub name>) (a download)
        return SizedConvNeXt(depths=depths, dims=dims, head_hidden_size=dims[-1], num_classes=10)

    convnext_encoder.convnext_large_mlp = factory
    return LlavaConfig, LlavaLlamaForCausalLM


def build_original(a, tmp):
    dims = [int(x) for x in a.convnext_dims.split(",")]
    depths = [int(x) for x in a.convnext_depths.split(",")]
    LlavaConfig, LlavaLlamaForCausalLM = import_original(a.llava_hr, dims, depths)
    import torch
    from safetensors.torch import save_file
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel
    clip = dict(hidden_size=a.clip_hidden, intermediate_size=4 * a.clip_hidden, num_hidden_layers=a.clip_layers,
                num_attention_heads=max(1, a.clip_hidden // 64), image_size=336, patch_size=14,
                hidden_act="quick_gelu", layer_norm_eps=1e-5)
    heads = max(1, a.llm_hidden // 64)
    text = dict(vocab_size=a.vocab, hidden_size=a.llm_hidden, intermediate_size=int(2.6875 * a.llm_hidden),
                num_hidden_layers=a.llm_layers, num_attention_heads=heads, num_key_value_heads=heads,
                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, hidden_act="silu")
    clip_dir = os.path.join(tmp, "clip")
    torch.manual_seed(0)
    CLIPVisionModel(CLIPVisionConfig(**clip)).save_pretrained(clip_dir, safe_serialization=True)
    CLIPImageProcessor(size=336, crop_size=336).save_pretrained(clip_dir)
    cfg = LlavaConfig(**text, mm_vision_tower=clip_dir, vision_tower_slow="convnext_large_mlp.clip_laion2b_ft_320",
                      is_multipath_encoder=True, input_image_size=a.size, freeze_vision=False,
                      mm_vision_select_layer=-2, mm_vision_select_feature="patch", mm_projector_type="mlp2x_gelu",
                      mm_hidden_size=a.clip_hidden, delay_load=False)
    model = LlavaLlamaForCausalLM(cfg).float()
    # The LLaVA-HR dir gmod loads: the same weights in the original names, the two tower configs embedded.
    d = a.keep or os.path.join(tmp, "llava_hr")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.named_parameters()}, os.path.join(d, "model.safetensors"))
    c = cfg.to_dict()
    c.pop("delay_load", None)
    c["mm_vision_tower"] = "bench-clip (config embedded as vision_config)"
    c["vision_config"] = clip
    c["vision_config_slow"] = dict(depths=depths, dims=dims, norm_eps=1e-6)
    c["image_token_id"] = a.vocab  # gmod's placeholder for the expanded image positions
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return model, d


def original_step_ms(a, model, tokens_per_image):
    import torch
    torch.set_num_threads(a.threads)
    model.train()  # the original's training path (tower checkpointing); no dropout in this model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, a.vocab, (a.batch, a.text + 2), generator=g)  # + BOS and the image token
    ids[:, 1] = -200  # llava_hr.constants.IMAGE_TOKEN_INDEX: spliced to tokens_per_image features
    labels = ids.clone()
    labels[:, :2] = -100
    pixels = torch.randn(a.batch, 3, a.size, a.size, generator=g)
    times, loss = [], 0.0
    for s in range(a.warmup + a.steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=labels, images=pixels)
        out.loss.backward()
        t1 = time.perf_counter()
        loss = out.loss.item()
        if s >= a.warmup:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times), min(times), loss


def main():
    a = parse_args()
    if a.size % 32:
        raise SystemExit(f"--size {a.size} is not a multiple of 32")
    tokens_per_image = (max(a.size * 14 // 32, 336) // 14) ** 2
    seq = tokens_per_image + a.text + 1
    with tempfile.TemporaryDirectory() as tmp:
        model, d = build_original(a, tmp)
        cmd = [a.bench_binary, "--model", d, "--batch", str(a.batch), "--seq", str(seq), "--images", "1",
               "--tower-checkpointing", "1", "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--threads", str(a.threads), "--dtype", "fp32"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(out.strip())
        gmod_ms = float(re.search(r"median ([0-9.]+) ms", out).group(1))
        import torch
        import transformers
        med, mn, loss = original_step_ms(a, model, tokens_per_image)
    params = sum(p.numel() for n, p in model.named_parameters() if ".head." not in n)
    print(f"original LLaVA-HR (torch {torch.__version__}, transformers {transformers.__version__})  "
          f"batch={a.batch} seq={seq} images=1 threads={a.threads}  median {med:.1f} ms/step  (min {mn:.1f})  "
          f"loss {loss:.6f}")
    print(f"shape: input {a.size} px -> {tokens_per_image} image tokens, CLIP {a.clip_layers}x{a.clip_hidden}, "
          f"ConvNeXt dims {a.convnext_dims} depths {a.convnext_depths}, LLM {a.llm_layers}x{a.llm_hidden} "
          f"vocab {a.vocab}; {params / 1e6:.1f} M parameters")
    print(f"ratio original/gmod = {med / gmod_ms:.3f}  (>1: gmod faster)")


if __name__ == "__main__":
    sys.exit(main())
