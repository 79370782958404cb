"""The analysis of finished runs: from a failing run to a confirmed alert at its first bad commit.

The path and each module's job are in ``docs/architecture.md`` (the module table, and stage 3 of "Follow one
push"). In short:
:mod:`~workers.analysis.run` dispatches a finished run by purpose; :mod:`~workers.analysis.primary` triages a
new commit's run (:mod:`~workers.analysis.triage`), queues its confirmation, checks drift
(:mod:`~workers.analysis.drift`) and resolves recovered alerts (:mod:`~workers.analysis.resolution`);
:mod:`~workers.analysis.confirmation` confirms per case and layer; :mod:`~workers.analysis.bisection` searches
the first bad commit over the branch loaded by :mod:`~workers.analysis.history`, its state typed in
:mod:`~workers.analysis.state`; :mod:`~workers.analysis.alerts` opens the alert once. The pure decisions are in
:mod:`~workers.analysis.decisions`.
"""

from workers.analysis.context import AnalysisConfig, AnalysisReport
from workers.analysis.run import analyse, unanalysed

__all__ = ["AnalysisConfig", "AnalysisReport", "analyse", "unanalysed"]
