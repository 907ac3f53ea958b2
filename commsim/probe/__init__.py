"""`commsim probe`: what a real machine reports through the device binding (`machine`) and
the scenario file that describes it (`scenario`). Importing needs no GPU."""
