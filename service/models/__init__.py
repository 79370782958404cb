"""The control plane's tables, one module per domain: targets and what arrives for them (commits, poll
states, deliveries), runs and their case results, alerts and the notification outbox, known findings,
dashboard sessions, the instance's identity.

Tables are created only by Alembic (``migrations/``), never by ``create_all()``. Conventions: constraints are
named by :data:`NAMING_CONVENTION` (so migrations can drop them on every backend); enums are stored by value
as ``VARCHAR`` + ``CHECK`` (the same migrations on SQLite and PostgreSQL, and a new state is a constraint
change, not an ``ALTER TYPE``); timestamps are timezone-aware UTC on both backends (:class:`UTCDateTime`);
every idempotency key is a unique constraint. Every name is importable from here.
"""

from service.models.alerts import RELEASES_BRANCH, Alert, AlertKind, AlertState, Notification, NotificationChannel, NotificationStatus
from service.models.base import NAMING_CONVENTION, Base, UTCDateTime
from service.models.findings import KnownFinding
from service.models.instance import InstanceIdentity
from service.models.runs import FINISHED_STATUSES, CaseResult, Run, RunPurpose, RunStatus
from service.models.sessions import DashboardSession
from service.models.targets import Commit, CommitPolicy, Delivery, DeliveryStatus, InstallMode, PollKind, PollState, Target
from specwatch.findings import FindingState
from specwatch.protocol import Verdict

__all__ = [
    "FINISHED_STATUSES",
    "NAMING_CONVENTION",
    "RELEASES_BRANCH",
    "Alert",
    "AlertKind",
    "AlertState",
    "Base",
    "CaseResult",
    "Commit",
    "CommitPolicy",
    "DashboardSession",
    "Delivery",
    "DeliveryStatus",
    "FindingState",
    "InstallMode",
    "InstanceIdentity",
    "KnownFinding",
    "Notification",
    "NotificationChannel",
    "NotificationStatus",
    "PollKind",
    "PollState",
    "Run",
    "RunPurpose",
    "RunStatus",
    "Target",
    "UTCDateTime",
    "Verdict",
]
