"""Failure hygiene as shortcuts take it (docs/lifecycle-rules.md FH1, FH3): when a backend's
set-up fails, what it allocated is not rolled back, and the fallback to the next backend is
not reported (vllm-project/vllm#55973: failed workspace creations neither cached nor
reported; vllm-project/vllm#56193 falls back *with* a warning)."""

from commsim.policy import Policy

POLICY = Policy(name="silent-leaky-fallback",
                params={"max_size": 8 << 20, "rollback": False, "report_fallback": False})
