"""What every layer reads: settings (config), the result row (schema), vLLM's knobs, the manual's
reference data, the machine (hardware).
"""
