"""The distribution-preservation suite: torch, numpy and scipy only (no service, DB or Celery)."""

#: Version of the statistics and runner; recorded with every run.
SUITE_VERSION = "0.2.0"  # 0.2: joint checks of a step, stopped e-values, headline, raised cases, result schema 2
#: Version of the case catalogue (fixtures, designs); bump when any case changes.
CATALOGUE_VERSION = "2026.12.3.1"  # long-horizon e2e cases, processed fixtures that cut mass, V256/V1024
