"""Model declarations (one file per model) and the torch components they share."""
