"""specwatch control plane: settings, database, webhooks, API, analysis, alerts, CLI (no torch)."""
