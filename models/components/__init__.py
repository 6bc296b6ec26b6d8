"""Torch modules shared by model declarations, written for serving: packed rows, no padding masks,
attention through a resource role so the plan can pick the backend."""
