"""What serves: a Server (base) and its kinds — vLLM, SGLang, a prefill/decode pair — picked by
server_for(config); what a start logs (startup, start_phases), its compile cache and its
/metrics.
"""
