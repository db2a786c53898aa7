"""Ready-made problems built on ssca_solver's public API (``from problems import ...``)."""
