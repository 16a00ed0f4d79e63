"""``lpm``: longest prefix match first keeps shared prefixes hot in a small cache."""

from tests.policy_workloads import run, table


def interleaved_groups(n_groups=6, per=20):
    """Requests of 6 prompt families (2,048 shared tokens + 512 own) arriving round-robin."""
    rows, hashes = [], []
    uid = 10_000
    for _ in range(per):
        for g in range(n_groups):
            rows.append((0.001 * len(rows), 2048 + 512, 50, "t", f"g{g}"))
            hashes.append((g * 100 + 1, g * 100 + 2, g * 100 + 3, g * 100 + 4, uid))
            uid += 1
    t = table(rows)
    t.hash_ids = hashes
    return t


def test_lpm_raises_the_hit_rate_against_fcfs_in_a_small_cache():
    t = interleaved_groups()
    engine = {"max_num_seqs": 4, "num_gpu_blocks_override": 800, "enable_prefix_caching": True}
    fcfs = run(t, "continuous", engine=engine).summary
    lpm = run(t, "lpm", engine=engine).summary
    assert fcfs["prefix_cache_hit_rate"] < 0.1  # round-robin families evict each other
    assert lpm["prefix_cache_hit_rate"] > 0.7  # the best possible is (1 - 6/120) * 0.8 = 0.76
    assert lpm["mean_ttft_ms"] < 0.8 * fcfs["mean_ttft_ms"]
    assert lpm["completed"] == fcfs["completed"] == len(t)
