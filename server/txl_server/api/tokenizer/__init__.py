"""vLLM's tokenizer routes: `/tokenize`, `/detokenize` and `/tokenizer_info`, at the server's root."""
