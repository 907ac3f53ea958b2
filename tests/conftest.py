"""Suite-wide set-up: torch's thread count as a commsim run sets it where it starts
(commsim.sim.set_torch_threads; importing commsim changes nothing global)."""

from commsim.sim import set_torch_threads

set_torch_threads()

# tests/hosting/test_plugin.py runs downstream test files under the commsim pytest plugin.
pytest_plugins = ["pytester"]
