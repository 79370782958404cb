"""specwatch workers: Celery tasks and the distribution-preservation suite."""
