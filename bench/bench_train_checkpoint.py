#!/usr/bin/env python3
"""Checkpoint save, async stall and load as `gmod train` does them (the product path), beside dd and
torch.save/torch.load of the same split state by the same number of ranks, in one run.

For each model (--models NAME=DIR: a config dir as configs/demo_model, random init, fp32 + AdamW, ZeRO-1, the
vision tower trained) and each rank count (--ranks):
  1. `mpirun -np N gmod train` for --steps steps with no checkpoint (the baseline wall time), then the same with a
     synchronous checkpoint after every step: the save time is the trainer's own line, `checkpoint: DIR (N ms)
     [prepare, write, sync, commit, sync]`, from the step's end to the commit (the median over the saves after
     the first); the bytes are the checkpoint directory's.
  2. The same run with `checkpoint.async: true`: the stall is the trainer's own `copied to host in N ms` line, and
     the cost to training is the run's wall time over the baseline's, per save (steps slowed by the background
     write included).
  3. A resume of the last synchronous checkpoint, its files read once before (page cache warm, as the peer's
     load: a save writes the large datasets with O_DIRECT, which leaves them out of the page cache): the trainer's
     own figure, `files checked in A ms, state read and its tensors' CRCs checked in B ms` (A + B). With --cold,
     the checkpoint's files are instead evicted from the page cache (fsync + POSIX_FADV_DONTNEED) before the
     resume, and the peer's file before each torch.load: both loads read the disk, as a resume after a crash or
     a reboot usually does (the bytes `fincore` still finds cached after each eviction are in the JSON rows).
  4. The peer: N Python ranks, each torch.save + fsync of the same tensors gmod's rank wrote (the model tensors
     of its model file, their shapes from `gmod export` of the checkpoint, and its optimizer shard: master,
     exp_avg, exp_avg_sq of the same size), then torch.load of that file; dd of the checkpoint's bytes (direct and
     fsync'ed), in the same run.

    python bench/bench_train_checkpoint.py --gmod build/bin/gmod \\
        [--models demo=configs/demo_model,smollm2=configs/bench_smollm2_llava] [--ranks 1,2,3] [--steps 4] [--dir D] [--cold]

Targets (issue 47): sync save >= 0.8 of dd; async stall <= 1.2 x a host copy of the rank's state (first save
included); load <= 1.2 x torch.load.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_checkpoint import dd_rate, mpirun, torch_save_load  # noqa: E402  (the component bench's dd, mpirun, peer)


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def train(gmod, n, base, model, run_dir, steps, sets, log):
    cmd = mpirun(n) + [gmod, "train", "--threads", "1", "--config", os.path.join(ROOT, "configs/demo.json"),
                       "--set", f"model.path={model}", "--set", "mod.enabled=false",
                       "--set", f"data.train={base}/data/train.json", "--set", f"eval.data={base}/data/heldout.json",
                       "--set", "eval.every=0", "--set", f"run_dir={run_dir}", "--set", f"schedule.max_steps={steps}",
                       "--set", "batch.micro_batch=1", "--set", f"batch.global_batch={n}", "--set", "metrics.log_every=1"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    with open(log, "a") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr + "\n")
    if r.returncode != 0:
        sys.exit(f"gmod train failed (np {n}, see {log}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, r.stdout + r.stderr


def warm(path):
    """Reads every file of a directory once, so that a load after it reads from the page cache."""
    for fn in sorted(os.listdir(path)):
        with open(os.path.join(path, fn), "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def evict(paths):
    """Drops files from the page cache (fsync, then POSIX_FADV_DONTNEED; no root needed), as after a reboot or a
    crash on a node whose memory went to other work: a load after it reads the disk. Returns the bytes still
    cached afterwards (from `fincore` where util-linux has it, else None), so that a run shows the eviction held."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not shutil.which("fincore"):
        return None
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES"] + list(paths), capture_output=True,
                       text=True)
    return sum(int(x) for x in r.stdout.split()) if r.returncode == 0 else None


def dir_files(path):
    return [os.path.join(path, f) for f in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, f))]


