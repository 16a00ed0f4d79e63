"""Real execution backend: a Llama-family model over a paged KV cache, driven by the shared scheduler.

Everything here imports torch; the simulator (`sim/`) never imports this package.
"""
