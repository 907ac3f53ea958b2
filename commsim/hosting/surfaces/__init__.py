"""Surfaces: the stand-ins a hosted program sees for foreign modules, one package per foreign package."""
