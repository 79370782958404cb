"""The control plane's HTTP routes, one router per resource, all included by :data:`router`:

- :mod:`service.routes.targets`: ``/targets`` (list, add, remove);
- :mod:`service.routes.commits`: ``/overview``, a branch's commits, one case over commits, ``/compare``;
- :mod:`service.routes.runs`: ``/runs/{id}``;
- :mod:`service.routes.alerts`: ``/alerts`` (list, one, acknowledge, resolve);
- :mod:`service.routes.findings`: ``/targets/{name}/findings``;
- :mod:`service.routes.ops`: ``/healthz``, ``/readyz``, ``/metrics``;
- the webhook ``/webhooks/github``: :mod:`service.webhooks`, the package that also verifies and parses it;
- the dashboard (``/ui``): :mod:`service.dashboard` and its actions.
"""

from __future__ import annotations

from fastapi import APIRouter

from service import dashboard, webhooks
from service.dashboard import actions as dashboard_actions
from service.routes import alerts, commits, findings, ops, runs, targets

router = APIRouter()
for module in (webhooks, targets, commits, runs, alerts, findings, ops, dashboard, dashboard_actions):
    router.include_router(module.router)
