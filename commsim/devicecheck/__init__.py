"""Tools that check a real machine against the simulator (users of the driver,
not part of it): the one-GPU device check (`check`, `python -m commsim.devicecheck`), the
simulator's prediction for a probed machine (`predict`), the communicator end to end under
torchrun (`e2e`), and the CUDA conformance rig (`rig`, `rig_worker`). Importing needs no GPU.
"""
