"""A caller that forces one-shot all-reduce (TRT-LLM `AllReduceStrategy.ONESHOT`, FlashInfer
`use_oneshot=True`) at a size where the library itself would run two-shot: one-shot in the
Lamport layout needs world x bytes of workspace, sized for the library's own choice
(docs/lifecycle-rules.md AW1). The library refuses it by name."""

from commsim.policy import Policy

POLICY = Policy(name="trtllm-forced-oneshot", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "force_algorithm": "one-shot", "workspace_check": "refuse"},
                fallback_on_setup_error=False)
