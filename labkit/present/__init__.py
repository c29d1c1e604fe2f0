"""Showing results: plots and the suite's HTML report. Like analyze, never starts an engine."""
