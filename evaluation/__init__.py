"""Metrics on the held-out split, champion comparison, gate decisions and reports."""
