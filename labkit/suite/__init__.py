"""The unattended rerun: every notebook under parameter profiles, baselines pinned per hardware, the
comparison with them, and the journal of conclusions."""
