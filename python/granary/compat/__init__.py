"""Layers that let code written for other stores run on Granary (see granary.compat.mooncake)."""
