"""The notebooks execute, and the numbers their plots are drawn from say what the text claims."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pandas as pd
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute(name: str, out: Path) -> None:
    book = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    env_before = os.environ.get("CBSIM_NOTEBOOK_OUT")
    os.environ["CBSIM_NOTEBOOK_OUT"] = str(out)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        NotebookClient(book, timeout=180, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        if env_before is None:
            os.environ.pop("CBSIM_NOTEBOOK_OUT", None)
        else:
            os.environ["CBSIM_NOTEBOOK_OUT"] = env_before
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors


def test_static_vs_continuous(tmp_path):
    execute("static_vs_continuous", tmp_path)
    out = tmp_path / "static_vs_continuous"
    summary = json.loads((out / "timeline_summary.json").read_text())
    share = "useful slot share (first 600 steps)"
    assert summary["continuous"][share] > summary["static"][share]
    assert summary["continuous"]["output tok/s"] > summary["static"]["output tok/s"]
    ratios = pd.read_parquet(out / "throughput_ratio.parquet")
    # Equal lengths: static batching is as good (continuous pays for prefills interleaved with
    # decodes); the wider the spread of output lengths, the more continuous batching gains.
    assert ratios.ratio.iloc[0] > 0.8 and (ratios.ratio.iloc[1:] > 1.2).all()
    assert ratios.ratio.is_monotonic_increasing and ratios.ratio.iloc[-1] > 2.5
    html = (out / "slot_animation.html").read_text()
    assert "http://" not in html and "https://" not in html and "src=" not in html
    assert '"static"' in html and '"continuous"' in html
    for stem in ("slot_timelines", "throughput_ratio", "timeseries"):
        assert (out / f"{stem}.png").exists() and (out / f"{stem}.svg").exists()


def test_capacity_planning(tmp_path):
    execute("capacity_planning", tmp_path)
    out = tmp_path / "capacity_planning"
    sat = pd.read_parquet(out / "saturation/sweep/results.parquet").set_index("engine.max_num_seqs")
    thr = sat.output_throughput
    # Rises with max_num_seqs while the KV cache has room...
    assert thr.loc[:64].is_monotonic_increasing and thr[64] > 10 * thr[1]
    # ...and stops rising once memory saturates (KV full, preemptions).
    assert sat.kv_usage_max[128] > 0.95 and sat.preemptions[256] > 0
    assert thr[256] < 1.05 * thr[128]
    # Each request's inter-token latency rises with the batch.
    assert sat.median_tpot_ms.is_monotonic_increasing and sat.median_tpot_ms[256] > 2 * sat.median_tpot_ms[1]
    rec = json.loads((out / "plan/plan/recommendation.json").read_text())["recommended"]
    assert rec["at_target"]["slo_met"] and rec["fewer_replicas"] < rec["replicas"]
    assert (out / "max_num_seqs.png").exists() and (out / "plan/plan/capacity.svg").exists()


def test_policy_comparison(tmp_path):
    execute("policy_comparison", tmp_path)
    out = tmp_path / "policy_comparison"
    rates = pd.read_parquet(out / "rates/sweep/results.parquet")
    ttft = rates.pivot(index="rate", columns="variant", values="p99_ttft_ms")
    assert (ttft["continuous"] <= ttft["static"]).all()
    thr = rates.pivot(index="rate", columns="variant", values="request_throughput")
    assert thr["continuous"].max() > 1.5 * thr["static"].max()
    tenants = pd.read_parquet(out / "tenants.parquet")
    assert set(tenants.tenant) == {"chat", "rag", "batch"} and set(tenants.run) == {
        "static", "orca", "continuous"}
    by = tenants.set_index(["run", "tenant"]).p99_ttft_ms
    assert by["continuous", "chat"] < by["static", "chat"]
    routers = json.loads((out / "routers.json").read_text())
    imb = routers["imbalance (max/mean routed)"]
    assert imb["round_robin"] <= imb["random"] and imb["least_outstanding"] < imb["random"]
    p99 = routers["P99 TTFT ms"]
    assert p99["least_outstanding"] < p99["random"]
    assert (out / "latency_throughput.png").exists() and (out / "tenants.png").exists()
