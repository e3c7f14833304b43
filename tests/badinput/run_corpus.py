#!/usr/bin/env python3
"""The bad-input corpus: every case is a bad value, file or dataset run through a gmod subcommand, which must
refuse it with a named error -- exit code != 0, no signal, the expected message fragment, within its timeout.

Python standard library only (CI runs it as ctest `badinput_corpus`). Cases live in tests/badinput/cases_*.py;
the runner imports every one of them. Each module defines

    def cases(ctx) -> list[dict]

where ctx has: gmod (the gmod binary), root (repo root), tmp (a fresh temp dir for this module), demo_data (a
directory with a demo dataset as `gmod data demo` writes it: images/, train.json, heldout.json; generated once)
and write(relpath, text_or_bytes) -> absolute path (a file under tmp, parent dirs created). A case is a dict:

    name     str, unique over the corpus
    argv     list of str, the arguments after the gmod binary
    env      dict, optional: added to the environment
    cwd      str, optional: working directory (default: the repo root)
    expect   regex that must occur in stdout+stderr (re.search, DOTALL)
    rc       int, optional: the exact exit code (default: any code from 1 to 127)
    timeout  seconds, optional (default 60): running longer is a failure (a hang), the process group is killed

Usage: run_corpus.py --gmod build/bin/gmod [--root .] [--filter REGEX] [--jobs N] [--keep] [--list]
Prints one line per case (PASS/FAIL, name, rc, elapsed) and a summary; exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CASE_KEYS = {"name", "argv", "env", "cwd", "expect", "rc", "timeout"}


class Context:
    def __init__(self, gmod, root, tmp, demo_data):
        self.gmod = gmod
        self.root = root
        self.tmp = tmp
        self.demo_data = demo_data

    def write(self, relpath, content):
        path = os.path.join(self.tmp, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mode = "wb" if isinstance(content, (bytes, bytearray)) else "w"
        with open(path, mode) as f:
            f.write(content)
        return path


def run_case(case, gmod, root):
    """Returns (ok, rc, elapsed, why, output)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.update({k: str(v) for k, v in case.get("env", {}).items()})
    timeout = case.get("timeout", 60)
    t0 = time.monotonic()
    proc = subprocess.Popen([gmod] + list(case["argv"]), cwd=case.get("cwd", root), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        text = out.decode("utf-8", "replace")
        return False, None, time.monotonic() - t0, f"no exit within {timeout} s (hang?)", text
    elapsed = time.monotonic() - t0
    rc = proc.returncode
    text = out.decode("utf-8", "replace")
    if rc < 0:
        return False, rc, elapsed, f"killed by signal {-rc} ({signal.Signals(-rc).name})", text
    if "rc" in case:
        if rc != case["rc"]:
            return False, rc, elapsed, f"exit code {rc}, expected {case['rc']}", text
    elif rc == 0:
        return False, rc, elapsed, "exit code 0: the bad input was accepted", text
    elif rc >= 128:
        return False, rc, elapsed, f"exit code {rc} (a signal through a shell or mpirun?)", text
    if not re.search(case["expect"], text, re.DOTALL):
        return False, rc, elapsed, f"output lacks /{case['expect']}/", text
    return True, rc, elapsed, "", text


def check_case(case, module):
    where = f"{module}: case {case.get('name', '?')!r}"
    if not isinstance(case, dict):
        raise ValueError(f"{module}: a case is not a dict: {case!r}")
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    for key in ("name", "argv", "expect"):
        if key not in case:
            raise ValueError(f"{where}: missing '{key}'")
    if not isinstance(case["argv"], list) or not all(isinstance(a, str) for a in case["argv"]):
        raise ValueError(f"{where}: argv must be a list of str")
    re.compile(case["expect"])


def make_demo_data(gmod, root, out):
    cmd = [gmod, "data", "demo", "--out", out, "--train", "16", "--heldout", "4", "--image-size", "32", "--seed", "1"]
    r = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0:
        sys.exit("run_corpus: cannot make the demo dataset: " + " ".join(cmd) + "\n" + r.stdout.decode())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gmod", required=True, help="the gmod binary")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(here)), help="repo root")
    ap.add_argument("--filter", default="", help="run only cases whose name matches this regex")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (its path is printed)")
    ap.add_argument("--list", action="store_true", help="print the case names (per module) and exit")
    args = ap.parse_args()
    gmod = os.path.abspath(args.gmod)
    root = os.path.abspath(args.root)
    if not os.access(gmod, os.X_OK):
        sys.exit(f"run_corpus: {gmod} is not an executable")

    t_start = time.monotonic()
    base = tempfile.mkdtemp(prefix="gmod-badinput-")
    demo_data = os.path.join(base, "demo_data")
    make_demo_data(gmod, root, demo_data)

    cases, names = [], set()
    modules = sorted(f for f in os.listdir(here) if f.startswith("cases_") and f.endswith(".py"))
    if not modules:
        sys.exit(f"run_corpus: no cases_*.py in {here}")
    for fname in modules:
        mod_name = fname[:-3]
        spec = importlib.util.spec_from_file_location(mod_name, os.path.join(here, fname))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        tmp = os.path.join(base, mod_name)
        os.makedirs(tmp)
        for case in module.cases(Context(gmod, root, tmp, demo_data)):
            check_case(case, fname)
            if case["name"] in names:
                raise ValueError(f"{fname}: duplicate case name {case['name']!r}")
            names.add(case["name"])
            cases.append(case)
            case["module"] = fname
    selected = [c for c in cases if re.search(args.filter, c["name"])]
    if args.list:
        for c in selected:
            print(f"{c['module']}: {c['name']}")
        print(f"{len(selected)} case(s)")
        shutil.rmtree(base, ignore_errors=True)
        return
    print(f"bad-input corpus: {len(selected)} case(s) from {len(modules)} module(s), "
          f"set up in {time.monotonic() - t_start:.1f} s", flush=True)

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [(c, pool.submit(run_case, c, gmod, root)) for c in selected]
        for case, fut in futures:
            ok, rc, elapsed, why, out = fut.result()
            print(f"{'PASS' if ok else 'FAIL'}  {case['name']:<48} rc={rc}  {elapsed:6.2f} s", flush=True)
            if not ok:
                failed.append(case["name"])
                tail = "\n".join(out.strip().splitlines()[-15:])
                print(f"      why: {why}\n      argv: gmod {' '.join(case['argv'])}\n      output (tail):\n"
                      + "\n".join("        " + line for line in tail.splitlines()), flush=True)

    total = time.monotonic() - t_start
    print(f"summary: {len(selected) - len(failed)} passed, {len(failed)} failed of {len(selected)} "
          f"in {total:.1f} s" + (": " + ", ".join(failed) if failed else ""))
    if args.keep:
        print(f"temp dir kept: {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(1 if failed or not selected else 0)


if __name__ == "__main__":
    main()
