"""Hosting unmodified programs as ranks of a simulated machine (DESIGN.md section 9)."""
