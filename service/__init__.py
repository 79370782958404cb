"""specwatch control plane: settings, database, webhooks, ingest and queue, API, queries, CLI, dashboard (no torch)."""
