"""Compiler passes, one per file, named verb_object; pipeline.py runs them in order."""
