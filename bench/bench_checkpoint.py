#!/usr/bin/env python3
"""Checkpoint save/load speed: gmod (sync and async) beside torch.save/torch.load of the same state by the same
ranks and beside the disk's own bandwidth (dd), in one run, at each model size and rank count given.

For every (--params P, --ranks N): `mpirun -np N bench_checkpoint_io --params P` (gmod, see its header), then the
peer: N Python ranks (torch.distributed, gloo, for the barriers), each saving with torch.save + fsync the same bytes
(its share of the P fp32 weights plus its 3 x P / N optimizer shard) into its own file, then torch.load-ing it.
Disk bandwidth: dd of the whole checkpoint's size, direct (oflag=direct) and buffered with a final fsync
(conv=fsync, what a save that fsyncs gets). Page cache warm for the loads (nothing is dropped).

    python bench/bench_checkpoint.py --bench-binary build/bench/bench_checkpoint_io [--params 16e6,64e6]
        [--ranks 1,2,3] [--dir DIR] [--reps 2] [--threads 1]

Targets (issue 30): sync save >= 0.8 of the disk's bandwidth; async stall <= a host copy of the state;
load <= 1.2 x torch.load.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def dd_rate(path, nbytes, flags):
    bs = 8 << 20
    count = max(1, nbytes // bs)
    r = subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", f"count={count}"] + flags,
                       capture_output=True, text=True)
    os.unlink(path) if os.path.exists(path) else None
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "dd failed"
    m = re.search(r"(\d+) bytes .* copied, ([0-9.e+-]+) s", r.stderr)
    return (int(m.group(1)) / float(m.group(2)), "") if m else (None, r.stderr)


def torch_save_load(state, path, reps, before_load=None):
    """The peer's part on one rank (torch.distributed initialised): the fastest of `reps` torch.save + fsync of
    `state` into `path` and of `reps` torch.load of it, each the slowest rank's; and the bytes of all ranks' files.
    `before_load(path)`, when given, runs before each load, untimed (e.g. evicting the file from the page cache)."""
    import torch
    import torch.distributed as dist
    best_save = best_load = 1e30
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best_save = min(best_save, t.item())
    nbytes = torch.tensor([os.path.getsize(path)], dtype=torch.float64)
    dist.all_reduce(nbytes)
    for _ in range(reps):
        if before_load:
            before_load(path)
        dist.barrier()
        t0 = time.perf_counter()
        back = torch.load(path, map_location="cpu")
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best_load = min(best_load, t.item())
        assert torch.equal(back["optim"]["master"], state["optim"]["master"])
    return best_save, best_load, nbytes.item()


def peer_rank(args):
    """One rank of the torch peer (started by mpirun: OMPI_COMM_WORLD_RANK/SIZE)."""
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank, world_size=world)
    n_tensors, params = 24, int(float(args.params))
    torch.manual_seed(1234)
    model = {f"layers.{i}.weight": torch.randn(params // n_tensors + (1 if i < params % n_tensors else 0))
             for i in range(n_tensors)}
    names = sorted(model, key=lambda n: -model[n].numel())
    load, mine = [0] * world, {}
    for n in names:  # the same split by bytes as gmod's (largest first onto the least loaded rank)
        r = min(range(world), key=lambda k: load[k])
        load[r] += model[n].numel()
        if r == rank:
            mine[n] = model[n]
    per = (params + world - 1) // world
    size = max(0, min(params, per * (rank + 1)) - min(params, per * rank))
    state = {"model": mine, "optim": {k: torch.randn(size) for k in ("master", "exp_avg", "exp_avg_sq")}}
    path = os.path.join(args.peer_dir, f"rank-{rank}.pt")
    best_save, best_load, nbytes = torch_save_load(state, path, args.reps)
    if rank == 0:
        print(json.dumps({"peer_save_s": best_save, "peer_load_s": best_load, "peer_bytes": nbytes}))
    dist.destroy_process_group()


def mpirun(n):
    return ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"]


def last_json(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no result line in:\n" + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-binary", default="build/bench/bench_checkpoint_io")
    ap.add_argument("--params", default="16e6,64e6")
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir beside the build)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--peer-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--peer-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_rank:
        return peer_rank(args)

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    base = args.dir or tempfile.mkdtemp(prefix="gmod-bench-ckpt-", dir=os.path.dirname(os.path.abspath(args.bench_binary)))
    os.makedirs(base, exist_ok=True)
    rows = []
    try:
        for p in args.params.split(","):
            params = int(float(p))
            dd_direct, why = dd_rate(os.path.join(base, "dd.bin"), params * 16, ["oflag=direct"])
            dd_fsync, _ = dd_rate(os.path.join(base, "dd.bin"), params * 16, ["conv=fsync"])
            for n in (int(x) for x in args.ranks.split(",")):
                g = subprocess.run(mpirun(n) + [args.bench_binary, "--params", str(params), "--dir", base, "--reps",
                                                str(args.reps), "--threads", str(args.threads), "--step-ms",
                                                str(args.step_ms)], capture_output=True, text=True, env=env)
                if g.returncode != 0:
                    sys.exit(f"bench_checkpoint_io failed (np {n}):\n{g.stdout}\n{g.stderr}")
                row = last_json(g.stdout)
                peer_dir = os.path.join(base, f"peer-np{n}")
                os.makedirs(peer_dir, exist_ok=True)
                store = os.path.join(base, f"store-np{n}-{time.time_ns()}")
                t = subprocess.run(mpirun(n) + [sys.executable, os.path.abspath(__file__), "--peer-rank", "--params",
                                                str(params), "--reps", str(args.reps), "--threads", str(args.threads),
                                                "--store", store, "--peer-dir", peer_dir],
                                   capture_output=True, text=True, env=env)
                shutil.rmtree(peer_dir, ignore_errors=True)
                if t.returncode != 0:
                    sys.exit(f"torch peer failed (np {n}):\n{t.stdout}\n{t.stderr}")
                row.update(last_json(t.stdout))
                row.update(dd_direct=dd_direct, dd_fsync=dd_fsync)
                rows.append(row)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)

    gbs = lambda b, s: b / s / 1e9
    print(f"checkpoint I/O: fp32 weights + ZeRO-1 AdamW state (16 B/param), {args.threads} thread(s) per rank, "
          f"best of {args.reps}, page cache warm for loads")
    hdr = ("params", "np", "GB", "dd direct", "dd fsync", "gmod sync", "torch.save", "save/dd", "save/torch",
           "async stall", "async total", "gmod load", "of it check", "torch.load", "load ratio", "step ms",
           "step ms+save", "+save nice0")
    print(("{:>8} {:>3} {:>6} " + "{:>11} " * (len(hdr) - 3)).format(*hdr))
    for r in rows:
        dd = r["dd_direct"] or r["dd_fsync"]
        print(("{:>8} {:>3} {:>6.2f} " + "{:>11} " * (len(hdr) - 3)).format(
            f"{r['params'] / 1e6:.0f}M", r["world"], r["bytes"] / 1e9,
            f"{r['dd_direct'] / 1e9:.2f} GB/s" if r["dd_direct"] else "n/a",
            f"{r['dd_fsync'] / 1e9:.2f} GB/s" if r["dd_fsync"] else "n/a",
            f"{gbs(r['bytes'], r['sync_save_s']):.2f} GB/s", f"{gbs(r['peer_bytes'], r['peer_save_s']):.2f} GB/s",
            f"{r['bytes'] / r['sync_save_s'] / dd:.2f}", f"{r['peer_save_s'] / r['sync_save_s']:.2f}x",
            f"{r['async_stall_s'] * 1e3:.0f} ms", f"{r['async_total_s']:.2f} s",
            f"{gbs(r['bytes'], r['load_s']):.2f} GB/s", f"{r['load_verify_s']:.2f} s",
            f"{gbs(r['peer_bytes'], r['peer_load_s']):.2f} GB/s",
            f"{r['load_s'] / r['peer_load_s']:.2f}", f"{r['step_alone_ms']:.0f}",
            f"{r['step_inflight_ms']:.0f} ({r['inflight_steps']})", f"{r['step_inflight_plain_ms']:.0f}"))
    if rows and "crc_gbps" in rows[0]:
        print(f"CRC-32 kernel alone (component figure, 256 MiB in memory): gmod (ISA-L) {rows[0]['crc_gbps']:.1f} GB/s, "
              f"zlib {rows[0]['zlib_crc_gbps']:.1f} GB/s")
    print("save/dd: gmod's sync save rate over dd's direct write (target >= 0.8); save/torch: torch.save time over "
          "gmod's; of it check: the resume's check of every file before loading (spread over the ranks; HDF5 "
          "metadata and small datasets, the large tensors' CRCs are checked as they are read) inside gmod's load "
          "time; load ratio: gmod load time over torch.load's (target <= 1.2; gmod also checks every byte's CRC "
          "and broadcasts the weights to every rank); step ms+save: the stand-in step while the async write is in "
          "flight (steps overlapped), the writer at background priority (nice +10, the trainer's default); "
          "+save nice0: the same with the writer at the trainer's priority")


if __name__ == "__main__":
    sys.exit(main())
