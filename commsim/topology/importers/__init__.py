"""Topology importers: `nvidia-smi topo -m` text (nvidia_smi, parsed by nvidia_smi_parse),
NCCL topology XML (nccl_xml) and NVML fabric info (nvml_fabric)."""
