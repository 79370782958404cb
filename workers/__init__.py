"""specwatch workers: Celery tasks, pollers, the analysis, the notification outbox and the distribution-preservation suite."""
