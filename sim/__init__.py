"""cbsim: a discrete-event simulator of continuous-batching LLM serving."""

__version__ = "0.1.0"
