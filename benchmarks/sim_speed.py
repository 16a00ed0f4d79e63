"""Simulator speed, measured side by side in one run: cbsim against Vidur, and cbsim at scale.

    python benchmarks/sim_speed.py [--skip-vidur] [--quick] [--only NAME ...] [--out DIR]

Each cbsim workload runs in its own child process pinned to one core (``taskset -c 0`` where
available), so wall time includes interpreter start-up and imports and peak memory is that
process's own maximum RSS. The child runs with compiled bytecode, as an installed package has
it: ``PYTHONDONTWRITEBYTECODE`` is dropped from its environment and one unmeasured warm-up run
writes the cache (Vidur, too, is measured warm: its predictors already trained). Vidur runs
through ``../shared/peers/vidur/vidur_run.sh`` (set up first with ``vidur_run.sh setup``;
skipped, and said so, when it is not there), pinned to the same core. Prints a table and
writes ``sim_speed_<date>.json``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "peers" / "vidur" / "vidur_run.sh"

# The peer comparison workload of shared/peers/vidur: Llama-2-7B on one A100, vLLM scheduler
# with a batch cap of 128 and a 4,096-token budget, Poisson 4 req/s, Zipf(0.6) total lengths
# 256-4,096 split 10:1 between prefill and decode.
VIDUR_WORKLOAD = {
    "name": "vidur_peer", "seed": 42, "model": "llama2-7b", "hardware": "a100-80g",
    "cost_model": {"kind": "roofline"},
    "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096,
               "enable_chunked_prefill": False, "max_model_len": 4096},
    "workload": {"num_requests": 10_000, "arrival": {"kind": "poisson", "rate": 4.0},
                 "total_len": {"kind": "zipf", "theta": 0.6, "min": 256, "max": 4096},
                 "prefill_decode_ratio": 10.0},
}

AZURE_CONV_HOUR = {
    "name": "azure_conv_hour", "seed": 1, "model": "llama3-8b", "hardware": "h200",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 16384},
    "workload": {"trace": {"path": "azure_conv"}},
}

# Issue #2's yardstick: 20,000 Poisson requests shaped like the Azure 2023 conversation trace
# (5.53 req/s; input median 1,020 / mean 1,155; output median 129 / mean 211).
AZURE_SHAPED_20K = {
    "name": "azure_shaped_20k", "seed": 2, "model": "llama3-8b", "hardware": "h200",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "workload": {"num_requests": 20_000, "arrival": {"kind": "poisson", "rate": 5.53},
                 "prompt_len": {"kind": "lognormal", "median": 1020, "sigma": 0.55, "min": 2,
                                "max": 8000},
                 "output_len": {"kind": "lognormal", "median": 129, "sigma": 1.0, "min": 1,
                                "max": 1000}},
}

_MIX = {
    "prompt_len": {"kind": "lognormal", "median": 1020, "sigma": 0.9, "min": 2, "max": 7000},
    "output_len": {"kind": "lognormal", "median": 129, "sigma": 1.0, "min": 1, "max": 1000},
}

SYNTHETIC_100K = {
    "name": "synthetic_100k", "seed": 3, "model": "llama3-8b", "hardware": "h200",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "workload": {"num_requests": 100_000, "arrival": {"kind": "gamma", "rate": 8.0, "cv": 1.5},
                 **_MIX},
}

# A day of traffic: a million requests over 24 h (11.6 req/s on average) on one H200.
DAY_1M = {
    "name": "day_1m", "seed": 4, "model": "llama3-8b", "hardware": "h200",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "workload": {"num_requests": 1_000_000, "arrival": {"kind": "poisson", "rate": 11.574},
                 "prompt_len": {"kind": "lognormal", "median": 600, "sigma": 0.9, "min": 2,
                                "max": 7000},
                 "output_len": {"kind": "lognormal", "median": 60, "sigma": 1.0, "min": 1,
                                "max": 1000}},
}

WORKLOADS = {w["name"]: w for w in (VIDUR_WORKLOAD, AZURE_SHAPED_20K, AZURE_CONV_HOUR,
                                     SYNTHETIC_100K, DAY_1M)}


def run_one(name: str) -> dict:
    """Child process: simulate one workload, report its own wall time and peak memory."""
    from sim.config import validate
    from sim.engine import simulate

    sc = validate(WORKLOADS[name], name)
    t0 = time.perf_counter()
    res = simulate(sc)
    sim_s = time.perf_counter() - t0
    s = res.summary
    tokens = s["total_input_tokens"] + s["total_output_tokens"]
    return {
        "workload": name, "requests": s["num_requests"], "completed": s["completed"],
        "steps": s["steps"], "sim_seconds": s["duration"], "sim_wall_s": sim_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens": tokens, "output_throughput": s["output_throughput"],
        "median_ttft_ms": s["median_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
        "median_e2el_ms": s["median_e2el_ms"],
    }


def check_exact(name: str, limit: int) -> dict:
    """Child process: the workload's first ``limit`` requests on the fast path and with
    ``simulation.exact_steps: true``; are the per-request records identical, in order?"""
    import copy

    from sim.config import validate
    from sim.engine import simulate

    data = copy.deepcopy(WORKLOADS[name])
    work = data["workload"]
    if work.get("num_requests", 0) > limit:
        work["num_requests"] = limit
    fast = simulate(validate(data, name))
    data.setdefault("simulation", {})["exact_steps"] = True
    exact = simulate(validate(data, name))
    same = (fast.frame().equals(exact.frame())
            and fast.records.ints["req_id"] == exact.records.ints["req_id"])
    return {"workload": name, "requests": len(fast.records), "identical": bool(same)}


def _pinned(cmd: list[str]) -> list[str]:
    import shutil

    return ["taskset", "-c", "0", *cmd] if shutil.which("taskset") else cmd


def measure_cbsim(name: str) -> dict:
    import subprocess

    cmd = _pinned([sys.executable, str(Path(__file__).resolve()), "--child", name])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as in an installed package
    env.setdefault("CBSIM_TRACE_PATH", str(ROOT.parent / "shared" / "traces"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"cbsim {name} failed: {proc.stderr.strip().splitlines()[-1:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["wall_s"] = wall
    row["requests_per_s"] = row["requests"] / wall
    row["tokens_per_s"] = row["tokens"] / wall
    return row


def measure_vidur(n: int) -> dict | None:
    home = os.environ.get("VIDUR_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "vidur-home"))
    if not VIDUR.exists() or not Path(home, "venv", "bin", "python").exists():
        return None
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.run(_pinned(["bash", str(VIDUR), "run", str(n)]), capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"vidur failed: {proc.stdout[-300:]}{proc.stderr[-300:]}")
        return None
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"workload": "vidur_peer", "simulator": "vidur 0.0.26", "requests": n, "wall_s": wall,
            "peak_rss_mb_children_max": peak, "stdout_tail": proc.stdout.strip().splitlines()[-1]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":  # measured: nothing else imported
        print(json.dumps(run_one(sys.argv[2])))
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--child-exact":
        print(json.dumps(check_exact(sys.argv[2], int(sys.argv[3]))))
        return
    import argparse
    import platform
    import shutil
    from datetime import date

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--only", nargs="*", choices=sorted(WORKLOADS))
    ap.add_argument("--skip-vidur", action="store_true")
    ap.add_argument("--quick", action="store_true", help="one try each instead of a median of 3")
    ap.add_argument("--exact-limit", type=int, default=20_000,
                    help="check fast path == exact_steps on up to this many requests of each "
                         "workload (0: skip)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()

    names = args.only or list(WORKLOADS)
    rows = []
    vidur = None
    if "vidur_peer" in names and not args.skip_vidur:
        n = VIDUR_WORKLOAD["workload"]["num_requests"]
        tries = [measure_vidur(n) for _ in range(1 if args.quick else 3)]
        if None in tries:
            print(f"Vidur not set up (run `bash {VIDUR} setup` first): peer comparison skipped")
        else:  # the median of three, as for cbsim's row
            tries.sort(key=lambda r: r["wall_s"])
            vidur = dict(tries[len(tries) // 2], wall_s_tries=[r["wall_s"] for r in tries])
            print(f"  vidur: {vidur['wall_s']:.1f} s", flush=True)
    measure_cbsim(names[0])  # warm-up, not counted: writes the bytecode cache
    for name in names:
        if name == "vidur_peer" and not args.quick:  # the median of three: a noisy machine
            tries = sorted((measure_cbsim(name) for _ in range(3)), key=lambda r: r["wall_s"])
            row = dict(tries[1], wall_s_tries=[r["wall_s"] for r in tries])
        else:
            row = measure_cbsim(name)
        rows.append(row)
        print(f"  {name}: {row['wall_s']:.2f} s", flush=True)

    print(f"\n{'workload':<18}{'requests':>10}{'wall s':>9}{'sim s':>10}{'peak MB':>9}"
          f"{'req/s':>11}{'tok/s':>13}{'steps':>11}")
    for r in rows:
        print(f"{r['workload']:<18}{r['requests']:>10,}{r['wall_s']:>9.2f}{r['sim_seconds']:>10.0f}"
              f"{r['peak_rss_mb']:>9.0f}{r['requests_per_s']:>11,.0f}{r['tokens_per_s']:>13,.0f}"
              f"{r['steps']:>11,}")
    exact = []
    if args.exact_limit:
        import subprocess

        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.setdefault("CBSIM_TRACE_PATH", str(ROOT.parent / "shared" / "traces"))
        print()
        for name in names:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-exact",
                                   name, str(args.exact_limit)], capture_output=True, text=True,
                                  env=env)
            if proc.returncode != 0:
                raise SystemExit(f"exactness check {name} failed: {proc.stderr[-300:]}")
            check = json.loads(proc.stdout.strip().splitlines()[-1])
            exact.append(check)
            print(f"fast path vs exact_steps, {name} ({check['requests']:,} requests): "
                  f"{'identical' if check['identical'] else 'DIFFERENT'}")
    ratio = None
    if vidur is not None:
        ours = next(r for r in rows if r["workload"] == "vidur_peer")
        ratio = vidur["wall_s"] / ours["wall_s"]
        print(f"\nVidur on the same workload: {vidur['wall_s']:.1f} s wall "
              f"(cbsim {ours['wall_s']:.2f} s): cbsim is {ratio:.0f}x faster")
    result = {
        "date": date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "pinned_to_one_core": bool(shutil.which("taskset"))},
        "cbsim": rows, "vidur": vidur, "vidur_over_cbsim": ratio, "exact_check": exact,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sim_speed_{date.today().isoformat()}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
