"""Symmetric memory whose POSIX-fd exchange pulls peers' fds with pidfd_getfd (as NVIDIA
Fuser's SymmetricTensor does) instead of passing them over a Unix socket with SCM_RIGHTS
(row W7 of docs/fidelity-rules.md). Not voted: the rank that gets EPERM raises it."""

from commsim.policy import Policy

POLICY = Policy(name="symm-pidfd-exchange", order=("symm", "nccl"),
                params={"symm_fd_exchange": "pidfd"})
