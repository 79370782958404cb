#!/bin/sh
# The official postgres image's first-start behaviour, reduced to what docker-compose.yml uses.
set -eu
chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp) && printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile" && chown postgres "$pwfile"
    su postgres -s /bin/sh -c "initdb --encoding=UTF8 --locale=C.UTF-8 --username='$POSTGRES_USER' --pwfile='$pwfile' --auth-host=scram-sha-256 --auth-local=trust -D '$PGDATA'" >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    su postgres -s /bin/sh -c "pg_ctl -D '$PGDATA' -o '-c listen_addresses=' -w start" >/dev/null
    su postgres -s /bin/sh -c "createdb --username='$POSTGRES_USER' '$POSTGRES_DB'" 2>/dev/null || true
    su postgres -s /bin/sh -c "pg_ctl -D '$PGDATA' -m fast -w stop" >/dev/null
fi
exec su postgres -s /bin/sh -c "exec postgres -D '$PGDATA' -c listen_addresses='*'"
