"""tunebook: sweep vLLM's serving knobs from notebooks, store every result, chart it beside
the vLLM manual's figures."""

__version__ = "0.1.0"
