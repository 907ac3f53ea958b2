"""NCCL on the simulated machine: a client of the process's driver, NVML, host identity and
/dev/shm, so every machine fault reaches it as it reaches real NCCL (NVIDIA/nccl v2.27.3-1
is the source each module cites). One job per module:

  errors.py      ncclResult_t, ncclGetErrorString, WARN / INFO lines, CUDACHECK / SYSCHECK
  calls.py       the driver calls NCCL makes, traced, failures as NCCL's errors
  topo.py        fillInfo + topology detection through the driver -> the decision model
  shm.py         the process's /dev/shm for SHM segments
  transports.py  per-peer set-up: P2P (legacy IPC, cuMem POSIX fd, FABRIC), SHM, NET
  nvls.py        NVLS multicast set-up, its failures by version
  comm.py        ncclCommInitRank: bootstrap, search (nccl_rules.decide), MNNVL check, set-up
  datapath.py    collectives over the connections
"""