def peer_rank(args):
    """One rank of the torch peer (started by mpirun): torch.save + fsync, then torch.load, of this rank's share."""
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank, world_size=world)
    spec = json.load(open(args.spec))[rank]
    g = torch.Generator().manual_seed(rank)
    state = {"model": {n: torch.randn(shape, generator=g) for n, shape in spec["model"]},
             "optim": {k: torch.randn(spec["shard"], generator=g) for k in ("master", "exp_avg", "exp_avg_sq")}}
    path = os.path.join(args.peer_dir, f"rank-{rank}.pt")
    cached = []
    before_load = (lambda p: cached.append(evict([p]))) if args.cold else None
    best_save, best_load, nbytes = torch_save_load(state, path, args.reps, before_load)
    copy = 1e30  # a host copy of this rank's state (what an async save's stall should cost)
    for _ in range(args.reps):
        t0 = time.perf_counter()
        _ = {k: {n: t.clone() for n, t in d.items()} for k, d in state.items()}
        copy = min(copy, time.perf_counter() - t0)
    t = torch.tensor([copy], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    copy = t.item()
    if rank == 0:
        print(json.dumps({"peer_save_s": best_save, "peer_load_s": best_load, "peer_bytes": nbytes,
                          "host_copy_s": copy, "peer_cached_after_evict": cached}))
    dist.destroy_process_group()


def safetensors_shapes(path):
    """{name: shape} from a .safetensors header (no tensor is read)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def peer_spec(gmod, ckpt, n, work, log):
    """Per rank: the model tensors (name, shape) of its model file and its optimizer shard's element count."""
    export = os.path.join(work, "export")
    shutil.rmtree(export, ignore_errors=True)
    r = subprocess.run([gmod, "export", "--checkpoint", ckpt, "--out", export], capture_output=True, text=True,
                       cwd=ROOT)
    with open(log, "a") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"gmod export failed (see {log})")
    shapes = {}
    for fn in os.listdir(export):
        if fn.endswith(".safetensors"):
            shapes.update(safetensors_shapes(os.path.join(export, fn)))
    # Which rank wrote which tensor: gmod's split (largest first onto the least loaded rank; ties, being the same
    # size, give every rank the same bytes in either order).
    numel = {k: max(1, math.prod(s)) for k, s in shapes.items()}
    load, owner = [0] * n, {}
    for k in sorted(numel, key=lambda k: (-numel[k], k)):
        r = min(range(n), key=lambda i: load[i])
        load[r] += numel[k]
        owner[k] = r
    spec = []
    for r in range(n):
        optim = os.path.join(ckpt, f"optim-rank-{r}.h5")
        spec.append({"model": [(k, shapes[k]) for k in shapes if owner[k] == r],
                     "shard": os.path.getsize(optim) // 12})
    return spec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gmod", default=os.path.join(ROOT, "build/bin/gmod"))
    ap.add_argument("--models", default="demo=configs/demo_model,smollm2=configs/bench_smollm2_llava")
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the peer's save and load (fastest)")
    ap.add_argument("--dir", default=None, help="where runs go (default: a temp dir under build/)")
    ap.add_argument("--keep", action="store_true", help="keep the runs and logs")
    ap.add_argument("--cold", action="store_true",
                    help="evict the checkpoint's and the peer's files from the page cache before each timed load "
                         "(fsync + POSIX_FADV_DONTNEED), instead of reading the checkpoint once before the resume")
    ap.add_argument("--peer-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--peer-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_rank:
        return peer_rank(args)

    # Absolute: the torch peer's file:// store URL takes a relative --dir's first folder as a host name.
    base = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="gmod-bench-train-ckpt-",
                                                        dir=os.path.join(ROOT, "build")))
    os.makedirs(base, exist_ok=True)
    log = os.path.join(base, "log.txt")
    r = subprocess.run([args.gmod, "data", "demo", "--out", os.path.join(base, "data")], capture_output=True,
                       text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit("gmod data demo failed:\n" + r.stdout + r.stderr)
    rows = []
    try:
        for spec in args.models.split(","):
            name, model = spec.split("=", 1)
            model = os.path.join(ROOT, model) if not os.path.isabs(model) else model
            for n in (int(x) for x in args.ranks.split(",")):
                work = os.path.join(base, f"{name}-np{n}")
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work)
                s = args.steps
                base_wall, _ = train(args.gmod, n, base, model, os.path.join(work, "none"), s,
                                     ["checkpoint.every=0", "resume=none"], log)
                sync_wall, out = train(args.gmod, n, base, model, os.path.join(work, "sync"), s,
                                       ["checkpoint.every=1", "checkpoint.keep_last=2", "resume=none"], log)
                saves = [int(m) for m in re.findall(r"checkpoint: \S+ \((\d+) ms\) \[", out)]
                if len(saves) < 2:
                    sys.exit(f"expected {s} checkpoint lines, got {len(saves)} (see {log})")
                ckpt = os.path.join(work, "sync", "checkpoints", f"step-{s}")
                nbytes = dir_bytes(ckpt)
                async_wall, out_a = train(args.gmod, n, base, model, os.path.join(work, "async"), s,
                                          ["checkpoint.every=1", "checkpoint.keep_last=2", "checkpoint.async=true",
                                           "resume=none"], log)
                # Each async save's line: the copy, and the wait for the previous save's write before it (if any).
                lines = [ln for ln in out_a.splitlines() if "copied to host in" in ln]
                copies = [int(re.search(r"copied to host in (\d+) ms", ln).group(1)) for ln in lines]
                waits = [int((re.search(r"waited (\d+) ms", ln) or [0, 0])[1]) for ln in lines]
                stalls = [c + w for c, w in zip(copies, waits)]
                cached = None
                if args.cold:
                    cached = evict(dir_files(ckpt))
                else:
                    warm(ckpt)
                _, out_r = train(args.gmod, n, base, model, os.path.join(work, "sync"), s + 1,
                                 ["checkpoint.every=0", "resume=auto"], log)
                m = re.search(r"files checked in (\d+) ms, state read and its tensors' CRCs checked in (\d+) ms", out_r)
                if not m:
                    sys.exit(f"no resume line (see {log})")
                load_s = (int(m.group(1)) + int(m.group(2))) / 1e3
                dd_direct, _ = dd_rate(os.path.join(work, "dd.bin"), nbytes, ["oflag=direct"])
                dd_fsync, _ = dd_rate(os.path.join(work, "dd.bin"), nbytes, ["conv=fsync"])
                pspec = peer_spec(args.gmod, ckpt, n, work, log)
                spec_path = os.path.join(work, "peer_spec.json")
                json.dump(pspec, open(spec_path, "w"))
                peer_dir = os.path.join(work, "peer")
                os.makedirs(peer_dir)
                t = subprocess.run(mpirun(n) + [sys.executable, os.path.abspath(__file__), "--peer-rank", "--spec",
                                                spec_path, "--store", os.path.join(work, f"store-{time.time_ns()}"),
                                                "--peer-dir", peer_dir, "--reps", str(args.reps)]
                                   + (["--cold"] if args.cold else []),
                                   capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
                if t.returncode != 0:
                    sys.exit(f"torch peer failed (np {n}):\n{t.stdout}\n{t.stderr}")
                peer = json.loads([ln for ln in t.stdout.splitlines() if ln.startswith("{")][-1])
                rows.append(dict(model=name, world=n, bytes=nbytes, saves_ms=saves, save_s=statistics.median(saves[1:]) / 1e3,
                                 stalls_ms=stalls, copies_ms=copies, waits_ms=waits, async_cost_s=(async_wall - base_wall) / s,
                                 sync_cost_s=(sync_wall - base_wall) / s, load_s=load_s, ckpt_cached_after_evict=cached,
                                 dd_direct=dd_direct,
                                 dd_fsync=dd_fsync, **peer))
                print(json.dumps(rows[-1]), flush=True)
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)

    gbs = lambda b, s: b / s / 1e9
    print(f"\ncheckpoints inside `gmod train` (fp32 + AdamW, ZeRO-1, {args.steps} steps, a save after each): "
          "the trainer's own figures beside dd and the torch peer, page cache "
          + ("COLD for loads (files evicted before each)" if args.cold else "warm for loads"))
    hdr = ("model", "np", "GB", "dd direct", "gmod save", "save/dd", "torch.save", "stall (1st)", "of it wait",
           "host copy", "copy/host", "async cost", "gmod load", "torch.load", "load ratio")
    fmt = "{:>8} {:>3} {:>6} " + "{:>12} " * (len(hdr) - 3)
    print(fmt.format(*hdr))
    for r in rows:
        dd = r["dd_direct"] or r["dd_fsync"]
        max_copy = max(r["copies_ms"]) / 1e3 if r["copies_ms"] else float("nan")
        print(fmt.format(r["model"], r["world"], f"{r['bytes'] / 1e9:.2f}",
                         f"{dd / 1e9:.2f} GB/s", f"{gbs(r['bytes'], r['save_s']):.2f} GB/s",
                         f"{r['bytes'] / r['save_s'] / dd:.2f}", f"{gbs(r['peer_bytes'], r['peer_save_s']):.2f} GB/s",
                         f"{max(r['stalls_ms'] or [0])} ms ({r['stalls_ms'][0] if r['stalls_ms'] else '-'})",
                         f"{max(r['waits_ms'] or [0])} ms",
                         f"{r['host_copy_s'] * 1e3:.0f} ms", f"{max_copy / r['host_copy_s']:.2f}",
                         f"{r['async_cost_s'] * 1e3:.0f} ms", f"{gbs(r['bytes'], r['load_s']):.2f} GB/s",
                         f"{gbs(r['peer_bytes'], r['peer_load_s']):.2f} GB/s",
                         f"{r['load_s'] / r['peer_load_s']:.2f}"))
    print("gmod save: the trainer's `checkpoint: DIR (N ms)` (median of the saves after the first); save/dd: over dd "
          "oflag=direct of the same bytes (target >= 0.8); stall: what an async save held training (largest, first): "
          "its copy to host plus, when the previous save was still writing, the wait for it (of it wait, largest); "
          "host copy: a clone of one rank's state in torch; copy/host: the largest copy (first save included) over "
          "it (target <= 1.2); async cost: "
          "the async run's wall time over the run without saves, per save (stall and steps slowed by the write); "
          "gmod load: the trainer's resume line (check before loading + read with CRCs); load ratio: over "
          "torch.load of the same tensors (target <= 1.2)")


if __name__ == "__main__":
    sys.exit(main())
