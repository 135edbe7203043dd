"""Policy and tokenizer loading: the built-in tiny model (with its cached warm start) or any HF model."""
