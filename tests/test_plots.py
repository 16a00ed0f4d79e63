"""Plot modules: each figure is written as PNG and SVG from data the test checks; the HTML
animation is self-contained and its script runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.animation import animation_data, write_animation
from sim.config import SLOConfig, expand_variants, load_scenario
from sim.engine import simulate
from sim.plots_batching import plot_replicas, plot_tenants, tenant_frame
from sim.plots_sweep import plot_latency_throughput, plot_max_num_seqs, plot_sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def seeds():
    _, raw = load_scenario(ROOT / "scenarios/seeds_sixteen_requests.yaml")
    return {k: simulate(sc) for k, sc in expand_variants(raw, "seeds").items()}


def both(paths):
    assert [p.suffix for p in paths] == [".png", ".svg"]
    for p in paths:
        assert p.stat().st_size > 5000
    svg = paths[1].read_text()
    return svg


def test_animation_matches_the_seeds_arithmetic(seeds, tmp_path):
    data = animation_data(seeds, max_steps=5000)
    static, cont = data["static"], data["continuous"]
    assert static["slots"] == 16
    # Static: two batches of 16, each holding every slot until its 512-token member is done:
    # 1,024 useful of 16 x 512 slot-steps per batch, 12.5% (the seeds' arithmetic).
    useful = np.array(static["useful"])
    share = useful.sum() / (static["slots"] * len(useful))
    assert share == pytest.approx(0.125, abs=0.005)
    # The same useful work; continuous batching runs both 512-token requests side by side.
    assert sum(cont["useful"]) == useful.sum()
    assert len(cont["useful"]) < 0.6 * len(useful)
    assert static["done"][-1] == cont["done"][-1] == 32
    path = write_animation(seeds, tmp_path / "a.html", max_steps=2000)
    html = path.read_text()
    assert not re.search(r"(src|href)=|https?://", html)  # no network, no external files


def test_animation_script_runs(seeds, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    html = write_animation(seeds, tmp_path / "a.html", max_steps=200).read_text()
    script = html.split("<script>")[1].split("</script>")[0]
    shim = """
const calls = {fill: 0};
function el(tag) { return {tag, style: {}, children: [], append(...c) { this.children.push(...c); },
  getContext() { return {fillRect() { calls.fill++; }, set fillStyle(v) {}}; },
  set textContent(v) { this._t = v; }, get textContent() { return this._t; }, value: "4"}; }
const byId = {};
const document = {createElement: el, getElementById(id) { return byId[id] || (byId[id] = el(id)); }};
function requestAnimationFrame(f) {}
"""
    tail = """
byId["fwd"].onclick(); byId["fwd"].onclick(); byId["scrub"].value = "50"; byId["scrub"].oninput();
console.log(JSON.stringify({fill: calls.fill, step: step, stats: views.map(v => v.stats.textContent)}));
"""
    out = subprocess.run([node, "-e", shim + script + tail], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["step"] == 50 and result["fill"] > 16 * 50
    assert result["stats"][0].startswith("step 50 / ")


def test_tenant_and_replica_bars(tmp_path):
    from sim.config import validate

    reqs = [{"arrival": i * 0.05, "prompt_len": 200 + 50 * (i % 3), "max_tokens": 20 + 40 * (i % 2),
             "tenant": ["a", "b", "c"][i % 3]} for i in range(90)]
    sc = validate({"workload": {"requests": reqs}, "cluster": {"replicas": 2,
                                                               "router": "least_outstanding"}}, "t")
    res = simulate(sc)
    slo = SLOConfig(ttft_ms=1000, tpot_ms=50)
    tenants = tenant_frame({"run": res.frame()}, slo)
    assert list(tenants.tenant) == ["a", "b", "c"] and (tenants.requests == 30).all()
    assert tenants.slo_attainment.between(0, 1).all()
    svg = both(plot_tenants(tenants, tmp_path / "tenants", slo))
    assert "TTFT SLO 1000 ms" in svg and "Per-tenant service" in svg
    svg = both(plot_replicas({"jsq": res.summary}, tmp_path / "replicas"))
    assert "imbalance" in svg and "replica 1" in svg


def fake_sweep():
    rows = []
    for v, scale in (("static", 3.0), ("continuous", 1.0)):
        for rate in (2, 4, 8):
            rows.append({"variant": v, "rate": rate, "request_throughput": min(rate, 6 / scale),
                         "p99_ttft_ms": 100 * rate * scale, "median_tpot_ms": 10 + rate,
                         "p99_itl_ms": 20 + rate, "output_throughput": 100 * rate})
    return pd.DataFrame(rows)


def test_latency_throughput_and_sweep_dispatch(tmp_path):
    frame = fake_sweep()
    slo = SLOConfig(ttft_ms=2000, tpot_ms=100)
    svg = both(plot_latency_throughput(frame, ["variant", "rate"], tmp_path / "lt", slo))
    assert "TTFT SLO 2000 ms" in svg and "continuous" in svg and "req/s" in svg
    paths = plot_sweep(frame, ["variant", "rate"], tmp_path / "s", slo)
    assert [p.name for p in paths] == ["latency_throughput.png", "latency_throughput.svg"]
    single = frame[frame.rate == 2]
    paths = plot_sweep(single, ["variant", "rate"], tmp_path / "s2")
    assert paths[0].name == "points.png"


def test_max_num_seqs_plot(tmp_path):
    seqs = [1, 4, 16, 64]
    frame = pd.DataFrame({"engine.max_num_seqs": seqs, "rate": 10.0,
                          "output_throughput": [50, 190, 600, 700],
                          "p99_ttft_ms": [9e5, 2e5, 5e3, 3e3], "median_tpot_ms": [8, 9, 14, 30],
                          "p99_itl_ms": [9, 12, 40, 90], "kv_usage_max": [0.02, 0.1, 0.5, 1.0]})
    svg = both(plot_max_num_seqs(frame, ["engine.max_num_seqs", "rate"], tmp_path / "m",
                                 SLOConfig(ttft_ms=2000, tpot_ms=50), recommended=16))
    assert "recommended max_num_seqs=16" in svg and "TPOT SLO 50 ms" in svg
    assert "max_num_seqs (log2 scale)" in svg
