"""Settings every LM of ``arag.lm`` starts from."""

PLACEHOLDER_API_KEY = "no-key-needed"  # what a local server without a key is sent
DEFAULT_MAX_TOKENS = 4096  # a cap: each call asks for what its output fields need (arag.adapters)
DEFAULT_TIMEOUT_S = 120.0
