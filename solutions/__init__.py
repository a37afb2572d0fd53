"""Chapter modules, chNN_<topic>.py. Start with docs/00_overview.md."""
