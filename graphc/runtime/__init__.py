"""The small runtime: boot a plan (build, load, allocate, capture), schedule steps, serve."""
