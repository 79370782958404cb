"""Notifications: the rows of the outbox, written in the transaction that decides them and sent later by the workers
(:mod:`workers.notify`, :mod:`workers.senders`), never sent here.

- :mod:`.outbox`: a row written once (its dedup key), the configured channels, a commit's link;
- :mod:`.slack`: an alert's message; :mod:`.findings`: a known finding's fix;
- :mod:`.statuses`: a run's GitHub commit status; :mod:`.check_runs`: its GitHub check run (opt-in); :mod:`.github`: both;
- :mod:`.text`: the texts of messages made literal and cut.
"""
