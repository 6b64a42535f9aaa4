"""Moving KV blocks between engine instances (prefill/decode disaggregation).

config.py parses vLLM's --kv-transfer-config and ladle's --disaggregate xPyD; worker/kv_peers.py is
the worker's side: a producer's KV pool exported to other processes, a consumer's pulls.
"""
