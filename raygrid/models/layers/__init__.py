"""Building blocks of decoder-only transformers, on packed tokens ``[num_tokens, hidden]``."""
